"""Group advantage estimators over rollouts, and per-token terms added on top (Filter signals).

An estimator maps one group of rollouts (a prompt's K samples, one tree, a replay-mixed group) to
one advantage per rollout: a float, or a float32 array aligned to the rollout's ``token_ids``
(TreeRL). Name → factory table: :data:`ESTIMATORS`; :func:`make_estimator`.

======================  ==========================================================================
name                    rule (maths in :mod:`gfcr.filters.signals` / :mod:`gfcr.filters.treerl`)
======================  ==========================================================================
``grpo``                (r − mean) / (std_unbiased + 1e-6)          DeepSeekMath, arXiv 2402.03300
``dr_grpo``             r − mean                                     Dr. GRPO, arXiv 2503.20783
``rloo``                r − mean of the others                       arXiv 2402.14740
``seed_grpo``           (r − mean) · f(α · SE / log G)               SEED-GRPO, arXiv 2505.12346
``treerl``              per-token TreeRL values of the tree          TreeRL, arXiv 2506.11902
``reward``              the reward itself (no baseline)              AdaptThink's "naive" advantage
``judge``               GRPO of reward + w · pairwise/listwise score  gfcr.filters.pairwise
======================  ==========================================================================

**Per-token terms.** :func:`with_token_terms` adds ``Σ coef · term(rollout)`` (each term a float
array aligned to ``token_ids``, 0 on context tokens) to whatever the estimator gave, so a signal
such as an on-policy distillation term (a teacher's per-token log-prob minus the behaviour
log-prob, stored as a rollout signal) joins the RL advantage without a new code path: register a
factory in :data:`TOKEN_TERMS` and name it in the config. Example: estimator advantage 0.5 on a
rollout of 4 tokens (2 context), term ``[0, 0, -0.2, 0.1]`` with coef 2 → ``[0.5, 0.5, 0.1, 0.7]``
on the generated tokens (context tokens are never trained, whatever their value).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np

from gfcr.filters.signals import ADVANTAGES, seed_grpo_advantages
from gfcr.filters.teacher import TeacherKL
from gfcr.filters.treerl import OVERALL_NORMS, SCALINGS, tree_advantages_for
from gfcr.records import Rollout

Advantage = float | np.ndarray
GroupAdvantage = Callable[[Sequence[Rollout]], list[Advantage]]


class TokenTerm(Protocol):
    """A per-token signal of one rollout: float ``[len(token_ids)]`` (0 on context tokens)."""

    def __call__(self, rollout: Rollout) -> np.ndarray: ...


#: name → factory of a :class:`TokenTerm` (keyword arguments from ``signals.token_terms[i].params``)
TOKEN_TERMS: dict[str, Callable[..., TokenTerm]] = {
    "teacher_kl": TeacherKL,  # on-policy distillation: −(log p − log q_teacher) per generated token
}


def answer_cluster(r: Rollout) -> str:
    """The semantic cluster of a rollout: the verifier's extracted final answer (``extracted`` /
    ``parsed`` / ``answer`` in its evidence), else the stripped completion text."""
    ev = (r.verifier or {}).get("evidence") or {}
    for key in ("value", "extracted", "parsed", "answer"):
        v = ev.get(key) if isinstance(ev, dict) else None
        if v is not None:
            return str(v)
    return r.completion.strip()


class _Scalar:
    def __init__(self, name: str):
        self.fn = ADVANTAGES[name]

    def __call__(self, rollouts: Sequence[Rollout]) -> list[Advantage]:
        return self.fn([r.reward for r in rollouts]).tolist()


class SeedGRPO:
    """SEED-GRPO advantages: clusters are :func:`answer_cluster`; ``likelihood`` weighs clusters by
    the rollouts' summed behaviour log-probs instead of counting them (see :mod:`gfcr.filters.signals`)."""

    def __init__(self, alpha: float = 1.0, form: str = "linear", estimator: str = "mc", likelihood: bool = False):
        if form not in ("linear", "exp", "focal") or estimator not in ("mc", "plugin"):
            raise ValueError(f"seed_grpo: form must be linear/exp/focal and estimator mc/plugin, got {form!r}, {estimator!r}")
        self.alpha, self.form, self.estimator, self.likelihood = alpha, form, estimator, likelihood

    def __call__(self, rollouts: Sequence[Rollout]) -> list[Advantage]:
        lp = [float(r.logprobs.sum()) for r in rollouts] if self.likelihood else None
        adv = seed_grpo_advantages([r.reward for r in rollouts], [answer_cluster(r) for r in rollouts], lp,
                                   self.alpha, self.form, self.estimator)  # type: ignore[arg-type]
        return [float(a) for a in adv]


class TreeRL:
    """TreeRL per-token advantages of one tree (``scaling``: ``reference`` or ``segment``;
    ``overall_norm``: ``none``, TreeRL's script, or ``token``, its token-mean shift)."""

    def __init__(self, scaling: str = "reference", overall_norm: str = "none"):
        if scaling not in SCALINGS:
            raise ValueError(f"treerl: scaling must be one of {SCALINGS}, got {scaling!r}")
        if overall_norm not in OVERALL_NORMS:
            raise ValueError(f"treerl: overall_norm must be one of {OVERALL_NORMS}, got {overall_norm!r}")
        self.scaling, self.overall_norm = scaling, overall_norm

    def __call__(self, rollouts: Sequence[Rollout]) -> list[Advantage]:
        if any(r.group_id != rollouts[0].group_id for r in rollouts):  # a replay-mixed "tree": not a tree
            return [float(np.mean(r.signals.get("advantage", 0.0))) for r in rollouts]
        tok = tree_advantages_for(rollouts, self.scaling, self.overall_norm)  # type: ignore[arg-type]
        return [tok[r.rollout_id] for r in rollouts]


class JudgeAdvantage:
    """GRPO over ``reward + weight · s``, ``s`` a pairwise or listwise judge's scores of the group
    (:mod:`gfcr.filters.pairwise`; written to ``signals["judge_<mode>"]``).

    ``judge``: a :class:`gfcr.filters.judge.JudgeConfig` mapping (an OpenAI-compatible judge), or
    ``"pkg.mod:fn"`` naming a ``Compare`` (pairwise) / ``Rank`` (listwise) callable. A group is judged
    once (its scores are memoised by rollout ids: the loop asks for a group's advantage twice).
    Example: rewards [1, 1, 0, 0], pairwise win rates [1, 1/3, 2/3, 0], weight 0.5 → GRPO of
    [1.5, 1.167, 0.333, 0].
    """

    def __init__(self, mode: str = "pairwise", judge: dict[str, Any] | str | None = None, weight: float = 0.5,
                 base: str = "grpo"):
        from gfcr.config import resolve_object
        from gfcr.filters.pairwise import llm_compare, llm_rank

        if mode not in ("pairwise", "listwise"):
            raise ValueError(f"judge: mode must be 'pairwise' or 'listwise', got {mode!r}")
        if judge is None:
            raise ValueError("judge: give judge: {base_url, model, ...} (an OpenAI-compatible judge) or 'pkg.mod:fn'")
        self.mode, self.weight, self.base = mode, float(weight), ADVANTAGES[base]
        self.judge = (resolve_object(judge, kind="judge") if isinstance(judge, str)
                      else (llm_compare if mode == "pairwise" else llm_rank)(judge))
        self._memo: dict[tuple[str, ...], np.ndarray] = {}

    def __call__(self, rollouts: Sequence[Rollout]) -> list[Advantage]:
        from gfcr.filters.pairwise import group_scores

        key = tuple(r.rollout_id for r in rollouts)
        if key not in self._memo:
            self._memo = {key: group_scores(rollouts, self.mode, self.judge)}  # keep only the latest group
        s = self._memo[key]
        return [float(a) for a in self.base([r.reward + self.weight * v for r, v in zip(rollouts, s, strict=True)])]


def _reward(rollouts: Sequence[Rollout]) -> list[Advantage]:
    return [float(r.reward) for r in rollouts]


ESTIMATORS: dict[str, Callable[..., GroupAdvantage]] = {
    "grpo": lambda: _Scalar("grpo"),
    "dr_grpo": lambda: _Scalar("dr_grpo"),
    "rloo": lambda: _Scalar("rloo"),
    "seed_grpo": SeedGRPO,
    "treerl": TreeRL,
    "reward": lambda: _reward,
    "judge": JudgeAdvantage,
}


def make_estimator(name: str, **params: Any) -> GroupAdvantage:
    """Build a group advantage estimator by its name in :data:`ESTIMATORS`."""
    try:
        factory = ESTIMATORS[name]
    except KeyError:
        raise ValueError(f"unknown advantage estimator {name!r}; choose one of {sorted(ESTIMATORS)}") from None
    return factory(**params)


def with_token_terms(estimator: GroupAdvantage, terms: Sequence[tuple[float, TokenTerm]],
                     base_coef: float = 1.0) -> GroupAdvantage:
    """``base_coef · estimator`` plus ``Σ coef · term(r)`` per token (the result is per-token when any
    term is given). ``base_coef = 0`` trains on the terms alone (pure on-policy distillation)."""
    if not terms and base_coef == 1.0:
        return estimator

    def composed(rollouts: Sequence[Rollout]) -> list[Advantage]:
        out: list[Advantage] = []
        for r, a in zip(rollouts, estimator(rollouts), strict=True):
            total = base_coef * np.broadcast_to(np.asarray(a, dtype=np.float64), (len(r.token_ids),)).copy()
            for coef, term in terms:
                t = np.asarray(term(r), dtype=np.float64)
                if t.shape != total.shape:
                    raise ValueError(f"rollout {r.rollout_id}: a token term has shape {t.shape}, expected {total.shape}")
                total += coef * t
            out.append(total.astype(np.float32))
        return out

    return composed
