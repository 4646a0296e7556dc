"""Policy-gradient losses as small pure functions over tensors.

Notation (shapes): ``B`` sequences, ``T`` positions. Every function takes per-token tensors already
aligned to the *predicted* token (position ``t`` holds the log-prob of token ``t`` given ``<t``; see
:func:`token_logprobs`) and a ``mask`` ``[B, T]`` that is 1 exactly on tokens the policy generated
(``token_role == 1``) and 0 elsewhere (context, padding). Masked positions contribute exactly zero
loss and zero gradient, even if the inputs there are ``inf`` or ``nan`` (``torch.where``, not a
multiplication).

The clipped surrogate is PPO's (Schulman et al. 2017, arXiv 1707.06347) in the group-relative form of
GRPO (DeepSeekMath, arXiv 2402.03300), with DAPO's decoupled ``clip_low``/``clip_high``
("clip-higher", arXiv 2503.14476). Aggregation modes follow verl's names:

* ``token-mean`` (DAPO): sum over all generated tokens of the batch / number of those tokens;
* ``seq-mean-token-mean`` (GRPO): mean over tokens within each sequence, then mean over sequences;
* ``seq-mean-token-sum-norm`` (Dr. GRPO, arXiv 2503.20783): sum over tokens within each sequence
  divided by a constant ``norm_len`` (e.g. the max generation length), then mean over sequences.

Gradient accumulation: pass the *global* denominators (``n_tokens`` for token-mean, ``n_seqs`` for the
sequence modes) of the whole batch to each micro-batch call and sum the micro-batch losses; the sum
then equals the one-big-batch loss exactly (tested).

Departures: the k3 KL (``ref/π − log(ref/π) − 1``, Schulman's estimator as used by GRPO) is added to
the loss per token and aggregated with the same mode as the policy term. Truncated importance
sampling for stale/replayed rollouts follows AReaL's decoupled objective (arXiv 2505.24298): when
``proximal_logp`` is given the PPO ratio is taken against it and each token is additionally weighted
by ``w = exp(proximal − behaviour)`` (detached): ``tis_mode="mask"`` (AReaL's rule,
``realhf/impl/model/utils/ppo_functional.py`` ``actor_loss_fn``: ``behav_mask = w <= cap``,
``w = where(behav_mask, w, 0)``, the denominator unchanged) drops tokens whose weight exceeds the
cap; ``tis_mode="clamp"`` keeps them at ``min(w, cap)`` (truncated IS).

Per-row forms (one loss for every method of the batch): ``sample_weight`` ``[B]`` multiplies a
row's per-token loss (RePO's ``off_policy_loss_coef`` on replayed rows); ``shaping`` ``[B]`` with
``γ > 0`` switches a row to ExGRPO's shaped, unclipped term ``−A·f(w)``, ``f(w) = w/(w+γ)``,
``w = exp(logp − behaviour)`` (ElliottYan/LUFFY ``ExGRPO/.../mix_core_alg.py`` L133–143, L189).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

AggMode = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
AGG_MODES: tuple[str, ...] = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def token_logprobs(logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """Log-prob of each token under the model, aligned to the token.

    ``logits`` ``[B, T, V]`` (position ``t`` predicts token ``t+1``), ``input_ids`` ``[B, T]`` →
    ``[B, T]`` where ``out[:, t] = log p(input_ids[:, t] | input_ids[:, :t])`` for ``t >= 1`` and
    ``out[:, 0] = 0`` (the first token has no prediction). Computed in fp32.
    """
    lp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    picked = lp.gather(-1, input_ids[:, 1:].long().unsqueeze(-1)).squeeze(-1)
    return torch.cat([torch.zeros_like(picked[:, :1]), picked], dim=1)


def masked_nll(logits: torch.Tensor, input_ids: torch.Tensor, loss_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean next-token NLL over exactly the masked-in target tokens (masked SFT, ROSS's objective).

    Shapes: ``logits [B, T, V]``, ``input_ids [B, T]``, ``loss_mask [B, T]`` (1 = token ``t`` is a
    target, predicted from positions ``< t``). Returns ``(loss, n_tokens)``; ``loss`` is
    ``sum_t mask[t] * -log p(x_t | x_<t) / sum_t mask[t]`` (0 when nothing is masked in), with the
    log-probs of :func:`token_logprobs`. Position 0 can never be a target (nothing precedes it).
    Masked-out tokens contribute exactly zero loss and gradient.

    Example: one sequence whose two targets have p = 0.5 and 0.25 → loss = (ln 2 + ln 4) / 2.
    """
    lp = token_logprobs(logits, input_ids)
    m = loss_mask.to(lp.dtype).clone()
    m[:, 0] = 0
    n = m.sum()
    nll = torch.where(m > 0, -lp, torch.zeros_like(lp))
    return nll.sum() / n.clamp_min(1.0), n


def token_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of the next-token distribution, aligned like :func:`token_logprobs`.

    ``logits`` ``[B, T, V]`` → ``[B, T]``; ``out[:, t]`` is the entropy of the distribution that
    produced token ``t`` (``out[:, 0] = 0``).
    """
    lp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    ent = -(lp.exp() * lp).sum(-1)
    return torch.cat([torch.zeros_like(ent[:, :1]), ent], dim=1)


def aggregate(
    values: torch.Tensor,
    mask: torch.Tensor,
    mode: AggMode = "token-mean",
    *,
    norm_len: float | None = None,
    n_tokens: float | None = None,
    n_seqs: float | None = None,
) -> torch.Tensor:
    """Reduce per-token ``values`` ``[B, T]`` over ``mask`` ``[B, T]`` to a scalar.

    * ``token-mean``: ``Σ v·m / n_tokens`` (default ``n_tokens = Σ m``).
    * ``seq-mean-token-mean``: ``Σ_i (Σ_t v·m / Σ_t m) / n_seqs`` (default ``n_seqs = B``; rows with
      no masked token contribute 0 but still count in the default ``n_seqs``).
    * ``seq-mean-token-sum-norm``: ``Σ_i (Σ_t v·m / norm_len) / n_seqs``; ``norm_len`` required.

    Example: ``values = [[1, 2, 3], [4, 0, 0]]``, ``mask = [[1, 1, 1], [1, 0, 0]]`` gives
    token-mean ``10/4 = 2.5``, seq-mean-token-mean ``(2 + 4)/2 = 3``, and with ``norm_len = 4``
    seq-mean-token-sum-norm ``(6/4 + 4/4)/2 = 1.25``.
    """
    m = mask.bool()
    v = torch.where(m, values, torch.zeros_like(values))
    if mode == "token-mean":
        denom = float(m.sum()) if n_tokens is None else float(n_tokens)
        return v.sum() / max(denom, 1.0)
    n = float(values.shape[0]) if n_seqs is None else float(n_seqs)
    if mode == "seq-mean-token-mean":
        per_seq = v.sum(-1) / m.sum(-1).clamp(min=1)
        return per_seq.sum() / max(n, 1.0)
    if mode == "seq-mean-token-sum-norm":
        if norm_len is None or norm_len <= 0:
            raise ValueError("aggregation 'seq-mean-token-sum-norm' needs norm_len > 0 (e.g. the max generation length)")
        return (v.sum(-1) / float(norm_len)).sum() / max(n, 1.0)
    raise ValueError(f"unknown aggregation {mode!r}; choose one of {AGG_MODES}")


def k3_kl(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimator of KL(π‖π_ref): ``exp(ref − logp) − (ref − logp) − 1`` (≥ 0).

    ``logp``, ``ref_logp`` ``[B, T]`` → ``[B, T]``. Example: ``logp = log 0.5``, ``ref = log 0.25``
    gives ``0.5 − log 0.5 − 1 = 0.1931``.
    """
    d = ref_logp - logp
    return torch.exp(d) - d - 1.0


def truncated_is_weight(proximal_logp: torch.Tensor, behaviour_logp: torch.Tensor, cap: float,
                        mode: Literal["mask", "clamp"] = "mask") -> torch.Tensor:
    """Detached behaviour importance weight ``w = exp(proximal − behaviour)`` with a cap, ``[B, T]``.

    Corrects for the gap between the policy that sampled a stale or replayed rollout (behaviour) and
    the policy at the start of this update (proximal). ``mask`` (AReaL): ``w`` if ``w <= cap`` else 0;
    ``clamp``: ``min(w, cap)``. Example: proximal ``log 0.6``, behaviour ``log 0.2`` (w = 3), cap 2 →
    mask 0, clamp 2; with behaviour ``log 0.4`` (w = 1.5) both give 1.5.
    """
    w = torch.exp(proximal_logp - behaviour_logp)
    if mode == "mask":
        return torch.where(w <= cap, w, torch.zeros_like(w)).detach()
    if mode == "clamp":
        return w.clamp(max=cap).detach()
    raise ValueError(f"tis_mode must be 'mask' or 'clamp', got {mode!r}")


@dataclass
class LossOutput:
    """The scalar loss and detached per-batch statistics (sums, so micro-batches can be added)."""

    loss: torch.Tensor
    pg_loss: float
    kl: float
    clip_frac: float
    ratio_mean: float
    n_tokens: int


def policy_gradient_loss(
    logp: torch.Tensor,
    behaviour_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    agg: AggMode = "token-mean",
    norm_len: float | None = None,
    n_tokens: float | None = None,
    n_seqs: float | None = None,
    ref_logp: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    proximal_logp: torch.Tensor | None = None,
    tis_cap: float | None = None,
    tis_mode: Literal["mask", "clamp"] = "mask",
    sample_weight: torch.Tensor | None = None,
    shaping: torch.Tensor | None = None,
) -> LossOutput:
    """Clipped policy-gradient loss (to minimise).

    Shapes: ``logp`` (current policy, with grad), ``behaviour_logp`` (stored sampling log-probs),
    ``mask`` ``[B, T]``; ``advantages`` ``[B]`` (one per sequence) or ``[B, T]``.

    Per token: ``r = exp(logp − old)`` with ``old = proximal_logp`` if given else ``behaviour_logp``;
    ``ℓ = −min(r·A, clip(r, 1 − clip_low, 1 + clip_high)·A)``; rows with ``shaping[b] = γ > 0`` take
    ``ℓ = −A·w/(w+γ)``, ``w = exp(logp − behaviour)`` instead; if ``tis_cap`` is set (requires
    ``proximal_logp``), ``ℓ *=`` :func:`truncated_is_weight` (``tis_mode``); ``ℓ *= sample_weight[b]``;
    if ``kl_coef > 0``, ``ℓ += kl_coef · k3(logp, ref_logp)``. The loss is ``aggregate(ℓ, mask, agg, ...)``.

    With ``r ≡ 1`` (``old = logp.detach()``) the gradient equals the vanilla policy gradient of
    ``aggregate(−A·logp)``.
    """
    if advantages.dim() == 1:
        advantages = advantages[:, None].expand_as(logp)
    if tis_cap is not None and proximal_logp is None:
        raise ValueError("tis_cap needs proximal_logp (the log-probs of the policy at the start of the update)")
    m = mask.bool()
    zeros = torch.zeros_like(logp)
    old = proximal_logp if proximal_logp is not None else behaviour_logp
    log_ratio = torch.where(m, logp - old.detach(), zeros)
    ratio = torch.exp(log_ratio)
    adv = torch.where(m, advantages.to(logp.dtype), zeros)
    surr1 = ratio * adv
    surr2 = ratio.clamp(1.0 - clip_low, 1.0 + clip_high) * adv
    per_token = -torch.minimum(surr1, surr2)
    if shaping is not None and bool((shaping > 0).any()):
        gam = shaping.to(logp.dtype)[:, None].expand_as(logp)
        w_b = torch.exp(torch.where(m, logp - behaviour_logp.detach(), zeros))
        shaped = -adv * w_b / (w_b + gam.clamp(min=1e-12))
        per_token = torch.where(gam > 0, shaped, per_token)
    if tis_cap is not None:
        w = truncated_is_weight(torch.where(m, proximal_logp, zeros), torch.where(m, behaviour_logp, zeros), tis_cap,
                                tis_mode)
        if shaping is not None:  # a shaped row already weighs π_θ against its behaviour policy
            w = torch.where(shaping.to(logp.dtype)[:, None].expand_as(w) > 0, torch.ones_like(w), w)
        per_token = per_token * w
    if sample_weight is not None:
        per_token = per_token * sample_weight.to(logp.dtype)[:, None]
    kl_val = 0.0
    if kl_coef > 0.0:
        if ref_logp is None:
            raise ValueError("kl_coef > 0 needs ref_logp (log-probs of the reference model)")
        kl = torch.where(m, k3_kl(logp, ref_logp.detach()), zeros)
        per_token = per_token + kl_coef * kl
        kl_val = float(kl.detach().sum())
    loss = aggregate(per_token, m, agg, norm_len=norm_len, n_tokens=n_tokens, n_seqs=n_seqs)
    with torch.no_grad():
        clipped = (surr2 < surr1) & m  # the clipped branch is active (gradient stopped)
        pg = aggregate(-torch.minimum(surr1, surr2), m, agg, norm_len=norm_len, n_tokens=n_tokens, n_seqs=n_seqs)
    return LossOutput(
        loss=loss,
        pg_loss=float(pg),
        kl=kl_val,
        clip_frac=float(clipped.sum()),
        ratio_mean=float(torch.where(m, ratio, zeros).detach().sum()),
        n_tokens=int(m.sum()),
    )


def masked_row_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-row mean of ``values`` over ``mask``: ``[B, T], [B, T] → [B]``; ``nan`` for a row with no masked token.

    Masked-out positions are ignored even when they hold ``inf``/``nan``. Example:
    ``values = [[1, 2, 9], [4, nan, 0]]``, ``mask = [[1, 1, 0], [0, 0, 0]]`` → ``[1.5, nan]``.
    """
    m = mask.bool()
    v = torch.where(m, values.float(), torch.zeros_like(values, dtype=torch.float32))
    n = m.sum(-1)
    out = v.sum(-1) / n.clamp(min=1)
    return torch.where(n > 0, out, torch.full_like(out, float("nan")))
