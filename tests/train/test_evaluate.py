"""pass@k, bootstrap CIs and the summary on hand-worked numbers."""

from __future__ import annotations

import json
from math import comb

import pytest

from gfcr.evaluate import EvalResult, bootstrap_ci, pass_at_k, summarize


def test_pass_at_k_hand_values():
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 1, 2) == pytest.approx(1 - 3 / 6)
    assert pass_at_k(5, 0, 3) == 0.0
    assert pass_at_k(5, 3, 3) == 1.0
    assert pass_at_k(10, 3, 4) == pytest.approx(1 - comb(7, 4) / comb(10, 4))


def test_pass_at_k_rejects_bad_input():
    with pytest.raises(ValueError, match="k <= n"):
        pass_at_k(2, 1, 3)
    with pytest.raises(ValueError, match="c <= n"):
        pass_at_k(2, 3, 1)


def test_bootstrap_ci_brackets_mean_and_constant():
    assert bootstrap_ci([1.0, 1.0, 1.0]) == (1.0, 1.0)
    lo, hi = bootstrap_ci([0, 1] * 20, seed=3)
    assert lo < 0.5 < hi
    assert 0.25 < lo and hi < 0.75


def test_summarize_metrics_and_json(tmp_path):
    correct = {"a": [True, False, False, False], "b": [True, True, False, False], "c": [False] * 4}
    greedy = {"a": True, "b": False, "c": False}
    res = summarize(correct, greedy, ks=[1, 2])
    assert res.metrics["pass@1"].value == pytest.approx((0.25 + 0.5 + 0) / 3)
    assert res.metrics["pass@2"].value == pytest.approx((0.5 + (1 - 1 / 6) + 0) / 3)
    assert res.metrics["avg@4"].value == pytest.approx(0.25)
    assert res.metrics["greedy_pass@1"].value == pytest.approx(1 / 3)
    m = res.metrics["pass@1"]
    assert m.ci_low <= m.value <= m.ci_high
    p = res.save(tmp_path / "e.json")
    assert json.loads(p.read_text())["metrics"]["avg@4"]["value"] == pytest.approx(0.25)
    assert EvalResult.load(p).metrics["pass@2"].value == pytest.approx(res.metrics["pass@2"].value)


def test_summarize_errors():
    with pytest.raises(ValueError, match="same number"):
        summarize({"a": [True], "b": [True, False]})
    with pytest.raises(ValueError, match="greedy verdicts missing"):
        summarize({"a": [True], "b": [False]}, {"a": True})


class _FakeEngine:
    """Answers correctly on the first sample of every request, wrongly otherwise; greedy correct for 'a'."""

    name = "fake"
    policy_version = "v0"

    def generate(self, requests):
        import numpy as np

        from gfcr.generate.engines.base import GenResult

        out = []
        for req in requests:
            gold = req.request_id[-1]
            if req.params.temperature == 0:
                texts = [f"Answer: {gold if req.request_id.startswith('a') else 'x'}"]
            else:
                texts = [f"so {gold}" if i == 0 else "Answer: 99" for i in range(req.params.n)]
            out.append([GenResult(np.zeros(1, np.int32), np.zeros(1, np.float32), "stop", text=t) for t in texts])
        return out


def test_evaluate_model_composes_engine_and_verifier():
    from gfcr.evaluate import evaluate_model
    from gfcr.records import Prompt

    prompts = [Prompt(prompt_id=f"{c}-{i}", task="arith", messages=[{"role": "user", "content": "q"}], answer=str(i))
               for c, i in (("a", 1), ("b", 2), ("c", 3))]
    res = evaluate_model(_FakeEngine(), prompts, k=4, ks=[1, 4], verifier="numeric", n_boot=200)
    assert res.metrics["pass@1"].value == pytest.approx(0.25)
    assert res.metrics["pass@4"].value == pytest.approx(1.0)
    assert res.metrics["greedy_pass@1"].value == pytest.approx(1 / 3)
    assert res.info["verifier"] == "numeric" and res.info["policy_version"] == "v0"
    with pytest.raises(ValueError, match="no prompts"):
        evaluate_model(_FakeEngine(), [], k=1)
