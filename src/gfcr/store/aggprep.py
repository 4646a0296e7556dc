"""A large append's per-step aggregate rows computed while its rows are written: the rows of
:func:`gfcr.store.aggregates.partials` started in a worker thread before the Lance write (DuckDB,
Arrow and Lance release the GIL), handed to :func:`gfcr.store.aggregates.committed`, which uses
them only where it would compute exactly those (every step of the batch new to the file). The same
numbers, earlier: the aggregates file ends as the serial computation leaves it
(``tests/diagnose/test_aggregates.py``)."""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from gfcr.store.aggregates import COLUMNS, _file, _keys, partials, read_tag

#: batches of at least this many rows get their aggregate rows computed in a worker thread while
#: the rows are written (:func:`prepare`); below it the thread costs more than the overlap saves
PREPARE_MIN_ROWS = 20_000
_POOL: list[ThreadPoolExecutor] = []
_POOL_LOCK = threading.Lock()


def prepare(path: Path, before: int, batch: pa.Table) -> Future | None:
    """Start :func:`partials` of ``batch`` in a worker thread (DuckDB and Arrow release the GIL)
    when :func:`~gfcr.store.aggregates.committed` will need exactly that: the file summarises rollouts version ``before``
    and holds none of the batch's steps. The caller writes the rows meanwhile and hands the future
    to :func:`~gfcr.store.aggregates.committed`, which uses it only in that case (the same numbers, computed earlier);
    None for a small batch or when the steps are not all new."""
    if batch.num_rows < PREPARE_MIN_ROWS:
        return None
    try:
        tag = read_tag(path)
        if tag is None or int(tag["rollouts_version"]) != before:
            return None
        have = pq.read_table(_file(path), columns=["run_id", "step"])
        if _keys(batch) & set(zip(have.column("run_id").to_pylist(), have.column("step").to_pylist(), strict=True)):
            return None
    except (OSError, KeyError, ValueError, pa.ArrowException):
        return None
    with _POOL_LOCK:
        if not _POOL:
            _POOL.append(ThreadPoolExecutor(max_workers=1, thread_name_prefix="gfcr-aggregates"))
    return _POOL[0].submit(partials, batch.select(COLUMNS))
