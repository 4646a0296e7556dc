"""One reward composition (gfcr.filters.reward): hand-worked rewards, and re-verification of a store
reproduces the rewards the composition stored."""

from __future__ import annotations

import numpy as np
import pytest

from gfcr.filters.apply import reverify_store, verdict_record
from gfcr.filters.reward import RewardComposition, arith_step_scores, no_thinking
from gfcr.filters.verifiers import get_verifier
from gfcr.records import Message, accuracy
from gfcr.testing import make_prompt, make_rollout


def _group(texts, n_gens, verified, fmt=None):
    g = []
    for i, (t, n, ok) in enumerate(zip(texts, n_gens, verified, strict=True)):
        r = make_rollout(i, prompt="p0", n_ctx=2, n_gen=n, messages=[Message("user", "q"), Message("assistant", t)],
                         group_id="p0@g", signals={"correctness": float(bool(ok)), "format": (fmt or [0] * len(texts))[i]})
        r.verified = ok
        g.append(r)
    return g


def test_docstring_example_format_and_overlong():
    g = _group(["a", "b"], [60, 64], [True, False], fmt=[1.0, 0.0])
    RewardComposition(format_bonus=0.1, max_tokens=64, overlong_buffer=8).apply(g)
    assert [r.reward for r in g] == pytest.approx([1 + 0.1 - 0.5, -1.0])
    assert [r.signals["overlong_penalty"] for r in g] == pytest.approx([-0.5, -1.0])
    assert g[0].verifier["reward_recipe"]["overlong_buffer"] == 8
    assert [accuracy(r) for r in g] == [1.0, 0.0]  # Control reads the verdict, not the shaped reward


def test_shorter_better_prm_and_adapt_think_by_hand():
    g = _group(["x", "y", "z"], [10, 4, 6], [True, False, True])
    RewardComposition(length={"alpha": 1.0, "beta": 0.1}).apply(g)
    assert [r.reward for r in g] == pytest.approx([0.6, -0.2, 1.0])  # SOL 6
    assert arith_step_scores("2 + 3 = 5, then 5 * 2 = 11 and 7-2=5") == [1.0, 0.0, 1.0]
    g = _group(["2 + 3 = 5. 5 * 2 = 11", "1 + 1 = 2"], [3, 3], [False, True])
    RewardComposition(prm={"scorer": "arith_steps", "aggregate": "product", "weight": 0.5}).apply(g)
    assert [r.signals["prm"] for r in g] == [0.0, 1.0] and [r.reward for r in g] == pytest.approx([0.0, 1.5])
    assert no_thinking("<think>\n</think> 42") and not no_thinking("<think>hmm</think> 42")
    g = _group(["<think></think>7", "<think>long</think>7", "<think></think>3", "<think>x</think>3"], [3] * 4,
               [True, True, False, False])
    comp = RewardComposition(adapt_think={"delta": 0.05})
    comp.apply(g)  # R̄_ref = this first group's accuracy, 0.5
    assert [r.reward for r in g] == pytest.approx([0.55, 0.5, -0.45, -0.5])
    assert comp.ref_accuracy == {"p0": 0.5}


def test_reverify_store_reproduces_composed_rewards(store):
    verifier = get_verifier("numeric")
    store.upsert_prompts([make_prompt("p0", answer="7")])
    g = _group(["Answer: 7", "I think 8", "so 7", "Answer: 3"], [5, 64, 30, 8], [None] * 4)
    for r in g:
        v = verifier.verify(r.completion, answer="7")
        r.verified, r.verifier = v.passed, verdict_record(verifier, v)
        r.signals["correctness"] = float(v.score)
        r.signals["format"] = float(r.completion.startswith("Answer"))
    comp = RewardComposition(format_bonus=0.2, max_tokens=64, overlong_buffer=16, length={"alpha": 1.0, "beta": 0.01})
    comp.apply(g)
    before = [r.reward for r in g]
    assert len(set(np.round(before, 6))) == 4  # every part moved the rewards apart
    store.append(g)
    summary = reverify_store(store, "numeric")
    assert summary["changed"] == 0
    after = {r.rollout_id: r.reward for r in store.rollouts()}
    assert [after[r.rollout_id] for r in g] == pytest.approx(before)
