"""Evaluations kept as stored rollouts (`gfcr.evaluate.stored`): a scripted engine whose answers are known,
so every stored verdict, the rebuilt metrics and the paired comparison of two checkpoints can be worked
out by hand; and `gfcr eval --store` / `gfcr compare` end to end on a tiny model."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from gfcr.evaluate import EvalRecorder, compare_stored, evaluate_model, stored_eval
from gfcr.generate.engines.base import GenResult
from gfcr.records import Message, Prompt
from gfcr.testing import save_tiny, tiny_tokenizer


class Answers:
    """Answers ``sampled[prompt_id][i]`` (sample i) or ``greedy[prompt_id]`` (temperature 0)."""

    name = "scripted"

    def __init__(self, sampled: dict[str, list[str]], greedy: dict[str, str], version: str):
        self.tokenizer = tiny_tokenizer()
        self.sampled, self.greedy, self.policy_version = sampled, greedy, version

    def generate(self, requests):
        out = []
        for req in requests:
            pid = req.request_id
            texts = [self.greedy[pid]] if req.params.temperature == 0 else self.sampled[pid][: req.params.n]
            res = []
            for t in texts:
                ids = self.tokenizer(t, add_special_tokens=False)["input_ids"]
                res.append(GenResult(token_ids=np.asarray(ids, np.int32), logprobs=np.full(len(ids), -0.25, np.float32),
                                     finish_reason="stop", text=t))
            out.append(res)
        return out


PROMPTS = [Prompt(prompt_id=f"p{i}", task="arith", messages=[Message("user", f"What is {i} + {i}?")], answer=str(2 * i))
           for i in range(1, 5)]
# checkpoint "base": greedy right on p1, p2; "after": greedy right on p2, p3, p4
BASE = Answers({"p1": ["2", "3"], "p2": ["4", "4"], "p3": ["1", "1"], "p4": ["0", "8"]},
               {"p1": "2", "p2": "4", "p3": "5", "p4": "9"}, "base")
AFTER = Answers({"p1": ["3", "3"], "p2": ["4", "4"], "p3": ["6", "1"], "p4": ["8", "8"]},
                {"p1": "3", "p2": "4", "p3": "6", "p4": "8"}, "after")


def _eval(store, engine, run_id):
    rec = EvalRecorder(store, engine, engine.policy_version, run_id=run_id, verifier="numeric", flush_every=3)
    res = evaluate_model(engine, PROMPTS, k=2, verifier="numeric", n_boot=200, record=rec)
    return res, rec.close()


def test_every_generation_is_stored_with_its_verdict(store):
    res, n = _eval(store, BASE, "eval-base")
    assert n == 4 * (2 + 1) == store.count()
    t = store.scan(run="eval-base").to_pylist()
    by = {(r["prompt_id"], r["sample_index"]): r for r in t}
    g = by[("p3", 2)]  # the greedy answer comes after the k = 2 sampled ones
    assert json.loads(g["meta"])["eval"]["phase"] == "greedy" and g["verified"] is False and g["reward"] == 0.0
    assert g["policy_version"] == "base" and g["messages"][-1]["content"] == "5"
    s = by[("p4", 1)]
    assert json.loads(s["meta"])["eval"]["phase"] == "sampled" and s["verified"] is True and s["reward"] == 1.0
    gen = np.asarray(s["token_role"]) == 1
    assert list(np.asarray(s["token_ids"])[gen]) == BASE.tokenizer("8", add_special_tokens=False)["input_ids"]
    assert {p.prompt_id for p in store.prompts()} == {"p1", "p2", "p3", "p4"}  # re-verifiable from the store
    assert store.prompts(["p4"])[0].answer == "8"


def test_stored_eval_gives_the_live_numbers(store):
    live, _ = _eval(store, BASE, "eval-base")
    again = stored_eval(store, "eval-base", n_boot=200)
    assert again.metrics.keys() == live.metrics.keys()
    for k, m in live.metrics.items():
        assert again.metrics[k].value == pytest.approx(m.value)
    # by hand: sampled correct p1 1/2, p2 2/2, p3 0/2, p4 1/2 -> avg@2 = 0.5; greedy p1, p2 -> 0.5
    assert again.metrics["avg@2"].value == pytest.approx(0.5)
    assert again.metrics["greedy_pass@1"].value == pytest.approx(0.5)


def test_compare_two_checkpoints_per_prompt(store):
    _eval(store, BASE, "eval-base")
    _eval(store, AFTER, "eval-after")
    c = compare_stored(store, "eval-after", "eval-base", metric="greedy_pass@1")
    assert c.diff.n == 4 and c.diff.diff == pytest.approx((3 - 2) / 4)
    assert [p for p, _, _ in c.a_only] == ["p3", "p4"] and [p for p, _, _ in c.b_only] == ["p1"]
    assert c.diff.test == "mcnemar_exact" and c.diff.p_value == pytest.approx(1.0)  # 2 vs 1 discordant
    avg = compare_stored(store, "eval-after", "eval-base", metric="avg@2")
    # per prompt after - base: p1 0 - .5, p2 0, p3 .5 - 0, p4 1 - .5 -> mean 0.125
    assert avg.diff.diff == pytest.approx(0.125)
    with pytest.raises(ValueError, match="no eval run 'eval-x'"):
        compare_stored(store, "eval-after", "eval-x")
    with pytest.raises(ValueError, match="already holds an eval run 'eval-base'"):
        EvalRecorder(store, BASE, "base", run_id="eval-base")


@pytest.mark.slow
def test_cli_eval_store_and_compare(tmp_path):
    model = save_tiny(str(tmp_path / "tiny"))
    st = tmp_path / "evals"
    for run in ("eval-a", "eval-b"):
        out = subprocess.run([sys.executable, "-m", "gfcr", "eval", "--model", model, "--tasks", "arith", "--n", "6",
                              "--k", "2", "--max-tokens", "4", "--store", str(st), "--eval-run", run, "--out",
                              str(tmp_path / f"{run}.json")], capture_output=True, text=True, timeout=600, cwd=tmp_path)
        assert out.returncode == 0, out.stderr
        assert f"stored 18 generations in {st} as eval run '{run}'" in out.stderr
    again = subprocess.run([sys.executable, "-m", "gfcr", "eval", "--model", model, "--n", "2", "--store", str(st),
                            "--eval-run", "eval-a"], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert again.returncode == 2 and "already holds an eval run 'eval-a'" in again.stderr
    cmp = subprocess.run([sys.executable, "-m", "gfcr", "compare", str(st), "eval-a", "eval-b", "--json"],
                         capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert cmp.returncode == 0, cmp.stderr
    d = json.loads(cmp.stdout)
    assert d["n"] == 6 and d["diff"] == pytest.approx(0.0) and d["a_only"] == d["b_only"] == []  # same greedy model


def test_train_keeps_its_before_and_after_evals_as_rollouts(tiny_dir, tmp_path):
    from gfcr.evaluate import EvalResult
    from gfcr.store import RolloutStore
    from gfcr.train.config import load_config
    from gfcr.train.loop import train

    cfg = load_config(None, {
        "model": tiny_dir, "output_dir": str(tmp_path / "runs"), "steps": 1, "tensorboard": False,
        "tasks": [{"name": "arith", "n_train": 4, "n_eval": 3, "params": {"level": 1}}],
        "generate.topology.params.k": 2, "generate.prompts_per_step": 2, "generate.max_tokens": 4,
        "eval.before": True, "eval.after": True, "eval.k": 2, "eval.max_tokens": 4})
    res = train(cfg, run_dir=tmp_path / "run", progress=False)
    evals = RolloutStore.open(res.run_dir / "evals")
    assert sorted(r["run_id"] for r in evals.stats()) == ["eval-after", "eval-before"]
    assert evals.count() == 2 * 3 * (2 + 1)
    for name in ("before", "after"):
        live = EvalResult.load(res.run_dir / f"eval_{name}.json")
        again = stored_eval(evals, f"eval-{name}", n_boot=1000, seed=cfg.seed)
        assert {k: m.value for k, m in again.metrics.items()} == pytest.approx({k: m.value for k, m in live.metrics.items()})
    versions = {r["run_id"]: r["policy_version"] for r in evals.sql("SELECT DISTINCT run_id, policy_version FROM rollouts").to_pylist()}
    assert versions == {"eval-before": "s0", "eval-after": "s1"}
    assert compare_stored(evals, "eval-after", "eval-before").diff.n == 3
