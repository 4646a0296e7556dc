"""GRESO's pure rules (arXiv 2506.02177; code Infini-AI-Lab/GRESO): the keep probability after a
zero-variance streak, the group test that extends a streak, the step adaptation of the exploration
probabilities and the adaptive rollout batch. :class:`gfcr.control.selectors.GRESO` uses them."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def greso_keep_prob(k_easy: np.ndarray, k_hard: np.ndarray, p_easy: float, p_hard: float,
                    min_keep: float = 0.01) -> np.ndarray:
    """GRESO keep (explore) probability per prompt.

    ``keep = max(p_easy**k_easy, min_keep)`` when the prompt is on an easy streak (k_easy > 0),
    else ``max(p_hard**k_hard, min_keep)``; a prompt on no streak (or never seen) is always kept.

    Shapes: k_easy, k_hard (N,) int -> (N,) float. Example: k_easy=3, p_easy=0.5 -> 0.125.
    """
    k_easy = np.asarray(k_easy)
    k_hard = np.asarray(k_hard)
    keep = np.ones(k_easy.shape, dtype=np.float64)
    easy = k_easy > 0
    hard = (~easy) & (k_hard > 0)
    keep[easy] = np.maximum(np.power(p_easy, k_easy[easy].astype(np.float64)), min_keep)
    keep[hard] = np.maximum(np.power(p_hard, k_hard[hard].astype(np.float64)), min_keep)
    return keep


#: how GRESO tests a group (:func:`greso_group_kind`)
GRESO_GROUP_TESTS = ("each", "mean")


def greso_group_kind(rewards: Sequence[float] | np.ndarray, easy_threshold: float = 0.98,
                     hard_threshold: float = 0.11, test: str = "each") -> tuple[bool, bool]:
    """(all-correct, all-wrong) for one group of rewards, as GRESO's streaks count them.

    ``"each"``: every reward >= easy_threshold / <= hard_threshold; ``"mean"``: the mean against them
    (GRESO's code literally: the same on its 1.0/0.1/0.0 scale at n = 8, not on 0/1 rewards).
    Shapes: (K,) -> two bools. Example: K = 10, ``[1] + [0] * 9``: "each" -> (False, False);
    "mean" -> (False, True), as mean 0.1 <= 0.11.
    """
    r = np.asarray(rewards, dtype=np.float64)
    if test == "each":
        return bool(r.min() >= easy_threshold), bool(r.max() <= hard_threshold)
    if test == "mean":
        m = float(r.mean())
        return m >= easy_threshold, (m < easy_threshold) and m <= hard_threshold
    raise ValueError(f"GRESO: group_test must be one of {GRESO_GROUP_TESTS}, got {test!r}")


def greso_adapt(p: float, observed_ratio: float, target: float, delta: float = 0.01,
                p_min: float = 0.05, p_max: float = 0.95) -> float:
    """One GRESO step of an exploration probability toward its zero-variance target share.

    Too many zero-variance groups of this kind (``observed_ratio >= target``) -> explore less
    (``p - delta``, floored at p_min); otherwise explore more (``p + delta``, capped at p_max).
    Example: p=0.5, observed 0.3 >= target 0.1667 -> 0.49.
    """
    if observed_ratio >= target:
        return max(p - delta, p_min)
    return min(p + delta, p_max)


def greso_batch_size(remaining: int, zero_var_ratio: float, n: int, default_bs: int,
                     min_bs: int = 64, margin: float = 1.25) -> int:
    """GRESO's adaptive rollout batch (in prompts): ``remaining / (1 - zv) / n * margin``.

    ``remaining`` counts responses still needed for the train batch, ``n`` responses per prompt;
    the result is clipped to [min_bs, default_bs]. Example: remaining=1024, zv=0.5, n=8 -> 320.
    """
    zv = min(max(zero_var_ratio, 0.0), 0.99)
    bs = int(np.ceil(remaining / (1.0 - zv) / n * margin))
    return int(min(max(bs, min_bs), default_bs))
