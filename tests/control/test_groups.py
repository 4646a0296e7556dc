"""Budget and group controls on hand-worked numbers."""

from __future__ import annotations

import numpy as np
import pytest

from gfcr.control.groups import (
    SAMPLE_CONTROLS,
    EarlyExit,
    OverlongFilter,
    StalenessBound,
    allocate_k,
    beta_variance_weight,
    gfpo_advantages,
    gfpo_keep,
    has_variance,
    make_sample_control,
    overlong_mask,
    staleness_capacity,
    tail_ngram_count,
)
from gfcr.control.policies import GFPO, GROUP_POLICIES, AdaptiveK, DynamicSampling, make_group_policy
from gfcr.filters.reward import AdaptThink, ShorterBetter, adaptthink_rewards, sol_rewards
from gfcr.records import Rollout


def test_adaptive_k_allocation():
    np.testing.assert_allclose(beta_variance_weight([1, 9], [1, 1]), [1 / 6, 9 / 110])
    assert allocate_k(np.array([3.0, 1.0]), 8, 1, 8).tolist() == [6, 2]
    k = allocate_k(np.array([1.0, 1.0, 0.0]), 10, 2, 4)  # caps bind: 2+2+2, rest 4 -> [4, 4, 2]
    assert k.tolist() == [4, 4, 2] and k.sum() == 10
    assert allocate_k(np.array([1.0, 1.0]), 100, 1, 5).tolist() == [5, 5]  # budget above the caps
    with pytest.raises(ValueError, match="below"):
        allocate_k(np.array([1.0, 1.0]), 1, 1, 4)
    # posterior Beta(1,1) (uncertain) gets more than Beta(20,1) (sure)
    k = AdaptiveK(k_min=2, k_max=16).allocate([1, 20], [1, 1], 16)
    assert k[0] > k[1] and k.sum() == 16


def _group(rewards):
    return [type("R", (), {"reward": r})() for r in rewards]


def test_dynamic_sampling_refill_stops_at_batch_cap():
    calls = []

    def gen_all_zero(n):
        calls.append(n)
        return [_group([1, 1, 1, 1]) for _ in range(n)]  # never any variance

    res = DynamicSampling(train_prompts=4, gen_prompts=6, max_num_gen_batches=3).refill(gen_all_zero)
    assert calls == [6, 6, 6] and res.n_gen_batches == 3 and res.groups == [] and not res.reached_target
    assert res.n_zero_variance == 18


def test_dynamic_sampling_keeps_variance_and_truncates():
    def gen(n):  # half the groups have variance
        return [_group([1, 0]) if i % 2 == 0 else _group([0, 0]) for i in range(n)]

    res = DynamicSampling(train_prompts=4, gen_prompts=6, max_num_gen_batches=10).refill(gen)
    # round 1 keeps 3, round 2 keeps 3 more -> 6, cut to 4 (2 surplus)
    assert res.n_gen_batches == 2 and len(res.groups) == 4 and res.n_dropped_surplus == 2 and res.reached_target
    assert has_variance([0.5]) and not has_variance([1, 1]) and has_variance([1, 0])


def test_gfpo_keeps_exactly_k():
    assert gfpo_keep([1, 1, 1, 1], [5, 3, 9, 3], 2).tolist() == [1, 3]
    # token efficiency r/len: [0.2, 0, 0.1, 0.333] -> [3, 0, 2]
    assert gfpo_keep([1, 0, 1, 1], [5, 3, 10, 3], 3, "token_efficiency").tolist() == [3, 0, 2]
    a = gfpo_advantages([1, 0, 1, 0], [0, 1])
    np.testing.assert_allclose(a, [0.70710, -0.70710, 0, 0], atol=1e-4)
    g = GFPO(k=3)
    for G in (4, 8, 16):
        kept, adv = g.filter(np.arange(G) % 2, np.arange(G)[::-1] + 1)
        assert len(kept) == 3 and np.count_nonzero(adv[np.setdiff1d(np.arange(G), kept)]) == 0
    ad = GFPO(adaptive=True)
    assert [ad.k_for([1] * 4), ad.k_for([1, 1, 0, 0]), ad.k_for([1, 0, 0, 0]), ad.k_for([0] * 4)] == [4, 6, 8, 8]
    with pytest.raises(ValueError, match="k must lie"):
        gfpo_keep([1, 0], [1, 2], 3)


def test_overlong_filter():
    assert overlong_mask(["stop", "length", "stop"]).tolist() == [1, 0, 1]
    assert overlong_mask(["stop", "stop"], [10, 30], max_len=20).tolist() == [1, 0]
    r = [Rollout("run", "p", [1, 2, 3], [0, 1, 1], [0, -0.1, -0.1], finish_reason=f) for f in ("stop", "length")]
    assert OverlongFilter().mask(r).tolist() == [1, 0]


def test_shorter_better_sol():
    np.testing.assert_allclose(sol_rewards([True, False, True], [10, 4, 6], 1.0, 0.1), [0.6, -0.2, 1.0])
    # none correct: l_SOL = mean length 6 -> -0.1 * |l - 6|
    np.testing.assert_allclose(ShorterBetter(1.0, 0.1).rewards([False, False], [4, 8]), [-0.2, -0.2])


def test_adapt_think():
    np.testing.assert_allclose(adaptthink_rewards([1, 1, 0], 0.5, [True, False, True], 0.05), [0.55, 0.5, -0.45])
    at = AdaptThink(delta=0.05)
    assert at.is_no_thinking("<think></think>42") and at.is_no_thinking("</think> 42")
    assert not at.is_no_thinking("<think>let me see</think>42")
    np.testing.assert_allclose(at.rewards([1, 1], 0.0, ["<think>\n</think>7", "<think>x</think>7"]), [1.05, 1.0])


def test_early_exit_rules():
    assert tail_ngram_count([1, 2, 1, 2, 1, 2], 2) == 3
    assert tail_ngram_count([1, 2, 3], 4) == 0
    ee = EarlyExit(ngram=2, max_repeats=3)
    assert ee.should_stop([1, 2, 1, 2, 1, 2]) == "repetition"
    assert ee.should_stop([1, 2, 3, 4, 1, 2]) is None
    verified = EarlyExit(ngram=4, max_repeats=0, extract=lambda t: t.split("Answer:")[-1].strip() if "Answer:" in t else None,
                         verify=lambda a: a == "42")
    assert verified.should_stop([1], "so Answer: 42") == "answered"
    assert verified.should_stop([1], "so Answer: 41") is None
    assert verified.should_stop([1], "thinking") is None


def test_staleness_bound():
    assert staleness_capacity(1, 2, 4, 10, 3, 8) == 3  # min(8-3, (1+2+1)*4 - 13)
    assert staleness_capacity(0, 0, 4, 4, 0, 100) == 0  # synchronous: a full batch blocks
    sb = StalenessBound(eta=2, mode="drop")
    assert sb.accept([10, 8, 7, 5], 10).tolist() == [True, True, False, False]
    assert StalenessBound(eta=2, mode="wait").accept([5], 10).tolist() == [True]
    with pytest.raises(ValueError, match="newer"):
        sb.accept([11], 10)
    with pytest.raises(ValueError, match="mode"):
        StalenessBound(mode="skip")


def test_factory():
    g = make_group_policy("gfpo", k=4)
    assert isinstance(g, GFPO) and g.k == 4 and GROUP_POLICIES["gfpo"] is GFPO  # one class: rule + policy
    assert isinstance(make_sample_control("staleness_bound", eta=2), StalenessBound)
    assert "staleness_bound" in SAMPLE_CONTROLS and "gfpo" not in SAMPLE_CONTROLS
    with pytest.raises(ValueError, match="unknown sample control"):
        make_sample_control("nope")
    with pytest.raises(ValueError, match="unknown group policy"):
        make_group_policy("nope")
