"""Learning signals as pure numpy functions: advantages, length shaping, entropy, PRM aggregation.

Shapes are in each docstring (G = group size, T = tokens, V = vocabulary, K = top-k, S = steps).
Decisions and departures:

- GRPO (DeepSeekMath, arXiv 2402.03300) uses the **unbiased** std (ddof=1), as verl's
  ``compute_grpo_outcome_advantage`` (``torch.std``) does, and ε = 1e-6. A singleton group gets
  advantage 0 (verl gives it r − 0 over std 1; one sample carries no group-relative information,
  so we emit no gradient).
- Dr. GRPO (arXiv 2503.20783) is the mean-centred reward without the std; the constant length
  normaliser belongs to the loss, not here.
- RLOO (Ahmadian et al., arXiv 2402.14740): rᵢ minus the mean of the other G−1 rewards.
- SEED-GRPO (arXiv 2505.12346, §3): clusters are verifier-equivalent final answers. The default
  estimator is the paper's Monte-Carlo form ``SE ≈ −(1/K) Σ_k log p(C_k|q)`` over the K clusters,
  ``p(C_k|q)`` the cluster's share of the group (frequencies, or normalised sequence likelihoods
  when log-probs are given); ``plugin`` (−Σ_k p_k log p_k) is kept as a variant. SE_max = log G.
  The form was read from a summary of the paper (themoonlight review of 2505.12346); the paper's
  own page was not readable here and no code was released, so f and α remain unverified.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable, Sequence
from typing import Literal

import numpy as np

EPS = 1e-6


def _as_1d(x: Sequence[float] | np.ndarray) -> np.ndarray:
    a = np.asarray(x, dtype=np.float64)
    if a.ndim != 1:
        raise ValueError(f"expected a 1-D array of rewards, got shape {a.shape}")
    return a


def grpo_advantages(rewards: Sequence[float] | np.ndarray, eps: float = EPS) -> np.ndarray:
    """GRPO: Âᵢ = (rᵢ − mean(r)) / (std(r) + ε), std unbiased; singleton → 0.

    rewards: (G,) → (G,).  Example: r = [1, 0, 0, 1] → mean 0.5, std 0.5774 →
    Â ≈ [0.866, −0.866, −0.866, 0.866].
    """
    r = _as_1d(rewards)
    n = r.size
    if n < 2:
        return np.zeros_like(r)
    d = r - np.add.reduce(r) / n  # r.mean() and r.std(ddof=1) as numpy computes them, without their overhead
    return d / (np.sqrt(np.add.reduce(d * d) / (n - 1)) + eps)


def dr_grpo_advantages(rewards: Sequence[float] | np.ndarray) -> np.ndarray:
    """Dr. GRPO: Âᵢ = rᵢ − mean(r) (no std). rewards: (G,) → (G,); singleton → 0."""
    r = _as_1d(rewards)
    return r - r.mean() if r.size else r


def rloo_advantages(rewards: Sequence[float] | np.ndarray) -> np.ndarray:
    """RLOO: Âᵢ = rᵢ − mean_{j≠i} rⱼ = G/(G−1)·(rᵢ − mean(r)). rewards: (G,) → (G,); singleton → 0.

    Example: r = [1, 0, 0] → [1 − 0, 0 − 0.5, 0 − 0.5] = [1, −0.5, −0.5].
    """
    r = _as_1d(rewards)
    g = r.size
    if g < 2:
        return np.zeros_like(r)
    return (r * g - r.sum()) / (g - 1)


ADVANTAGES = {"grpo": grpo_advantages, "dr_grpo": dr_grpo_advantages, "rloo": rloo_advantages}


def group_advantages(
    rewards: Sequence[float] | np.ndarray,
    group_ids: Sequence[Hashable],
    method: Literal["grpo", "dr_grpo", "rloo"] = "grpo",
) -> np.ndarray:
    """Advantages computed within each group. rewards: (N,), group_ids: (N,) → (N,)."""
    r = _as_1d(rewards)
    if len(group_ids) != r.size:
        raise ValueError(f"{r.size} rewards but {len(group_ids)} group ids")
    try:
        fn = ADVANTAGES[method]
    except KeyError:
        raise ValueError(f"unknown advantage method {method!r}; known: {sorted(ADVANTAGES)}") from None
    idx: dict[Hashable, list[int]] = defaultdict(list)
    for i, g in enumerate(group_ids):
        idx[g].append(i)
    out = np.zeros_like(r)
    for ii in idx.values():
        out[ii] = fn(r[ii])
    return out


def dapo_overlong_penalty(
    lengths: Sequence[int] | np.ndarray, max_len: int, cache_len: int, factor: float = 1.0
) -> np.ndarray:
    """DAPO soft overlong punishment (arXiv 2503.14476), added to the correctness reward.

    R = 0 if L ≤ L_max − L_cache; ((L_max − L_cache) − L)/L_cache · factor inside the cache window;
    −factor beyond L_max.  lengths: (N,) → (N,).
    Example: L_max = 20, L_cache = 4: L = 16 → 0, L = 18 → −0.5, L = 25 → −1.
    """
    if cache_len <= 0 or cache_len > max_len:
        raise ValueError(f"need 0 < cache_len <= max_len, got cache_len={cache_len}, max_len={max_len}")
    L = np.asarray(lengths, dtype=np.float64)
    exceed = L - (max_len - cache_len)
    pen = np.minimum(-exceed / cache_len, 0.0)
    return np.maximum(pen, -1.0) * factor


def token_entropy(logits: np.ndarray) -> np.ndarray:
    """Entropy of each next-token distribution from logits. logits: (T, V) → (T,) nats."""
    z = np.asarray(logits, dtype=np.float64)
    z = z - z.max(axis=-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))
    return -(np.exp(logp) * logp).sum(axis=-1)


def topk_entropy(top_logprobs: np.ndarray) -> np.ndarray:
    """Entropy from the engine's top-K log-probs, renormalised over the K. (T, K) → (T,) nats.

    A lower bound-ish estimate when K ≪ V (the tail is dropped); exact when K = V.
    """
    lp = np.asarray(top_logprobs, dtype=np.float64)
    lp = lp - np.logaddexp.reduce(lp, axis=-1, keepdims=True)
    p = np.exp(lp)
    return -(p * lp).sum(axis=-1)


def mean_surprisal(logprobs: np.ndarray, mask: np.ndarray | None = None) -> float:
    """Monte-Carlo entropy estimate from sampled-token log-probs: mean of −log p over masked tokens.

    logprobs: (T,), mask: (T,) of 0/1 (e.g. token_role == GENERATED) → scalar; 0 if no token.
    """
    lp = np.asarray(logprobs, dtype=np.float64)
    m = np.ones_like(lp, dtype=bool) if mask is None else np.asarray(mask).astype(bool)
    return float(-lp[m].mean()) if m.any() else 0.0


def semantic_entropy(cluster_ids: Sequence[Hashable], seq_logprobs: Sequence[float] | None = None,
                     estimator: Literal["mc", "plugin"] = "plugin") -> float:
    """Semantic entropy of a group over answer clusters (SEED-GRPO, arXiv 2505.12346).

    cluster_ids: (G,) cluster label per response (verifier-equivalent final answers);
    seq_logprobs: optional (G,) total log-prob of each response — then p(C) ∝ Σ_{i∈C} exp(logpᵢ),
    else p(C) = |C|/G. ``plugin``: −Σ_C p(C) log p(C); ``mc`` (SEED-GRPO's): −(1/K) Σ_C log p(C)
    over the K clusters (nats). Both equal log G when every answer differs.
    Example: clusters [a, a, b, c] → p = [.5, .25, .25] → plugin 1.0397, mc (0.693 + 2·1.386)/3 = 1.1552.
    """
    labels = list(cluster_ids)
    if not labels:
        return 0.0
    if seq_logprobs is None:
        w = np.ones(len(labels))
    else:
        lp = np.asarray(seq_logprobs, dtype=np.float64)
        if lp.shape != (len(labels),):
            raise ValueError(f"seq_logprobs shape {lp.shape} != ({len(labels)},)")
        w = np.exp(lp - lp.max())
    mass: dict[Hashable, float] = defaultdict(float)
    for c, wi in zip(labels, w, strict=True):
        mass[c] += float(wi)
    p = np.array(list(mass.values())) / sum(mass.values())
    if estimator == "mc":
        return float(-np.log(p).mean())
    if estimator != "plugin":
        raise ValueError(f"unknown semantic-entropy estimator {estimator!r}; use mc or plugin")
    return float(-(p * np.log(p)).sum())


def seed_grpo_scale(
    entropy: float, group_size: int, alpha: float = 1.0, form: Literal["linear", "exp", "focal"] = "linear",
    gamma: float = 2.0,
) -> float:
    """SEED-GRPO advantage scale f(α·SE/SE_max), SE_max = log G; high uncertainty → smaller updates.

    linear: 1 − x (clipped at 0); exp: exp(−x); focal: (1 − x)^γ (clipped).  Scalar → scalar.
    Example: SE = log 4 / 2, G = 4, α = 1, linear → 0.5.
    """
    if group_size < 2:
        return 1.0
    x = alpha * entropy / np.log(group_size)
    if form == "linear":
        return float(max(0.0, 1.0 - x))
    if form == "exp":
        return float(np.exp(-x))
    if form == "focal":
        return float(max(0.0, 1.0 - x) ** gamma)
    raise ValueError(f"unknown SEED-GRPO form {form!r}; use linear, exp or focal")


def seed_grpo_advantages(
    rewards: Sequence[float] | np.ndarray,
    cluster_ids: Sequence[Hashable],
    seq_logprobs: Sequence[float] | None = None,
    alpha: float = 1.0,
    form: Literal["linear", "exp", "focal"] = "linear",
    estimator: Literal["mc", "plugin"] = "mc",
) -> np.ndarray:
    """SEED-GRPO: mean-baseline advantage rᵢ − mean(r) scaled by f(α·SE/log G). (G,) → (G,).

    Example: r [1, 0, 0, 0], clusters [a, b, b, c] (p .25, .5, .25; mc SE = 1.1552, SE/log 4 = 0.8333),
    linear → [0.75, −0.25, −0.25, −0.25] × 0.1667 = [0.125, −0.0417, −0.0417, −0.0417].
    """
    r = _as_1d(rewards)
    se = semantic_entropy(cluster_ids, seq_logprobs, estimator)
    return dr_grpo_advantages(r) * seed_grpo_scale(se, r.size, alpha, form)


def prm_aggregate(step_scores: Sequence[float] | np.ndarray, how: Literal["product", "min", "last"] = "product") -> float:
    """Aggregate per-step PRM scores into a solution score. (S,) → scalar.

    product: Πₖ pₖ (Lightman et al., arXiv 2305.20050); min: the weakest step; last: the final step.
    An empty list scores 0.
    """
    s = _as_1d(step_scores)
    if s.size == 0:
        return 0.0
    if how == "product":
        return float(np.prod(s))
    if how == "min":
        return float(s.min())
    if how == "last":
        return float(s[-1])
    raise ValueError(f"unknown PRM aggregation {how!r}; use product, min or last")


def assign_advantages(rollouts: list, method: Literal["grpo", "dr_grpo", "rloo"] = "grpo",
                      key: str = "advantage") -> list:
    """Compute advantages of ``rollouts`` (grouped by ``group_id``, from ``reward``) and write them into
    ``rollout.signals[key]`` (in place). Returns the same list."""
    adv = group_advantages([r.reward for r in rollouts], [r.group_id for r in rollouts], method)
    for r, a in zip(rollouts, adv, strict=True):
        r.signals[key] = float(a)
    return rollouts
