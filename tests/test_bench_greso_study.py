"""bench/greso_study.py: its paired statistics, and that a stopped or killed study resumes exactly
(tiny random model, hf engine: same per-step records, held-out verdicts, stored tokens and weights)."""

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

spec = importlib.util.spec_from_file_location("greso_study", Path(__file__).parents[1] / "bench" / "greso_study.py")
gs = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gs)


def test_sign_test_and_paired_bootstrap():
    assert gs.sign_test(np.array([-1.0] * 5 + [0.0])) == (5, 0, 0.0625)  # 2 * 0.5**5
    lo, hi, p = gs.sign_test(np.array([-1.0, -2.0, 1.0, 0.0]))
    assert (lo, hi) == (2, 1) and p == pytest.approx(1.0)  # 2 * (1 + 3) / 8, capped at 1
    assert gs.bootstrap_mean(np.array([0.5, 0.5])) == (0.5, 0.5, 0.5)
    mean, lo, hi = gs.bootstrap_mean(np.array([0.0, 1.0] * 20))
    assert mean == 0.5 and lo < 0.5 < hi
    # tokens per effective sample: arm 100/4 = 25 vs baseline 100/2 = 50 -> ratio 0.5
    r = gs.ratio_ci(np.array([50.0, 50.0]), np.array([2.0, 2.0]), np.array([50.0, 50.0]), np.array([1.0, 1.0]))
    assert r == (0.5, 0.5, 0.5)
    # --until: a round that evaluates is estimated with the evaluation's time (the first study stopped
    # at step 1 when the step-0 round, evaluations included, was taken as the time of every round)
    assert gs.round_estimate([300.0, 400.0, 350.0], [900.0], False) == 350.0
    assert gs.round_estimate([300.0, 400.0, 350.0], [900.0], True) == 1250.0


def test_until_is_the_next_occurrence_of_the_time():
    """--until 00:25 given at 22:25 means 2 h ahead (it used to mean today's 00:25, already past, and the
    study stopped before its first step)."""
    from datetime import UTC, datetime

    now = datetime(2026, 12, 2, 22, 25, 10, tzinfo=UTC)
    assert gs.until_ts("00:25", now) == datetime(2026, 12, 3, 0, 25, tzinfo=UTC).timestamp()
    assert gs.until_ts("23:00", now) == datetime(2026, 12, 2, 23, 0, tzinfo=UTC).timestamp()
    assert gs.until_ts(None, now) is None


def _strip(rows):
    drop = {"wall_s", "cpu_s", "load_1m", "time", "stage_s"}
    return [{k: v for k, v in r.items() if k not in drop} for r in rows]


def _trace(state):
    import torch
    from safetensors.torch import load_file

    from gfcr.store import RolloutStore
    from gfcr.train.checkpoint import latest_checkpoint

    out = {}
    for arm in ("uniform", "greso"):
        d = state / "arms" / arm
        rs = sorted(RolloutStore.open(d / "store").rollouts(), key=lambda r: (r.step, r.prompt_id, r.sample_index))
        w = load_file(str(latest_checkpoint(d) / "model.safetensors"))
        out[arm] = {"rows": _strip(gs.read_jsonl(d / "study.jsonl")), "evals": _strip(gs.read_jsonl(d / "evals.jsonl")),
                    "tokens": [(r.step, r.prompt_id, r.sample_index, r.token_ids.tolist(), r.policy_version) for r in rs],
                    "ckpt": latest_checkpoint(d).name, "w": {k: v.to(torch.float64) for k, v in w.items()}}
    return out


def _same(a, b):
    import torch

    for arm in a:
        assert a[arm]["rows"] == b[arm]["rows"]
        assert a[arm]["evals"] == b[arm]["evals"]
        assert a[arm]["tokens"] == b[arm]["tokens"]
        assert a[arm]["ckpt"] == b[arm]["ckpt"]
        assert all(torch.equal(a[arm]["w"][k], b[arm]["w"][k]) for k in a[arm]["w"])


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    from gfcr.testing import tiny_model, tiny_tokenizer

    path = tmp_path_factory.mktemp("gs_tiny") / "model"
    tok = tiny_tokenizer()
    tiny_model(tok, seed=1).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def _argv(state, model):
    return ["--state", str(state), "--engine", "hf", "--arms", "uniform,greso", "--steps", "4", "--ckpt-every", "2",
            "--eval-every", "2", "--n-train", "2,3", "--n-eval", "2,3", "--set", f"model={model}",
            "--set", "generate.max_tokens=6", "--set", "generate.topology.params.k=2", "--set", "generate.prompts_per_step=2",
            "--set", "optim.lr=0.05", "--set", "eval.max_tokens=6", "--set", "signals.entropy=false"]


@pytest.mark.slow
def test_stopped_and_killed_studies_resume_exactly(tiny_path, tmp_path, monkeypatch):
    full = gs.main(_argv(tmp_path / "full", tiny_path))
    assert full["steps"] == 4 and set(full["arms"]["greso"]["greedy_pass@1"]) == {"0", "2", "4"}
    ref = _trace(tmp_path / "full")
    assert [r["step"] for r in ref["greso"]["rows"]] == [0, 1, 2, 3]
    assert ref["uniform"]["ckpt"] == "step_000003"

    # a clean stop after step 0 (not a checkpoint step): every arm checkpointed there, then resumed
    cut = gs.main(_argv(tmp_path / "cut", tiny_path) + ["--max-rounds", "1"])
    assert cut["steps"] == 1
    assert _trace(tmp_path / "cut")["greso"]["ckpt"] == "step_000000"
    gs.main(_argv(tmp_path / "cut", tiny_path))
    _same(ref, _trace(tmp_path / "cut"))

    # a kill during step 2 (after the last checkpoint, step 1): greso's step-2 rollouts are in its store,
    # no checkpoint is written on the way out; the re-run recomputes step 2 from the store
    real = gs.step_record

    def dies(step, row, wall, cpu):
        if step == 2 and len(gs.read_jsonl(tmp_path / "kill" / "arms" / "uniform" / "study.jsonl")) == 3:
            raise KeyboardInterrupt("killed")
        return real(step, row, wall, cpu)

    monkeypatch.setattr(gs, "step_record", dies)
    with pytest.raises(KeyboardInterrupt):
        gs.main(_argv(tmp_path / "kill", tiny_path))
    killed = _trace(tmp_path / "kill")
    assert killed["greso"]["ckpt"] == "step_000001" and len(killed["uniform"]["rows"]) == 3
    assert {t[0] for t in killed["greso"]["tokens"]} == {0, 1, 2}  # step 2 generated and stored before the kill
    monkeypatch.setattr(gs, "step_record", real)
    gs.main(_argv(tmp_path / "kill", tiny_path))
    _same(ref, _trace(tmp_path / "kill"))


def test_a_resume_with_other_study_arguments_is_refused(tmp_path):
    args = gs.parser().parse_args(["--state", str(tmp_path), "--steps", "4"])
    gs.check_same_study(tmp_path, args)
    gs.check_same_study(tmp_path, gs.parser().parse_args(["--state", str(tmp_path), "--until", "17:55"]))
    with pytest.raises(SystemExit, match="n_train"):
        gs.check_same_study(tmp_path, gs.parser().parse_args(["--state", str(tmp_path), "--n-train", "4,4"]))
    assert json.loads((tmp_path / "study.json").read_text())["args"]["arms"] == "uniform,greso,vade"
