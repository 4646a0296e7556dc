"""Paged reads for the viewer's list: a per-step aggregate instead of a full scan per request.

:func:`step_index` reads two columns of one dataset version once (``run_id``, ``step``) and keeps,
per (run, step): the row count and the first and last row positions holding it. A list page sorted
by (run, step, prompt, sample, id) then needs only the steps its rows fall in
(:func:`plan_page`), and each step's rows are read by position range
(``to_table(offset, limit)``, which Lance answers from the fragments holding those rows; only the
five sort-key columns), then the page's own rows are taken by position, so a page costs the sort
keys of the steps it shows, not the store. Stores are appended step by step, so
a step's rows sit together; when they do not (a step's span is over ``max_spread`` × its count),
that step is read with a pushed-down filter instead.

The index belongs to one dataset version: the viewer rebuilds it when the store's version moves
(an append), once, on the next request.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

KEY_COLUMNS = ["run_id", "step", "prompt_id", "sample_index", "rollout_id"]
SORT_KEYS = [("run_id", "ascending"), ("step", "ascending"), ("prompt_id", "ascending"),
             ("sample_index", "ascending"), ("rollout_id", "ascending")]


def step_index(ds: Any, batch_size: int = 262_144) -> pa.Table:
    """Per (run_id, step) of a Lance dataset: ``n`` rows, first/last position ``lo``/``hi``;
    sorted by run_id, step. Shapes: one row per step present.

    Example: rows (run, step) in position order [(a, 0), (a, 0), (a, 1), (b, 0)] →
    run_id [a, a, b], step [0, 1, 0], n [2, 1, 1], lo [0, 2, 3], hi [1, 2, 3].
    """
    parts = []
    pos = 0
    for b in ds.to_batches(columns=["run_id", "step"], batch_size=batch_size):
        t = pa.Table.from_batches([b]).append_column("pos", pa.array(np.arange(pos, pos + b.num_rows), pa.int64()))
        pos += b.num_rows
        parts.append(t.group_by(["run_id", "step"]).aggregate([("pos", "count"), ("pos", "min"), ("pos", "max")]))
    if not parts:
        return pa.table({"run_id": pa.array([], pa.string()), "step": pa.array([], pa.int64()),
                         "n": pa.array([], pa.int64()), "lo": pa.array([], pa.int64()), "hi": pa.array([], pa.int64())})
    g = pa.concat_tables(parts).group_by(["run_id", "step"]).aggregate(
        [("pos_count", "sum"), ("pos_min", "min"), ("pos_max", "max")])
    g = g.rename_columns(["run_id", "step", "n", "lo", "hi"])
    return g.take(pc.sort_indices(g, sort_keys=[("run_id", "ascending"), ("step", "ascending")]))


def select_steps(index: pa.Table, run: str | None, step_min: int | None, step_max: int | None) -> pa.Table:
    """The index rows of one run (None: all) within [step_min, step_max] (None: unbounded)."""
    mask = pa.array(np.ones(index.num_rows, bool))
    if run is not None:
        mask = pc.and_(mask, pc.equal(index.column("run_id"), run))
    if step_min is not None:
        mask = pc.and_(mask, pc.greater_equal(index.column("step"), step_min))
    if step_max is not None:
        mask = pc.and_(mask, pc.less_equal(index.column("step"), step_max))
    return index.filter(mask)


def plan_page(counts: np.ndarray, offset: int, limit: int) -> list[tuple[int, int, int]]:
    """Which steps a page of ``limit`` rows from ``offset`` touches: ``[(step row, skip, take)]``.

    ``counts`` ``[S]``: rows per step in list order. Example: counts [3, 2, 4], offset 2, limit 4 →
    [(0, 2, 1), (1, 0, 2), (2, 0, 1)].
    """
    out = []
    ends = np.cumsum(counts)
    i = int(np.searchsorted(ends, offset, side="right"))
    left = limit
    while i < len(counts) and left > 0:
        start = offset - (int(ends[i - 1]) if i else 0)
        skip = max(0, start)
        take = min(int(counts[i]) - skip, left)
        if take > 0:
            out.append((i, skip, take))
            left -= take
        offset = int(ends[i])
        i += 1
    return out


def read_page(ds: Any, steps: pa.Table, offset: int, limit: int, columns: list[str],
              max_spread: float = 4.0) -> pa.Table:
    """The rows ``offset .. offset + limit`` of ``steps`` (a :func:`select_steps` table) in list
    order, with ``columns`` (which must include the sort keys)."""
    counts = steps.column("n").to_numpy()
    parts = []
    for i, skip, take in plan_page(counts, offset, limit):
        run, step = steps.column("run_id")[i].as_py(), int(steps.column("step")[i].as_py())
        n, lo, hi = int(counts[i]), int(steps.column("lo")[i].as_py()), int(steps.column("hi")[i].as_py())
        if hi - lo + 1 <= max_spread * n:
            # the step's sort keys only, by position range; then the page's rows by position
            keys = ds.to_table(columns=KEY_COLUMNS, offset=lo, limit=hi - lo + 1)
            keys = keys.append_column("_pos", pa.array(np.arange(lo, lo + keys.num_rows), pa.int64()))
            keys = keys.filter(pc.and_(pc.equal(keys.column("run_id"), run), pc.equal(keys.column("step"), step)))
            keys = keys.take(pc.sort_indices(keys, sort_keys=SORT_KEYS)).slice(skip, take)
            pos = keys.column("_pos").to_numpy()
            got = ds.take(pos.tolist(), columns=columns)  # rows come back in the order asked
            parts.append(got)
            continue
        else:
            q = "'" + run.replace("'", "''") + "'"
            t = ds.to_table(columns=columns, filter=f"run_id = {q} AND step = {step}")
        t = t.take(pc.sort_indices(t, sort_keys=SORT_KEYS))
        parts.append(t.slice(skip, take))
    if not parts:
        return ds.schema.empty_table().select(columns)
    return pa.concat_tables(parts)


__all__ = ["SORT_KEYS", "plan_page", "read_page", "select_steps", "step_index"]
