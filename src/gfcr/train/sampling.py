"""Small helpers of the training loop and its collector (:mod:`gfcr.train.collect`): seeded per-stage
generators, stage timers, policy-version numbers, replay events, a rollout's final answer text."""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

from gfcr.records import Rollout
from gfcr.replay.buffers import stage_rng as step_rng  # noqa: F401  (re-exported)


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
