"""Random-row reads of the rollouts table: rows by ``rollout_id`` and random samples.

Both take rows by row id or offset, never through a filtered scan of whole rows:

- :func:`take_ids` first finds the row ids of the wanted ``rollout_id`` values (one filtered read
  of the id column, answered by the BTREE index that :func:`build_id_index` makes, which
  ``RolloutStore.compact`` calls; rows appended later, and fragments that automatic compaction
  rewrote, are not in the index and Lance scans them, so the look-up stays exact), then takes
  only those rows (``LanceDataset._take_rows``), which Lance returns in the order asked;
- :func:`sample_rows` draws distinct offsets and takes them (``LanceDataset.take``).

:func:`rows_in` (rows whose key is in a list, e.g. the stored prompts of an upsert) filters with
an SQL ``IN`` list when the list is short and with Arrow's ``is_in`` on the read columns when long.

Datasets are opened with :data:`READ_BLOCK_SIZE` and :data:`READ_PARAMS` (on object storage
:data:`REMOTE_BLOCK_SIZE`; a sample from small data files reads each whole, :func:`whole_file_block`).
What remains of the cost is Lance's per-row take (every row of every variable-width column is its
own read and decode); docs/store.md has the profile and what did not help.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import lance
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from gfcr.store.sql import in_list

#: Lance merges reads less than this many bytes apart into one I/O (its local default: 4 KiB).
#: With 64 KiB (and READ_PARAMS), 1,000 random rows cost 0.76-0.90x the CPU of Lance's defaults.
READ_BLOCK_SIZE = 64 * 1024
#: the same for a store on object storage, where a request costs more than the bytes it reads: on the
#: loopback S3 server, sample(1000) of 20,000 rows took 26 requests at 1 MiB against 58 at 64 KiB
#: (0.6x the wall time; bench/s3_bench.py, docs/performance.md)
REMOTE_BLOCK_SIZE = 1024 * 1024
#: on object storage, a sample whose rows lie in data files holding at most this many bytes per
#: sampled row in all is read with a block as large as the largest of those files
#: (:func:`whole_file_block`): Lance then merges each file's reads into one request. 1M rows x 16
#: tokens in 100 fragments (1.65 MB files, 165 KB per sampled row): 100 requests for sample(1000)
#: against 400 with REMOTE_BLOCK_SIZE (bench/s3_bench.py, docs/performance.md)
WHOLE_FILE_PER_ROW = 256 * 1024
#: ... and only when the largest of those files is at most this large
WHOLE_FILE_MAX = 64 * 1024 * 1024
#: Lance read options: keep list columns' repetition index in the session cache between takes
READ_PARAMS = {"cache_repetition_index": True}
#: :func:`rows_in` matches longer key lists with ``is_in`` after the read: Lance parses an ``IN`` list
#: of 12,500 ids in 60-80 ms (on an empty table too); reading the columns and ``is_in`` took 5-19 ms
#: at 0-200k rows
IN_LIST_MAX = 1000


def rows_in(ds: lance.LanceDataset, column: str, keys: Sequence[str] | None, columns: Sequence[str] | None = None,
            where: str | None = None) -> pa.Table:
    """Rows of ``ds`` (its order) whose ``column`` is in ``keys`` (every row: None) and that match
    ``where``; ``columns``: those (all: None). Example: keys ``["p1", "p9"]`` of a prompts table
    holding p1 and p2 → the row of p1."""
    if keys is not None and len(keys) > IN_LIST_MAX:
        cols = None if columns is None else list(dict.fromkeys([*columns, column]))
        t = ds.to_table(columns=cols, filter=f"({where})" if where else None)
        t = t.filter(pc.is_in(t.column(column), pa.array(list(keys), pa.string())))
        return t if columns is None else t.select(list(columns))
    parts = ([in_list(column, keys)] if keys is not None else []) + ([f"({where})"] if where else [])
    return ds.to_table(columns=list(columns) if columns else None, filter=" AND ".join(parts) or None)


def rollout_filter(run: str | None = None, steps: tuple[int, int] | None = None, verified: bool | None = None,
                   prompt_ids: Iterable[str] | None = None, task: str | None = None, where: str | None = None) -> str | None:
    """The Lance SQL filter of ``RolloutStore.scan``'s arguments (None: every row). Example:
    ``rollout_filter(run="a", steps=(2, 4))`` → ``"run_id = 'a' AND step >= 2 AND step <= 4"``."""
    q = lambda x: "'" + str(x).replace("'", "''") + "'"  # noqa: E731
    parts = [f"run_id = {q(run)}"] if run is not None else []
    if steps is not None:
        parts.append(f"step >= {int(steps[0])} AND step <= {int(steps[1])}")
    if verified is not None:
        parts.append("verified = true" if verified else "verified = false")
    if prompt_ids is not None:
        parts.append(in_list("prompt_id", prompt_ids))
    if task is not None:
        parts.append(f"task = {q(task)}")
    if where:
        parts.append(f"({where})")
    return " AND ".join(parts) if parts else None


def take_ids(ds: lance.LanceDataset, ids: Sequence[str], columns: Sequence[str] | None = None) -> pa.Table:
    """Rows of ``ds`` for ``ids`` in the order given (an id may repeat; unknown ids raise ``KeyError``).

    Example: ``take_ids(ds, ["b", "a", "b"], ["reward"])`` → 3 rows, rewards of b, a, b."""
    ids = list(ids)
    want = list(columns) if columns else None
    uniq = list(dict.fromkeys(ids))
    found = ds.to_table(columns=["rollout_id"], filter=in_list("rollout_id", uniq), with_row_id=True)
    rowid = dict(zip(found.column("rollout_id").to_pylist(), found.column("_rowid").to_pylist(), strict=True))
    missing = [i for i in ids if i not in rowid]
    if missing:
        raise KeyError(f"{len(missing)} rollout id(s) not in the store, e.g. {missing[0]!r}")
    if not uniq:
        return ds.to_table(columns=want, limit=0)
    t = ds._take_rows([rowid[i] for i in uniq], columns=want)
    if len(uniq) < len(ids):  # repeated ids
        pos = {rid: k for k, rid in enumerate(uniq)}
        t = t.take(pa.array([pos[i] for i in ids], pa.int64()))
    return t


def sample_rows(ds: lance.LanceDataset, n: int, where: str | None = None, seed: int | None = None,
                columns: Sequence[str] | None = None,
                reopen: Callable[[int], lance.LanceDataset] | None = None) -> pa.Table:
    """``n`` distinct random rows of ``ds`` (all rows if fewer), optionally among rows matching
    ``where`` (a Lance SQL predicate), in row order. ``reopen(block_size)`` (a store on object
    storage): ``ds`` at the same version opened with another read block, used when
    :func:`whole_file_block` says the sampled files are small enough to read whole."""
    rng = np.random.default_rng(seed)
    cols = list(columns) if columns else None
    if where:
        rowids = ds.to_table(columns=[], filter=where, with_row_id=True).column("_rowid").to_numpy()
        pick = rng.choice(len(rowids), size=min(n, len(rowids)), replace=False) if len(rowids) else []
        if not len(pick):
            return ds.schema.empty_table()
        ids = np.sort(rowids[pick])
        block = whole_file_block(ds, ids >> 32, len(ids)) if reopen is not None else None
        return (reopen(block) if block else ds)._take_rows(ids.tolist(), columns=cols)
    total = ds.count_rows()
    if total == 0:
        return ds.schema.empty_table() if cols is None else ds.to_table(columns=cols, limit=0)
    idx = np.sort(rng.choice(total, size=min(n, total), replace=False))
    if reopen is not None:
        frags = ds.get_fragments()
        ends = np.cumsum([f.metadata.num_rows for f in frags])
        if ends[-1] == total:  # (the fragments' live rows are the offsets' rows)
            ids = np.asarray([f.fragment_id for f in frags])[np.searchsorted(ends, idx, side="right")]
            block = whole_file_block(ds, ids, len(idx), frags)
            if block:
                return reopen(block).take(idx.tolist(), columns=cols)
    return ds.take(idx.tolist(), columns=cols)


def whole_file_block(ds: lance.LanceDataset, frag_ids: np.ndarray, rows: int,
                     frags: list[Any] | None = None) -> int | None:
    """A read block size that makes Lance read each data file of the fragments ``frag_ids`` (``[rows]``,
    the fragment of each sampled row) in one request, or None when that reads too much: more than
    :data:`WHOLE_FILE_PER_ROW` bytes per sampled row in all, or a file over :data:`WHOLE_FILE_MAX`
    (then :data:`REMOTE_BLOCK_SIZE` stays). Sizes are Lance's own record of each file (no request).

    Example: 1,000 rows from 100 fragments of one 1.65 MB file each → 165 KB a row ≤ 256 KiB: the
    block is 1.65 MB (rounded up to a MiB: 2 MiB); from 100 fragments of 50 MB each → None."""
    frags = ds.get_fragments() if frags is None else frags
    size = {f.fragment_id: [df.file_size_bytes for df in f.metadata.files] for f in frags}
    touched = [x for i in np.unique(frag_ids).tolist() for x in size.get(int(i), [None])]
    if not touched or any(not x for x in touched):  # (a size Lance did not record)
        return None
    if sum(touched) > rows * WHOLE_FILE_PER_ROW or max(touched) > WHOLE_FILE_MAX:
        return None
    mib = 1 << 20
    return max(REMOTE_BLOCK_SIZE, -(-max(touched) // mib) * mib)


def build_id_index(uri: str, storage_options: dict[str, str] | None = None) -> bool:
    """(Re)build the BTREE index on ``rollout_id`` of the dataset at ``uri`` (one commit; Lance
    rebases it over concurrent appends). Returns whether one was built (not for an empty table)."""
    ds = lance.dataset(uri, storage_options=storage_options)
    if not ds.count_rows():
        return False
    ds.create_scalar_index("rollout_id", "BTREE", replace=True)
    return True
