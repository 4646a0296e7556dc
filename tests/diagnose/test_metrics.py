"""Each metric on a hand-built store, against numbers worked out by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest
from diag_helpers import audit, group, rollout

from gfcr.diagnose.metrics import (
    MetricsConfig,
    linear_trend,
    relative_growth,
    rollout_features,
    step_metrics,
    ter_from_mask,
)
from gfcr.store import RolloutStore


def test_pure_helpers_hand_worked():
    assert linear_trend(np.array([0, 1, 2]), np.array([1, 3, 5])) == pytest.approx((2.0, 1.0))
    assert relative_growth(np.array([0, 1, 2, 3]), np.array([100, 120, 140, 160])) == pytest.approx(0.6)
    assert math.isnan(relative_growth(np.array([0]), np.array([5])))
    role = np.array([0, 0, 1, 1, 1, 1])
    assert ter_from_mask(np.array([0, 0, 1, 0, 0, 1]), role) == pytest.approx(0.5)
    assert math.isnan(ter_from_mask(np.array([0, 0]), np.array([0, 0])))


@pytest.fixture(scope="module")
def hand_store(tmp_path_factory):
    store = RolloutStore.open(tmp_path_factory.mktemp("m") / "store", create=True)
    rs = []
    # step 0: group a all right (len 10), group b mixed (len 10, 30), group c mixed with tiny spread
    rs += group("r", 0, "a", [1.0, 1.0], [True, True], gen_len=10)
    rs += [rollout("r", 0, "b", 1.0, gen_len=10, verified=True, signals={"advantage": 0.5}),
           rollout("r", 0, "b", 0.0, gen_len=30, verified=False, finish="length", signals={"advantage": -0.5},
                   sample_index=1)]
    rs += [rollout("r", 0, "c", 0.50, gen_len=10, verified=False, signals={"advantage": 1.0}),
           rollout("r", 0, "c", 0.52, gen_len=10, verified=False, signals={"advantage": -1.0}, sample_index=1)]
    # step 1: one all-wrong group, one rollout rewarded 1.0 that the verifier fails (hack),
    # entropy signal recorded, log-prob -2 per generated token
    rs += group("r", 1, "a", [0.0, 0.0], [False, False], gen_len=20, logprob=-2.0, signals={"entropy": 0.5})
    rs += [rollout("r", 1, "b", 1.0, gen_len=20, verified=False, logprob=-2.0, signals={"entropy": 1.5}),
           rollout("r", 1, "b", 0.0, gen_len=20, verified=False, logprob=-2.0, signals={"entropy": 1.0},
                   sample_index=1, finish="abort")]  # stopped early (e.g. the repetition early exit)
    # a replayed copy at step 1 (lag 3, weight 0.5) and a step-0 row annotated as replayed at step 1 and 2
    rs.append(rollout("r", 1, "z", 1.0, signals={"replayed": 1.0, "staleness": 3.0, "importance_weight": 0.5}))
    rs.append(rollout("r", 0, "y", 1.0, meta={"replayed_at_step": [1, 2], "replay_importance_weight": [2.0, 1.5]}))
    # a second run that must not leak into run r
    rs += group("other", 0, "q", [0.0, 1.0], [False, True])
    store.append(rs)
    store.upsert_audits([audit(rs[0], [(0, 3, "redundant_exploration"), (5, 6, "other")], ter=0.25),
                         audit(rs[2], [], status="discarded")])
    return store, rs


def test_step_metrics_hand_worked(hand_store):
    store, _ = hand_store
    m = {(r["run_id"], r["step"]): r for r in step_metrics(store, run="r").to_pylist()}
    assert set(m) == {("r", 0), ("r", 1), ("r", 2)}  # step 2 exists only through a replay event
    s0, s1 = m[("r", 0)], m[("r", 1)]
    # step 0: 7 fresh rollouts (a:2, b:2, c:2, y:1); groups with >= 2 members: a, b, c
    assert s0["n_rollouts"] == 7 and s0["n_groups"] == 3
    assert s0["reward_mean"] == pytest.approx((1 + 1 + 1 + 0 + 0.5 + 0.52 + 1) / 7)
    assert s0["verified_rate"] == pytest.approx(3 / 6)  # y has verified = None
    assert s0["zero_var_share"] == pytest.approx(1 / 3)
    # by verdict: a all verified, c none verified (its rewards differ: shaping, not a zero-variance group)
    assert s0["all_correct_share"] == pytest.approx(1 / 3) and s0["all_wrong_share"] == pytest.approx(1 / 3)
    # tokens: a 10+10, b 10+30, c 10+10, y 10 = 90; wasted = group a (zero variance) = 20
    assert s0["gen_tokens"] == 90 and s0["wasted_tokens"] == 20
    assert s0["waste_share"] == pytest.approx(20 / 90)
    assert s0["len_mean"] == pytest.approx(90 / 7)
    assert s0["len_p95"] == pytest.approx(30 - 0.3 * 20)  # quantile_cont over [10]*6 + [30]
    assert s0["trunc_rate"] == pytest.approx(1 / 7) and s0["abort_rate"] == 0.0
    assert s1["abort_rate"] == pytest.approx(1 / 4) and s1["trunc_rate"] == 0.0  # fresh rows of step 1: a, a, b, b
    assert s0["nll_mean"] == pytest.approx(1.0) and s0["entropy_mean"] is None
    # hack: a failed rollout rewarded at least the passing median (1.0); c's 0.5 and 0.52 are partial credit
    assert s0["hack_rate"] == 0.0
    # advantage vs verdict inside mixed groups only: b ranks its pass above its fail; c has no pass to contradict
    assert s0["adv_disagreement"] == 0.0
    # low-std groups among non-constant mixed-verdict groups: b (std 0.5) only; c's tiny spread is shaping
    assert s0["low_std_share"] == 0.0
    assert s0["n_kept_groups"] is None and s0["n_dropped_groups"] is None  # no meta["trained"] recorded
    assert s0["n_replayed"] == 0 and s0["staleness_mean"] is None
    # audits on step 0: a kept audit with ter 0.25 and 2 spans, a discarded one
    assert s0["n_audited"] == 2 and s0["kept_share"] == pytest.approx(0.5)
    assert s0["ter_mean"] == pytest.approx(0.25)
    assert s0["excl_redundant_exploration"] == 1 and s0["excl_other"] == 1 and s0["excl_incorrect_claim"] == 0

    # step 1: fresh = a (2 wrong) + b (1.0 unverified, 0.0) = 4 rows; replayed copy excluded
    assert s1["n_rollouts"] == 4 and s1["n_groups"] == 2
    assert s1["all_wrong_share"] == pytest.approx(1.0)  # b's 1.0 is a reward, not a pass: both groups fail
    # no pass at step 1: the run's passing median (1.0, from step 0) is the reference; b's 1.0 fails
    assert s1["verified_rate"] == 0.0 and s1["hack_rate"] == pytest.approx(1 / 4)
    assert s1["entropy_mean"] == pytest.approx((0.5 + 0.5 + 1.5 + 1.0) / 4)
    assert s1["nll_mean"] == pytest.approx(2.0)
    assert s1["waste_share"] == pytest.approx(0.5)
    # replay events at step 1: the copy (lag 3, w 0.5) and the annotation (lag 1, w 2.0)
    assert s1["n_replayed"] == 2
    assert s1["staleness_mean"] == pytest.approx(2.0) and s1["staleness_max"] == pytest.approx(3.0)
    assert s1["iw_mean"] == pytest.approx(1.25) and s1["iw_max"] == pytest.approx(2.0)
    assert m[("r", 2)]["staleness_mean"] == pytest.approx(2.0) and m[("r", 2)]["n_rollouts"] == 0
    assert m[("r", 2)]["iw_mean"] == pytest.approx(1.5)
    assert s1["n_audited"] == 0 and s1["ter_mean"] is None


def test_runs_are_separate_and_config_keys(hand_store):
    store, rs = hand_store
    all_rows = step_metrics(store)
    assert sorted(set(all_rows.column("run_id").to_pylist())) == ["other", "r"]
    other = [r for r in all_rows.to_pylist() if r["run_id"] == "other"]
    assert len(other) == 1 and other[0]["reward_mean"] == pytest.approx(0.5)
    # a different advantage key: with none recorded, waste falls back to reward spread
    feats, _ = rollout_features(store.scan(run="r"), MetricsConfig(advantage_key="adv2"))
    assert feats.column("advantage").null_count == feats.num_rows


def test_ter_computed_from_mask_when_not_stored(tmp_path):
    store = RolloutStore.open(tmp_path / "s", create=True)
    r = rollout("r", 0, "a", 1.0, gen_len=4, prompt_len=2, verified=True)
    store.append([r])
    a = audit(r, [(0, 2, "other")])
    a.mask = np.array([0, 0, 1, 0, 0, 1], np.uint8)
    store.upsert_audits([a])
    row = step_metrics(store).to_pylist()[0]
    assert row["ter_mean"] == pytest.approx(0.5)


def test_empty_store_gives_empty_table(tmp_path):
    store = RolloutStore.open(tmp_path / "s", create=True)
    assert step_metrics(store).num_rows == 0


def _grpo(rewards: list[float]) -> list[float]:
    r = np.asarray(rewards, float)
    return ((r - r.mean()) / (r.std() + 1e-6)).tolist()


def test_partial_credit_is_not_a_hack_or_noise(tmp_path):
    """RLTF partial credit (arXiv 2307.04349: -0.3 + 1.3 x pass ratio): pass ratios [1, .8, .2, 0]
    give rewards [1, .74, -.04, -.3]; only the first passes. The .74 rollout fails with a reward above
    0.5 and a positive GRPO advantage, yet the reward still ranks every pass above every fail."""
    from gfcr.filters.verifiers import coderl_reward

    rewards = [coderl_reward("passed")] + [coderl_reward("failed", x) for x in (0.8, 0.2, 0.0)]
    assert rewards == pytest.approx([1.0, 0.74, -0.04, -0.3])
    adv = _grpo(rewards)
    assert adv[1] > 0  # the designed case the old sign rule called a contradiction
    store = RolloutStore.open(tmp_path / "s", create=True)
    rows = [rollout("r", 0, "p", r, verified=(i == 0), sample_index=i, signals={"advantage": a})
            for i, (r, a) in enumerate(zip(rewards, adv, strict=True))]
    # the same step, a hack: a failing rollout rewarded like the pass, its advantage level with it
    hacked = [1.0, 1.0, 0.0, 0.0]
    rows += [rollout("r", 0, "h", r, verified=(i == 0), sample_index=i, signals={"advantage": a})
             for i, (r, a) in enumerate(zip(hacked, _grpo(hacked), strict=True))]
    store.append(rows)
    m = step_metrics(store).to_pylist()[0]
    # passing median = 1.0; fails at >= 1.0: one (group h) of 8 verdicts
    assert m["hack_rate"] == pytest.approx(1 / 8)
    # discordant: h's fail ties its pass (adv equal) -> both count; p is fully concordant → 2 of 8
    assert m["adv_disagreement"] == pytest.approx(2 / 8)
    assert m["low_std_share"] == 0.0 and m["all_wrong_share"] == 0.0


def test_long_tail_and_group_control(tmp_path):
    store = RolloutStore.open(tmp_path / "s", create=True)
    # step 0: nine rollouts of 10 tokens and one of 100 (kept by group control: group a only)
    lens = [10] * 9 + [100]
    rows = [rollout("r", 0, "a" if i < 5 else "b", 1.0, gen_len=n, sample_index=i,
                    meta={"trained": i < 5}) for i, n in enumerate(lens)]
    store.append(rows)
    m = step_metrics(store, config=MetricsConfig(tail_quantile=0.9)).to_pylist()[0]
    # 90% quantile (quantile_cont over 9 x 10 and 100) = 10 + 0.1 * 90 = 19: decode steps after it 81 of 100
    assert m["len_max"] == 100 and m["tail_timed"] == 0.0
    assert m["tail_time_share"] == pytest.approx(0.81)
    # tokens past the 19th: 100 - 19 = 81 of 190
    assert m["tail_token_share"] == pytest.approx(81 / 190)
    assert m["n_kept_groups"] == 1 and m["n_dropped_groups"] == 1


def test_long_tail_from_per_sample_timings(tmp_path):
    store = RolloutStore.open(tmp_path / "s", create=True)
    rows = []
    for i, t in enumerate([1.0, 2.0, 3.0, 4.0, 10.0]):
        r = rollout("r", 0, "a", 1.0, gen_len=10, sample_index=i)
        r.cost.latency_s = t
        rows.append(r)
    store.append(rows)
    m = step_metrics(store, config=MetricsConfig(tail_quantile=0.5)).to_pylist()[0]
    # finish times are distinct → timed; median 3.0 → (10 - 3) / 10; equal lengths → no token tail
    assert m["tail_timed"] == 1.0 and m["tail_time_share"] == pytest.approx(0.7)
    assert m["tail_token_share"] == 0.0
