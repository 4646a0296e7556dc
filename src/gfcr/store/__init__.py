"""The rollout store: Lance datasets for rollouts, prompts, audits and component state, with
DuckDB SQL on top. ``import gfcr.store`` needs no torch."""

from gfcr.store.core import MANIFEST, TABLES, RolloutStore, StoreError

__all__ = ["MANIFEST", "TABLES", "RolloutStore", "StoreError"]
