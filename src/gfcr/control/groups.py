"""Control's pure maths and per-sample controls. The group policies that use the maths (adaptive K,
DAPO's dynamic sampling, GFPO ...) are classes of :mod:`gfcr.control.policies`, one per method,
named after its paper; here are their pure functions (K allocation, the variance test, GFPO's
keep set and advantages) and the controls that act on single samples: DAPO's overlong filter,
early exit, AReaL's staleness bound (table :data:`SAMPLE_CONTROLS`, factory
:func:`make_sample_control`). Length- and mode-shaped rewards (ShorterBetter, AdaptThink) are
Filter rules: :mod:`gfcr.filters.reward`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import numpy as np

G = TypeVar("G")

# ---------------------------------------------------------------------------------------------
# Adaptive K
# ---------------------------------------------------------------------------------------------


def beta_variance_weight(alpha: np.ndarray, beta: np.ndarray) -> np.ndarray:
    """Expected Bernoulli variance under a Beta posterior: ``E[p(1-p)] = αβ / ((α+β)(α+β+1))``.

    Shapes: (N,), (N,) -> (N,). Example: Beta(1, 1) -> 1/6; Beta(9, 1) -> 9/110.
    """
    a = np.asarray(alpha, dtype=np.float64)
    b = np.asarray(beta, dtype=np.float64)
    s = a + b
    return a * b / (s * (s + 1.0))


def allocate_k(weights: np.ndarray, budget: int, k_min: int, k_max: int) -> np.ndarray:
    """Split ``budget`` samples over prompts in proportion to ``weights``, each in [k_min, k_max].

    Every prompt first gets k_min; the rest goes by largest remainder of ``w_i / Σw · rest``,
    capped at k_max (iterating when caps bind). The sum equals ``budget`` unless the caps make
    that impossible (then it is ``N·k_max`` or the budget is below ``N·k_min`` -> error).
    Shapes: (N,) -> (N,) int. Example: weights [3, 1], budget 8, k in [1, 8]: base [1, 1], rest 6
    split [4.5, 1.5] -> floors [4, 1], one left, remainders tie -> larger weight -> [6, 2].
    """
    w = np.asarray(weights, dtype=np.float64)
    n = w.size
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    if np.any(w < 0) or not np.all(np.isfinite(w)):
        raise ValueError("allocate_k: weights must be finite and >= 0")
    if k_min < 0 or k_max < k_min:
        raise ValueError(f"allocate_k: need 0 <= k_min <= k_max, got {k_min}, {k_max}")
    if budget < n * k_min:
        raise ValueError(f"allocate_k: budget {budget} is below {n} prompts x k_min {k_min}")
    k = np.full(n, k_min, dtype=np.int64)
    rest = min(budget, n * k_max) - k.sum()
    while rest > 0:
        open_ = k < k_max
        ww = np.where(open_, w, 0.0)
        if ww.sum() == 0:
            ww = open_.astype(np.float64)
        share = ww / ww.sum() * rest
        add = np.minimum(np.floor(share).astype(np.int64), k_max - k)
        k += add
        left = rest - int(add.sum())
        if left > 0:
            frac = np.where(k < k_max, share - np.floor(share), -1.0)
            order = np.lexsort((-ww, -frac))  # largest remainder, ties -> larger weight
            for i in order[:left]:
                if k[i] < k_max:
                    k[i] += 1
        new_rest = min(budget, n * k_max) - int(k.sum())
        if new_rest >= rest:
            break
        rest = new_rest
    return k


# ---------------------------------------------------------------------------------------------
# Dynamic sampling (DAPO)
# ---------------------------------------------------------------------------------------------


def has_variance(rewards: Sequence[float]) -> bool:
    """True when a group's rewards are not all equal, or the group has one member (DAPO keeps
    singleton groups). Example: [1, 1, 1] -> False; [1, 0] -> True; [0.5] -> True."""
    r = np.asarray(rewards, dtype=np.float64)
    return bool(r.size == 1 or (r.size > 1 and r.std() > 0))


@dataclass
class DynamicSamplingResult(Generic[G]):
    """What one :meth:`DynamicSampling.collect` produced."""

    groups: list[G]
    n_gen_batches: int
    n_generated_groups: int
    n_zero_variance: int
    n_dropped_surplus: int
    reached_target: bool


# ---------------------------------------------------------------------------------------------
# GFPO
# ---------------------------------------------------------------------------------------------


def gfpo_keep(rewards: Sequence[float], lengths: Sequence[int], k: int, metric: str = "length") -> np.ndarray:
    """Indices of the k responses GFPO retains, best first.

    metric ``"length"``: shortest first; ``"token_efficiency"``: largest reward/length first.
    Ties keep the earlier index. Shapes: (G,), (G,) -> (k,) int.
    Example: lengths [5, 3, 9, 3], k=2, length -> [1, 3].
    """
    r = np.asarray(rewards, dtype=np.float64)
    ln = np.asarray(lengths, dtype=np.float64)
    if r.shape != ln.shape:
        raise ValueError(f"gfpo_keep: {r.size} rewards but {ln.size} lengths")
    if not 0 < k <= r.size:
        raise ValueError(f"gfpo_keep: k must lie in [1, {r.size}], got {k}")
    if metric == "length":
        key = ln
    elif metric == "token_efficiency":
        key = -r / np.maximum(ln, 1.0)
    else:
        raise ValueError(f"gfpo_keep: metric must be 'length' or 'token_efficiency', got {metric!r}")
    return np.argsort(key, kind="stable")[:k]


def gfpo_advantages(rewards: Sequence[float], kept: Sequence[int], eps: float = 1e-6) -> np.ndarray:
    """GFPO advantages: GRPO-normalised over the retained subset S, 0 outside it.

    ``A_i = (r_i - mean_S) / (std_S + eps)`` for i in S (unbiased std; a one-element or
    equal-reward S gives 0). Shapes: (G,), (k,) -> (G,). Example: r [1,0,1,0], S {0,1}
    -> [0.7071, -0.7071, 0, 0].
    """
    r = np.asarray(rewards, dtype=np.float64)
    s = np.asarray(kept, dtype=np.int64)
    a = np.zeros_like(r)
    if s.size < 2:
        return a
    sub = r[s]
    sd = sub.std(ddof=1)
    if sd > 0:
        a[s] = (sub - sub.mean()) / (sd + eps)
    return a


# ---------------------------------------------------------------------------------------------
# Length control
# ---------------------------------------------------------------------------------------------


def overlong_mask(finish_reasons: Sequence[str], lengths: Sequence[int] | None = None,
                  max_len: int | None = None) -> np.ndarray:
    """DAPO overlong filtering: 1 = keep in the loss, 0 = truncated (no EOS) sample.

    A sample is truncated when ``finish_reason == "length"`` or, if given, ``length > max_len``.
    Shapes: (G,) -> (G,) uint8. Example: ["stop", "length"] -> [1, 0].
    """
    m = np.array([fr != "length" for fr in finish_reasons], dtype=bool)
    if lengths is not None and max_len is not None:
        m &= np.asarray(lengths) <= max_len
    return m.astype(np.uint8)


class OverlongFilter:
    """DAPO overlong filtering (arXiv 2503.14476): truncated samples are masked out of the loss.

    Rule: loss weight 0 for samples that hit the length limit (finish_reason ``length``). The
    soft overlong *punishment* (a reward term) is a Filter signal and lives in ``gfcr.filters``.
    """

    def __init__(self, max_len: int | None = None):
        self.max_len = max_len

    def mask(self, rollouts: Sequence[Any]) -> np.ndarray:
        """(G,) uint8 loss mask for rollouts (objects with finish_reason and n_generated)."""
        return overlong_mask([r.finish_reason for r in rollouts], [r.n_generated for r in rollouts], self.max_len)


# ---------------------------------------------------------------------------------------------
# Early exit
# ---------------------------------------------------------------------------------------------


def tail_ngram_count(tokens: Sequence[int], n: int) -> int:
    """How often the last n-gram of ``tokens`` occurs in ``tokens`` (overlaps counted).

    Shapes: (T,) -> int; 0 when T < n. Example: [1,2,1,2,1,2], n=2 -> 3.
    """
    t = np.asarray(tokens)
    if n <= 0 or t.size < n:
        return 0
    win = np.lib.stride_tricks.sliding_window_view(t, n)
    return int(np.count_nonzero(np.all(win == t[-n:], axis=1)))


@dataclass
class EarlyExit:
    """Early-exit rules for a generation in progress (Kimi k1.5 repeat detection, arXiv 2501.12599;
    answer-then-stop as in the survey's Control stage).

    Rules: ``repetition`` when the last ``ngram`` tokens occurred ``max_repeats`` times or more;
    ``answered`` when ``extract(text)`` finds an answer and ``verify(answer)`` accepts it.
    Departure: Kimi's exact repeat detector is NOT FOUND; the n-gram count is ours.
    """

    ngram: int = 16
    max_repeats: int = 4
    extract: Callable[[str], str | None] | None = None
    verify: Callable[[str], bool] | None = None
    check_every: int = 1
    reasons: list[str] = field(default_factory=list)

    def should_stop(self, token_ids: Sequence[int], text: str | None = None) -> str | None:
        """``"repetition"``, ``"answered"`` or None (keep generating)."""
        if len(token_ids) % self.check_every:
            return None
        if self.max_repeats > 0 and tail_ngram_count(token_ids, self.ngram) >= self.max_repeats:
            return "repetition"
        if text is not None and self.extract is not None:
            ans = self.extract(text)
            if ans is not None and (self.verify is None or self.verify(ans)):
                return "answered"
        return None


# ---------------------------------------------------------------------------------------------
# Staleness (AReaL)
# ---------------------------------------------------------------------------------------------


def staleness_capacity(eta: int, version: int, batch_size: int, n_accepted: int, n_running: int,
                       max_concurrent: int) -> int:
    """AReaL's admission capacity: how many new generation requests may start now.

    ``min(max_concurrent − running, (η + v + 1)·B − (accepted + running))``; <= 0 blocks.
    Example: η=1, v=2, B=4, accepted=10, running=3, max 8 -> min(5, 16 − 13) = 3.
    """
    return int(min(max_concurrent - n_running, (eta + version + 1) * batch_size - (n_accepted + n_running)))


class StalenessBound:
    """AReaL bounded staleness (arXiv 2505.24298): cap in-flight samples by policy-version lag.

    Rule: new requests only while :func:`staleness_capacity` > 0 (``mode="wait"``); finished
    samples whose lag ``v_now − v_behaviour`` exceeds η are dropped (``mode="drop"``; in
    ``"wait"`` mode they are kept because admission already bounded them). Versions are the
    integer trainer steps (the record's ``step``), not the string ``policy_version``.
    """

    def __init__(self, eta: int = 4, batch_size: int = 1, max_concurrent: int = 1 << 30, mode: str = "drop"):
        if eta < 0:
            raise ValueError(f"StalenessBound: eta must be >= 0, got {eta}")
        if mode not in ("drop", "wait"):
            raise ValueError(f"StalenessBound: mode must be 'drop' or 'wait', got {mode!r}")
        self.eta, self.batch_size, self.max_concurrent, self.mode = eta, batch_size, max_concurrent, mode

    def capacity(self, version: int, n_accepted: int, n_running: int) -> int:
        return staleness_capacity(self.eta, version, self.batch_size, n_accepted, n_running, self.max_concurrent)

    def accept(self, behaviour_steps: Sequence[int], version: int) -> np.ndarray:
        """(N,) bool: which finished samples may enter the batch at trainer version ``version``."""
        lag = version - np.asarray(behaviour_steps, dtype=np.int64)
        if np.any(lag < 0):
            raise ValueError("StalenessBound: a sample's step is newer than the current version")
        if self.mode == "wait":
            return np.ones(lag.shape, dtype=bool)
        return lag <= self.eta


SAMPLE_CONTROLS: dict[str, type] = {
    "overlong_filter": OverlongFilter,
    "early_exit": EarlyExit,
    "staleness_bound": StalenessBound,
}


def make_sample_control(name: str, **params: Any) -> Any:
    """Build a per-sample control by its name in :data:`SAMPLE_CONTROLS`."""
    try:
        cls = SAMPLE_CONTROLS[name.lower()]
    except KeyError:
        raise ValueError(f"unknown sample control {name!r}; choose one of {sorted(SAMPLE_CONTROLS)}") from None
    return cls(**params)
