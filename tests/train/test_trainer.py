"""The policy update on a tiny random model."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gfcr.records import Rollout
from gfcr.testing import tiny_model, tiny_tokenizer
from gfcr.train.config import ConfigError, LossConfig, OptimConfig, load_config
from gfcr.train.trainer import PolicyTrainer, collate, is_live


def _rollouts(tok, model, n=4, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        ctx = tok("What is 1 + 2?")["input_ids"]
        gen = rng.integers(3, len(tok), size=5 + i).tolist()
        ids = ctx + gen
        role = [0] * len(ctx) + [1] * len(gen)
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids])).logits[0]
            lp = torch.log_softmax(logits[:-1], -1).gather(-1, torch.tensor(ids[1:])[:, None])[:, 0]
        lps = [0.0] + lp.tolist()
        lps = [x if r else 0.0 for x, r in zip(lps, role, strict=True)]
        out.append(Rollout(run_id="r", prompt_id=f"p{i // 2}", token_ids=ids, token_role=role, logprobs=lps))
    return out


def test_collate_masks_context_and_truncated():
    tok = tiny_tokenizer()
    model = tiny_model(tok)
    rs = _rollouts(tok, model, n=2)
    rs[1].finish_reason = "length"
    b = collate(rs, [1.0, -1.0], tok.pad_token_id, mask_truncated=True)
    assert b.input_ids.shape == (2, len(rs[1].token_ids))
    assert b.loss_mask[0].sum().item() == rs[0].n_generated
    assert b.loss_mask[1].sum().item() == 0
    assert (b.input_ids[0, len(rs[0].token_ids):] == tok.pad_token_id).all()


def test_one_step_changes_every_trainable_parameter():
    tok = tiny_tokenizer()
    model = tiny_model(tok, seed=1)
    rs = _rollouts(tok, model)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    tr = PolicyTrainer(model, LossConfig(agg="token-mean"), OptimConfig(lr=1e-2, micro_batch=3), tok.pad_token_id)
    stats = tr.update(rs, [1.0, -1.0, 0.5, -0.5])
    assert stats["n_tokens"] == sum(r.n_generated for r in rs)
    assert stats["ratio_mean"] == pytest.approx(1.0, abs=1e-4)  # on-policy: ratio 1
    assert stats["clip_frac"] == 0.0
    for n, p in model.named_parameters():
        assert not torch.equal(before[n], p.detach()), f"parameter {n} did not change"


def test_zero_advantage_leaves_weights_unchanged():
    tok = tiny_tokenizer()
    model = tiny_model(tok, seed=2)
    rs = _rollouts(tok, model, n=2)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    PolicyTrainer(model, LossConfig(), OptimConfig(lr=1e-2), tok.pad_token_id).update(rs, [0.0, 0.0])
    for n, p in model.named_parameters():
        assert torch.equal(before[n], p.detach()), n


def test_config_unknown_key_and_override(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("steps: 3\noptim:\n  lr: 0.001\n  lrr: 2\n")
    with pytest.raises(ConfigError, match="optim.lrr"):
        load_config(p)
    p.write_text("steps: 3\nloss:\n  agg: seq-mean-token-sum-norm\ngenerate:\n  max_tokens: 48\n")
    cfg = load_config(p, {"optim.lr": 1e-4})
    assert cfg.steps == 3 and cfg.optim.lr == 1e-4 and cfg.loss.norm_len == 48


def test_skipping_zero_advantage_rollouts_gives_the_same_step():
    import copy

    tok = tiny_tokenizer()
    base = tiny_model(tok, seed=3)
    rs = _rollouts(tok, base, n=4, seed=3)
    adv = [1.0, 0.0, -0.5, 0.0]
    a, b = copy.deepcopy(base), copy.deepcopy(base)
    opt = OptimConfig(lr=1e-2, micro_batch=2)
    ta = PolicyTrainer(a, LossConfig(agg="token-mean"), opt, tok.pad_token_id)
    # kl_coef > 0 with ref == policy forwards every rollout; the k3 term and its gradient are 0 there
    tb = PolicyTrainer(b, LossConfig(agg="token-mean", kl_coef=1e-3), opt, tok.pad_token_id, ref_model=copy.deepcopy(base))
    # plain SGD so that parameter changes equal gradients (Adam's first step amplifies float noise)
    ta.optimizer = torch.optim.SGD(a.parameters(), lr=1.0)
    tb.optimizer = torch.optim.SGD(b.parameters(), lr=1.0)
    sa = ta.update(rs, adv)
    sb = tb.update(rs, adv)
    assert sa["n_forward"] == 2.0
    assert sb["n_forward"] == 4.0 and sb["kl"] == pytest.approx(0.0, abs=1e-7)
    for (n, pa), (_, pb) in zip(a.named_parameters(), b.named_parameters(), strict=True):
        assert torch.allclose(pa, pb, atol=1e-6), n
    before = {n: p.detach().clone() for n, p in base.named_parameters()}
    s0 = PolicyTrainer(base, LossConfig(), opt, tok.pad_token_id).update(rs, [0.0] * 4)
    assert s0["skipped"] == 1.0
    assert all(torch.equal(before[n], p) for n, p in base.named_parameters())


def test_per_token_advantages_collate_and_train_like_constant_scalars():
    import copy

    tok = tiny_tokenizer()
    base = tiny_model(tok, seed=4)
    rs = _rollouts(tok, base, n=3, seed=4)
    arr = np.arange(len(rs[1].token_ids), dtype=np.float32)
    b = collate(rs, [1.0, arr, -2.0], tok.pad_token_id)
    assert b.advantages.shape == b.input_ids.shape
    assert (b.advantages[0] == 1.0).all() and (b.advantages[2] == -2.0).all()
    assert b.advantages[1, : len(arr)].tolist() == arr.tolist()
    assert (b.advantages[1, len(arr):] == 0).all()
    with pytest.raises(ValueError, match="per-token advantages have shape"):
        collate(rs, [1.0, arr[:-1], 0.0], tok.pad_token_id)
    assert is_live(np.array([0.0, 0.0, 0.3])) and not is_live(np.zeros(4)) and not is_live(0.0)

    # a per-token array that is constant on a rollout trains exactly like that scalar
    scal = [0.7, -0.4, 0.0]
    toks = [np.full(len(r.token_ids), a, dtype=np.float32) for r, a in zip(rs, scal, strict=True)]
    a, c = copy.deepcopy(base), copy.deepcopy(base)
    opt = OptimConfig(lr=1e-2, micro_batch=2)
    ta = PolicyTrainer(a, LossConfig(agg="seq-mean-token-mean"), opt, tok.pad_token_id)
    tc = PolicyTrainer(c, LossConfig(agg="seq-mean-token-mean"), opt, tok.pad_token_id)
    ta.optimizer = torch.optim.SGD(a.parameters(), lr=1.0)
    tc.optimizer = torch.optim.SGD(c.parameters(), lr=1.0)
    sa, sc = ta.update(rs, scal), tc.update(rs, toks)
    assert sa["n_forward"] == sc["n_forward"] == 2.0  # the all-zero array is skipped like a 0 scalar
    for (n, pa), (_, pc) in zip(a.named_parameters(), c.named_parameters(), strict=True):
        assert torch.allclose(pa, pc, atol=1e-6), n


def test_rollout_entropy_matches_an_unpadded_forward():
    tok = tiny_tokenizer()
    model = tiny_model(tok, seed=5)
    rs = _rollouts(tok, model, n=3, seed=5)  # different lengths: the batch is right-padded
    temp = 0.7
    tr = PolicyTrainer(model, LossConfig(), OptimConfig(micro_batch=2), tok.pad_token_id, temperature=temp)
    got = tr.rollout_entropy(rs)
    for r, e in zip(rs, got, strict=True):
        ids = torch.tensor([r.token_ids.tolist()])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0].double() / temp
        p = torch.softmax(logits, -1)
        h = -(p * torch.log(p)).sum(-1)  # h[t] = entropy of the distribution of token t + 1
        gen = [t for t in range(1, len(r.token_ids)) if r.token_role[t] == 1]
        assert e == pytest.approx(float(np.mean([h[t - 1].item() for t in gen])), rel=1e-4)
        assert 0 < e < np.log(len(tok))


def test_last_importance_weight_on_and_off_policy():
    tok = tiny_tokenizer()
    model = tiny_model(tok, seed=6)
    rs = _rollouts(tok, model, n=3, seed=6)  # behaviour log-probs = this model's (on-policy)
    gen = rs[2].token_role == 1
    rs[2].logprobs = np.where(gen, rs[2].logprobs - np.log(4.0), 0.0).astype(np.float32)  # π/μ = 4 on every token
    tr = PolicyTrainer(model, LossConfig(tis_cap=2.0, tis_mode="clamp"), OptimConfig(lr=1e-3), tok.pad_token_id)
    tr.update(rs, [1.0, 0.0, -1.0])
    w = tr.last_importance_weight
    assert w[0] == pytest.approx(1.0, abs=1e-4)  # on-policy
    assert np.isnan(w[1])  # advantage 0: not run forward
    assert w[2] == pytest.approx(2.0)  # 4, truncated at tis_cap


def _params(model):
    return {n: p.detach().clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
def test_ppo_mini_batches_equal_sequential_updates_on_each_mini_batch(agg):
    """optim.mini_batch = 2 over 4 rollouts: two optimizer steps, each exactly an update on its half
    (its own denominators), the second one starting from the weights the first left."""
    tok = tiny_tokenizer()
    rs = _rollouts(tok, tiny_model(tok, seed=4), n=4)
    adv = [1.0, -1.0, 0.5, -0.5]
    loss = LossConfig(agg=agg)
    a = tiny_model(tok, seed=4)
    stats = PolicyTrainer(a, loss, OptimConfig(lr=1e-2, micro_batch=1, mini_batch=2), tok.pad_token_id).update(rs, adv)
    assert stats["n_optimizer_steps"] == 2.0 and stats["n_forward"] == 4.0
    b = tiny_model(tok, seed=4)
    tb = PolicyTrainer(b, loss, OptimConfig(lr=1e-2, micro_batch=1), tok.pad_token_id)
    tb.update(rs[:2], adv[:2])
    second = tb.update(rs[2:], adv[2:])
    assert second["ratio_mean"] != pytest.approx(1.0, abs=1e-6)  # the second half sees a moved policy
    pa, pb = _params(a), _params(b)
    for n in pa:
        torch.testing.assert_close(pa[n], pb[n], atol=1e-6, rtol=0)


def test_mini_batch_as_large_as_the_batch_is_the_plain_update():
    tok = tiny_tokenizer()
    rs = _rollouts(tok, tiny_model(tok, seed=5), n=4)
    adv = [1.0, -1.0, 0.0, -0.5]
    out = []
    for mini in (None, 4, 10):
        m = tiny_model(tok, seed=5)
        st = PolicyTrainer(m, LossConfig(), OptimConfig(lr=1e-2, epochs=2, mini_batch=mini), tok.pad_token_id).update(rs, adv)
        assert st["n_optimizer_steps"] == 2.0
        out.append(_params(m))
    for n in out[0]:
        torch.testing.assert_close(out[0][n], out[1][n], atol=0, rtol=0)
        torch.testing.assert_close(out[0][n], out[2][n], atol=0, rtol=0)


def test_a_mini_batch_with_nothing_to_learn_takes_no_step():
    tok = tiny_tokenizer()
    rs = _rollouts(tok, tiny_model(tok, seed=6), n=4)
    m = tiny_model(tok, seed=6)
    tr = PolicyTrainer(m, LossConfig(), OptimConfig(lr=1e-2, mini_batch=2), tok.pad_token_id)
    st = tr.update(rs, [0.0, 0.0, 1.0, -1.0])
    assert st["n_optimizer_steps"] == 1.0 and st["n_forward"] == 2.0
    assert np.isnan(tr.last_importance_weight[:2]).all() and np.isfinite(tr.last_importance_weight[2:]).all()
