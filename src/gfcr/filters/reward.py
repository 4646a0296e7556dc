"""One reward composition: verdict + format + overlong + length + PRM (+ AdaptThink) → ``reward``.

The training loop and re-verification (:func:`gfcr.filters.apply.reverify_store`) both call
:meth:`RewardComposition.apply` on a group, so re-verifying a store reproduces the rewards it
stores. Every part is recorded in ``rollout.signals`` and the recipe in
``rollout.verifier["reward_recipe"]``, so a stored rollout says how its reward was made.

Per rollout ``i`` of a group (``c_i`` = the verdict's score, ``signals["correctness"]``)::

    base_i    = c_i                                            (default)
              | ShorterBetter: α·1[verified_i] − β·|len_i − SOL|    (arXiv 2504.21370)
              | AdaptThink:    c_i − R̄_ref(prompt) + δ·1[no thinking_i]   (arXiv 2505.13417)
    reward_i  = base_i + format_bonus·format_i + overlong_i + prm_weight·PRM_i
    overlong_i = DAPO soft punishment of len_i (arXiv 2503.14476), 0 when off
    PRM_i      = aggregate(step scores_i) (Lightman et al., arXiv 2305.20050: product)

Example: c = [1, 0], format [1, 0], bonus 0.1, lengths [60, 64] with max 64 and buffer 8
(penalty [−0.5, −1] … the soft window starts at 56): rewards [1 + 0.1 − 0.5, 0 + 0 − 1] = [0.6, −1].

Control decisions (dynamic sampling, selectors, GFPO, VADE) read :func:`gfcr.records.accuracy`, the verdict,
not this shaped reward (``control.decide_on: reward`` switches back).
"""

from __future__ import annotations

import ast
import operator
import re
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from gfcr.filters.signals import dapo_overlong_penalty, prm_aggregate
from gfcr.records import GENERATED, Rollout, accuracy


def longest_generated_run(token_role: np.ndarray) -> int:
    """Length of the longest run of generated tokens (a multi-turn episode's longest policy turn,
    the length ``max_tokens`` caps). Example: roles [0, 0, 1, 1, 1, 0, 1, 1, 0] → 3; [0, 0] → 0."""
    gen = np.concatenate([[False], np.asarray(token_role) == GENERATED, [False]])
    edges = np.flatnonzero(np.diff(gen.astype(np.int8)))
    return int((edges[1::2] - edges[0::2]).max()) if edges.size else 0


# ---------------------------------------------------------------------------------------------
# Process scores (PRM-style step scorers)
# ---------------------------------------------------------------------------------------------

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}
_EQ = re.compile(r"(-?\d+(?:\.\d+)?(?:\s*[-+*/×x]\s*-?\d+(?:\.\d+)?)+)\s*=\s*(-?\d+(?:\.\d+)?)")


def _arith(node: ast.AST) -> float:
    if isinstance(node, ast.Expression):
        return _arith(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
        return float(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_arith(node.operand)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_arith(node.left), _arith(node.right))
    raise ValueError("not arithmetic")


def arith_step_scores(text: str) -> list[float]:
    """Rule-based process scores for arithmetic work: one score per stated equation ``a op b = c``
    (1 when the left side evaluates to the right, else 0). Example: "2 + 3 = 5, 5 * 2 = 11" → [1, 0]."""
    out = []
    for lhs, rhs in _EQ.findall(text):
        try:
            v = _arith(ast.parse(lhs.replace("×", "*").replace("x", "*"), mode="eval"))
        except (ValueError, SyntaxError, ZeroDivisionError):
            out.append(0.0)
            continue
        out.append(float(abs(v - float(rhs)) < 1e-9))
    return out


#: name → step scorer ``text -> per-step scores in [0, 1]``
STEP_SCORERS: dict[str, Callable[[str], list[float]]] = {"arith_steps": arith_step_scores}


def sol_rewards(correct: Sequence[bool], lengths: Sequence[int], alpha: float = 1.0, beta: float = 0.001) -> np.ndarray:
    """ShorterBetter rewards: ``r_j = α·1[correct_j] − β·|ℓ_j − ℓ_SOL|``.

    ``ℓ_SOL`` = shortest correct length in the group, or the group's mean length when none is
    correct. Shapes: (G,), (G,) -> (G,). Example: correct [T, F, T], lengths [10, 4, 6],
    α=1, β=0.1 -> ℓ_SOL=6 -> [0.6, -0.2, 1.0].
    """
    c = np.asarray(correct, dtype=bool)
    ln = np.asarray(lengths, dtype=np.float64)
    sol = ln[c].min() if c.any() else ln.mean()
    return alpha * c.astype(np.float64) - beta * np.abs(ln - sol)


class ShorterBetter:
    """ShorterBetter (arXiv 2504.21370): reward the Sample Optimal Length.

    Rule: :func:`sol_rewards`. Departures: β is NOT FOUND in the reference; default 0.001 per
    token is ours. The no-correct fallback uses the mean length (two of three secondary sources).
    """

    def __init__(self, alpha: float = 1.0, beta: float = 0.001):
        self.alpha, self.beta = alpha, beta

    def rewards(self, correct: Sequence[bool], lengths: Sequence[int]) -> np.ndarray:
        return sol_rewards(correct, lengths, self.alpha, self.beta)


def adaptthink_rewards(acc: Sequence[float], ref_mean: float, no_thinking: Sequence[bool],
                       delta: float = 0.05) -> np.ndarray:
    """AdaptThink reward: ``acc − R̄_ref + δ·1[no thinking]``.

    Shapes: (G,), scalar, (G,) -> (G,). Example: acc [1, 1, 0], ref 0.5, no_think [T, F, T],
    δ=0.05 -> [0.55, 0.5, -0.45].
    """
    a = np.asarray(acc, dtype=np.float64)
    nt = np.asarray(no_thinking, dtype=bool)
    return a - ref_mean + delta * nt.astype(np.float64)


class AdaptThink:
    """AdaptThink (arXiv 2505.13417): prefer answering without thinking when it is still right.

    Rule: :func:`adaptthink_rewards` with the reference model's mean accuracy on the prompt; the
    advantage is the reward itself (no group normalisation). δ default 0.05 (the paper's
    scripts). A response counts as no-thinking when its thinking segment is empty
    (:meth:`is_no_thinking`). Not implemented here: the importance-sampled first token of the
    paper's cold start (a training-loss detail).
    """

    def __init__(self, delta: float = 0.05, think_open: str = "<think>", think_close: str = "</think>"):
        self.delta, self.think_open, self.think_close = delta, think_open, think_close

    def is_no_thinking(self, text: str) -> bool:
        s = text.lstrip()
        if s.startswith(self.think_open):
            s = s[len(self.think_open):].lstrip()
        return s.startswith(self.think_close)

    def rewards(self, acc: Sequence[float], ref_mean: float, texts: Sequence[str]) -> np.ndarray:
        return adaptthink_rewards(acc, ref_mean, [self.is_no_thinking(t) for t in texts], self.delta)



def no_thinking(text: str, think_open: str = "<think>", think_close: str = "</think>") -> bool:
    """AdaptThink's NoThinking mode: the response opens with an empty thinking segment."""
    s = text.lstrip()
    if s.startswith(think_open):
        s = s[len(think_open):].lstrip()
    return s.startswith(think_close)


# ---------------------------------------------------------------------------------------------
# The composition
# ---------------------------------------------------------------------------------------------


@dataclass
class RewardComposition:
    """The recipe; :meth:`apply` writes ``reward`` and the parts into each rollout of a group.

    ``max_tokens`` is the generation budget (for the overlong window); ``length`` is
    ``{"alpha", "beta"}`` (ShorterBetter) or None; ``prm`` is ``{"scorer", "aggregate", "weight"}``
    or None; ``adapt_think`` is ``{"delta"}`` or None; ``per_turn_length`` measures a multi-turn
    episode's length as its longest policy turn.
    """

    format_bonus: float = 0.0
    max_tokens: int = 0
    overlong_buffer: int = 0
    overlong_penalty: float = 1.0
    length: dict[str, float] | None = None
    prm: dict[str, Any] | None = None
    adapt_think: dict[str, float] | None = None
    per_turn_length: bool = False
    ref_accuracy: dict[str, float] = field(default_factory=dict, repr=False)  # AdaptThink R̄_ref per prompt

    def recipe(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("ref_accuracy")
        return d

    @classmethod
    def from_recipe(cls, d: dict[str, Any]) -> RewardComposition:
        return cls(**d)

    def _length(self, r: Rollout) -> int:
        return longest_generated_run(r.token_role) if self.per_turn_length else r.n_generated

    def apply(self, group: Sequence[Rollout]) -> None:
        """Set ``reward`` of every rollout of one group (reads ``signals["correctness"]``, ``verified``,
        ``signals["format"]``, the tokens and the text; writes the parts it used into ``signals``)."""
        if not group:
            return
        c = np.array([float(r.signals.get("correctness", r.reward)) for r in group])
        lengths = np.array([self._length(r) for r in group])
        base = c.copy()
        if self.length is not None:
            base = sol_rewards([r.verified is True for r in group], [r.n_generated for r in group],
                               float(self.length.get("alpha", 1.0)), float(self.length.get("beta", 0.001)))
            for r, v in zip(group, base, strict=True):
                r.signals["length_reward"] = float(v)
        if self.adapt_think is not None:
            p = group[0].prompt_id
            ref = self.ref_accuracy.setdefault(p, float(np.mean([accuracy(r) for r in group])))
            nt = np.array([no_thinking(r.completion) for r in group], dtype=np.float64)
            base = c - ref + float(self.adapt_think.get("delta", 0.05)) * nt
            for r in group:
                r.signals["ref_accuracy"] = ref
        total = base + self.format_bonus * np.array([float(r.signals.get("format", 0.0)) for r in group])
        if self.overlong_buffer:
            pens = dapo_overlong_penalty(lengths, self.max_tokens, self.overlong_buffer, self.overlong_penalty)
            for r, pen in zip(group, pens, strict=True):
                r.signals["overlong_penalty"] = float(pen)
            total = total + pens
        if self.prm is not None:
            scorer = STEP_SCORERS[self.prm.get("scorer", "arith_steps")]
            how = self.prm.get("aggregate", "product")
            prm = np.array([prm_aggregate(scorer(r.completion), how) for r in group])
            for r, v in zip(group, prm, strict=True):
                r.signals["prm"] = float(v)
            total = total + float(self.prm.get("weight", 1.0)) * prm
        recipe = self.recipe()
        for r, v in zip(group, total, strict=True):
            r.reward = float(v)
            r.verifier = {**(r.verifier or {}), "reward_recipe": recipe}

    def seed_ref_accuracy(self, rollouts: Sequence[Rollout]) -> None:
        """Restore AdaptThink's per-prompt reference accuracies from stored rollouts (resume)."""
        for r in rollouts:
            if "ref_accuracy" in r.signals:
                self.ref_accuracy.setdefault(r.prompt_id, float(r.signals["ref_accuracy"]))
