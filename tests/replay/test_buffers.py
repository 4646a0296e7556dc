"""Replay buffers on hand-worked examples, and rebuilt from the store after a restart."""

from __future__ import annotations

import numpy as np
import pytest

from gfcr.records import Rollout
from gfcr.replay.buffers import (
    AR3PO,
    BUFFERS,
    FIFO,
    ExGRPO,
    RePO,
    exgrpo_bucket_weight,
    make_buffer,
    max_variance_subset,
    shape_importance,
    split_advantages,
)


def ro(prompt, step, i, reward, verified=None, nll=0.5, group=None):
    return Rollout(
        run_id="run", prompt_id=prompt, group_id=group or f"{prompt}@{step}", sample_index=i, step=step,
        token_ids=[1, 2 + i, 3 + 100 * step], token_role=[0, 1, 1], logprobs=[0.0, -nll, -nll], reward=float(reward),
        verified=verified, rollout_id=f"{prompt}-{step}-{i}",
    )


def group(prompt, step, correct):
    return [ro(prompt, step, i, float(c), bool(c)) for i, c in enumerate(correct)]


def test_pure_maths():
    assert shape_importance(1.0) == pytest.approx(1 / 1.1)
    assert shape_importance(0.1) == pytest.approx(0.5)
    np.testing.assert_allclose(exgrpo_bucket_weight([4, 6], 8), [0.398942, 0.053991], atol=1e-6)
    assert max_variance_subset([1, 1, 0, 0, 1], 2).tolist() == [0, 2]
    assert max_variance_subset([0.1, 0.9, 0.5, 0.4], 3).tolist() in ([0, 1, 2], [0, 1, 3])  # extremes + one
    on, off = split_advantages([1, 1], [1, 0, 0, 0], "split")  # RePO's torch.std is unbiased
    np.testing.assert_allclose(off, [1.5, -0.5, -0.5, -0.5], atol=1e-3)
    np.testing.assert_allclose(on, [0, 0])
    on, off = split_advantages([1, 0], [1, 1], "mixed")  # mean 0.75, unbiased std 0.5
    np.testing.assert_allclose(on, [0.5, -1.5], atol=1e-3)


def test_fifo_window_lag_and_behaviour_logprobs():
    b = FIFO(capacity=3)
    b.add([ro("a", s, 0, 1.0) for s in range(5)])
    assert [r.step for r in b.items] == [2, 3, 4]
    out = b.sample(10, policy_version=6, rng=np.random.default_rng(0))
    assert sorted(s.lag for s in out) == [2, 3, 4]
    np.testing.assert_array_equal(out[0].behaviour_logprobs, out[0].rollout.logprobs)
    f = FIFO(capacity=10, max_lag=3)
    f.add([ro("a", s, 0, 1.0) for s in range(5)])
    assert sorted(s.lag for s in f.sample(10, 6)) == [2, 3]


def test_repo_strategies():
    b = RePO(strategy="highest", num_replays=2, max_cache_size=4, min_cache_to_replay=4)
    b.add([ro("a", 0, i, r) for i, r in enumerate([0.1, 0.9, 0.5])])
    assert b.replay_for("a") == []  # cache not warm (3 < 4)
    b.add([ro("a", 1, 0, 0.7), ro("a", 1, 1, 0.2)])  # deque of 4 keeps the newest: 0.9, 0.5, 0.7, 0.2
    assert [r.reward for r in b.replay_for("a")] == [0.9, 0.7]
    b.strategy = "recent"
    assert [r.reward for r in b.replay_for("a")] == [0.7, 0.2]
    b.strategy = "variance"
    assert sorted(r.reward for r in b.replay_for("a")) == [0.2, 0.9]
    out = b.sample(8, policy_version=3, prompt_ids=["a"])
    assert len(out) == 2 and {s.lag for s in out} <= {2, 3}
    with pytest.raises(ValueError, match="strategy"):
        RePO(strategy="oldest")


def test_exgrpo_retires_all_correct_questions():
    b = ExGRPO(group_size=4)
    b.add(group("q9", 0, [1, 0, 0, 0]))  # solved share 0.25 <= 0.35: stays on-policy, collects nothing
    assert not b.active and not b.experience
    b.add(group("q0", 1, [1, 1, 0, 0]))  # 0.5 > 0.35: mixed-policy from the next step (nothing collected now)
    assert b.active and not b.experience
    b.add(group("q1", 2, [1, 1, 0, 0]) + group("q2", 2, [1, 0, 0, 0]) + group("q3", 2, [0, 0, 0, 0]))
    assert sorted(b.experience) == ["q1", "q2"] and b.bucket == {"q1": 2, "q2": 1}
    assert len(b.experience["q1"]) == 2 and all(r.verified for r in b.experience["q1"])  # only correct ones
    b.add(group("q2", 3, [1, 1, 1, 0]))  # experience accumulates (new trajectories), bucket follows the latest k
    assert len(b.experience["q2"]) == 1 + 3 and b.bucket["q2"] == 3
    b.add(group("q1", 4, [1, 1, 1, 1]))  # all correct -> retired
    assert "q1" in b.retired and "q1" not in b.experience and b.exclude() == {"q1"}
    b.add(group("q1", 5, [1, 0, 0, 0]))  # a retired question stays retired
    assert "q1" not in b.experience
    out = b.sample(5, policy_version=6, rng=np.random.default_rng(0))
    assert [s.rollout.prompt_id for s in out] == ["q2"] and out[0].lag in (3, 4)
    assert b.n_experience(128) == 64 and b.n_experience(5) == 2  # int(ρ·B), the collate's truncation


def test_exgrpo_picks_lowest_entropy_and_prefers_half_correct():
    b = ExGRPO(group_size=4, sigma=0.5)
    b.active = True
    g = [ro("q", 0, 0, 1, True, nll=2.0), ro("q", 0, 1, 1, True, nll=0.3), ro("q", 0, 2, 0, False), ro("q", 0, 3, 0, False)]
    b.add(g)
    assert b.sample(1, 1)[0].rollout.rollout_id == "q-0-1"
    b.add(group("easy", 0, [1, 1, 1, 0]))
    firsts = [b.sample(1, 1, np.random.default_rng(s))[0].rollout.prompt_id for s in range(200)]
    assert firsts.count("q") > 150  # bucket 2 (= K/2) weighs 0.798 vs bucket 3's 0.108


def test_ar3po_injects_only_into_all_wrong_groups_and_only_verified():
    b = AR3PO()
    cached_ok = ro("a", 0, 0, 1.0, verified=True)
    reward_only = ro("b", 0, 0, 1.0, verified=None)  # high reward but no verifier verdict: not cached
    b.add([cached_ok, reward_only, ro("a", 0, 1, 0.0, verified=False)])
    assert list(b.cache) == ["a"] and len(b.cache["a"]) == 1
    wrong = [ro("a", 3, i, 0.0, verified=False) for i in range(3)]
    g, inj = b.inject(wrong, policy_version=3)
    assert len(g) == 4 and g[-1] is cached_ok and inj.lag == 3
    mixed = [ro("a", 3, 0, 1.0, verified=True), ro("a", 3, 1, 0.0, verified=False)]
    g2, inj2 = b.inject(mixed, policy_version=3)
    assert g2 == mixed and inj2 is None
    g3, inj3 = b.inject([ro("b", 3, 0, 0.0, verified=False)], policy_version=3)
    assert inj3 is None and len(g3) == 1


def test_ar3po_adaptive_rollout_stops_solved_prompts():
    """AR3PO's staged sampling is the ``ar3po`` group policy (the buffer's copy of it is gone, issue 46)."""
    from gfcr.control.policies import make_group_policy

    calls = []

    class Sampler:
        def select(self, n):
            return ["easy", "hard"]

        def generate(self, pids, sizes):
            calls.append(list(pids))
            return [[ro(p, 0, len(calls) * 10 + i, 1.0 if p == "easy" else 0.0, p == "easy") for i in range(sizes[p])]
                    for p in pids]

    col = make_group_policy("ar3po", stages=3, per_stage=2).collect(Sampler(), 2, 4)
    out = {g[0].prompt_id: g for g in col.generated}
    assert calls == [["easy", "hard"], ["hard"], ["hard"]] and sum(map(len, col.generated)) == 8
    assert len(out["hard"]) == 6 and len({r.group_id for r in out["hard"]}) == 1  # its stages form one group


@pytest.mark.parametrize("name", sorted(BUFFERS))
def test_rebuild_from_store_equals_live_state(tmp_path, name):
    from gfcr.store import RolloutStore

    store = RolloutStore.open(tmp_path / "s", create=True)
    params = {"fifo": {"capacity": 10}, "repo": {"max_cache_size": 4, "min_cache_to_replay": 2},
              "exgrpo": {"group_size": 4}, "ar3po": {}}[name]
    live = make_buffer(name, **params)
    rng = np.random.default_rng(0)
    for step in range(4):
        batch = []
        for q in ("q1", "q2", "q3"):
            batch += group(q, step, (rng.random(4) < [0.9, 0.5, 0.2][int(q[1]) - 1]).astype(int).tolist())
        store.append(batch)
        live.add(list(reversed(batch)))  # order within a call does not matter
    before = live.state_dict()
    assert before != make_buffer(name, **params).state_dict()
    rebuilt = make_buffer(name, **params)
    n = rebuilt.rebuild(RolloutStore.open(tmp_path / "s"), run="run")
    assert n == 48 and rebuilt.state_dict() == before


def test_repo_split_gives_replay_half_the_gradient_at_the_authors_sizes():
    """8 prompts × 8 fresh, one prompt with 8 cached replays: pooled (RePO's loss_type grpo) gives the
    replays 8/72 = 11% of the loss weight; split (J_on + J_off, loss_type bnpo) gives them 50%."""
    from gfcr.replay.buffers import repo_set_weights

    def share(**kw):
        b = RePO(strategy="recent", num_replays=8, max_cache_size=8, min_cache_to_replay=8, **kw)
        b.add(group("p0", 0, [1, 0, 0, 0, 1, 0, 0, 0]))
        groups = [group(f"p{j}", 1, [1, 0, 1, 0, 0, 0, 0, 1]) for j in range(8)]
        items = b.mix(groups, 1, np.random.default_rng(0), lambda g: [0.0] * len(g))
        assert len(items) == 72 and sum(it.replayed for it in items) == 8
        w = np.array([it.weight for it in items])
        return w[[it.replayed for it in items]].sum() / w.sum()

    assert share() == pytest.approx(8 / 72)
    assert share(loss_sets="split") == pytest.approx(0.5)
    np.testing.assert_allclose(repo_set_weights([0, 0, 0, 0, 1, 1, 1], [1] * 7), [7 / 4] * 4 + [7 / 3] * 3)
    # token-mean: each set over its own tokens (rows of 2 and 6 tokens): fresh 8/2, replayed 0.5·8/6
    np.testing.assert_allclose(repo_set_weights([0, 1], [2, 6], 0.5), [4.0, 8 / 12])
    with pytest.raises(ValueError, match="loss_sets"):
        RePO(loss_sets="both")
