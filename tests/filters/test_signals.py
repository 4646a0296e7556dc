"""Signals on hand-computed numbers."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gfcr.filters import signals as S
from gfcr.records import Rollout


def test_grpo_hand_numbers():
    # r = [1,0,0,1]: mean .5, unbiased std sqrt(1/3)=0.57735 -> ±0.5/0.57735 = ±0.866024
    a = S.grpo_advantages([1, 0, 0, 1])
    assert a == pytest.approx([0.866024, -0.866024, -0.866024, 0.866024], abs=1e-5)
    # r = [2, 4]: mean 3, unbiased std sqrt(2) -> ±1/1.414214
    assert S.grpo_advantages([2, 4]) == pytest.approx([-0.707106, 0.707106], abs=1e-5)
    assert S.grpo_advantages([1, 1, 1]).tolist() == [0, 0, 0]  # zero variance: no signal
    assert S.grpo_advantages([5.0]).tolist() == [0.0]  # singleton


def test_dr_grpo_and_rloo():
    assert S.dr_grpo_advantages([1, 0, 0, 1]).tolist() == [0.5, -0.5, -0.5, 0.5]
    # RLOO: r_i - mean of others. [1,0,0]: 1-0, 0-0.5, 0-0.5
    assert S.rloo_advantages([1, 0, 0]) == pytest.approx([1.0, -0.5, -0.5])
    # [3, 1, 2]: 3-1.5, 1-2.5, 2-2
    assert S.rloo_advantages([3, 1, 2]) == pytest.approx([1.5, -1.5, 0.0])
    assert S.rloo_advantages([7]).tolist() == [0.0]


def test_group_advantages_and_assign():
    adv = S.group_advantages([1, 0, 3, 1], ["a", "a", "b", "b"], "dr_grpo")
    assert adv.tolist() == [0.5, -0.5, 1.0, -1.0]
    rs = [Rollout(run_id="r", prompt_id=g, token_ids=[1], token_role=[1], logprobs=[0.0], reward=x)
          for g, x in [("p", 1.0), ("p", 0.0), ("q", 1.0)]]
    S.assign_advantages(rs, "rloo")
    assert [r.signals["advantage"] for r in rs] == [1.0, -1.0, 0.0]
    with pytest.raises(ValueError, match="unknown advantage method"):
        S.group_advantages([1], ["a"], "ppo")


def test_dapo_overlong():
    # L_max=20, L_cache=4: <=16 -> 0; 18 -> (16-18)/4 = -0.5; 20 -> -1; 25 -> -1
    assert S.dapo_overlong_penalty([10, 16, 18, 20, 25], 20, 4).tolist() == [0, 0, -0.5, -1, -1]
    assert S.dapo_overlong_penalty([17], 20, 4, factor=2.0).tolist() == [-0.5]
    with pytest.raises(ValueError):
        S.dapo_overlong_penalty([1], 4, 8)


def test_entropies():
    # uniform over 4 -> log 4; one-hot-ish -> ~0
    h = S.token_entropy(np.array([[0.0, 0.0, 0.0, 0.0], [100.0, 0.0, 0.0, 0.0]]))
    assert h == pytest.approx([math.log(4), 0.0], abs=1e-6)
    # top-2 logprobs log(.5), log(.25) renormalised -> p = [2/3, 1/3]
    h2 = S.topk_entropy(np.log(np.array([[0.5, 0.25]])))
    assert h2 == pytest.approx([-(2 / 3 * math.log(2 / 3) + 1 / 3 * math.log(1 / 3))])
    assert S.mean_surprisal(np.array([-1.0, -3.0, 0.0]), np.array([1, 1, 0])) == pytest.approx(2.0)


def test_semantic_entropy_and_seed_grpo():
    se = S.semantic_entropy(["a", "a", "b", "c"])  # p = .5, .25, .25
    assert se == pytest.approx(-(0.5 * math.log(0.5) + 2 * 0.25 * math.log(0.25)))
    assert S.semantic_entropy(["x"] * 4) == 0.0
    # likelihood-weighted: logp equal -> same as counts; a dominant sequence -> low entropy
    assert S.semantic_entropy(["a", "b"], [0.0, 0.0]) == pytest.approx(math.log(2))
    assert S.semantic_entropy(["a", "b"], [0.0, -50.0]) < 1e-6
    assert S.seed_grpo_scale(math.log(4) / 2, 4) == pytest.approx(0.5)
    assert S.seed_grpo_scale(math.log(4), 4, form="exp") == pytest.approx(math.exp(-1))
    assert S.seed_grpo_scale(math.log(4) / 2, 4, form="focal") == pytest.approx(0.25)
    # r = [1,1,0,0], clusters [a,a,b,c] -> A = ±.5, SE = 1.0397, scale = 1 - 1.0397/log 4 = 0.25
    a = S.seed_grpo_advantages([1, 1, 0, 0], ["a", "a", "b", "c"], estimator="plugin")
    assert a == pytest.approx(np.array([0.5, 0.5, -0.5, -0.5]) * 0.25, abs=1e-6)
    # the paper's Monte-Carlo form −(1/K) Σ log p(C): (log 2 + 2 log 4)/3 = 1.1552 → scale 1 − 1.1552/log 4 = 1/6
    assert S.semantic_entropy(["a", "a", "b", "c"], estimator="mc") == pytest.approx((math.log(2) + 2 * math.log(4)) / 3)
    a = S.seed_grpo_advantages([1, 1, 0, 0], ["a", "a", "b", "c"])
    assert a == pytest.approx(np.array([0.5, 0.5, -0.5, -0.5]) / 6, abs=1e-6)


def test_prm_aggregate():
    s = [0.9, 0.5, 0.8]
    assert S.prm_aggregate(s, "product") == pytest.approx(0.36)
    assert S.prm_aggregate(s, "min") == 0.5
    assert S.prm_aggregate(s, "last") == 0.8
    assert S.prm_aggregate([], "product") == 0.0
