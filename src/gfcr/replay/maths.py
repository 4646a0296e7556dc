"""Pure maths of the replay buffers (numpy; shapes and a worked example in each docstring)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from gfcr.records import GENERATED, Rollout


def shape_importance(w: np.ndarray | float, gamma: float = 0.1) -> np.ndarray:
    """ExGRPO policy shaping of an off-policy importance weight: ``f(w) = w / (w + gamma)``.

    Shapes: any -> same. Example: w=1, γ=0.1 -> 0.9091; w=0.1 -> 0.5.
    """
    w = np.asarray(w, dtype=np.float64)
    return w / (w + gamma)


def exgrpo_bucket_weight(k: np.ndarray | float, group_size: int, sigma: float = 1.0) -> np.ndarray:
    """ExGRPO bucket weight: Gaussian density ``N(k; μ=K/2, σ)`` over the correct count k.

    Shapes: any -> same. Example: K=8, σ=1: k=4 -> 0.3989, k=6 -> 0.0540.
    """
    k = np.asarray(k, dtype=np.float64)
    mu = group_size / 2.0
    return np.exp(-0.5 * ((k - mu) / sigma) ** 2) / (sigma * np.sqrt(2.0 * np.pi))


def max_variance_subset(rewards: Sequence[float], k: int) -> np.ndarray:
    """RePO ``max_variance_k``: indices of the k-subset with the largest reward variance.

    A maximum-variance subset of reals is made of extremes (the j largest and k−j smallest), so
    all j in [0, k] are tried; ties go to the larger reward sum. Shapes: (N,) -> (k,).
    Example: [1, 1, 0, 0, 1], k=2 -> one 1 and one 0: indices [0, 2].
    """
    r = np.asarray(rewards, dtype=np.float64)
    k = min(k, r.size)
    high = np.argsort(-r, kind="stable")  # high -> low, ties by index
    low = np.argsort(r, kind="stable")  # low -> high, ties by index
    best, best_key = high[:k], (-np.inf, -np.inf)
    for j in range(k + 1):
        idx = np.concatenate([high[:j], low[: k - j]])
        if len(set(idx.tolist())) != k:
            continue
        key = (float(r[idx].var()), float(r[idx].sum()))
        if key > best_key:
            best, best_key = idx, key
    return np.sort(best)


def split_advantages(on_rewards: Sequence[float], off_rewards: Sequence[float], mode: str = "split",
                     eps: float = 1e-4) -> tuple[np.ndarray, np.ndarray]:
    """RePO advantages for G fresh and R replayed samples of one prompt.

    ``split``: each set normalised by its own mean and std; ``mixed``: one group of G+R.
    ``A = (r − mean) / (std + eps)`` with the **unbiased** std (``torch.std``, RePO's
    ``replay_grpo_trainer.py`` L1452, L1468); a set of one gets 0 (torch gives nan there).
    Shapes: (G,), (R,) -> (G,), (R,). Example split: off [1, 0, 0, 0] -> mean 0.25, std 0.5 ->
    [1.5, −0.5, −0.5, −0.5] (up to eps); on [1, 1] -> [0, 0].
    """
    on = np.asarray(on_rewards, dtype=np.float64)
    off = np.asarray(off_rewards, dtype=np.float64)

    def norm(x: np.ndarray, ref: np.ndarray) -> np.ndarray:
        if ref.size < 2:
            return np.zeros_like(x)
        return (x - ref.mean()) / (ref.std(ddof=1) + eps)

    if mode == "split":
        return norm(on, on), norm(off, off)
    if mode == "mixed":
        both = np.concatenate([on, off])
        return norm(on, both), norm(off, both)
    raise ValueError(f"split_advantages: mode must be 'split' or 'mixed', got {mode!r}")


def stage_rng(seed: int, step: int, stage: str) -> np.random.Generator:
    """A generator that depends only on (seed, step, stage), so a resumed run, the loop and the
    simulator draw the same numbers (the loop's ``mix`` uses stage ``"replay"``)."""
    return np.random.default_rng([int(seed), int(step), sum(ord(c) * 31**i for i, c in enumerate(stage)) % (2**31)])


def mean_token_nll(rollout: Rollout) -> float:
    """Mean negative behaviour log-prob of a rollout's generated tokens (an entropy proxy)."""
    lp = rollout.logprobs[rollout.token_role == GENERATED]
    return float(-lp.mean()) if lp.size else 0.0


def is_correct(rollout: Rollout, threshold: float = 0.5) -> bool:
    """Verifier verdict when there is one, else ``reward >= threshold``."""
    if rollout.verified is not None:
        return bool(rollout.verified)
    return float(rollout.reward) >= threshold


def n_loss_tokens(r: Rollout) -> float:
    """Generated tokens of a rollout that take a loss (the first token never does)."""
    return float(np.count_nonzero(np.asarray(r.token_role)[1:] == GENERATED))


def repo_set_weights(replayed: Sequence[bool], sizes: Sequence[float], coef: float = 1.0) -> np.ndarray:
    """Loss weights that turn one mean over a batch into RePO's two means added (``split``).

    ``replayed`` (N,) marks the off-policy rows, ``sizes`` (N,) each row's share of the batch's
    denominator (1 per row for the seq-mean aggregations, its loss tokens for token-mean). The
    batch mean ``Σ_i w_i·ℓ_i / Σ sizes`` then equals ``Σ_on ℓ_i / Σ_on sizes + coef·Σ_off ℓ_i /
    Σ_off sizes``: ``w = S/S_on`` on fresh rows, ``coef·S/S_off`` on replayed rows (a set that is
    empty gets no weight to rescale). Shapes: (N,), (N,) -> (N,).
    Example: 4 fresh + 3 replayed rows, sizes 1 -> [7/4]*4 + [7/3]*3, i.e. per-row weights
    1/4 and 1/3 of the loss instead of 1/7 each.
    """
    off = np.asarray(replayed, dtype=bool)
    n = np.asarray(sizes, dtype=np.float64)
    total, s_on, s_off = n.sum(), n[~off].sum(), n[off].sum()
    w = np.ones(len(off))
    if s_on > 0:
        w[~off] = total / s_on
    if s_off > 0:
        w[off] = coef * total / s_off
    return w
