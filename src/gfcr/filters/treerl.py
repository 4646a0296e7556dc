"""TreeRL per-token advantages of tree rollouts (a Filter signal; arXiv 2506.11902).

A tree (one ``group_id``) is a set of leaf paths; path ``c`` with parent ``p`` and branch position
``b`` shares tokens ``[0, b)`` with ``p``. A *segment* (TreeRL's node) is a maximal run of tokens
shared by the same set of leaves; ``V(s)`` is the mean reward of those leaves, ``n(s)`` their count,
and the root is the prompt (all ``N`` leaves).

``reference`` (default) is THUDM/TreeRL's code at its script's settings (``scripts/treerl-qw14b.sh``
→ ``train_reinforce_ray.py``; ``openrlhf/trainer/ppo_utils/tree_node.py`` and ``parallel_mcts.py``):

1. leaves are RLOO-centred (``tree_node.py`` ``leaf_normalize``: ``R_i − mean of the others`` =
   ``N/(N−1)·(R_i − mean)``) and summed up the tree (``leaf_backpropagate``), so a node's mean is
   ``c(s) = N/(N−1)·(V(s) − V(root))``;
2. ``overall_norm`` ``token`` (``normalize_all_steps``) subtracts the token-weighted mean
   ``m = Σ_i R'_i·L_i / Σ_i L_i`` (``L_i`` the generated tokens of leaf i) from every node; the
   script leaves ``--overall_norm_style`` at its default ``none`` (``train_reinforce_ray.py``), so
   ``m = 0`` by default;
3. ``compute_weighted_update`` (``weighted_value_style sqrt``) divides each node's sum by
   ``√n(s)``, and ``path_from_root_to_node`` divides by ``n(s)``: the state value is
   ``u(s) = (c(s) − m)/√n(s)`` (the root: ``−m/√N``);
4. ``value = u(s) − u(parent)``; ``fill_in_paths`` replaces a value that is exactly 0 (below 1e-8)
   by the previous node's on the path (not on the path's first node); with
   ``--use_state_value_reward`` (``gather_paths``) every token of ``s`` gets ``value + u(s)``.

``segment`` (an earlier variant, kept for comparison): ``R(s) = ((V(s) − V(root)) + (V(s) −
V(p))) / √n(s)``: plain mean-centring, both terms over the segment's own count, no fill-in.

Worked example (``tests/filters/test_treerl.py``): leaves rewarded [1, 1, 0] (N = 3), the first two
share a segment (n = 2). On the first leaf's own segment, c = 3/2·(1 − 2/3) = 1/2 there and on the
shared segment, so reference gives 1/2 + (1/2 − (1/2)/√2) = 0.646 (0.431 without the RLOO factor
3/2); segment gives ((1 − 2/3) + (1 − 1))/1 = 0.333.

Departures from the reference code: none in the values; its tree harness samples ``num_traces``
of the leaves for training (``select_terminal``), here every leaf trains (``use_all_terminals``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np

from gfcr.records import GENERATED, Rollout

Scaling = Literal["reference", "segment"]
SCALINGS: tuple[str, ...] = ("reference", "segment")
OverallNorm = Literal["none", "token"]
OVERALL_NORMS: tuple[str, ...] = ("none", "token")


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
                    rewards: Sequence[float], prompt_len: int, scaling: Scaling = "reference",
                    overall_norm: OverallNorm = "none") -> list[np.ndarray]:
    """TreeRL per-token advantages, one float32 ``[len_a]`` array per path (prompt tokens get 0).

    ``scaling`` is ``reference`` (TreeRL's code) or ``segment``; ``overall_norm`` (reference only)
    is TreeRL's ``overall_norm_style``: ``none`` (its script) or ``token`` (see the module
    docstring). A tree of one leaf gets 0 everywhere (TreeRL's RLOO needs two leaves).
    Example: ``parents [None, 0, None]``, ``branch_pos [2, 4, 2]``, ``lengths [6, 6, 6]``,
    ``rewards [1, 1, 0]``, ``prompt_len 2`` → path 0 is ``[0, 0, 0.707, 0.707, 0.646, 0.646]``.
    """
    if scaling not in SCALINGS:
        raise ValueError(f"TreeRL scaling must be one of {SCALINGS}, got {scaling!r}")
    if overall_norm not in OVERALL_NORMS:
        raise ValueError(f"TreeRL overall_norm must be one of {OVERALL_NORMS}, got {overall_norm!r}")
    values, counts = tree_values(parents, branch_pos, lengths, rewards)
    r = np.asarray(rewards, dtype=np.float64)
    n_root = len(parents)
    v_root = float(r.mean()) if n_root else 0.0
    if scaling == "reference" and n_root < 2:
        return [np.zeros(int(n), dtype=np.float32) for n in lengths]
    loo = n_root / (n_root - 1) if n_root > 1 else 1.0
    m = 0.0
    if overall_norm == "token":
        gen = np.maximum(np.asarray(lengths, dtype=np.float64) - prompt_len, 0.0)
        m = float((loo * (r - v_root) * gen).sum() / max(gen.sum(), 1.0))

    def state(v: float, n: int) -> float:  # u(s) = (c(s) − m)/√n(s)
        return (loo * (v - v_root) - m) / np.sqrt(max(n, 1))

    out = []
    for v, c in zip(values, counts, strict=True):
        adv = np.zeros(len(v), dtype=np.float64)
        start, seg_start, prev_value, first = 0, -1, 0.0, True
        value = 0.0
        for t in range(len(v)):
            if t > 0 and c[t] != c[t - 1]:
                start = t
            if t < prompt_len:
                continue
            v_p, n_p = (v[start - 1], c[start - 1]) if start > 0 else (v_root, n_root)
            if scaling == "segment":
                adv[t] = ((v[t] - v_root) + (v[t] - v_p)) / np.sqrt(c[t])
                continue
            own = state(v[t], int(c[t]))
            if start != seg_start:  # a new node on the path: its value, filled in when exactly 0
                value = own - state(v_p, int(n_p))
                if abs(value) < 1e-8 and not first:
                    value = prev_value
                prev_value, seg_start, first = value, start, False
            adv[t] = value + own
        out.append(adv.astype(np.float32))
    return out


def tree_advantages_for(rollouts: Sequence[Rollout], scaling: Scaling = "reference",
                        overall_norm: OverallNorm = "none") -> dict[str, np.ndarray]:
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
        adv = tree_advantages(parents, bps, [len(r.token_ids) for r in rs], [r.reward for r in rs], prompt_len, scaling,
                              overall_norm)
        out.update({r.rollout_id: a for r, a in zip(rs, adv, strict=True)})
    return out
