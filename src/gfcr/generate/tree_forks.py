"""EPTree's forking rule and the token accounting that compares trees with groups per leaf.

Pure functions over entropies and stored rollouts (no engine): :func:`choose_forks` picks a tree's
forking points, :func:`fork_end` is TreeRL's "no fork after the answer" mask, and
:func:`token_accounting` / :func:`tree_token_saving` count what a tree actually sampled. Used by
:class:`gfcr.generate.topologies.EPTree` and :mod:`gfcr.generate.tree_growing`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from gfcr.records import GENERATED, Rollout


def choose_forks(
    entropies: Sequence[np.ndarray],
    seg_starts: Sequence[int],
    n: int,
    min_prefix_frac: float = 0.5,
    ends: Sequence[int | None] | None = None,
    used: Iterable[tuple[int, int]] = (),
) -> list[tuple[int, int]]:
    """The ``n`` forking points of one tree: EPTree's highest ``-log p`` tokens, preferring late ones.

    Offsets count generated tokens (offset 0 = the first token after the prompt). Path ``a`` may
    fork only inside its own segment, ``[seg_starts[a], ends[a])``, at an offset not in ``used``.
    A candidate is *in the window* when its offset is ``>= ceil(min_prefix_frac * G_a)``, with
    ``G_a = len(entropies[a])`` the path's generated length (shared prefix included). Candidates
    are ranked: in-window first, then by entropy proxy (descending), then path and offset
    (ascending, so ties are deterministic). The window is a preference, not a cut: a tree whose
    window holds fewer than ``n`` candidates is filled from outside it, so the leaf count stays
    ``m(1 + t·n·l)`` whenever the paths have tokens at all.

    Args:
        entropies: per path, float ``[G_a]`` entropy proxy ``-log pi(token)`` of each generated token.
        seg_starts: per path, the offset where its own segment starts (0 for a root).
        n: forking points to return.
        min_prefix_frac: in ``[0, 1)``; 0 gives TreeRL's plain top-``n``.
        ends: per path, offsets ``>=`` this are never candidates (``None`` = no limit); used for
            TreeRL's "no fork after the answer is announced" mask.
        used: ``(path, offset)`` pairs already forked.
    Returns:
        up to ``n`` ``(path, offset)`` pairs, best first.

    Example: one path with entropies ``[5, 1, 2, 3]``, ``n = 2``: ``min_prefix_frac = 0`` picks
    offsets 0 and 3; ``min_prefix_frac = 0.5`` (window = offsets 2, 3) picks 3 and 2.
    """
    if not 0.0 <= min_prefix_frac < 1.0:
        raise ValueError(f"min_prefix_frac must be in [0, 1), got {min_prefix_frac}")
    done = set(used)
    cand = []
    for a, ent in enumerate(entropies):
        g = len(ent)
        lo = math.ceil(min_prefix_frac * g)
        end = g if ends is None or ends[a] is None else min(g, int(ends[a]))
        for j in range(int(seg_starts[a]), end):
            if (a, j) not in done:
                cand.append((j < lo, -float(ent[j]), a, j))
    cand.sort()
    return [(a, j) for _, _, a, j in cand[: max(n, 0)]]


def fork_end(tokens: Sequence[str], words: Sequence[str]) -> int | None:
    """TreeRL's answer mask: offsets after the first token containing one of ``words`` (case-insensitive) are no forks.

    Returns that token's offset + 1 (the token itself may still be resampled), or ``None`` when no
    token matches. Example: tokens ``["So", " the", " answer", " is", " 4"]``, words ``["answer"]`` → 3.
    """
    ws = [w.lower() for w in words if w]
    for i, s in enumerate(tokens):
        low = s.lower()
        if any(w in low for w in ws):
            return i + 1
    return None


@dataclass
class TokenAccounting:
    """Generated tokens of a set of rollouts, per leaf (every rollout is a leaf).

    ``leaf_tokens`` counts each leaf's generated tokens as a trajectory (a tree leaf's shared
    prefix is counted again in every leaf); ``sampled_tokens`` counts what the engine actually
    sampled (a tree child only from its branch point on). For a group both are equal.
    """

    leaves: int
    leaf_tokens: int
    sampled_tokens: int

    @property
    def sampled_per_leaf(self) -> float:
        return self.sampled_tokens / self.leaves if self.leaves else 0.0

    @property
    def leaf_tokens_per_leaf(self) -> float:
        return self.leaf_tokens / self.leaves if self.leaves else 0.0

    def to_dict(self) -> dict[str, float]:
        return {"leaves": self.leaves, "leaf_tokens": self.leaf_tokens, "sampled_tokens": self.sampled_tokens,
                "sampled_per_leaf": round(self.sampled_per_leaf, 2), "leaf_tokens_per_leaf": round(self.leaf_tokens_per_leaf, 2)}


def sampled_tokens(rollout: Rollout) -> int:
    """Tokens the engine sampled for this rollout: all generated tokens of a root or group sample,
    those from ``branch_pos`` on for a tree child (read from the token structure, not from ``cost``)."""
    n_gen = rollout.n_generated
    if rollout.parent_id is None or rollout.branch_pos is None:
        return n_gen
    return int(np.count_nonzero(rollout.token_role[int(rollout.branch_pos):] == GENERATED))


def token_accounting(rollouts: Sequence[Rollout]) -> TokenAccounting:
    """:class:`TokenAccounting` of ``rollouts`` (a tree's or a group's)."""
    return TokenAccounting(
        leaves=len(rollouts),
        leaf_tokens=sum(r.n_generated for r in rollouts),
        sampled_tokens=sum(sampled_tokens(r) for r in rollouts),
    )


def tree_token_saving(tree: Sequence[Rollout], group: Sequence[Rollout]) -> float:
    """``1 - (sampled tokens per leaf of tree) / (sampled tokens per leaf of group)``: > 0 when the tree is cheaper per leaf."""
    t, g = token_accounting(tree), token_accounting(group)
    if not t.leaves or not g.sampled_tokens:
        raise ValueError("tree_token_saving needs non-empty rollouts and a group that sampled tokens")
    return 1.0 - t.sampled_per_leaf / g.sampled_per_leaf
