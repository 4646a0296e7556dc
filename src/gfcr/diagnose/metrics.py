"""Pathology metrics per (run, step), computed from a rollout store.

The computation lives with the store (:mod:`gfcr.store.stepstats`: features, one DuckDB query),
which keeps its per-step parts with the rows (:mod:`gfcr.store.aggregates`, updated on append);
this module reads them (:func:`step_metrics`) and splits them per run (:func:`by_run`). The
columns are listed in :data:`METRIC_COLUMNS` and described in ``docs/diagnose.md``.
"""

from __future__ import annotations

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


def step_metrics(store: Any, run: str | None = None, config: MetricsConfig | None = None,
                 use_aggregates: bool = True) -> pa.Table:
    """One row per (run, step) with the columns of :data:`METRIC_COLUMNS` (see ``docs/diagnose.md``).

    Shares are in [0, 1]; a metric that cannot be computed for a step (no verified rollouts, no
    replayed rows, no audits) is null. Read from the store's per-step aggregates
    (:mod:`gfcr.store.aggregates`: kept with the store, updated on append, rebuilt from the rows
    when missing or stale) when ``config`` keeps the defaults they were built with (``pass_reward``
    and ``judge`` may differ); otherwise (or ``use_aggregates=False``) from one scan of the rows.

    Example: a store of one step, 2 groups of 2 with rewards [1, 1] and [0, 1] → one row with
    ``n_rollouts`` 4, ``n_groups`` 2, ``zero_var_share`` 0.5.
    """
    from gfcr.store import aggregates

    cfg = config or MetricsConfig()
    if use_aggregates and aggregates.config_ok(cfg):
        parts = aggregates.load(store)
        if parts is not None:
            return aggregates.metrics(store, parts, run, cfg)
    table = store.scan(run=run, columns=FEATURE_COLUMNS)
    feats, events = rollout_features(table, cfg)
    return metrics_of(feats, events, audit_features(store, run, cfg), cfg)


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
           "metrics_of", "relative_growth", "rollout_features", "scored_mask", "step_metrics", "ter_from_mask"]
