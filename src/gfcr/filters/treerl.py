"""TreeRL per-token advantages of tree rollouts (a Filter signal; arXiv 2506.11902).

A tree (one ``group_id``) is a set of leaf paths; path ``c`` with parent ``p`` and branch position
``b`` shares tokens ``[0, b)`` with ``p``. A *segment* is a maximal run of tokens shared by the same
set of leaves; ``V(s)`` is the mean reward of those leaves, ``n(s)`` their count, and the root is the
prompt (all ``N`` leaves). With ``c(x) = V(x) − V(root)``:

``reference`` (default): ``R(s) = c(s)/√n(s) + (c(s)/√n(s) − c(p)/√n(p))``, ``p`` the segment before
``s``. This is THUDM/TreeRL's own scaling (``openrlhf/trainer/ppo_utils/tree_node.py``
``compute_weighted_update`` divides every node's accumulated value by ``sqrt`` of *that* node's
leaf count before ``parallel_mcts.py`` ``path_from_root_to_node`` takes ``child − parent``, and
``gather_paths`` with ``use_state_value_reward`` adds the child's own value: ``value + state_value``).

``segment`` (the earlier variant, kept for comparison): ``R(s) = ((V(s) − V(root)) + (V(s) − V(p))) / √n(s)``,
i.e. both terms scaled by the segment's own count.

Worked example (``tests/filters/test_treerl.py``): leaves rewarded [1, 1, 0], the first two share
a segment (n = 2). On the first leaf's own segment, reference gives 1/3 + 1/3 − (1/3)/√2 = 0.431;
segment gives ((1 − 2/3) + (1 − 1))/1 = 0.333.

Departures from the reference code: its leaves are RLOO-centred (``leaf_normalize``: ``R − mean of
the others``, i.e. ×N/(N−1) of ``R − mean``) and a token-weighted mean is subtracted from every
node (``normalize_all_steps``, ``overall_norm_style="token"``); both are left out here, so the
values are those of plain mean-centring. Nodes whose value difference is exactly 0 are not
back-filled from the previous node (``fill_in_paths``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np

from gfcr.records import GENERATED, Rollout

Scaling = Literal["reference", "segment"]
SCALINGS: tuple[str, ...] = ("reference", "segment")


def shared_prefix_lengths(parents: Sequence[int | None], branch_pos: Sequence[int | None], lengths: Sequence[int]) -> np.ndarray:
    """Structural shared-prefix length between every pair of tree paths.

    Path ``c`` with parent ``p`` and branch position ``b`` shares tokens ``[0, b)`` with ``p`` (and
    was sampled afresh from ``b`` on). Two paths share the minimum branch position on the way to
    their deepest common ancestor path. ``parents`` ``[n]`` (``None`` for a root path; roots share
    the prompt), ``branch_pos`` ``[n]`` (roots: the prompt length), ``lengths`` ``[n]`` → int
    ``[n, n]`` with ``S[a, a] = lengths[a]``.
    """
    n = len(parents)
    chains: list[dict[int | None, int]] = []
    for a in range(n):
        chain: dict[int | None, int] = {a: int(lengths[a])}
        cur, m = a, int(lengths[a])
        while cur is not None:
            m = min(m, int(branch_pos[cur]))
            cur = parents[cur]
            chain[cur] = m  # cur None = the prompt (virtual root)
        chains.append(chain)
    S = np.zeros((n, n), dtype=np.int64)
    for a in range(n):
        for b in range(n):
            ca, cb = chains[a], chains[b]
            for z in cb:  # nearest first: the deepest common ancestor
                if z in ca:
                    S[a, b] = min(ca[z], cb[z])
                    break
    return S


def tree_values(parents: Sequence[int | None], branch_pos: Sequence[int | None], lengths: Sequence[int],
                rewards: Sequence[float]) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Per path and token ``t``: ``V_t`` = mean reward of the leaves sharing tokens ``[0..t]`` with
    it, and their count. Returns ``(values, counts)``: float / int ``[len_a]`` arrays per path."""
    S = shared_prefix_lengths(parents, branch_pos, lengths)
    r = np.asarray(rewards, dtype=np.float64)
    values, counts = [], []
    for a in range(len(parents)):
        M = S[a][None, :] > np.arange(int(lengths[a]))[:, None]  # [len_a, n]
        c = M.sum(1)
        values.append((M @ r) / np.maximum(c, 1))
        counts.append(c)
    return values, counts


def tree_advantages(parents: Sequence[int | None], branch_pos: Sequence[int | None], lengths: Sequence[int],
                    rewards: Sequence[float], prompt_len: int, scaling: Scaling = "reference") -> list[np.ndarray]:
    """TreeRL per-token advantages, one float32 ``[len_a]`` array per path (prompt tokens get 0).

    ``scaling`` is ``reference`` (TreeRL's code) or ``segment`` (see the module docstring).
    """
    if scaling not in SCALINGS:
        raise ValueError(f"TreeRL scaling must be one of {SCALINGS}, got {scaling!r}")
    values, counts = tree_values(parents, branch_pos, lengths, rewards)
    v_root = float(np.mean(np.asarray(rewards, dtype=np.float64)))
    n_root = len(parents)
    out = []
    for v, c in zip(values, counts, strict=True):
        adv = np.zeros(len(v), dtype=np.float64)
        start = 0
        for t in range(len(v)):
            if t > 0 and c[t] != c[t - 1]:
                start = t
            if t < prompt_len:
                continue
            v_p, n_p = (v[start - 1], c[start - 1]) if start > 0 else (v_root, n_root)
            if scaling == "segment":
                adv[t] = ((v[t] - v_root) + (v[t] - v_p)) / np.sqrt(c[t])
            else:
                own = (v[t] - v_root) / np.sqrt(c[t])
                adv[t] = own + own - (v_p - v_root) / np.sqrt(max(n_p, 1))
        out.append(adv.astype(np.float32))
    return out


def tree_advantages_for(rollouts: Sequence[Rollout], scaling: Scaling = "reference") -> dict[str, np.ndarray]:
    """:func:`tree_advantages` over stored tree rollouts (one tree = one ``group_id``), from ``reward``.
    Returns ``rollout_id → float32 [len(token_ids)]``."""
    out: dict[str, np.ndarray] = {}
    groups: dict[str, list[Rollout]] = {}
    for r in rollouts:
        groups.setdefault(r.group_id, []).append(r)
    for rs in groups.values():
        idx = {r.rollout_id: i for i, r in enumerate(rs)}
        prompt_len = int(np.argmax(rs[0].token_role == GENERATED)) if rs[0].n_generated else len(rs[0].token_ids)
        parents = [idx.get(r.parent_id) if r.parent_id else None for r in rs]
        bps = [r.branch_pos if r.parent_id else prompt_len for r in rs]
        adv = tree_advantages(parents, bps, [len(r.token_ids) for r in rs], [r.reward for r in rs], prompt_len, scaling)
        out.update({r.rollout_id: a for r, a in zip(rs, adv, strict=True)})
    return out
