"""The simulator's long-tail arm: partial rollouts (Kimi k1.5) against full ones on the simulated
world's response lengths (:class:`gfcr.sim.simulator.World`), scheduled by
:func:`gfcr.control.partial.long_tail_schedule`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from gfcr.control.partial import long_tail_schedule
from gfcr.sim.simulator import SimConfig, World


def long_tail(cfg: SimConfig, budgets: Sequence[int | None], steps: int = 50, seed: int | None = None) -> dict[str, Any]:
    """Partial rollouts vs full ones (Kimi k1.5) in this world's lengths: per step ``train_prompts`` ×
    ``group_size`` lengths at the initial solve rates (no learning), the same for every arm, run by
    :func:`gfcr.control.partial.long_tail_schedule` per ``budget`` (``None`` = full). Returns its measures per arm."""
    world = World(cfg)
    rng = np.random.default_rng(cfg.seed if seed is None else seed)
    lengths = []
    for _ in range(steps):
        idx = rng.integers(0, cfg.n_prompts, size=cfg.train_prompts)
        lengths.append(world.generate(idx, cfg.group_size, rng)[1].ravel())
    return {("full" if b is None else f"partial_{b}"): long_tail_schedule(lengths, b).to_dict() for b in budgets}
