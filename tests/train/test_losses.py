"""Losses on hand-worked tensors."""

from __future__ import annotations

import math

import pytest
import torch

from gfcr.train.losses import (
    aggregate,
    k3_kl,
    masked_row_mean,
    policy_gradient_loss,
    token_logprobs,
    truncated_is_weight,
)

V = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
M = torch.tensor([[1, 1, 1], [1, 0, 0]])


def test_aggregate_token_mean():
    assert aggregate(V, M, "token-mean").item() == pytest.approx(10 / 4)


def test_aggregate_seq_mean_token_mean():
    assert aggregate(V, M, "seq-mean-token-mean").item() == pytest.approx((2 + 4) / 2)


def test_aggregate_seq_mean_token_sum_norm():
    assert aggregate(V, M, "seq-mean-token-sum-norm", norm_len=4).item() == pytest.approx((6 / 4 + 4 / 4) / 2)
    with pytest.raises(ValueError, match="norm_len"):
        aggregate(V, M, "seq-mean-token-sum-norm")


def test_aggregate_ignores_inf_under_mask():
    v = torch.tensor([[1.0, float("inf")], [float("nan"), 3.0]])
    m = torch.tensor([[1, 0], [0, 1]])
    assert aggregate(v, m, "token-mean").item() == pytest.approx(2.0)


def test_unknown_mode():
    with pytest.raises(ValueError, match="token-mean"):
        aggregate(V, M, "mean")  # type: ignore[arg-type]


def test_k3_hand_value():
    got = k3_kl(torch.tensor([math.log(0.5)]), torch.tensor([math.log(0.25)])).item()
    assert got == pytest.approx(0.5 - math.log(0.5) - 1)
    assert k3_kl(torch.tensor([-1.3]), torch.tensor([-1.3])).item() == pytest.approx(0.0)


def test_truncated_is_weight_mask_and_clamp():
    prox, behav = torch.tensor([math.log(0.6), math.log(0.2)]), torch.tensor([math.log(0.2), math.log(0.4)])  # w = 3, 0.5
    assert truncated_is_weight(prox, behav, 2.0, "clamp").tolist() == pytest.approx([2.0, 0.5])
    # AReaL (ppo_functional.actor_loss_fn): a token whose weight exceeds the cap is masked out (weight 0)
    assert truncated_is_weight(prox, behav, 2.0).tolist() == pytest.approx([0.0, 0.5])


def test_exgrpo_shaped_rows_and_sample_weights_by_hand():
    """Row 0 clipped ratio (A = 1, ratio 1.5, clip_high 0.2 → 1.2 in the value, no gradient); row 1
    shaped: w = 0.3/0.1 = 3, f(w) = 3/3.1, A = 1 → −0.9677 and d/dlogp = −A·γw/(w+γ)² = −0.0312;
    row 2 weight 0.5 on −A·r = −1·1 → −0.5. token-mean over 3 tokens."""
    logp = torch.log(torch.tensor([[0.3], [0.3], [0.2]])).requires_grad_(True)
    behav = torch.log(torch.tensor([[0.2], [0.1], [0.2]]))
    out = policy_gradient_loss(logp, behav, torch.tensor([1.0, 1.0, 1.0]), torch.ones(3, 1), clip_high=0.2,
                               shaping=torch.tensor([0.0, 0.1, 0.0]), sample_weight=torch.tensor([1.0, 1.0, 0.5]))
    assert out.loss.item() == pytest.approx((-1.2 - 3 / 3.1 - 0.5) / 3, abs=1e-5)
    (g,) = torch.autograd.grad(out.loss, logp)
    assert g[:, 0].tolist() == pytest.approx([0.0, -(0.1 * 3 / 3.1**2) / 3, -0.5 / 3], abs=1e-5)


def test_token_logprobs_alignment():
    logits = torch.zeros(1, 3, 4)
    logits[0, 0, 2] = math.log(3.0)  # p(token 2 | pos 0) = 3/6
    ids = torch.tensor([[1, 2, 0]])
    lp = token_logprobs(logits, ids)
    assert lp[0, 0].item() == 0.0
    assert lp[0, 1].item() == pytest.approx(math.log(0.5))
    assert lp[0, 2].item() == pytest.approx(math.log(0.25))


def test_clipping_hand_worked():
    # ratio 1.5 with A=+1: clip_high 0.28 -> surrogate 1.28 (clipped); A=-1: min(-1.5, -1.28) = -1.5 (unclipped)
    old = torch.log(torch.tensor([[0.2, 0.2]]))
    logp = torch.log(torch.tensor([[0.3, 0.3]])).requires_grad_(True)
    mask = torch.ones(1, 2)
    out = policy_gradient_loss(logp, old, torch.tensor([[1.0, -1.0]]), mask, clip_low=0.2, clip_high=0.28)
    assert out.loss.item() == pytest.approx((-1.28 + 1.5) / 2, abs=1e-6)
    assert out.clip_frac == 1.0
    out.loss.backward()
    # clipped token has zero gradient; unclipped gets d(-r*A)/dlogp / 2 = 1.5/2
    assert logp.grad[0, 0].item() == 0.0
    assert logp.grad[0, 1].item() == pytest.approx(0.75, abs=1e-6)


def test_role0_tokens_get_exactly_zero_gradient():
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 7, requires_grad=True)
    ids = torch.randint(0, 7, (2, 5))
    role = torch.tensor([[0, 0, 1, 1, 0], [0, 1, 1, 1, 1]])
    lp = token_logprobs(logits, ids)
    behaviour = lp.detach() + 0.1 * torch.randn(2, 5)
    behaviour[role == 0] = float("-inf")  # garbage there must not leak
    for agg in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"):
        logits.grad = None
        out = policy_gradient_loss(
            token_logprobs(logits, ids), behaviour, torch.tensor([1.0, -0.5]), role,
            agg=agg, norm_len=8, ref_logp=lp.detach() - 0.3, kl_coef=0.1,
        )
        out.loss.backward()
        g = logits.grad
        assert torch.isfinite(g).all()
        # logits at position t predict token t+1: gradient there is zero iff token t+1 is context
        for b in range(2):
            for t in range(4):
                if role[b, t + 1] == 0:
                    assert torch.count_nonzero(g[b, t]) == 0
                else:
                    assert torch.count_nonzero(g[b, t]) > 0
            assert torch.count_nonzero(g[b, 4]) == 0  # last logits predict nothing


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_ratio_one_equals_vanilla_policy_gradient(agg):
    torch.manual_seed(1)
    logits = torch.randn(3, 6, 5, requires_grad=True)
    ids = torch.randint(0, 5, (3, 6))
    mask = torch.tensor([[0, 1, 1, 1, 0, 0], [0, 0, 1, 1, 1, 1], [0, 1, 0, 1, 1, 0]])
    adv = torch.tensor([0.7, -1.2, 0.4])
    lp = token_logprobs(logits, ids)
    out = policy_gradient_loss(lp, lp.detach(), adv, mask, agg=agg, norm_len=6)
    (g1,) = torch.autograd.grad(out.loss, logits)
    lp2 = token_logprobs(logits, ids)
    vanilla = aggregate(-adv[:, None] * lp2, mask, agg, norm_len=6)
    (g2,) = torch.autograd.grad(vanilla, logits)
    assert torch.allclose(g1, g2, atol=1e-7)
    assert g1.abs().sum() > 0


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_grad_accumulation_equals_big_batch(agg):
    torch.manual_seed(2)
    w = torch.randn(4, 5, requires_grad=True)
    x = torch.randn(6, 7, 4)
    ids = torch.randint(0, 5, (6, 7))
    mask = (torch.rand(6, 7) > 0.4).long()
    mask[:, 0] = 0
    adv = torch.randn(6)
    behaviour = token_logprobs(x @ w, ids).detach() + 0.05 * torch.randn(6, 7)
    kw = dict(agg=agg, norm_len=7, clip_low=0.1, clip_high=0.15)
    big = policy_gradient_loss(token_logprobs(x @ w, ids), behaviour, adv, mask, **kw)
    (g_big,) = torch.autograd.grad(big.loss, w)
    n_tok, n_seq = float(mask[:, 1:].sum()), 6.0
    g_acc = torch.zeros_like(w)
    total = 0.0
    for sl in (slice(0, 2), slice(2, 5), slice(5, 6)):
        out = policy_gradient_loss(
            token_logprobs(x[sl] @ w, ids[sl]), behaviour[sl], adv[sl], mask[sl], n_tokens=n_tok, n_seqs=n_seq, **kw
        )
        (g,) = torch.autograd.grad(out.loss, w)
        g_acc += g
        total += out.loss.item()
    assert total == pytest.approx(big.loss.item(), abs=1e-6)
    assert torch.allclose(g_acc, g_big, atol=1e-6)


def test_tis_weights_scale_loss():
    logp = torch.log(torch.tensor([[0.3]])).requires_grad_(True)
    prox = logp.detach().clone()
    behaviour = torch.log(torch.tensor([[0.1]]))  # exp(prox - behaviour) = 3, capped at 2
    out = policy_gradient_loss(logp, behaviour, torch.tensor([1.0]), torch.ones(1, 1), proximal_logp=prox, tis_cap=2.0,
                               tis_mode="clamp")
    assert out.loss.item() == pytest.approx(-2.0)
    out = policy_gradient_loss(logp, behaviour, torch.tensor([1.0]), torch.ones(1, 1), proximal_logp=prox, tis_cap=2.0)
    assert out.loss.item() == pytest.approx(0.0)  # mask (AReaL): the token is dropped
    with pytest.raises(ValueError, match="proximal_logp"):
        policy_gradient_loss(logp, behaviour, torch.tensor([1.0]), torch.ones(1, 1), tis_cap=2.0)


def test_masked_row_mean_by_hand():
    v = torch.tensor([[1.0, 2.0, 9.0], [4.0, float("nan"), 0.0], [float("inf"), 3.0, 5.0]])
    m = torch.tensor([[1, 1, 0], [0, 0, 0], [0, 1, 1]])
    out = masked_row_mean(v, m)
    assert out[0].item() == pytest.approx(1.5)
    assert math.isnan(out[1].item())  # no masked token
    assert out[2].item() == pytest.approx(4.0)  # the inf at a masked-out position is ignored


def test_masked_nll_hand_worked_and_masked_tokens_get_no_gradient():
    import math

    from gfcr.train.losses import masked_nll

    # vocab 4; logits at position 0 give token 2 p = 0.5 (target 1), at position 1 token 3 p = 0.25 (target 2)
    probs = torch.tensor([[[0.25, 0.25, 0.5, 0.0], [0.25, 0.25, 0.25, 0.25], [0.25] * 4]])
    logits = torch.log(probs.clamp_min(1e-30)).requires_grad_(True)
    ids = torch.tensor([[0, 2, 3]])
    loss, n = masked_nll(logits, ids, torch.tensor([[1, 1, 1]]))  # position 0 is never a target
    assert n.item() == 2 and loss.item() == pytest.approx((math.log(2) + math.log(4)) / 2, rel=1e-5)
    loss, n = masked_nll(logits, ids, torch.tensor([[0, 0, 1]]))
    loss.backward()
    assert n.item() == 1 and loss.item() == pytest.approx(math.log(4), rel=1e-5)
    assert torch.all(logits.grad[0, 0] == 0) and torch.all(logits.grad[0, 2] == 0)  # only target 2 (logits 1) counts


def test_unclipped_loss_keeps_the_gradient_outside_the_clip_range():
    """loss.clip false (ExGRPO's loss_remove_clip): with ratio 2 and A > 0 the clipped loss has no
    gradient; the unclipped −A·ratio keeps d/dlogp = −A·ratio."""
    logp = torch.tensor([[0.0, math.log(2.0)]], requires_grad=True)
    args = (torch.zeros(1, 2), torch.tensor([1.0]), torch.tensor([[0, 1]]))
    policy_gradient_loss(logp, *args, clip_low=0.2, clip_high=0.2).loss.backward()
    assert float(logp.grad[0, 1]) == 0.0
    logp.grad = None
    out = policy_gradient_loss(logp, *args, clip_low=float("inf"), clip_high=float("inf"))
    out.loss.backward()
    assert float(logp.grad[0, 1]) == pytest.approx(-2.0) and out.clip_frac == 0
