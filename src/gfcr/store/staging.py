"""Staged writes: many writers write data files, one commit makes them visible (Lance's distributed write).

On object storage every Lance commit is a conditional ``PUT`` of the next version's manifest: writers
that each commit every batch race for the same object, and one server accepts one of them at a time
(measured on the loopback S3 server: 7–8 commits/s for 4 racing processes, single commits stalled
17–30 s). Writing rows does not need that race, only making them visible does. So a writer
*stages* a batch (:func:`stage`: its rows written as Lance data files with
``lance.fragment.write_fragments``, no commit) and hands the :class:`Staged` record (the files'
fragment metadata, the batch's ids; JSON, a few hundred bytes) to whoever commits; one
:func:`commit_staged` makes any number of staged batches, from any number of processes or machines,
visible as **one** ``LanceOperation.Append`` commit. :class:`BatchedWriter` is the writer-side
helper: it stages each batch and commits every ``max_batches`` batches or ``max_seconds``.

What a commit of staged batches guarantees (the same as :meth:`RolloutStore.append` of their rows):

* all of them land in one version, or none (one Lance commit); a commit that loses the race to
  another writer's commit is re-run against the new version (Lance rebases an append on a
  concurrent append, then :func:`gfcr.store.commits.retry_commit`);
* no ``rollout_id`` twice: ids repeated across the staged batches, or already in the store, are
  refused before the commit (the in-process id index, :mod:`gfcr.store.upkeep`), nothing committed;
  and since Append commits do not conflict, a commit that another writer's commit of the same ids
  overtook between check and commit drops its own copies in one follow-up commit
  (:func:`drop_raced_copies`: the copy of the lowest version stays; readers can see both copies
  until the follow-up lands, and a committer stopped in between leaves both, which
  ``gfcr store check`` names);
* the commit's Lance transaction carries gfcr's properties (``gfcr.rows``, ``gfcr.schema_version``,
  ``gfcr.writer``, and ``gfcr.staged``: how many staged batches); a local store records the new
  version, row count and file digests in ``gfcr-store.json`` as after any commit.

A staged batch never committed is invisible: no version references its files, so no read, count,
check or checkout sees it, and a later commit of other batches does not pick it up. Its data files
stay under ``rollouts.lance/data/`` as unreferenced objects (storage only); Lance's
``cleanup_old_versions(older_than, delete_unverified=True)`` removes them (and the versions older than
``older_than``); without ``delete_unverified`` Lance leaves unreferenced files younger than 7 days
alone, so a batch staged but not yet committed is never deleted under a committer (docs/store.md).

Worked example::

    st = RolloutStore.open("s3://bkt/runs/r7")
    s = st.stage(table_a)                    # writer 1 (any process): data files, no commit
    t = Staged.from_json(json_from_writer_2)  # writer 2's batch, sent as JSON
    st.commit_staged([s, t])                  # one commit: both batches visible at once → rows added
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import lance
import pyarrow as pa
import pyarrow.compute as pc
from lance.fragment import FragmentMetadata, write_fragments

from gfcr.records import SCHEMA_VERSION
from gfcr.store.commits import retry_commit
from gfcr.store.errors import StoreError
from gfcr.store.sql import in_list
from gfcr.store.upkeep import hash_ids, id_index


def writer_name() -> str:
    """``host:pid`` of this process (the ``gfcr.writer`` transaction property)."""
    return f"{socket.gethostname()}:{os.getpid()}"


@dataclass(frozen=True)
class Staged:
    """One staged batch of rollouts: data files written into ``rollouts.lance`` but referenced by no
    version yet. ``fragments``: Lance fragment metadata (``FragmentMetadata.to_json()``) of the files;
    ``ids``: the batch's ``rollout_id``s; ``writer``: who staged it (``host:pid``). Plain data:
    :meth:`to_json` / :meth:`from_json` carry it between processes and machines."""

    fragments: list[dict[str, Any]]
    ids: list[str]
    rows: int
    writer: str = field(default_factory=writer_name)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Staged:
        d = json.loads(text)
        return cls(fragments=list(d["fragments"]), ids=[str(x) for x in d["ids"]], rows=int(d["rows"]),
                   writer=str(d.get("writer", "")))

    def fragment_metadata(self) -> list[FragmentMetadata]:
        return [FragmentMetadata.from_json(json.dumps(f)) for f in self.fragments]


def _unique_ids(table: pa.Table) -> list[str]:
    """``table``'s rollout ids; :class:`StoreError` naming one that repeats."""
    ids = table.column("rollout_id")
    if pc.count_distinct(ids).as_py() != table.num_rows:
        vc = pc.value_counts(ids)
        dup = next(x["values"].as_py() for x in vc if x["counts"].as_py() > 1)
        raise StoreError(f"duplicate rollout_id {dup!r} within the batch; nothing was written")
    return ids.to_pylist()


def stage(ds: lance.LanceDataset, table: pa.Table, existing: Callable[[list[str]], set[str]] | None = None) -> Staged:
    """Write ``table`` (rows of the rollout schema, conformed) as data files of the dataset ``ds`` (the
    rollouts table at its latest version), without a commit. Refuses, writing nothing, a batch whose
    ids repeat, or (with ``existing``: ids → the stored ones) one that holds a stored id."""
    ids = _unique_ids(table)
    if existing is not None:
        clash = existing(ids)
        if clash:
            raise StoreError(f"{len(clash)} rollout_id(s) already in the store (e.g. {sorted(clash)[0]!r}); "
                             "nothing was written")
    frags = write_fragments(table.select(ds.schema.names).cast(ds.schema), ds, mode="append")
    return Staged([f.to_json() for f in frags], ids, table.num_rows)


def staged_props(staged: Sequence[Staged]) -> dict[str, str]:
    """The transaction properties of one commit of ``staged`` (see the module)."""
    return {"gfcr.rows": str(sum(s.rows for s in staged)), "gfcr.schema_version": str(SCHEMA_VERSION),
            "gfcr.writer": writer_name(), "gfcr.staged": str(len(staged))}


def commit_staged(uri: str, latest: Callable[[], lance.LanceDataset], staged: Sequence[Staged],
                  storage_options: dict[str, str] | None, after: Callable[[lance.LanceDataset], None],
                  check_existing: bool = True) -> int:
    """Make ``staged`` visible in one Append commit to the rollouts table at ``uri`` (``latest()``
    opens it at its newest version); ``after(ds)`` runs once the commit has landed (the store's
    record and upkeep). Returns the rows committed. Refused in one line, nothing committed, when an
    id repeats across ``staged`` or (``check_existing``) is already stored. See the module."""
    staged = [s for s in staged if s.rows]
    if not staged:
        return 0
    seen: dict[str, str] = {}
    for s in staged:
        for i in s.ids:
            if i in seen:
                raise StoreError(f"rollout_id {i!r} is in two staged batches (from {seen[i]} and {s.writer}); "
                                 "nothing was committed")
            seen[i] = s.writer
    ids = list(seen)
    hashes = hash_ids(ids)
    frags = [f for s in staged for f in s.fragment_metadata()]
    props = staged_props(staged)
    idx = id_index(uri, "rollout_id")
    with idx.lock:  # one check-and-commit at a time in this process, as append
        before = latest()
        clash = idx.existing(before, ids, hashes) if check_existing else set()
        if clash:
            raise StoreError(f"{len(clash)} staged rollout_id(s) already in the store (e.g. {sorted(clash)[0]!r}); "
                             "nothing was committed (the staged files stay unreferenced)")

        def go() -> lance.LanceDataset:
            read = latest()  # each try reads the version it commits on
            tx = lance.Transaction(read_version=read.version, operation=lance.LanceOperation.Append(frags),
                                   transaction_properties=props)
            return lance.LanceDataset.commit(uri, tx, storage_options=storage_options)

        ds = retry_commit(go)
        idx.committed(before, ds, hashes)
        dropped: set[str] = set()
        if check_existing and ds.version > before.version + 1:  # commits landed between the check and this one
            ds, dropped = drop_raced_copies(latest, before, ds, ids, {df["path"] for s in staged for f in s.fragments
                                                                     for df in f["files"]}, storage_options)
    after(ds)
    return len(ids) - len(dropped)


def drop_raced_copies(latest: Callable[[], lance.LanceDataset], before: lance.LanceDataset, mine: lance.LanceDataset,
                      ids: list[str], paths: set[str], storage_options: dict[str, str] | None
                      ) -> tuple[lance.LanceDataset, set[str]]:
    """After an Append commit of ``ids`` (data files ``paths``) checked against ``before`` and landed as
    ``mine``: the ids that a commit between the two also added (a racing writer that passed its own
    check first), and this commit's copies of them deleted in one follow-up Delete commit. The rule is
    the same for every writer, so exactly one copy stays: the one of the lowest version (its writer
    saw no earlier copy), every later copy is deleted by its own writer. Returns the newest dataset
    and the ids whose copies were dropped (none: ``mine`` as it was). See the module."""
    old = {f.fragment_id for f in before.get_fragments()}
    frags = mine.get_fragments()
    ours = {f.fragment_id for f in frags if any(df.path in paths for df in f.data_files())}
    between = [f for f in frags if f.fragment_id not in old and f.fragment_id not in ours]
    doubled: set[str] = set()
    for i in range(0, len(ids), 2000):
        if between:
            t = mine.scanner(columns=["rollout_id"], filter=in_list("rollout_id", ids[i : i + 2000]), fragments=between).to_table()
            doubled.update(t.column(0).to_pylist())
    if not doubled:
        return mine, doubled
    pred = in_list("rollout_id", sorted(doubled))

    def go() -> lance.LanceDataset:
        cur = latest()
        frags = [f for f in cur.get_fragments() if any(df.path in paths for df in f.data_files())]
        if not frags:
            raise StoreError(f"{len(doubled)} rollout(s) were committed by a racing writer first and again by this "
                             f"commit (e.g. {sorted(doubled)[0]!r}), whose files a compaction rewrote before its copies "
                             "could be dropped: they are stored twice (docs/store.md, \"Staged writes\")")
        updated, removed = [], []
        for f in frags:
            m = f.delete(pred)
            (removed.append(f.fragment_id) if m is None else updated.append(m))
        op = lance.LanceOperation.Delete(updated_fragments=updated, deleted_fragment_ids=removed, predicate=pred)
        tx = lance.Transaction(read_version=cur.version, operation=op,
                               transaction_properties={"gfcr.writer": writer_name(), "gfcr.dropped_raced": str(len(doubled))})
        return lance.LanceDataset.commit(mine.uri, tx, storage_options=storage_options)

    return retry_commit(go), doubled


class BatchedWriter:
    """Stage every batch, commit many batches at once: ``write`` stages a batch (data files, no
    commit) and commits the staged batches once ``max_batches`` are pending or the oldest has waited
    ``max_seconds`` (checked at each ``write``/``add``: no timer thread); ``add`` takes a batch another process staged (:class:`Staged`, e.g. received as
    JSON), so one process can commit for many writers; ``flush`` commits what is pending. As a context
    manager it flushes on a normal exit; after an exception the pending batches stay uncommitted
    (invisible). ``committed``: rows committed so far; ``commits``: commits made.

    Example: ``with BatchedWriter(store, max_batches=16) as w: for b in batches: w.write(b)`` → 1 commit
    per 16 batches instead of 16."""

    def __init__(self, store: Any, max_batches: int = 16, max_seconds: float = 5.0, check_existing: bool = True):
        if max_batches < 1 or max_seconds < 0:
            raise StoreError(f"BatchedWriter needs max_batches >= 1 and max_seconds >= 0 (got {max_batches}, {max_seconds})")
        self.store, self.max_batches, self.max_seconds = store, int(max_batches), float(max_seconds)
        self.check_existing = check_existing
        self.pending: list[Staged] = []
        self._since: float | None = None
        self.committed = 0
        self.commits = 0

    def write(self, records: Iterable[Any] | pa.Table, source: str = "append") -> Staged:
        s = self.store.stage(records, source=source, check_existing=False)
        self.add(s)
        return s

    def add(self, staged: Staged) -> None:
        if not self.pending:
            self._since = time.monotonic()
        self.pending.append(staged)
        if len(self.pending) >= self.max_batches or time.monotonic() - (self._since or 0.0) >= self.max_seconds:
            self.flush()

    def flush(self) -> int:
        if not self.pending:
            return 0
        n = self.store.commit_staged(self.pending, check_existing=self.check_existing)
        self.pending, self._since = [], None
        self.committed += n
        self.commits += 1
        return n

    def __enter__(self) -> BatchedWriter:
        return self

    def __exit__(self, exc_type: Any, *_: Any) -> None:
        if exc_type is None:
            self.flush()


__all__ = ["BatchedWriter", "Staged", "commit_staged", "drop_raced_copies", "stage", "staged_props", "writer_name"]
