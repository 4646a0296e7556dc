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
:data:`REMOTE_BLOCK_SIZE`). On object storage both takes go through :func:`take_planned`: each data
file is read by its rows' ranges, whole in one request, or from a local read cache, by the cost model
of :mod:`gfcr.store.readcache` (the rows taken never depend on it). What remains of the cost is Lance's per-row take (every row of every variable-width column is its
own read and decode); docs/store.md has the profile and what did not help.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from contextlib import ExitStack
from typing import Any

import lance
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from gfcr.store.readcache import RemoteReads, fragment_bytes, fragment_files, plan_reads
from gfcr.store.sql import in_list

#: Lance merges reads less than this many bytes apart into one I/O (its local default: 4 KiB).
#: With 64 KiB (and READ_PARAMS), 1,000 random rows cost 0.76-0.90x the CPU of Lance's defaults.
READ_BLOCK_SIZE = 64 * 1024
#: the same for a store on object storage, where a request costs more than the bytes it reads: on the
#: loopback S3 server, sample(1000) of 20,000 rows took 26 requests at 1 MiB against 58 at 64 KiB
#: (0.6x the wall time; bench/s3_bench.py, docs/performance.md). Lance's rule (merge when the gap is
#: under the block) is the cost model of gfcr.store.readcache at the range level; 2 MiB (its B) cost
#: the same there at 1M x 512 tokens (1,650 requests, 1.74 GB against 2,105, 0.85 GB): 1 MiB moves fewer bytes
REMOTE_BLOCK_SIZE = 1024 * 1024
MIB = 1024 * 1024
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


def take_ids(ds: lance.LanceDataset, ids: Sequence[str], columns: Sequence[str] | None = None,
             remote: RemoteReads | None = None) -> pa.Table:
    """Rows of ``ds`` for ``ids`` in the order given (an id may repeat; unknown ids raise ``KeyError``);
    ``remote``: a table on object storage, read as :func:`take_planned` says.

    Example: ``take_ids(ds, ["b", "a", "b"], ["reward"])`` → 3 rows, rewards of b, a, b."""
    ids = list(ids)
    want = list(columns) if columns else None
    uniq = list(dict.fromkeys(ids))
    found = scan_rows(ds, remote, columns=["rollout_id"], filter=in_list("rollout_id", uniq), with_row_id=True)
    rowid = dict(zip(found.column("rollout_id").to_pylist(), found.column("_rowid").to_pylist(), strict=True))
    missing = [i for i in ids if i not in rowid]
    if missing:
        raise KeyError(f"{len(missing)} rollout id(s) not in the store, e.g. {missing[0]!r}")
    if not uniq:
        return ds.to_table(columns=want, limit=0)
    keys = np.asarray([rowid[i] for i in uniq], np.uint64)
    t = take_planned(ds, keys, keys >> np.uint64(32), want, remote, rowids=True)
    if len(uniq) < len(ids):  # repeated ids
        pos = {rid: k for k, rid in enumerate(uniq)}
        t = t.take(pa.array([pos[i] for i in ids], pa.int64()))
    return t


def sample_rows(ds: lance.LanceDataset, n: int, where: str | None = None, seed: int | None = None,
                columns: Sequence[str] | None = None, remote: RemoteReads | None = None) -> pa.Table:
    """``n`` distinct random rows of ``ds`` (all rows if fewer), optionally among rows matching
    ``where`` (a Lance SQL predicate), in row order. The rows depend on ``seed`` and the table only:
    ``remote`` (a table on object storage, :func:`take_planned`) changes how they are read, not which."""
    rng = np.random.default_rng(seed)
    cols = list(columns) if columns else None
    if where:
        rowids = scan_rows(ds, remote, columns=[], filter=where, with_row_id=True).column("_rowid").to_numpy()
        pick = rng.choice(len(rowids), size=min(n, len(rowids)), replace=False) if len(rowids) else []
        if not len(pick):
            return ds.schema.empty_table()
        ids = np.sort(rowids[pick])
        return take_planned(ds, ids, ids >> np.uint64(32), cols, remote, rowids=True)
    total = ds.count_rows()
    if total == 0:
        return ds.schema.empty_table() if cols is None else ds.to_table(columns=cols, limit=0)
    idx = np.sort(rng.choice(total, size=min(n, total), replace=False))
    if remote is None:  # (a local table: one take, no fragment listing)
        return ds.take(idx.tolist(), columns=cols)
    frags = ds.get_fragments()
    ends = np.cumsum([f.metadata.num_rows for f in frags])  # (live rows: the offsets' rows)
    if ends[-1] != total:
        return ds.take(idx.tolist(), columns=cols)
    fids = np.asarray([f.fragment_id for f in frags])[np.searchsorted(ends, idx, side="right")]
    return take_planned(ds, idx, fids, cols, remote, rowids=False, frags=frags)


def scan_rows(ds: lance.LanceDataset, remote: RemoteReads | None, **scan: Any) -> pa.Table:
    """``ds.to_table(**scan)`` (the look-ups of :func:`take_ids` and ``where``); on object storage, over
    the read cache's copies when every fragment's files are there and the table has no index (no
    request; Lance reads an index's manifest, which is not cached, and an indexed look-up is cheap)."""
    cache = remote.cache if remote is not None else None
    if cache is not None and not ds.has_index:
        files = [fragment_files(f) for f in ds.get_fragments()]
        if files and all(fs is not None and cache.has(remote.uri, fs) for fs in files):
            every = [x for fs in files if fs for x in fs]
            with cache.view(ds, remote.uri, every, remote.storage_options, **remote.open_args) as local:
                return local.to_table(**scan)
    return ds.to_table(**scan)


def take_planned(ds: lance.LanceDataset, keys: np.ndarray, frag_ids: np.ndarray, columns: list[str] | None,
                 remote: RemoteReads | None, rowids: bool, frags: list[Any] | None = None) -> pa.Table:
    """Rows ``keys`` (``[k]`` offsets, or row ids with ``rowids``) of ``ds`` in the order given, where
    ``frag_ids`` (``[k]``) is each row's fragment. Locally one take; on object storage each fragment is
    read as :func:`gfcr.store.readcache.plan_reads` says: from the read cache (fetching files worth it),
    whole (the table reopened with a block as large as the largest such file, so that Lance reads each
    in one request), or by the rows' ranges (the store's own open). Fragments with neither recorded
    sizes nor cacheable files are read by ranges.

    Example: 1,000 offsets of 1M rows × 512 tokens in 200 fragments of 15 MB, 5 rows each: no cache →
    all "rows" (15 MB > 5 × 2 MiB); rows of 20 fragments, 50 each → all "whole" (20 requests)."""
    def take(d: lance.LanceDataset, k: np.ndarray) -> pa.Table:
        return d._take_rows(k.tolist(), columns=columns) if rowids else d.take(k.tolist(), columns=columns)

    if remote is None or not len(keys):
        return take(ds, keys)
    by_id = {f.fragment_id: f for f in (frags if frags is not None else ds.get_fragments())}
    fids, counts = np.unique(frag_ids, return_counts=True)
    touched = [by_id[int(i)] for i in fids]
    files = {f.fragment_id: fragment_files(f) for f in touched}
    sizes = {f.fragment_id: fragment_bytes(f) for f in touched}
    rows = dict(zip((int(i) for i in fids), (int(c) for c in counts), strict=True))
    cache, uri, b = remote.cache, remote.uri, remote.request_bytes
    cacheable = {i for i, fs in files.items() if fs is not None}
    cached = {i for i in cacheable if cache is not None and cache.has(uri, files[i])}
    rent = {i: cache.rent.get((uri, i), 0.0) for i in rows} if cache is not None else None
    plan = plan_reads(sizes, rows, b, cached, rent, cache.max_bytes if cache else 0, cacheable)
    if cache is not None:
        for i, how in plan.items():
            if how != "local":
                cache.rent[(uri, i)] = cache.rent.get((uri, i), 0.0) + rows[i] * b
    how = np.asarray([plan[int(i)] for i in frag_ids])
    parts, where = [], []
    with ExitStack() as stack:
        views = {"rows": lambda: ds}
        if "whole" in plan.values():
            big = max(sizes[i] or 0 for i, h in plan.items() if h == "whole")
            views["whole"] = lambda: remote.reopen(max(REMOTE_BLOCK_SIZE, -(-big // MIB) * MIB))
        if "local" in plan.values():
            local = [f for i, h in plan.items() if h == "local" for f in files[i]]
            views["local"] = lambda: stack.enter_context(
                cache.view(ds, uri, local, remote.storage_options, **remote.open_args))
        for name, view in views.items():
            sel = np.flatnonzero(how == name)
            if len(sel):
                parts.append(take(view(), keys[sel]))
                where.append(sel)
    if len(parts) == 1:
        return parts[0]
    return pa.concat_tables(parts).take(pa.array(np.argsort(np.concatenate(where)), pa.int64()))


def build_id_index(uri: str, storage_options: dict[str, str] | None = None) -> bool:
    """(Re)build the BTREE index on ``rollout_id`` of the dataset at ``uri`` (one commit; Lance
    rebases it over concurrent appends). Returns whether one was built (not for an empty table)."""
    ds = lance.dataset(uri, storage_options=storage_options)
    if not ds.count_rows():
        return False
    ds.create_scalar_index("rollout_id", "BTREE", replace=True)
    return True
