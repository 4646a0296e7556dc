"""Pathology metrics per (run, step), computed from a rollout store.

The computation lives with the store (:mod:`gfcr.store.stepstats`: per-rollout features, one
DuckDB query; the training loop's per-step row calls the same function,
:func:`gfcr.store.stepstats.summarize`); the store's write path computes none of it. This module
derives the metrics from the rows when asked (:func:`step_metrics`), keeps the result in an
in-process cache keyed by the store and the exact versions of the tables it read, and splits them
per run (:func:`by_run`). The columns are listed in :data:`METRIC_COLUMNS` and described in
``docs/diagnose.md``.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from gfcr.store.stepstats import (
    FEATURE_COLUMNS,
    METRIC_COLUMNS,
    MetricsConfig,
    audit_features,
    linear_trend,
    metrics_of,
    relative_growth,
    rollout_features,
    scored_mask,
    ter_from_mask,
)

#: step-metrics tables kept in the process (least recently used dropped first)
CACHE_SIZE = 8
_CACHE: OrderedDict[tuple[Any, ...], pa.Table] = OrderedDict()
_CACHE_LOCK = threading.Lock()


def _version_of(store: Any, table: str) -> tuple[int, str]:
    """``(version, commit time)`` of ``table`` as ``store`` reads it (its pinned or latest
    version): the time tells a store deleted and created again at the same path (whose version
    numbers start over) from the one that was there."""
    v = store.dataset(table).get_version()
    return int(v["version"]), str(v["timestamp"])


def cache_key(store: Any, run: str | None, cfg: MetricsConfig) -> tuple[Any, ...] | None:
    """The cache key of :func:`step_metrics`: the store's path, the versions of the two tables the
    metrics read (rollouts, audits), ``run`` and the config; None for an object that is not a
    :class:`~gfcr.store.RolloutStore` (never cached)."""
    if not hasattr(store, "dataset") or not hasattr(store, "path"):
        return None
    return (str(store.path), _version_of(store, "rollouts"), _version_of(store, "audits"), run,
            cfg.model_dump_json())


def clear_cache() -> None:
    """Forget every cached step-metrics table of this process."""
    with _CACHE_LOCK:
        _CACHE.clear()


def step_metrics(store: Any, run: str | None = None, config: MetricsConfig | None = None,
                 cache: bool = True) -> pa.Table:
    """One row per (run, step) with the columns of :data:`METRIC_COLUMNS` (see ``docs/diagnose.md``).

    Shares are in [0, 1]; a metric that cannot be computed for a step (no verified rollouts, no
    replayed rows, no audits) is null. Derived from one scan of the rows' :data:`FEATURE_COLUMNS`
    (:func:`~gfcr.store.stepstats.rollout_features`, :func:`~gfcr.store.stepstats.metrics_of`).
    With ``cache`` the table is kept in the process under :func:`cache_key` (the exact rollouts
    and audits versions read), so a later call on an unchanged store returns it without a scan;
    any commit to either table changes the key, so a cached table is never one of another version.

    Why not per step: a step's row depends on other steps (``hack_rate`` of a step nobody passed
    uses the run's passing median; replay events recorded by earlier steps' rows count at the step
    they target), so one per-version table is the unit that stays exact.

    Example: a store of one step, 2 groups of 2 with rewards [1, 1] and [0, 1] → one row with
    ``n_rollouts`` 4, ``n_groups`` 2, ``zero_var_share`` 0.5.
    """
    cfg = config or MetricsConfig()
    key = cache_key(store, run, cfg) if cache else None
    if key is not None:
        with _CACHE_LOCK:
            hit = _CACHE.get(key)
            if hit is not None:
                _CACHE.move_to_end(key)
                return hit
    table = store.scan(run=run, columns=FEATURE_COLUMNS)
    feats, events = rollout_features(table, cfg)
    out = metrics_of(feats, events, audit_features(store, run, cfg), cfg)
    # kept only when no commit landed while the rows were read (the numbers are then those of ``key``)
    if key is not None and cache_key(store, run, cfg) == key:
        with _CACHE_LOCK:
            _CACHE[key] = out
            while len(_CACHE) > CACHE_SIZE:
                _CACHE.popitem(last=False)
    return out


def by_run(metrics: pa.Table) -> dict[str, dict[str, np.ndarray]]:
    """Split a :func:`step_metrics` table into ``{run_id: {column: array over steps}}`` (nulls → nan)."""
    out: dict[str, dict[str, np.ndarray]] = {}
    runs = metrics.column("run_id").to_pylist()
    for run in dict.fromkeys(runs):
        sub = metrics.filter(pc.equal(metrics.column("run_id"), run))
        d = {}
        for name in metrics.column_names:
            if name == "run_id":
                continue
            col = sub.column(name)
            d[name] = np.asarray([np.nan if v is None else v for v in col.to_pylist()], dtype=float)
        out[run] = d
    return out


__all__ = ["FEATURE_COLUMNS", "METRIC_COLUMNS", "MetricsConfig", "audit_features", "by_run", "linear_trend",
           "cache_key", "clear_cache", "metrics_of", "relative_growth", "rollout_features", "scored_mask", "step_metrics",
           "ter_from_mask"]
