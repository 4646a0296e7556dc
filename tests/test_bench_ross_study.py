"""bench/ross_study.py: the refusal on too few verified rollouts, every stage end to end on a tiny
model (hf engine), each skipped once its output exists, a stop by --until resumed, the false-claim
measure and the until semantics."""

import importlib.util
import json
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest

spec = importlib.util.spec_from_file_location("ross_study", Path(__file__).parents[1] / "bench" / "ross_study.py")
rs = importlib.util.module_from_spec(spec)
spec.loader.exec_module(rs)


def test_until_is_the_next_occurrence_and_gates_each_unit(tmp_path, monkeypatch):
    now = datetime(2026, 12, 2, 22, 25, 10, tzinfo=UTC)
    assert rs.until_ts("00:25", now) == datetime(2026, 12, 3, 0, 25, tzinfo=UTC).timestamp()
    clock = rs.Clock(tmp_path, "00:25")
    monkeypatch.setattr(rs.time, "time", lambda: clock.deadline - 100.0)  # 100 s before the deadline
    assert clock.rate("rl_step") == (rs.PRIOR_S["rl_step"], False)
    assert clock.may_start("rl_step", 3, "x")  # 3 x 25 s prior fits
    assert not clock.may_start("rl_step", 5, "x")
    clock.record("rl_step", 1, "step 0", wall=60.0, cpu=40.0)
    assert clock.rate("rl_step") == (40.0, True)  # the measured rate replaces the prior
    assert not clock.may_start("rl_step", 3, "x")
    assert rs.Clock(tmp_path, None).may_start("rl_step", 1e9, "x")


def test_timed_counts_the_cpu_of_a_child_process(tmp_path):
    # an evaluation row's vLLM engine core is a child process: its CPU used to be left out (6 CPU-s
    # recorded for a 200 s row)
    import subprocess
    import sys

    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.6: pass"
    clock = rs.Clock(tmp_path, None)
    rs.timed(clock, "eval_sample", 1, "child", lambda: subprocess.run([sys.executable, "-c", burn], check=True))
    (rec,) = rs.read_jsonl(tmp_path / "timings.jsonl")
    assert rec["cpu_s"] >= 0.55


def test_false_claim_share_and_paired_test():
    assert rs.has_false_claim("3 + 4 = 8\nAnswer: 8") and not rs.has_false_claim("3 + 4 = 7\nAnswer: 7")
    assert not rs.has_false_claim("Answer: 7")  # no claim, nothing false
    by_row = {"ross": {"greedy": {f"b/p{i}": False for i in range(6)}, "sampled": [1, 12]},
              "upstream": {"greedy": {f"b/p{i}": True for i in range(6)}, "sampled": [12, 12]}}
    s = rs.claims_summary(by_row)
    assert s["rows"]["upstream"]["greedy_share"] == 1.0 and s["rows"]["ross"]["sampled_share"] == 1 / 12
    (t,) = s["tests"]
    assert (t["a"], t["b"], t["n"], t["diff"], t["a_more"]) == ("upstream", "ross", 6, 1.0, 6)
    assert t["p_value"] == pytest.approx(2 * 0.5**6) and t["p_holm"] == t["p_value"]
    assert "| upstream | 100.0% (n = 6)" in rs.claims_table(s)


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """A 2-step `gfcr train` run of a tiny random model (hf) whose store also holds 6 verified
    distinct rollouts (the random model solves nothing)."""
    from tests.ross.conftest import make_prompt, make_rollout

    from gfcr.store import RolloutStore
    from gfcr.testing import save_tiny, tiny_tokenizer
    from gfcr.train.config import load_config
    from gfcr.train.loop import train

    root = tmp_path_factory.mktemp("rs")
    model = save_tiny(str(root / "model"), seed=1)
    cfg = load_config(Path(__file__).parents[1] / "configs" / "arith-smollm2.yaml", {
        "model": model, "steps": 2, "output_dir": str(root), "run_name": "up", "tensorboard": False,
        "generate.engine": "hf", "generate.max_tokens": 6, "generate.topology": {"name": "group", "params": {"k": 2}}, "generate.prompts_per_step": 2,
        "optim.lr": 0.05, "eval.before": False, "eval.after": False, "checkpoint.every": 1,
        "signals.entropy": False})
    for t in cfg.tasks:
        t.n_train, t.n_eval = 2, 0
    res = train(cfg, run_dir=root / "up", progress=False)
    tok = tiny_tokenizer()
    store = RolloutStore.open(res.run_dir / "store")
    rows = []
    for i in range(6):
        a, b = i + 2, 7
        text = f"{a} + {b} = {a + b + 1}.\nOops. {a} + {b} = {a + b}.\nAnswer: {a + b}\n"
        rows.append(make_rollout(tok, f"What is {a} + {b}?", text, gold=str(a + b), step=i % 2, prompt_id=f"q{i}"))
    store.append(rows)
    store.upsert_prompts([make_prompt(f"What is {i + 2} + 7?", str(i + 9), f"q{i}") for i in range(6)])
    return res.run_dir, model


def _argv(state, run, model, *more):
    return ["--state", str(state), "--run", str(run), "--min-verified", "6", "--extra-steps", "1", "--engine", "hf",
            "--base-model", model, "--n-2d", "3", "--n-1d", "2", "--k", "2", "--max-tokens", "6", "--epochs", "1",
            "--set", "train.lr=0.001", "--set", "train.batch_size=4", *more]


def _listing(d):
    return sorted((str(p.relative_to(d)), p.stat().st_size, p.stat().st_mtime_ns) for p in Path(d).rglob("*"))


def test_too_few_verified_rollouts_is_refused_in_one_line(tiny_run, tmp_path):
    run, model = tiny_run
    before = _listing(run)
    argv = _argv(tmp_path / "s", run, model)
    argv[argv.index("--min-verified") + 1] = "7"
    with pytest.raises(SystemExit, match=r"holds 6 verified distinct rollouts, fewer than --min-verified 7"):
        rs.main(argv)
    assert not (tmp_path / "s" / "upstream").exists() and _listing(run) == before  # the run folder only read


@pytest.mark.slow
def test_every_stage_runs_then_skips_and_an_until_stop_resumes(tiny_run, tmp_path, monkeypatch):
    run, model = tiny_run
    before = _listing(run)
    state = tmp_path / "s"
    real = rs.Clock.may_start
    # the first call stops before the evaluation of its third model row (as --until would)
    monkeypatch.setattr(rs.Clock, "may_start", lambda self, kind, units, what: kind != "eval_sample"
                        or len([r for r in rs.read_jsonl(self.path) if r["kind"] == "eval_sample"]) < 2)
    text = rs.main(_argv(state, run, model))
    assert "Left:" in text and not (state / "ross" / "eval.json").exists()
    assert json.loads((state / "upstream" / "upstream.json").read_text())["verified_distinct"] == 6
    cont = json.loads((state / "continued.json").read_text())
    assert cont["steps"] == 3 and cont["checkpoint"].endswith("step_000002")  # upstream step 1 + 1 extra
    assert sorted(p.name for p in (state / "ross" / "rows").glob("*.json")) == ["ross.json", "upstream.json"]
    built = (state / "ross" / "build.json").stat().st_mtime_ns
    monkeypatch.setattr(rs.Clock, "may_start", real)
    text = rs.main(_argv(state, run, model))
    assert (state / "ross" / "build.json").stat().st_mtime_ns == built  # done stages are skipped
    timings = rs.read_jsonl(state / "timings.jsonl")
    kinds = [t["kind"] for t in timings]
    assert kinds.count("rl_step") == 1 and kinds.count("sft_row_epoch") == 3  # nomask = positive SFT: not trained
    ev = json.loads((state / "ross" / "eval.json").read_text())
    assert list(ev["results"]) == ["base", "upstream", "continued_rl", "positive_sft", "ross", "ross_from_base"]
    assert kinds.count("eval_sample") == 6 and {r["n_prompts"] for r in ev["results"]["ross"].values()} == {2, 3}
    assert any(p["benchmark"] == "math avg" and "p_holm" in p for p in ev["paired"])
    claims = json.loads((state / "claims.json").read_text())
    assert set(claims["rows"]) == set(ev["results"]) and all(r["greedy_n"] == 5 for r in claims["rows"].values())
    assert all(r["sampled_n"] == 10 for r in claims["rows"].values())
    assert "false arithmetic claim" in text and "load (1 min)" in text and "Left:" not in text
    assert _listing(run) == before
    # a third call has nothing left to do; other study arguments are refused
    n = len(rs.read_jsonl(state / "timings.jsonl"))
    rs.main(_argv(state, run, model))
    assert len(rs.read_jsonl(state / "timings.jsonl")) == n
    with pytest.raises(SystemExit, match="n_2d"):
        rs.main(_argv(state, run, model)[:-4] + ["--n-2d", "4"])
    assert np.isfinite(rs.estimate(rs.parser().parse_args(_argv(state, run, model)), state, rs.Clock(state, None))[0][1])


def test_own_upstream_rl_trains_resumably_then_the_count_decides(tmp_path, capsys):
    """--run own: the study's upstream RL run in STATE/rl (2 steps here), kept across calls; the tiny
    random model verifies nothing, so the snapshot is refused with the count."""
    from gfcr.testing import save_tiny

    model = save_tiny(str(tmp_path / "m"), seed=1)
    argv = ["--state", str(tmp_path / "s"), "--run", "own", "--rl-engine", "hf", "--rl-steps", "2", "--min-verified", "1",
            "--rl-config", str(Path(__file__).parents[1] / "configs" / "arith-smollm2.yaml"),
            *[f"--rl-set={kv}" for kv in (f"model={model}", "generate.max_tokens=4", "generate.topology.params.k=2",
                                           "generate.prompts_per_step=2", "signals.entropy=false")]]
    with pytest.raises(SystemExit, match="holds 0 verified distinct rollouts, fewer than --min-verified 1"):
        rs.main(argv)
    assert json.loads((tmp_path / "s" / "rl.json").read_text())["checkpoint"].endswith("step_000001")
    with pytest.raises(SystemExit, match="holds 0 verified"):
        rs.main(argv)  # the upstream RL is not run again
    assert [t["kind"] for t in rs.read_jsonl(tmp_path / "s" / "timings.jsonl")] == ["rl_step", "rl_step"]
    # a larger --rl-steps (the only new argument) continues the same run from its checkpoint
    longer = [("3" if a == "2" and argv[i - 1] == "--rl-steps" else a) for i, a in enumerate(argv)]
    with pytest.raises(SystemExit, match="holds 0 verified"):
        rs.main(longer)
    assert "extended from 2 to 3 steps" in capsys.readouterr().out
    assert json.loads((tmp_path / "s" / "rl.json").read_text())["checkpoint"].endswith("step_000002")
    assert [t["what"] for t in rs.read_jsonl(tmp_path / "s" / "timings.jsonl")] == [
        "upstream RL step 0", "upstream RL step 1", "upstream RL step 2"]
    study = json.loads((tmp_path / "s" / "study.json").read_text())
    assert study["args"]["rl_steps"] == 3 and study["extended"][0]["rl_steps"] == [2, 3]
    # fewer steps, or another argument with them, is refused as any other change
    for bad in (argv, [*longer, "--k", "2"]):
        with pytest.raises(SystemExit, match="started with other arguments"):
            rs.main(bad)
