"""Paired comparisons: two models on the same prompts. Exact McNemar for a binary outcome per prompt
(greedy pass@1); a paired bootstrap interval of the mean difference with a sign-flip permutation
p-value otherwise (pass@k, avg@k).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from gfcr.evaluate.metrics import EvalResult, pass_at_k


@dataclass
class PairedDiff:
    """Model A minus model B on one metric, paired per prompt.

    ``diff`` is the mean per-prompt difference; ``ci_low``/``ci_high`` its paired percentile
    bootstrap interval; ``p_value`` two-sided (sign-flip permutation test for ``paired_bootstrap``,
    exact binomial for ``mcnemar``). ``a_better``/``b_better`` count prompts where one side is
    higher (for McNemar: the discordant pairs).
    """

    metric: str
    n: int
    diff: float
    ci_low: float
    ci_high: float
    p_value: float
    a_better: int
    b_better: int
    test: str

    @property
    def significant(self) -> bool:
        """The interval excludes 0 and p < 0.05."""
        return self.p_value < 0.05 and (self.ci_low > 0 or self.ci_high < 0)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "significant": self.significant}


def paired_bootstrap(a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray, n_boot: int = 2000,
                     alpha: float = 0.05, seed: int = 0, n_perm: int = 10000, metric: str = "") -> PairedDiff:
    """Paired comparison of per-prompt values ``a[i]`` vs ``b[i]`` (same prompts, same order).

    Interval: percentile bootstrap of the mean difference, prompts resampled with replacement
    (the pair moves together). p-value: sign-flip permutation test of the per-prompt differences
    (under H0 each difference is as likely ``+d`` as ``−d``); exact over all ``2^n`` flips when
    ``n <= 16``, else ``n_perm`` random flips with the ``(hits + 1) / (n_perm + 1)`` estimator.

    Example: a = [1, 1, 1, 0], b = [0, 0, 1, 0] → d = [1, 1, 0, 0], diff 0.5; zeros do not move
    under a flip, and of the 4 sign patterns of the two ones, 2 give |sum| >= 2 → p = 0.5.
    """
    x, y = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError(f"paired values need the same 1-D shape, got {x.shape} and {y.shape}")
    if x.size == 0:
        raise ValueError("no prompts to compare")
    d = x - y
    obs = abs(d.mean())
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, d.size, size=(n_boot, d.size))
    lo, hi = np.quantile(d[idx].mean(axis=1), [alpha / 2, 1 - alpha / 2])
    nz = d[d != 0]
    if nz.size == 0:
        p = 1.0
    elif nz.size <= 16:
        signs = ((np.arange(2 ** nz.size)[:, None] >> np.arange(nz.size)) & 1) * 2 - 1
        p = float(np.mean(np.abs((signs * nz).sum(axis=1)) >= obs * d.size - 1e-9))
    else:
        signs = rng.choice(np.array([-1.0, 1.0]), size=(n_perm, nz.size))
        hits = int(np.sum(np.abs((signs * nz).sum(axis=1)) >= obs * d.size - 1e-9))
        p = (hits + 1) / (n_perm + 1)
    return PairedDiff(metric, int(d.size), float(d.mean()), float(lo), float(hi), min(1.0, p),
                      int((d > 0).sum()), int((d < 0).sum()), "paired_bootstrap+sign_flip")


def mcnemar(a: Sequence[bool], b: Sequence[bool], alpha: float = 0.05, metric: str = "") -> PairedDiff:
    """Exact McNemar test of two paired binary outcomes per prompt (e.g. greedy correct).

    Only discordant prompts count: ``n01`` (A right, B wrong) and ``n10`` (B right, A wrong);
    under H0 ``n01 ~ Binomial(n01 + n10, 1/2)``; two-sided p = ``min(1, 2·P(X <= min(n01, n10)))``.
    The interval is the Wald interval of the difference of paired proportions,
    ``(n01 − n10)/n ± z·sqrt(n01 + n10 − (n01 − n10)²/n)/n``.

    Example: 10 prompts, A alone right on 6, B alone right on 1 → diff 0.5, p = 2·P(X <= 1 | 7, ½)
    = 2·8/128 = 0.125.
    """
    from math import comb, sqrt

    x, y = np.asarray(a, bool), np.asarray(b, bool)
    if x.shape != y.shape or x.ndim != 1 or x.size == 0:
        raise ValueError(f"paired outcomes need the same non-empty 1-D shape, got {x.shape} and {y.shape}")
    n = int(x.size)
    n01, n10 = int(np.sum(x & ~y)), int(np.sum(~x & y))
    m = n01 + n10
    p = 1.0 if m == 0 else min(1.0, 2 * sum(comb(m, i) for i in range(min(n01, n10) + 1)) / 2 ** m)
    diff = (n01 - n10) / n
    z = float(_norm_ppf(1 - alpha / 2))
    half = z * sqrt(max(m - (n01 - n10) ** 2 / n, 0.0)) / n
    return PairedDiff(metric, n, diff, diff - half, diff + half, p, n01, n10, "mcnemar_exact")


def _norm_ppf(q: float) -> float:
    """Standard normal quantile."""
    from statistics import NormalDist

    return NormalDist().inv_cdf(q)


def per_prompt_values(res: EvalResult | Mapping[str, Any], metric: str) -> dict[str, float]:
    """``prompt_id → value`` of ``metric`` (``pass@k``, ``avg@n``, ``greedy_pass@1``) from an
    evaluation's ``per_prompt`` rows (an :class:`EvalResult` or its ``to_dict()``)."""
    rows = res.per_prompt if isinstance(res, EvalResult) else res["per_prompt"]
    out: dict[str, float] = {}
    for r in rows:
        if metric == "greedy_pass@1":
            if "greedy_correct" not in r:
                raise ValueError("no greedy verdicts in this evaluation")
            out[r["prompt_id"]] = float(bool(r["greedy_correct"]))
        elif metric.startswith("pass@"):
            out[r["prompt_id"]] = pass_at_k(int(r["n"]), int(r["correct"]), int(metric[5:]))
        elif metric.startswith("avg@"):
            out[r["prompt_id"]] = r["correct"] / r["n"]
        else:
            raise ValueError(f"unknown metric {metric!r}; use pass@k, avg@n or greedy_pass@1")
    return out


def compare_paired(a: EvalResult | Mapping[str, Any], b: EvalResult | Mapping[str, Any], metric: str,
                   n_boot: int = 2000, seed: int = 0) -> PairedDiff:
    """A minus B on ``metric`` over the prompts both evaluated, paired per prompt: McNemar for
    greedy pass@1 (binary per prompt), paired bootstrap + sign-flip test otherwise.
    Refuses two evaluations that share no prompt."""
    va, vb = per_prompt_values(a, metric), per_prompt_values(b, metric)
    ids = sorted(set(va) & set(vb))
    if not ids:
        raise ValueError("the two evaluations share no prompt: a paired comparison needs the same prompts")
    if metric == "greedy_pass@1":
        return mcnemar([va[i] > 0.5 for i in ids], [vb[i] > 0.5 for i in ids], metric=metric)
    return paired_bootstrap([va[i] for i in ids], [vb[i] for i in ids], n_boot=n_boot, seed=seed, metric=metric)
