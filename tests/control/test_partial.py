"""Partial rollouts (Kimi k1.5): the pure schedule on hand-worked lengths, and the loop carrying
unfinished rollouts across steps with their behaviour log-probs and per-token policy versions."""

from __future__ import annotations

import numpy as np
import pytest

from gfcr.control.partial import PartialPool, long_tail_schedule, token_versions


def test_long_tail_schedule_hand_worked():
    full = long_tail_schedule([np.array([1, 9]), np.array([2, 2]), []], None)
    assert full.step_wall.tolist() == [9, 2, 0] and full.idle_slot_tokens == 8 and full.generated == 14
    part = long_tail_schedule([np.array([1, 9]), np.array([2, 2]), []], 3)
    # step 0: segments 1, 3 (wall 3, idle 2); step 1: 3, 2, 2 (wall 3, idle 2); step 2: 3 (the 9 ends)
    assert part.step_wall.tolist() == [3, 3, 3] and part.idle_slot_tokens == 4 and part.generated == 14
    assert part.completed == 4 and part.carried == 0 and part.lag_mean == pytest.approx(0.5)  # the 9 took 2 extra steps
    assert long_tail_schedule([np.array([9])], 3).carried == 1


def test_token_versions_expand_and_check():
    assert token_versions({"token_versions": [[3, 2], [4, 3]]}, 5).tolist() == [3, 3, 4, 4, 4]
    assert token_versions({}, 2, default=7).tolist() == [7, 7]
    with pytest.raises(ValueError, match="cover 5 tokens"):
        token_versions({"token_versions": [[3, 2], [4, 3]]}, 4)
    with pytest.raises(ValueError, match="budget"):
        PartialPool(0, 8)


def test_the_loop_carries_unfinished_rollouts_and_trains_them_when_complete(tiny_dir, tmp_path):
    """max_tokens 6, budget 2: a tiny random model never stops early, so every rollout is cut at 2 and
    held; it is continued at steps 1 and 2 (2 tokens each, under versions s1, s2) and trains at step 2 with
    its step-0 log-probs kept, token_versions [[0, 2], [1, 2], [2, 2]], stored once at step 2."""
    from gfcr.train.config import load_config
    from gfcr.train.loop import TrainingRun, prepare_run

    over = {"model": tiny_dir, "output_dir": str(tmp_path / "runs"), "steps": 3, "tensorboard": False,
            "tasks": [{"name": "arith", "n_train": 2, "n_eval": 0, "params": {"level": 1}}],
            "generate.topology.params.k": 2, "generate.prompts_per_step": 1, "generate.max_tokens": 6,
            "generate.partial_budget": 2, "signals.entropy": False}
    cfg = load_config(None, over)
    d, _ = prepare_run(cfg)
    t = TrainingRun(cfg, d, False, progress=False)
    t.setup()
    t._end = cfg.steps
    seen = []
    real = t.update.update
    t.update.update = lambda rs, *a, **k: (seen.append(list(rs)), real(rs, *a, **k))[1]
    row0 = t.step(0)
    assert seen == [] and row0["partial_held_groups"] == 1.0 and row0["partial_held_tokens"] == 4.0
    first = [r.logprobs[r.token_role == 1].copy() for r in t.partial.held[0]]
    assert all(len(x) == 2 for x in first) and not t.store.rollouts()
    t.step(1)
    assert seen == [] and len(t.partial.held) == 2
    t.step(2)
    (batch,) = seen
    assert len(batch) == 2 and all(r.n_generated == 6 for r in batch)
    for r, lp in zip(batch, first, strict=True):
        assert r.meta["token_versions"] == [[0, 2], [1, 2], [2, 2]] and r.meta["partial_steps"] == 3
        np.testing.assert_array_equal(r.logprobs[r.token_role == 1][:2], lp)  # the step-0 segment's behaviour log-probs
        assert r.step == 2 and r.meta["started_step"] == 0 and r.policy_version == "s0"
    stored = t.store.rollouts()
    assert len(stored) == 2 and all(r.step == 2 and r.n_generated == 6 for r in stored)
    assert token_versions(stored[0].meta, 6).tolist() == [0, 0, 1, 1, 2, 2]
    t.close()
    with pytest.raises(Exception, match="partial_budget"):
        load_config(None, over | {"generate.topology": "tree"})


def test_partial_rollouts_default_to_areals_decoupled_objective(tiny_dir, tmp_path, monkeypatch):
    """Issue 47: partial rollouts took the clipped ratio against the stale sampler log-probs unless
    loss.tis_cap was set. A segment sampled by an older policy is off-policy, and AReaL runs such data
    with its decoupled objective (examples/math/gsm8k_grpo.yaml: use_decoupled_loss true, cap 5.0), so
    partial_budget now sets tis_cap 5.0 unless the config names tis_cap itself.

    Hand-worked, one token, A = +1, clip 0.2: the sampler gave it p = 0.2, the policy now gives 0.6.
    Against the sampler the ratio is 3, the clipped branch (1.2) is active and the token gets no
    gradient at all. Decoupled: ratio π/π_prox = 1 (unclipped), weight w = 0.6 / 0.2 = 3 <= 5, so
    ℓ = −3·ratio and dℓ/dlogp = −3."""
    import math

    import torch

    import gfcr.train.trainer as trainer_mod
    from gfcr.train.config import load_config
    from gfcr.train.loop import TrainingRun, prepare_run
    from gfcr.train.losses import policy_gradient_loss

    def grad(**kw):
        logp = torch.tensor([[0.0, math.log(0.6)]], requires_grad=True)
        out = policy_gradient_loss(logp, torch.tensor([[0.0, math.log(0.2)]]), torch.tensor([1.0]),
                                   torch.tensor([[0, 1]]), agg="token-mean", **kw)
        out.loss.backward()
        return float(logp.grad[0, 1])

    assert grad() == 0.0  # the old default: clipped against the stale sampler, no gradient
    assert grad(proximal_logp=torch.tensor([[0.0, math.log(0.6)]]), tis_cap=5.0) == pytest.approx(-3.0)

    over = {"model": tiny_dir, "output_dir": str(tmp_path / "runs"), "steps": 3, "tensorboard": False,
            "tasks": [{"name": "arith", "n_train": 2, "n_eval": 0, "params": {"level": 1}}],
            "generate.topology.params.k": 2, "generate.prompts_per_step": 1, "generate.max_tokens": 6,
            "generate.partial_budget": 2, "signals.entropy": False}
    assert load_config(None, over).loss.tis_cap == 5.0
    assert load_config(None, over | {"loss.tis_cap": None}).loss.tis_cap is None  # opting out stays possible
    assert load_config(None, over | {"loss.tis_cap": 2.0}).loss.tis_cap == 2.0
    assert load_config(None, {k: v for k, v in over.items() if k != "generate.partial_budget"}).loss.tis_cap is None
    calls = []
    real = trainer_mod.policy_gradient_loss

    def spy(*a, **k):
        calls.append((k["proximal_logp"], k["tis_cap"]))
        return real(*a, **k)

    monkeypatch.setattr(trainer_mod, "policy_gradient_loss", spy)
    cfg = load_config(None, over)
    d, _ = prepare_run(cfg)
    t = TrainingRun(cfg, d, False, progress=False)
    t.setup()
    t._end = cfg.steps
    real_update = t.update.update

    def signed(rollouts, advantages, *a, **k):  # a random tiny model is always wrong: give the group a spread
        advantages = [np.full_like(np.asarray(x, dtype=np.float32), 1.0 - 2.0 * (i % 2)) for i, x in enumerate(advantages)]
        return real_update(rollouts, advantages, *a, **k)

    t.update.update = signed
    for s in range(3):
        t.step(s)
    assert calls and all(p is not None and cap == 5.0 for p, cap in calls)  # the rollouts trained at step 2
    t.close()
