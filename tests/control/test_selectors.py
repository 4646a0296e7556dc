"""Prompt selectors: the rules on hand-worked numbers, and state persisted through the store."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gfcr.control.selectors import (
    GRESO,
    SEC,
    SELECTORS,
    VADE,
    VCRL,
    Uniform,
    beta_decay,
    binary_group_variance,
    greso_adapt,
    greso_batch_size,
    greso_keep_prob,
    group_abs_advantage,
    make_selector,
    vcrl_score,
)

IDS = [f"q{i}" for i in range(6)]


def test_greso_keep_prob_after_k_zero_variance_epochs():
    # p_easy = 0.5: 1, 2, 3 all-correct epochs -> keep 0.5, 0.25, 0.125; 8 epochs -> 0.0039 -> floor 0.01
    keep = greso_keep_prob(np.array([1, 2, 3, 8, 0, 0]), np.array([0, 0, 0, 0, 2, 0]), 0.5, 0.6)
    np.testing.assert_allclose(keep, [0.5, 0.25, 0.125, 0.01, 0.36, 1.0])


def test_greso_streaks_and_skip_probability_through_observe():
    s = GRESO(IDS, p_easy=0.5, p_hard=0.5)
    for step in range(3):
        s.observe("q0", [1] * 8, step)  # all correct three times
        s.observe("q1", [0] * 8, step)  # all wrong three times
        s.observe("q2", [1, 0, 1, 0, 1, 0, 1, 0], step)
    assert s.prompt_state("q0")["k_easy"] == 3 and s.prompt_state("q1")["k_hard"] == 3
    keep = dict(zip(IDS, s.keep_prob(), strict=True))
    assert keep["q0"] == pytest.approx(0.125) and keep["q1"] == pytest.approx(0.125)
    assert keep["q2"] == 1.0 and keep["q3"] == 1.0  # informative / never seen: always kept
    s.observe("q0", [1, 0, 0, 0, 0, 0, 0, 0], 3)  # the streak breaks
    assert s.prompt_state("q0")["k_easy"] == 0


def test_greso_adapts_p_toward_target_share():
    assert greso_adapt(0.5, 0.30, 0.25 / 3) == pytest.approx(0.49)
    assert greso_adapt(0.5, 0.0, 0.25 / 3) == pytest.approx(0.51)
    assert greso_adapt(0.05, 1.0, 0.1) == pytest.approx(0.05)  # floor
    s = GRESO(IDS, p_easy=0.5, p_hard=0.5, target_zero_variance=0.25)
    # one step: 2 of 4 groups all-correct (0.5 >= 1/12) and 0 all-wrong (0 < 2/12)
    for pid, r in (("q0", [1, 1]), ("q1", [1, 1]), ("q2", [1, 0]), ("q3", [0, 1])):
        s.observe(pid, r, 0)
    s.end_step()
    assert s.p_easy == pytest.approx(0.49) and s.p_hard == pytest.approx(0.51)


def test_greso_batch_size_formula():
    assert greso_batch_size(1024, 0.5, 8, 1000) == 320  # 1024 / 0.5 / 8 * 1.25
    assert greso_batch_size(8, 0.0, 8, 1000, min_bs=64) == 64
    assert greso_batch_size(10**6, 0.0, 8, 500) == 500


def test_greso_skips_streaky_prompts_in_selection():
    s = GRESO(IDS, p_easy=0.5, p_hard=0.5, min_keep=0.01)
    for step in range(10):
        s.observe("q0", [1] * 4, step)  # keep prob -> 0.01
    rng = np.random.default_rng(0)
    picks = sum("q0" in s.select(3, rng) for _ in range(300))
    assert picks < 30  # ~3 of 300 expected; uniform would give ~150


def test_vcrl_normalised_variance():
    assert binary_group_variance(2, 4) == pytest.approx(1 / 3)
    assert vcrl_score([1, 0, 0, 0]) == pytest.approx(0.75)  # (3/12) / (4/12)
    assert vcrl_score([1, 1, 0, 0]) == pytest.approx(1.0)
    assert vcrl_score([1, 1, 1]) == 0.0
    assert vcrl_score([1, 0, 0]) == pytest.approx((1 / 3) / (4 / 12))  # odd G: s2_max = (G+1)/(4G) = 1/3
    s = VCRL(IDS, kappa=0.3, floor=0.05)
    s.observe("q0", [1, 1, 1, 1], 0)
    s.observe("q1", [1, 0, 0, 0], 0)
    np.testing.assert_allclose(s.weights()[:3], [0.05, 0.75, 1.0])


def test_vade_posterior_after_observations():
    s = VADE(IDS, gamma=1.0)
    s.observe("q0", [1, 1, 0, 1], 0)
    s.observe("q0", [0, 0, 0, 1], 1)
    st = s.prompt_state("q0")
    assert (st["alpha"], st["beta"]) == (1 + 3 + 1, 1 + 1 + 3)  # Beta(5, 5)
    # with decay 0.5 per step: Beta(4, 2) at step 0, observed again at step 2 -> 1 + 0.25 * 3 = 1.75
    a, b = beta_decay(np.array([4.0]), np.array([2.0]), 1.0, 1.0, 0.5, 2)
    assert a[0] == pytest.approx(1.75) and b[0] == pytest.approx(1.25)
    d = VADE(IDS, gamma=0.5)
    d.observe("q0", [1, 1, 1, 0], 0)
    d.observe("q0", [1, 1], 2)
    assert d.prompt_state("q0")["alpha"] == pytest.approx(1 + 0.25 * 3 + 2)


def test_vade_prefers_uncertain_prompts():
    s = VADE(IDS, gamma=1.0)
    for _ in range(10):
        s.observe("q0", [1] * 8, 0)  # sure easy
        s.observe("q1", [0] * 8, 0)  # sure hard
        s.observe("q2", [1, 0] * 4, 0)  # p ~ 0.5
    rng = np.random.default_rng(1)
    counts = {p: 0 for p in IDS}
    for _ in range(200):
        for p in s.select(1, rng):
            counts[p] += 1
    assert counts["q0"] == 0 and counts["q1"] == 0 and counts["q2"] > 20


def test_sec_td_update_and_boltzmann():
    assert group_abs_advantage([1, 0]) == pytest.approx(0.5 / math.sqrt(0.5), rel=1e-5)
    assert group_abs_advantage([1, 1, 1]) == 0.0
    cats = ["a", "a", "b", "b", "c", "c"]
    s = SEC(IDS, cats, lr=0.5, temperature=1.0)
    s.observe("q0", [1, 0], 0)  # arm a: 0.7071
    s.observe("q2", [1, 1], 0)  # arm b: 0
    s.end_step()
    np.testing.assert_allclose(s.q, [0.5 * 0.70710, 0.0, 0.0], atol=1e-4)  # c absent -> r = 0
    p = s.probs()
    e = math.exp(0.5 * 0.70710)
    np.testing.assert_allclose(p, [e / (e + 2), 1 / (e + 2), 1 / (e + 2)], atol=1e-4)
    rng = np.random.default_rng(0)
    got = s.select(6, rng)
    assert sorted(got) == sorted(IDS)  # arms run out -> the rest is drawn from the others


def test_uniform_and_factory_and_errors():
    u = make_selector("uniform", IDS)
    assert isinstance(u, Uniform)
    got = u.select(4, np.random.default_rng(0))
    assert len(set(got)) == 4 and set(got) <= set(IDS)
    assert u.select(100, np.random.default_rng(0)).__len__() == len(IDS)
    with pytest.raises(ValueError, match="unknown prompt selector"):
        make_selector("nope", IDS)
    with pytest.raises(KeyError, match="not in the selector's pool"):
        u.observe("zzz", [1.0], 0)
    with pytest.raises(ValueError, match="non-empty"):
        u.observe("q0", [], 0)
    with pytest.raises(ValueError, match="duplicate"):
        Uniform(["a", "a"])
    assert set(SELECTORS) == {"uniform", "greso", "vcrl", "vade", "sec"}


def _drive(sel, steps=4, seed=0):
    rng = np.random.default_rng(seed)
    for step in range(steps):
        for pid in sel.select(3, rng):
            sel.observe(pid, (rng.random(4) < 0.5).astype(float), step)
    sel.observe(IDS[0], [1, 1, 1, 1], steps)  # leave a step pending


@pytest.mark.parametrize("name", sorted(SELECTORS))
def test_state_dict_roundtrip(name):
    cats = ["a", "b", "a", "b", "c", "c"]
    s = make_selector(name, IDS, cats)
    _drive(s)
    t = make_selector(name, IDS, cats)
    t.load_state_dict(s.state_dict())
    assert t.state_dict() == s.state_dict()


@pytest.mark.parametrize("name", sorted(SELECTORS))
def test_restart_through_store(tmp_path, name):
    from gfcr.records import Prompt
    from gfcr.store import RolloutStore

    cats = ["a", "b", "a", "b", "c", "c"]
    store = RolloutStore.open(tmp_path / "s", create=True)
    store.upsert_prompts([Prompt(p, "arith", [{"role": "user", "content": p}], category=c) for p, c in zip(IDS, cats, strict=True)])
    s = make_selector(name, IDS, cats)
    _drive(s)
    s.save(store)
    before = s.state_dict()
    reopened = RolloutStore.open(tmp_path / "s")
    by_id = {p.prompt_id: p.category for p in reopened.prompts()}
    t = make_selector(name, IDS, [by_id[p] for p in IDS])  # the pool in the caller's order
    t.load(reopened)
    assert t.state_dict() == before
    # both continue identically
    rng1, rng2 = np.random.default_rng(5), np.random.default_rng(5)
    assert s.select(3, rng1) == t.select(3, rng2)



def test_greso_group_test_matches_its_code_on_its_scale_and_01_rewards_at_k10():
    """Issue 47: GRESO's 0.98 / 0.11 mean thresholds were set for its reward scale (1.0 right,
    0.1 wrong with an answer, 0.0 none; n = 8). On 0/1 rewards at K = 10 a group with one right
    answer has mean 0.1 <= 0.11 and counted as all-wrong (kept with p_hard, 0.49 after a step)."""
    from gfcr.control.selectors import greso_group_kind

    one_right = [1] + [0] * 9
    assert greso_group_kind(one_right) == (False, False)  # informative: never on a streak
    assert greso_group_kind(one_right, test="mean") == (False, True)  # the old reading
    # GRESO's own scale at n = 8: its mean test and the per-reward test agree on every group kind
    for g in ([1.0] * 8, [0.1] * 8, [0.1, 0.0] * 4, [1.0] + [0.1] * 7, [1.0] * 7 + [0.1], [0.0] * 8):
        assert greso_group_kind(g) == greso_group_kind(g, test="mean"), g
    assert greso_group_kind([1] * 49 + [0]) == (False, False)  # K = 50, one wrong: mean 0.98 said all-correct
    with pytest.raises(ValueError, match="group_test"):
        GRESO(IDS, group_test="median")

    s = GRESO(IDS, p_easy=0.5, p_hard=0.5)
    for pid in IDS:  # one step of all-wrong groups (share 1 >= 2/12) drives p_hard to 0.49
        s.observe(pid, [0] * 10, 0)
    s.end_step()
    assert s.p_hard == pytest.approx(0.49)
    s.observe("q0", one_right, 1)
    s.observe("q1", [0] * 10, 1)
    keep = dict(zip(IDS, s.keep_prob(), strict=True))
    assert keep["q0"] == 1.0 and keep["q1"] == pytest.approx(0.49 ** 2)  # GRESO's code keeps q0 for sure
    old = GRESO(IDS, p_easy=0.5, p_hard=0.5, group_test="mean")
    old.observe("q0", one_right, 0)
    assert old.prompt_state("q0")["k_hard"] == 1  # the departure, kept behind its name
