"""EPTree decoded as one growing batch (continuous batching), for engines with ``generate_growing``.

The round-by-round :meth:`gfcr.generate.topologies.EPTree.generate` waits for every root path of
every prompt before the first branch starts, then for every first-round branch before the second
round: three short, sequential decode loops whose batches shrink as rows finish. Here each root
tree advances on its own: the moment a root path ends, its first-round forks (which depend only on
that path) join the running batch; the moment all first-round branches of a root are done, its
second-round forks join; and so on. The forking rule is the same (:func:`choose_forks` over the
same members of the same root tree, with the same window and the same used positions), so a tree
has the same shape and leaf count; only the timing differs.

Determinism: a root path's seed is ``derive_seed(seed, prompt, step, "root") + root`` (what the
round-by-round path gives sample ``root`` of its one request), a branch's seed derives from the
branch's place in its tree (round, parent path, position), and ``sample_index`` is assigned at the
end in a fixed order (roots, then branches by round, root, fork and sample), so the order in which
rows happen to finish changes nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from gfcr.generate.engines.base import GenRequest, GenResult
from gfcr.generate.rollouts import (
    derive_seed,
    encode_prompt,
    group_id_of,
    rollout_from_result,
    token_entropies,
)
from gfcr.generate.tree_forks import choose_forks
from gfcr.records import Prompt, Rollout


class _Tree:
    """One root's tree: its member paths (root first), their keys, entropies, fork ends."""

    def __init__(self, pi: int, root: int):
        self.pi, self.root = pi, root
        self.paths: list[Rollout] = []
        self.keys: list[str] = []
        self.order: list[tuple[int, int, int, int]] = []  # (round, root, fork, sample): final order
        self.ents: list[np.ndarray | None] = []
        self.ends: list[int | None] = []
        self.used: set[tuple[int, int]] = set()  # (member, offset)
        self.round = 0
        self.pending = 0


def grow_trees(tree: Any, engine: Any, prompts: Sequence[Prompt], run_id: str, step: int) -> list[Rollout]:
    """The rollouts of ``tree`` (an :class:`~gfcr.generate.topologies.EPTree`) for ``prompts``,
    decoded with ``engine.generate_growing`` (see the module docstring).

    Long because: ``follow`` and ``next_round`` are closures over the trees being grown and the request tags:
    the state the growing batch calls back into.
    """
    version = engine.policy_version
    prompt_ids = [encode_prompt(engine, p) for p in prompts]
    P = [len(ids) for ids in prompt_ids]
    trees = [[_Tree(pi, r) for r in range(tree.m)] for pi in range(len(prompts))]
    reqs: list[GenRequest] = []
    tags: list[tuple[Any, ...]] = []  # per request: ("root", tree) or ("branch", tree, member, pos, round, fork)
    for pi, (p, ids) in enumerate(zip(prompts, prompt_ids, strict=True)):
        base = derive_seed(tree.seed, p.prompt_id, step, "root")
        for r in range(tree.m):
            seed = None if base is None else base + r
            reqs.append(GenRequest(prompt_ids=ids, params=tree.params.model_copy(update={"n": 1, "seed": seed})))
            tags.append(("root", trees[pi][r]))

    def add(tr: _Tree, ro: Rollout, res: GenResult, key: str, order: tuple[int, int, int, int],
            prefix_ent: Any, n_before: int, continued: bool) -> None:
        tr.paths.append(ro)
        tr.keys.append(key)
        tr.order.append(order)
        tr.ents.append(token_entropies(res, n_before, prefix_ent, continued=continued))
        tr.ends.append(tree._fork_ends(engine, [ro])[0])

    def next_round(tr: _Tree) -> list[GenRequest]:
        tr.round += 1
        if tr.round > tree.t:
            return []
        pi, p0 = tr.pi, P[tr.pi]
        ents = [-a.logprobs[p0:].astype(np.float64) for a in tr.paths]
        starts = [(a.branch_pos - p0) if a.parent_id is not None else 0 for a in tr.paths]
        picks = choose_forks(ents, starts, tree.n, tree.min_prefix_frac, ends=tr.ends, used=sorted(tr.used))
        new = []
        for f, (k, off) in enumerate(picks):
            tr.used.add((k, off))
            a, pos = tr.paths[k], p0 + off
            params = tree.params.model_copy(update={
                "n": tree.l, "max_tokens": tree.params.max_tokens - off,
                "seed": derive_seed(tree.seed, prompts[pi].prompt_id, step, "branch", tr.round, tr.keys[k], pos),
            })
            new.append(GenRequest(prompt_ids=a.token_ids[:pos].tolist(), params=params))
            tags.append(("branch", tr, k, pos, tr.round, f))
        tr.pending = len(new)
        return new

    def follow(i: int, results: list[GenResult]) -> list[GenRequest]:
        tag = tags[i]
        tr: _Tree = tag[1]
        p = prompts[tr.pi]
        gid = group_id_of(p.prompt_id, step, run_id)
        if tag[0] == "root":
            req = reqs[i]
            ro = rollout_from_result(engine, p, results[0], prompt_ids[tr.pi], req.params, run_id, step, tr.root, gid,
                                     version, meta={"tree": {"root": tr.root, "round": 0, "prompt_index": tr.pi}})
            add(tr, ro, results[0], f"r{tr.root}", (0, tr.root, 0, 0), None, P[tr.pi], False)
            return next_round(tr)
        _, _, k, pos, rnd, f = tag
        a = tr.paths[k]
        parent_ent = tr.ents[k]
        for j, r in enumerate(results):
            prefix_ent = None if parent_ent is None else parent_ent[:pos]
            child = rollout_from_result(
                engine, p, r, None, tree.params, run_id, step, -1, a.group_id, version,
                parent_id=a.rollout_id, branch_pos=pos, prefix_entropies=prefix_ent,
                prefix_ids=a.token_ids[:pos], prefix_role=a.token_role[:pos], prefix_logprobs=a.logprobs[:pos],
                meta={"tree": {"root": tr.root, "round": rnd, "prompt_index": tr.pi,
                               "fork_entropy_proxy": -float(a.logprobs[pos]),
                               "fork_offset": pos - P[tr.pi], "parent_gen_tokens": a.n_generated}},
            )
            add(tr, child, r, f"{tr.keys[k]}/{pos}.{j}", (rnd, tr.root, f, j), prefix_ent, pos, True)
        tr.pending -= 1
        return next_round(tr) if tr.pending == 0 else []

    engine.generate_growing(reqs, follow)
    out: list[Rollout] = []
    for per_prompt in trees:
        members = [(o, ro) for tr in per_prompt for o, ro in zip(tr.order, tr.paths, strict=True)]
        members.sort(key=lambda x: x[0])
        for idx, (_, ro) in enumerate(members):
            ro.sample_index = idx
            out.append(ro)
    return out
