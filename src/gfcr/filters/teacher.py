"""The teacher signal of on-policy distillation, as a Filter signal: per-token advantages from a
teacher's log-probs of the tokens the student sampled (pure numpy; the teachers themselves and the
scoring live in :mod:`gfcr.train.distill`).

Each generated token ``x_t`` gets ``A_t = −(log p(x_t) − log q(x_t))``: minus the sampled-token
estimate of the reverse KL between the student ``p`` (the stored behaviour log-probs) and the
teacher ``q``. Trained with the policy-gradient loss this descends ``KL(p ‖ q)`` on the student's
own samples (see :mod:`gfcr.train.distill` for the derivation and the reference code). As a
:class:`gfcr.filters.advantages.TokenTerm` named ``teacher_kl`` it is added, with its coefficient,
to whatever the group advantage estimator gives.

The teacher's log-probs are stored on the rollout as ``meta["teacher"] = {"name", "logprobs"}``, one
float per generated token in order (:func:`teacher_logprobs_of`).
"""

from __future__ import annotations

import numpy as np

from gfcr.records import GENERATED, Rollout


class MissingTeacherError(ValueError):
    """A rollout has no stored teacher log-probs."""


def discounted_future_sum(x: np.ndarray, gamma: float) -> np.ndarray:
    """``out[t] = Σ_{s ≥ t} γ^{s−t} x[s]``, ``[T] → [T]``. Example: ``x = [1, 1, 1]``, ``γ = 0.5``
    → ``[1.75, 1.5, 1]``."""
    out = np.zeros(len(x), dtype=np.float64)
    acc = 0.0
    for t in range(len(x) - 1, -1, -1):
        acc = float(x[t]) + gamma * acc
        out[t] = acc
    return out


def distill_token_advantages(behaviour_logp: np.ndarray, teacher_logp: np.ndarray, token_role: np.ndarray,
                             coef: float = 1.0, discount: float = 0.0) -> np.ndarray:
    """Per-token distillation advantages aligned to a rollout's ``token_ids``.

    Args:
        behaviour_logp: ``[T]`` the stored sampling log-probs (0 on context tokens).
        teacher_logp: ``[G]`` the teacher's log-prob of each *generated* token, in order
            (``G = (token_role == 1).sum()``).
        token_role: ``[T]`` 0 context, 1 generated.
        coef: the reverse-KL coefficient.
        discount: ``γ`` of the discounted future sum over generated tokens (0 = each token its own
            term, the reference code's default).
    Returns:
        float32 ``[T]``: ``−coef·(log p(x_t) − log q(x_t))`` on generated tokens, 0 on context.

    Example: behaviour ``[0, log .5, log .5]``, role ``[0, 1, 1]``, teacher ``[log .25, log .5]``,
    coef 1 → ``[0, −ln 2, 0] = [0, −0.693, 0]``.
    """
    role = np.asarray(token_role)
    gen = role == GENERATED
    t = np.asarray(teacher_logp, dtype=np.float64)
    if t.shape != (int(gen.sum()),):
        raise ValueError(f"teacher log-probs have shape {t.shape}, expected ({int(gen.sum())},): one per generated token")
    per = -float(coef) * (np.asarray(behaviour_logp, dtype=np.float64)[gen] - t)
    if discount > 0:
        per = discounted_future_sum(per, float(discount))
    out = np.zeros(len(role), dtype=np.float32)
    out[gen] = per.astype(np.float32)
    return out


def teacher_logprobs_of(r: Rollout) -> np.ndarray:
    """The stored per-generated-token teacher log-probs of a rollout."""
    t = r.meta.get("teacher")
    if not isinstance(t, dict) or "logprobs" not in t:
        raise MissingTeacherError(f"rollout {r.rollout_id} has no teacher log-probs (meta.teacher): "
                                  "score it with gfcr.train.distill.score_rollouts (gfcr train's distill section)")
    return np.asarray(t["logprobs"], dtype=np.float32)


class TeacherKL:
    """The ``teacher_kl`` token term: ``r ↦ distill_token_advantages(r.logprobs, teacher, r.token_role,
    discount=discount)`` (its coefficient comes from the config's ``coef``)."""

    def __init__(self, discount: float = 0.0):
        if not 0.0 <= discount <= 1.0:
            raise ValueError(f"teacher_kl: discount must be in [0, 1], got {discount}")
        self.discount = float(discount)

    def __call__(self, r: Rollout) -> np.ndarray:
        return distill_token_advantages(r.logprobs, teacher_logprobs_of(r), r.token_role, discount=self.discount)
