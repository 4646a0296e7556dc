"""Partial rollouts and long-tail control (Kimi k1.5, arXiv 2501.12599, §2.6.2 "Partial Rollouts").

Rule (the report's text, as the survey summarises it): each step generates at most a fixed token
budget per rollout; a trajectory that reaches the budget unfinished is kept and *continued* in the
next steps, so a long chain of thought is produced over several iterations and no step waits for
the longest sample of its batch. Here:

* :class:`PartialPool` caps a step's generation at ``budget`` new tokens per rollout. A rollout
  cut by the cap (``finish_reason == "length"`` below the run's ``max_tokens``) is *unfinished*; its
  group is held (not verified, not trained, not stored) and its unfinished members continue the next
  step from their own tokens (``prompt + generated so far`` as ``prompt_ids``) under the then current
  policy, for up to ``budget`` more tokens. A group trains in the step its last member finishes (a
  group advantage needs every member's reward).
* Every continued rollout keeps the **behaviour log-probs of each segment** as sampled (the update's
  ratio is taken against them, so older segments are off-policy rows like replay; ``loss.tis_cap``
  bounds their weight) and the **policy version of every token** as run-length pairs
  ``meta["token_versions"] = [[version, n_tokens], ...]`` (:func:`token_versions` expands them);
  ``policy_version`` stays the first segment's, so the loop's lag and staleness bound see the
  oldest token. ``meta["partial_steps"]`` counts the steps it spanned.
* :func:`long_tail_schedule` is the same rule over bare lengths (the simulator's): per step the
  synchronous batch's wall time is its longest member's new tokens, and the decode slots idle while
  it waits are the long tail's waste.

Departures: Kimi's budget value and its treatment of old segments in the loss are not in the
public text (NOT FOUND in the reference); here old segments train with their stored behaviour
log-probs, like any stale row. Kimi also stops repetitive rollouts early (``generate.repeat_ngram``,
a separate option).

Resume: the held pool is saved with every checkpoint (:func:`save_pool`, ``partial_pool.arrow`` in
the checkpoint folder: the held rollouts bit-exact, with their group boundaries) and restored by
:func:`load_pool`; before a step's store append the loop also writes the pool after that step and
the order of the groups it returned (``partial_pending.arrow`` in the run folder), so a run killed
between append and checkpoint replays that step from the store and continues with the same pool.
A resumed run then equals an uninterrupted one: same tokens, behaviour log-probs and token versions.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from gfcr.records import GENERATED, Rollout

#: the caller's continuation: (rollouts, max new tokens each) -> per rollout (token ids, logprobs, finish reason)
Continue = Callable[[Sequence[Rollout], Sequence[int]], Sequence[tuple[Any, Any, str]]]


def token_versions(meta: dict[str, Any], n_generated: int, default: int = 0) -> np.ndarray:
    """Per generated token, the policy version that sampled it: ``[n_generated]`` int.

    ``meta["token_versions"]`` holds run-length pairs ``[[version, count], ...]`` in token order;
    a rollout without them was sampled in one piece by ``default``.
    Example: ``{"token_versions": [[3, 2], [4, 3]]}``, 5 tokens → ``[3, 3, 4, 4, 4]``.
    """
    runs = meta.get("token_versions")
    if not runs:
        return np.full(n_generated, default, dtype=np.int64)
    out = np.concatenate([np.full(int(c), int(v), dtype=np.int64) for v, c in runs])
    if len(out) != n_generated:
        raise ValueError(f"token_versions cover {len(out)} tokens, the rollout generated {n_generated}")
    return out


def _add_run(meta: dict[str, Any], version: int, n: int) -> None:
    runs = [list(x) for x in meta.get("token_versions", [])]
    if n <= 0:
        return
    if runs and runs[-1][0] == version:
        runs[-1][1] += n
    else:
        runs.append([version, n])
    meta["token_versions"] = runs


@dataclass
class PartialPool:
    """The held groups of a run with partial rollouts (``generate.partial_budget``).

    ``budget``: most new tokens per rollout per step; ``max_tokens``: a rollout's total cap.
    """

    budget: int
    max_tokens: int
    held: list[list[Rollout]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.budget < 1 or self.max_tokens < 1:
            raise ValueError(f"partial rollouts: budget ({self.budget}) and max_tokens ({self.max_tokens}) must be >= 1")

    def unfinished(self, r: Rollout) -> bool:
        """Cut by the step's budget, not by the run's ``max_tokens`` or a stop."""
        return r.finish_reason == "length" and r.n_generated < self.max_tokens

    def admit(self, groups: Sequence[Sequence[Rollout]], version: int) -> list[list[Rollout]]:
        """Fresh groups of this step: stamp each token's version; return the complete groups, hold the rest."""
        done = []
        for g in groups:
            for r in g:
                r.meta.setdefault("partial_steps", 1)
                if "token_versions" not in r.meta:
                    _add_run(r.meta, version, r.n_generated)
            (self.held.append(list(g)) if any(self.unfinished(r) for r in g) else done.append(list(g)))
        return done

    def resume(self, cont: Continue, version: int, step: int) -> list[list[Rollout]]:
        """Continue every held group's unfinished members by up to ``budget`` tokens (one ``cont`` call:
        the rollouts and each one's token allowance → per rollout ``(token_ids, logprobs, finish_reason)``,
        the caller's engine call); return the groups that are now complete (their rollouts re-stamped
        ``step``), keep the others."""
        todo = [r for g in self.held for r in g if self.unfinished(r)]
        if todo:
            outs = cont(todo, [min(self.budget, self.max_tokens - r.n_generated) for r in todo])
            for r, (ids, lps, finish) in zip(todo, outs, strict=True):
                extend(r, np.asarray(ids), np.asarray(lps), finish, version)
        done, keep, moved = [], [], {id(r) for r in todo}
        for g in self.held:
            for r in g:
                if id(r) in moved:
                    r.meta["partial_steps"] = int(r.meta.get("partial_steps", 1)) + 1
            if any(self.unfinished(r) for r in g):
                keep.append(g)
            else:
                for r in g:
                    r.meta["started_step"] = int(r.meta.get("started_step", r.step))
                    r.step = step
                done.append(g)
        self.held = keep
        return done

    def held_tokens(self) -> int:
        """Generated tokens of the held (not yet trained) rollouts."""
        return sum(r.n_generated for g in self.held for r in g)


POOL_FILE = "partial_pool.arrow"
PENDING_FILE = "partial_pending.arrow"


def save_pool(groups: Sequence[Sequence[Rollout]], path: str | Path, info: dict[str, Any] | None = None) -> Path:
    """Write held groups to an Arrow IPC file (the rollout schema, bit-exact) with their group sizes and
    ``info`` (JSON) in the schema metadata; written to a temp name and renamed into place.
    Example: ``save_pool([[a, b], [c]], p)`` → 3 rows, metadata ``group_sizes = [2, 1]``."""
    import pyarrow as pa

    from gfcr.records import rollouts_to_table

    path = Path(path)
    table = rollouts_to_table([r for g in groups for r in g], validate=False)
    meta = {b"gfcr.group_sizes": json.dumps([len(g) for g in groups]).encode(),
            b"gfcr.info": json.dumps(info or {}).encode()}
    table = table.replace_schema_metadata({**(table.schema.metadata or {}), **meta})
    tmp = path.with_name(f".tmp_{path.name}")
    with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_file(sink, table.schema) as w:
        w.write_table(table)
    os.replace(tmp, path)
    return path


def load_pool(path: str | Path, with_info: bool = False) -> Any:
    """The groups :func:`save_pool` wrote (``list[list[Rollout]]``), and its ``info`` when ``with_info``."""
    import pyarrow as pa

    from gfcr.records import table_to_rollouts

    with pa.memory_map(str(path), "r") as src:
        table = pa.ipc.open_file(src).read_all()
    md = table.schema.metadata or {}
    sizes = json.loads(md.get(b"gfcr.group_sizes", b"[]"))
    rs = table_to_rollouts(table)
    if sum(sizes) != len(rs):
        raise ValueError(f"{path}: the group sizes cover {sum(sizes)} rollouts, the file holds {len(rs)}")
    groups, i = [], 0
    for n in sizes:
        groups.append(rs[i:i + n])
        i += n
    return (groups, json.loads(md.get(b"gfcr.info", b"{}"))) if with_info else groups


def extend(r: Rollout, ids: np.ndarray, logprobs: np.ndarray, finish_reason: str, version: int) -> None:
    """Append a continuation segment to ``r`` in place: its tokens (role generated), their behaviour
    log-probs, the finish reason and the segment's policy version."""
    n = len(ids)
    r.token_ids = np.concatenate([np.asarray(r.token_ids), ids.astype(np.asarray(r.token_ids).dtype)])
    r.token_role = np.concatenate([np.asarray(r.token_role), np.full(n, GENERATED, dtype=np.asarray(r.token_role).dtype)])
    r.logprobs = np.concatenate([np.asarray(r.logprobs), logprobs.astype(np.float32)])
    r.finish_reason = finish_reason if finish_reason in ("stop", "length", "abort", "error") else "unknown"
    _add_run(r.meta, version, n)


@dataclass
class LongTail:
    """What :func:`long_tail_schedule` measures."""

    step_wall: np.ndarray  # [S] per step, the longest member's new tokens (a synchronous batch waits for it)
    idle_slot_tokens: float  # Σ over steps and slots of (step_wall − the slot's new tokens): decode capacity left idle
    generated: float  # Σ generated tokens
    completed: int  # rollouts finished within the run
    carried: int  # rollouts still unfinished at the end (their tokens are not trained yet)
    lag_mean: float  # mean steps between a finished rollout's first and last segment

    def to_dict(self) -> dict[str, float]:
        w = self.step_wall
        return {"steps": float(len(w)), "step_wall_mean": float(w.mean()) if len(w) else 0.0,
                "step_wall_p90": float(np.quantile(w, 0.9)) if len(w) else 0.0,
                "step_wall_max": float(w.max()) if len(w) else 0.0,
                "idle_slot_tokens": self.idle_slot_tokens, "generated": self.generated,
                "idle_share": self.idle_slot_tokens / max(self.idle_slot_tokens + self.generated, 1.0),
                "completed": float(self.completed), "carried": float(self.carried), "lag_mean": self.lag_mean,
                "completed_per_kstep": 1000.0 * self.completed / max(float(w.sum()), 1.0)}


def long_tail_schedule(lengths: Sequence[np.ndarray], budget: int | None) -> LongTail:
    """Step-by-step generation of batches of rollouts with target lengths, full or partial.

    ``lengths[s]`` ``[B_s]``: the lengths of the rollouts that *start* at step ``s``; ``budget``:
    most new tokens per rollout per step (``None``: full rollouts, each step runs every rollout to its
    end). Each step decodes its new rollouts plus the carried ones; its wall time is the longest new
    segment; ``idle_slot_tokens`` sums, per step, ``wall − segment`` over the step's rollouts. Runs
    ``len(lengths)`` steps; what is unfinished then is ``carried``.
    Example: ``[[1, 9], [], []]``: full → walls [9, 0, 0], idle 8; budget 3 → walls [3, 3, 3], idle 2.
    """
    rem: list[tuple[int, int]] = []  # (remaining tokens, start step)
    walls, idle, gen, lags = [], 0.0, 0.0, []
    s = 0
    while s < len(lengths):
        new = [(int(x), s) for x in (lengths[s] if s < len(lengths) else [])]
        active = rem + new
        seg = np.array([r if budget is None else min(r, budget) for r, _ in active], dtype=np.float64)
        wall = float(seg.max()) if len(seg) else 0.0
        walls.append(wall)
        idle += float((wall - seg).sum())
        gen += float(seg.sum())
        rem = []
        for (r, s0), g in zip(active, seg, strict=True):
            if r - g > 0:
                rem.append((int(r - g), s0))
            else:
                lags.append(s - s0)
        s += 1
    return LongTail(np.array(walls), idle, gen, len(lags), len(rem), float(np.mean(lags)) if lags else 0.0)
