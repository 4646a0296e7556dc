"""Retrieval-guided seeds in training (``retrieve:`` of ``gfcr train``): before each generation
round, every selected prompt gets the ``k`` nearest *solved* prompts of a store, one verified
solution each, as earlier ``user``/``assistant`` turns (:class:`gfcr.replay.retrieval.RetrievalSeeder`,
the same seeder as ``gfcr generate``'s ``retrieve:`` option, docs/control.md).

Source: ``retrieve.store`` (a store folder, indexed once when the run starts) or, when null, the
run's own store: indexed as it is when the run starts, then, at the start of each step ``s``, the
run's solved rollouts of steps ``< s`` are added (already indexed ids are skipped), so a prompt can
be seeded with another prompt's solution found earlier in the same run. A prompt is never its own
seed. The seeds are context tokens (``token_role`` 0): the loss never trains on them, but the
policy's log-probs of the generated tokens are taken with them in context, as they were sampled.
Each rollout records its seeds' rollout ids in ``meta.retrieved`` (``[]``: no solved neighbour).
Held-out evaluation stays unseeded (it measures the policy, not the prompt).

Example: step 3 of a run whose step 1 solved ``what is 12 + 7 ?`` → the prompt ``what is 12 + 9 ?``
is generated from ``[user "what is 12 + 7 ?", assistant "12 + 7 = 19 …", user "what is 12 + 9 ?"]``.

No single paper's rule: the rollout survey names "retrieved solved cases as in-context seeds or
prefixes"; this is the in-context form, applied to the prompts an RL step samples.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import Field

from gfcr.generate.config import RetrieveConfig
from gfcr.records import Prompt


class TrainRetrieveConfig(RetrieveConfig):
    """``retrieve:`` of ``gfcr train`` — the keys of ``gfcr generate``'s ``retrieve:`` (``store``, ``k``,
    ``embed``, ``max_distance``); ``store: null`` is the run's own store, refreshed every step."""

    store: str | None = Field(None, description=(
        "Store whose solved rollouts are retrieved (a local folder, indexed when the run starts); "
        "null = the run's own store, whose solved rollouts of earlier steps are added at the start "
        "of each step."))


class StepSeeder:
    """Seeds the prompts of each training step from a store's solved rollouts (module docstring).

    ``store``: the source store; ``run_id``: this run's id when the source is its own store (each
    :meth:`refresh` then indexes the run's solved rollouts of the steps before it), else None.
    """

    def __init__(self, cfg: TrainRetrieveConfig, store: Any, run_id: str | None = None):
        from gfcr.replay.retrieval import RetrievalSeeder

        self.cfg, self.store, self.run_id = cfg, store, run_id
        self.seeder = RetrievalSeeder(store, k=cfg.k, embed=cfg.embed, max_distance=cfg.max_distance)
        self.indexed_through = -1  # the run's steps < this + 1 are indexed (own store)

    def refresh(self, step: int) -> int:
        """Own store: index the run's solved rollouts of steps ``indexed_through + 1 .. step − 1``;
        returns the rows added (0 for a fixed source store)."""
        if self.run_id is None or step - 1 <= self.indexed_through:
            return 0
        rs = self.store.rollouts(run=self.run_id, steps=(self.indexed_through + 1, step - 1))
        self.indexed_through = step - 1
        return self.seeder.index.add(rs)

    def seed(self, prompts: Sequence[Prompt]) -> list[Prompt]:
        """Each prompt with its seeds (``meta["retrieved"]``: their rollout ids, ``[]`` when none)."""
        from dataclasses import replace

        return [p if "retrieved" in p.meta else replace(p, meta=dict(p.meta) | {"retrieved": []})
                for p in self.seeder.seed(prompts)]


def retrieve_unsupported(cfg: Any, world_size: int) -> str | None:
    """Why ``retrieve:`` cannot run with this config on this machine (None: it can). Checked before the
    run writes anything: a data-parallel run (each rank would write the one index), a run store on
    object storage (the index is a local Lance table), a source store that does not exist."""
    from pathlib import Path

    r = cfg.retrieve
    if r is None:
        return None
    if world_size > 1:
        return ("retrieve: retrieval-guided seeds run in a single process (each rank would write the one index); "
                "unset retrieve or run with WORLD_SIZE=1")
    if r.store is None and cfg.store is not None and "://" in str(cfg.store):
        return (f"retrieve: the run's store {cfg.store} is on object storage, where the retrieval index cannot be "
                "kept; set retrieve.store to a local store folder or store: null")
    if r.store is not None and ("://" in r.store or not Path(r.store).is_dir()):
        return f"retrieve.store {r.store!r}: not a local store folder"
    return None
