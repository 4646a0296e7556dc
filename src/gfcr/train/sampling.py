"""The loop's sampling side: :class:`StepSampler` (what a group policy drives in ``gfcr train``) and
small helpers the loop shares with tests (seeded per-stage generators, stage timers, replay events)."""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from gfcr.records import Rollout
from gfcr.replay.buffers import stage_rng as step_rng  # noqa: F401  (re-exported)
from gfcr.train.run_setup import TrainError

if TYPE_CHECKING:
    from gfcr.train.loop import TrainingRun


def with_replay_events(meta: dict[str, Any], step: int, weights: list[float | None]) -> dict[str, Any]:
    """A copy of ``meta`` recording that the rollout was replayed ``len(weights)`` times at ``step``:
    ``replayed_at_step`` and the parallel ``replay_importance_weight`` get exactly these entries for
    ``step`` (earlier entries of that step are replaced, so redoing a step counts it once).

    Example: ``{"replayed_at_step": [3]}``, step 5, ``[0.9]`` → ``[3, 5]`` and ``[None, 0.9]``.
    """
    out = dict(meta)
    at = out.get("replayed_at_step", [])
    at = [int(a) for a in (at if isinstance(at, list) else [at])]
    ws = (list(out.get("replay_importance_weight", [])) + [None] * len(at))[: len(at)]
    pairs = [(a, w) for a, w in zip(at, ws, strict=True) if a != int(step)]
    pairs += [(int(step), None if w is None or not np.isfinite(w) else float(w)) for w in weights]
    pairs.sort(key=lambda p: p[0])
    out["replayed_at_step"] = [a for a, _ in pairs]
    out["replay_importance_weight"] = [w for _, w in pairs]
    return out


def final_turn_text(r: Rollout) -> str:
    """The last assistant message of a rollout (its final answer; ``""`` when it has none)."""
    from gfcr.generate.envs import last_assistant_text

    return last_assistant_text(r.messages)


def version_number(policy_version: str, default: int) -> int:
    """The update count in a ``s<n>`` policy version (``default`` for any other form)."""
    m = re.match(r"s(\d+)", policy_version or "")
    return int(m.group(1)) if m else default


class StageTimer:
    """Times named stages: ``with timer("generate"): ...``; ``seconds`` holds the totals."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - t0


class StepSampler:
    """The :class:`~gfcr.control.policies.Sampler` of one step: ``select`` (replay reservations first,
    then the selector, skipping what the buffer excludes) and ``generate`` (one round: topology →
    verify → reward → entropy). With ``stored`` (round → rollouts) it returns the stored rollouts of
    each round instead of generating, and checks they are the ones this run would have drawn."""

    def __init__(self, run: TrainingRun, step: int, timer: StageTimer, stored: dict[int, list[Rollout]] | None):
        self.run, self.step, self.timer, self.stored = run, step, timer, stored
        self.selects = self.rounds = 0
        self.reserved: dict[str, int] = {}
        self.drawn: set[str] = set()  # a step never draws a prompt twice (DAPO's refill rounds, issue 47)

    def select(self, n: int) -> list[str]:
        run, cfg = self.run, self.run.cfg
        with self.timer("select"):
            if self.selects == 0 and run.buffer is not None:
                self.reserved = run.buffer.reserve(n, self.step, step_rng(cfg.seed, self.step, "reserve"))
            skip = (run.buffer.exclude() if run.buffer is not None else set()) | set(self.reserved) | self.drawn
            want = n - len(self.reserved) if self.selects == 0 else n
            ask = min(len(run.train_prompts), want + len(skip & run.prompt_by_id.keys()))
            got = run.selector.select(ask, step_rng(cfg.seed, self.step, f"select{self.selects}"))
            self.selects += 1
            fresh = [p for p in got if p not in skip][: max(want, 0)]
            self.drawn.update(fresh)
            return (list(self.reserved) if self.selects == 1 else []) + fresh

    def generate(self, prompt_ids: Sequence[str], sizes: Mapping[str, int]) -> list[list[Rollout]]:
        rnd = self.rounds
        self.rounds += 1
        if rnd == 0:  # a reserved prompt's group is completed from replay
            sizes = {p: max(1, k - self.reserved.get(p, 0)) for p, k in sizes.items()}
        if self.stored is not None:
            return self._from_store(rnd, prompt_ids)
        run = self.run
        with self.timer("generate"):
            groups = run.generate_groups(list(prompt_ids), dict(sizes), self.step, rnd)
        with self.timer("verify"):
            run.verify(groups)
        if getattr(run, "teachers", None) is not None:
            with self.timer("teacher"):
                run.score_teacher(groups)
        if run.cfg.signals.entropy:
            with self.timer("entropy"):
                run.entropy(groups)
        return groups

    def _from_store(self, rnd: int, prompt_ids: Sequence[str]) -> list[list[Rollout]]:
        if getattr(self.run, "partial", None) is not None:
            return self.run.partial_from_store(self.step, rnd, list(prompt_ids), self.stored)
        rows = self.stored.get(rnd, [])
        by: dict[str, list[Rollout]] = {}
        for r in sorted(rows, key=lambda r: (r.group_id, r.sample_index)):
            by.setdefault(r.prompt_id, []).append(r)
        if sorted(by) != sorted(set(prompt_ids)):
            raise TrainError(f"step {self.step} round {rnd}: the store holds rollouts of prompts {sorted(by)[:4]}, but the "
                             f"resumed run selects {sorted(prompt_ids)[:4]}; the run cannot continue exactly (start a new run)")
        self.run.reward.seed_ref_accuracy(rows)
        return [by[p] for p in dict.fromkeys(prompt_ids)]
