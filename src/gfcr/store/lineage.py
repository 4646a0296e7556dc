"""Lineage: which stored rollouts trained a checkpoint, fresh and replayed, and at which steps.

A checkpoint saved after step ``S`` of run ``R`` was trained by the updates of steps ``0..S``. The
update of step ``t`` trained on

* the *fresh* rollouts generated at step ``t`` that group control kept for the update (``gfcr train``
  records ``meta["trained"] = true`` on them; ``false`` on those it dropped);
* the *replayed* rollouts the replay buffer mixed in at step ``t``: a stored row whose
  ``meta["replayed_at_step"]`` (an int or a list) holds ``t`` (``gfcr train`` annotates the original row),
  or a replayed copy stored at step ``t`` (``signals["replayed"] > 0``, as some imports write them).

A row without a ``trained`` flag (an import, or a store written before the flag) is *unknown*: it
is listed apart, never counted as trained. :func:`lineage` reads the run's rows of steps ``<= S``
(ids, steps, rewards, signals, meta; no tokens).

Example: fresh rows a (step 0, trained), b (step 0, dropped), c (step 1, trained) and a replayed at
step 1: ``lineage(store, R, 1)`` lists a at steps [0, 1], c at [1]; per step: 0 -> 1 fresh,
1 -> 1 fresh + 1 replayed; b is not listed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

#: the columns :func:`lineage` reads
COLUMNS = ["rollout_id", "step", "prompt_id", "reward", "verified", "signals", "meta"]


@dataclass
class Used:
    """One rollout that trained the checkpoint: generated at ``step``, trained at ``trained_at``
    (sorted); ``fresh``: trained at its own step; ``replayed``: the later steps it was replayed at."""

    rollout_id: str
    step: int
    prompt_id: str
    reward: float | None
    verified: bool | None
    trained_at: list[int]
    fresh: bool
    replayed: list[int] = field(default_factory=list)


@dataclass
class Lineage:
    """What trained checkpoint (``run``, ``step``): the rollouts used (:class:`Used`), per training step
    the counts ``{"fresh": n, "replayed": m}``, and the ids of rows whose use is unknown."""

    run: str
    step: int
    used: list[Used]
    per_step: dict[int, dict[str, int]]
    unknown: list[str]

    @property
    def rollout_ids(self) -> list[str]:
        return [u.rollout_id for u in self.used]


def _steps(x: Any) -> list[int]:
    xs = x if isinstance(x, list) else [x]
    return [int(v) for v in xs if isinstance(v, int | float) and not isinstance(v, bool)]


def lineage(store: Any, run: str, step: int) -> Lineage:
    """The rollouts of run ``run`` that trained the checkpoint saved after step ``step`` (see the module
    docstring). A run the store does not hold is a ``ValueError``."""
    if store.count(where=f"run_id = '{run.replace(chr(39), chr(39) * 2)}'") == 0:
        runs = sorted({r["run_id"] for r in store.stats()})
        raise ValueError(f"no run {run!r} in the store; runs: {', '.join(runs[:8]) or 'none'}")
    t = store.scan(run=run, steps=(0, int(step)), columns=COLUMNS)
    cols = {c: t.column(c).to_pylist() for c in COLUMNS}
    used: list[Used] = []
    unknown: list[str] = []
    per_step: dict[int, dict[str, int]] = {}

    def count(s: int, kind: str) -> None:
        per_step.setdefault(s, {"fresh": 0, "replayed": 0})[kind] += 1

    for i, rid in enumerate(cols["rollout_id"]):
        meta = json.loads(cols["meta"][i] or "{}")
        meta = meta if isinstance(meta, dict) else {}
        s = int(cols["step"][i])
        signals = cols["signals"][i] or []
        sig = dict(signals) if isinstance(signals, list) else dict(signals or {})
        copy = float(sig.get("replayed") or 0.0) > 0  # a replayed copy: used at its own step, as a replay
        trained = meta.get("trained")
        own = trained is True and not copy
        replays = sorted(({s} if copy else set()) | {t for t in _steps(meta.get("replayed_at_step")) if s < t <= step})
        if not own and not replays:
            if trained is None and not copy:
                unknown.append(rid)
            continue
        if own:
            count(s, "fresh")
        for at in replays:
            count(at, "replayed")
        used.append(Used(rid, s, cols["prompt_id"][i], cols["reward"][i], cols["verified"][i],
                         sorted(({s} if own else set()) | set(replays)), own, replays))
    used.sort(key=lambda u: (u.step, u.rollout_id))
    return Lineage(run, int(step), used, dict(sorted(per_step.items())), sorted(unknown))
