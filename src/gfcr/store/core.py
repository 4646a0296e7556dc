"""RolloutStore: a store of Lance datasets queried through DuckDB, in a local directory or under an
object-store URI (``s3://``, ``gs://``, ``az://``; :mod:`gfcr.store.location`, :mod:`gfcr.store.opening`).

Layout of a store::

    gfcr-store.json     manifest: format, schema version, creation time, the commit record (local; on
                        object storage it is the rollouts table's schema metadata, committed with its
                        first version)
    gfcr-store.log      the appends' commit records since gfcr-store.json was last written (local)
    rollouts.lance      one row per trajectory (gfcr.records.ROLLOUT_SCHEMA)
    prompts.lance       tasks + Control state (PROMPT_SCHEMA)
    audits.lance        ROSS audits keyed by (rollout_id, judge, judge_version) (AUDIT_SCHEMA)
    state.lance         small JSON state of Control/Replay components, keyed by name

Every dataset is created empty, with its schema, when the store is initialised; afterwards rows are
only appended or merged. Every write is one Lance commit (a conflict with another writer's commit
is retried, :func:`gfcr.store.commits.retry_commit`): a batch lands whole or not at all, a killed
writer leaves the earlier commits intact, and every commit is a version that
:meth:`RolloutStore.checkout` can travel back to.

Upkeep (:mod:`gfcr.store.upkeep`): duplicate ids are looked up in an in-process hash index, and
every write merges adjacent small fragments of one size tier (``auto_compact`` at a time).

Integrity (:mod:`gfcr.store.integrity`): a local store records every commit's Lance version, row
count and new files' digests (an append: one line of its record log) and checks them cheaply at
open; ``gfcr store check`` verifies everything.
A remote store writes nothing outside Lance's own commit (docs/store.md, "Stores on object storage").

Summaries: the write path writes rows and what integrity needs, nothing else. Per-step summaries
(the report's metrics, the health checks, the viewer's run list) are derived from the rows by their
readers (:func:`gfcr.diagnose.metrics.step_metrics`, cached per store version in the process).

Reads (:mod:`gfcr.store.reads`): :meth:`RolloutStore.get` and :meth:`RolloutStore.sample` take rows
by row id or offset, never through a filtered scan of whole rows.

Long because: it is the store's one public face (open, every write, every read, upkeep, staging, the
text index), each method a few lines over the modules named above.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterable, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import lance
import pyarrow as pa
import pyarrow.compute as pc

from gfcr.records import (
    AUDIT_SCHEMA,
    PROMPT_SCHEMA,
    ROLLOUT_SCHEMA,
    Audit,
    Prompt,
    Rollout,
    audits_to_table,
    conform,
    prompts_to_table,
    rollouts_to_table,
    table_to_prompts,
    table_to_rollouts,
    utcnow,
)
from gfcr.store import integrity
from gfcr.store.commits import retry_commit as _retry
from gfcr.store.commits import writes
from gfcr.store.errors import StoreError
from gfcr.store.integrity import MANIFEST
from gfcr.store.keys import has_key, insert_absent
from gfcr.store.location import Location, locate
from gfcr.store.opening import open_local, open_remote, props
from gfcr.store.readcache import REQUEST_BYTES, REQUEST_BYTES_ENV, ReadCache, RemoteReads, env_int
from gfcr.store.reads import (
    READ_BLOCK_SIZE,
    READ_PARAMS,
    REMOTE_BLOCK_SIZE,
    build_id_index,
    rollout_filter,
    rows_in,
    sample_rows,
    take_ids,
)
from gfcr.store.sql import in_list, quote
from gfcr.store.staging import Staged, commit_staged, stage
from gfcr.store.textindex import build_text_index
from gfcr.store.upkeep import compact_small, compaction_due, fragment_set, hash_ids, id_index

STATE_SCHEMA = pa.schema(
    [
        pa.field("key", pa.string(), nullable=False),
        pa.field("value", pa.string(), nullable=False),
        pa.field("updated_at", pa.timestamp("us", tz="UTC"), nullable=False),
    ]
)
TABLES: dict[str, pa.Schema] = {
    "rollouts": ROLLOUT_SCHEMA,
    "prompts": PROMPT_SCHEMA,
    "audits": AUDIT_SCHEMA,
    "state": STATE_SCHEMA,
}
#: after a write, this many adjacent fragments of one size tier are merged into one (0 = never)
AUTO_COMPACT = 8


_SESSION: list[Any] = []


def _session() -> Any:
    """One Lance session per process: its cached file metadata is read once, not on every open."""
    if not _SESSION:
        _SESSION.append(lance.Session() if hasattr(lance, "Session") else None)
    return _SESSION[0]



class RolloutStore:
    """A durable, queryable rollout store. See the module docstring for the layout.

    Open with ``RolloutStore.open(path, create=True)``. A store opened by :meth:`checkout` is a
    read-only view of an earlier version. ``auto_compact``: after a write, that many adjacent
    fragments of one size tier are merged into one (:func:`gfcr.store.upkeep.pick_compaction`);
    ``0`` turns automatic compaction off.
    """

    def __init__(self, path: str | os.PathLike[str] | Location, versions: dict[str, int] | None = None,
                 auto_compact: int = AUTO_COMPACT, manifest: dict[str, Any] | None = None,
                 read_cache: ReadCache | None = None, request_bytes: int | None = None):
        self.location = locate(path)
        self.local = not self.location.remote
        self.path: Any = self.location.local if self.local else self.location.uri  # Path, or the URI (str)
        self._opts = self.location.storage_options
        self._pinned = versions  # None = follow the latest version of every table
        self.manifest = manifest if manifest is not None else integrity.read_manifest(self.path)
        self.auto_compact = int(auto_compact)
        self.compactions: list[dict[str, Any]] = []  # automatic compactions done by this object
        self.if_absent = False  # see append()
        self._relaxed = False  # every nullable rollout field is nullable in the stored schema (_allow_nulls)
        #: on object storage: random-row reads' local cache of data files, and what a request costs in
        #: bytes (gfcr.store.readcache; GFCR_READ_CACHE, GFCR_READ_CACHE_BYTES, GFCR_REQUEST_BYTES)
        self.read_cache = None if self.local else read_cache
        self.request_bytes = int(request_bytes or env_int(REQUEST_BYTES_ENV, REQUEST_BYTES))
        self._head: lance.LanceDataset | None = None  # the rollouts table as this object's last append left it

    # --- opening ------------------------------------------------------------------------------
    @classmethod
    def open(cls, path: str | os.PathLike[str], create: bool = False, auto_compact: int = AUTO_COMPACT,
             verify: bool = True, storage_options: dict[str, Any] | None = None,
             allow_unsafe_commits: bool = False, read_cache: str | os.PathLike[str] | ReadCache | None = None,
             request_bytes: int | None = None) -> RolloutStore:
        """Open (or with ``create``, create) the store at ``path``: a local directory or an ``s3://``,
        ``gs://``, ``az://`` URI (:mod:`gfcr.store.location`; ``storage_options``: Lance's object-store
        options, over the environment's). ``verify``: run the cheap integrity checks
        (:func:`~gfcr.store.integrity.quick_check`; a damaged store raises ``StoreDamaged``).
        ``read_cache`` (a folder, or a :class:`~gfcr.store.readcache.ReadCache`; default
        ``$GFCR_READ_CACHE``) and ``request_bytes`` (default ``$GFCR_REQUEST_BYTES`` or 2 MiB): how
        ``get`` and ``sample`` read a store on object storage (:mod:`gfcr.store.readcache`; a local
        store reads its own files and keeps no cache)."""
        loc = locate(path, storage_options, allow_unsafe_commits)
        if loc.remote:
            m = open_remote(loc, TABLES, create, verify)
        else:
            m = open_local(loc.local, list(TABLES), create, cls._init)
            if verify:
                integrity.quick_check(loc.local, m, list(TABLES), lambda uri: lance.dataset(uri, session=_session()))
        integrity.opened(loc.uri)
        cache = ReadCache.shared(read_cache) if isinstance(read_cache, (str, os.PathLike)) else read_cache
        return cls(loc, auto_compact=auto_compact, manifest=m, read_cache=cache or ReadCache.from_env(),
                   request_bytes=request_bytes)

    @classmethod
    def init(cls, path: str | os.PathLike[str], storage_options: dict[str, Any] | None = None) -> RolloutStore:
        return cls.open(path, create=True, storage_options=storage_options)

    @staticmethod
    def _init(p: Path) -> None:
        if p.exists() and not p.is_dir():
            raise StoreError(f"{p} is a file, not a directory")
        p.mkdir(parents=True, exist_ok=True)
        with open(p / ".init.lock", "w") as lockf:
            fcntl.flock(lockf, fcntl.LOCK_EX)
            if (p / MANIFEST).exists():
                return  # another process initialised it while we waited
            integrity.refuse_lost_manifest(p, list(TABLES))
            committed = {}
            for name, schema in TABLES.items():
                uri = str(p / f"{name}.lance")
                if not os.path.exists(uri):  # (an init that crashed may have created some already)
                    lance.write_dataset(pa.Table.from_batches([], schema=schema), uri, mode="create")
                ds = lance.dataset(uri)
                committed[name] = {"version": ds.version, "rows": ds.count_rows()}
            # (the new tables have no files: nothing to digest yet, and the first append's record is a log line)
            integrity.write_manifest(p, {**integrity.new_manifest(list(TABLES)), "committed": committed, "files": {}})

    # --- low level ------------------------------------------------------------------------------
    def _record(self, name: str, ds: lance.LanceDataset | None = None,
                since: lance.LanceDataset | None = None) -> None:
        """Record table ``name``'s version after a commit in a local store's manifest
        (:func:`gfcr.store.integrity.record_commit`; ``since``: the version an append wrote on, so
        that only its new files are digested); a remote store records nothing outside Lance's commit."""
        if self.local:
            integrity.record_commit(self.path, name, ds if ds is not None else self._latest(name), since)

    def _uri(self, name: str) -> str:
        return self.location.join(f"{name}.lance")

    def _latest(self, name: str) -> lance.LanceDataset:
        """Table ``name`` at its latest version (whatever this view pins)."""
        return lance.dataset(self._uri(name), storage_options=self._opts)

    def _write_head(self) -> lance.LanceDataset:
        """The rollouts table at its latest version, for an append: the dataset this object's last
        append committed when no commit has landed since (one listing of the versions, no open: ~0.4 ms
        of a 64-row append locally, a manifest read on object storage), else a fresh open."""
        h = self._head
        if h is not None and h.latest_version == h.version:
            return h
        return self.dataset("rollouts")

    def dataset(self, name: str) -> lance.LanceDataset:
        """The Lance dataset of table ``name`` at the pinned (or latest) version."""
        if name not in TABLES:
            raise StoreError(f"unknown table {name!r}; tables are {sorted(TABLES)}")
        version = self._pinned[name] if self._pinned is not None else None
        return lance.dataset(self._uri(name), version=version, session=_session(), read_params=READ_PARAMS,
                             block_size=READ_BLOCK_SIZE if self.local else REMOTE_BLOCK_SIZE, storage_options=self._opts)

    @property
    def read_only(self) -> bool:
        return self._pinned is not None

    def _writable(self) -> None:
        if self._pinned is not None:
            raise StoreError("this store view is a checkout of an earlier version and is read-only")

    def _append(self, name: str, table: pa.Table) -> lance.LanceDataset:
        uri = self._uri(name)
        ds = _retry(lambda: lance.write_dataset(table, uri, mode="append", storage_options=self._opts,
                                                transaction_properties=props(table)))
        self._record(name, ds)
        self._upkeep(name, ds)
        return ds

    def _merge(self, name: str, table: pa.Table, on: str | list[str], insert: bool = True) -> None:
        """Merge ``table`` into table ``name`` (one commit)."""

        def go() -> None:
            b = self._latest(name).merge_insert(on).when_matched_update_all()
            if insert:
                b = b.when_not_matched_insert_all()
            b.execute(table)

        _retry(go)
        ds = self._latest(name)
        self._record(name, ds)
        self._upkeep(name, ds)

    def _upkeep(self, name: str, ds: lance.LanceDataset) -> None:
        """Merge ``auto_compact`` adjacent fragments of one size tier of table ``name``, if it has them."""
        if not compaction_due(ds, self.auto_compact):
            return
        idx = id_index(self._uri(name), "rollout_id") if name == "rollouts" else None
        if idx is not None:
            with idx.lock:
                ds = self._latest(name)
                frags, rows = fragment_set(ds), ds.count_rows()
                done = compact_small(ds, self.auto_compact, self._opts)
                if done:
                    idx.compacted(frags, rows, self._latest(name))
        else:
            done = compact_small(ds, self.auto_compact, self._opts)
        if done:
            self._record(name)
            self.compactions.append({"table": name, **done})

    # --- rollouts -------------------------------------------------------------------------------
    def _as_rollout_table(self, records: Iterable[Rollout] | pa.Table, source: str) -> pa.Table:
        if isinstance(records, pa.Table):
            return conform(records, ROLLOUT_SCHEMA, source)
        return rollouts_to_table(records)

    def existing_ids(self, ids: Sequence[str], table: str = "rollouts", column: str = "rollout_id") -> set[str]:
        """Which of ``ids`` are already stored (through the id index, see :mod:`gfcr.store.upkeep`;
        a checkout of an earlier version reads the column instead)."""
        ds = self.dataset(table)
        ids = list(ids)
        if self._pinned is None:
            idx = id_index(self._uri(table), column)
            with idx.lock:
                return idx.existing(ds, ids)
        found: set[str] = set()
        for i in range(0, len(ids), 2000):
            chunk = ids[i : i + 2000]
            t = ds.to_table(columns=[column], filter=in_list(column, chunk))
            found.update(t.column(0).to_pylist())
        return found

    @writes
    def append(self, records: Iterable[Rollout] | pa.Table, source: str = "append", check_existing: bool = True) -> int:
        """Append rollouts as one commit. Rejects duplicate ``rollout_id``s (within the batch or
        against the store) before writing anything. Returns the number of rows written.
        ``check_existing=False`` skips the look-up against stored ids (cheap through the in-process id index,
        whose first use in a process reads every stored id) for writers whose ids are fresh by construction
        (random uuids), e.g. the live recorders; duplicates within the batch are still refused.
        ``self.if_absent`` (an import into a remote store): stored ids are skipped in the commit itself
        (:func:`gfcr.store.keys.insert_absent`). Only the rows and what integrity needs are written:
        per-step summaries are derived by readers (:func:`gfcr.diagnose.metrics.step_metrics`)."""
        self._writable()
        table = self._as_rollout_table(records, source)
        if table.num_rows == 0:
            return 0
        ids = table.column("rollout_id")
        if pc.count_distinct(ids).as_py() != table.num_rows:
            vc = pc.value_counts(ids)
            dup = next(x["values"].as_py() for x in vc if x["counts"].as_py() > 1)
            raise StoreError(f"duplicate rollout_id {dup!r} within the batch; nothing was written")
        id_list = ids.to_pylist()
        hashes = hash_ids(id_list)
        idx = id_index(self._uri("rollouts"), "rollout_id")
        with idx.lock:  # one check-and-commit at a time in this process
            before = self._write_head()
            clash = idx.existing(before, id_list, hashes) if check_existing else set()
            if clash and not self.if_absent:
                raise StoreError(
                    f"{len(clash)} rollout_id(s) already in the store (e.g. {sorted(clash)[0]!r}); nothing was written"
                )
            # the write goes through the dataset just checked (Lance then opens none of its own: on object
            # storage a list and a manifest read fewer; a commit that landed since is rebased on, as for a
            # path); after a schema change, the new one; a try after a commit conflict, a fresh open
            changed = self._allow_nulls(table, before)
            uri = self._uri("rollouts")
            target = self.dataset("rollouts") if changed else before
            tries: list[lance.LanceDataset] = []  # the dataset each try wrote on
            since = None
            if self.if_absent and has_key(before, "rollout_id"):
                n, after = _retry(lambda: insert_absent(uri, table, "rollout_id", self._opts)), self._latest("rollouts")
            else:
                def write() -> lance.LanceDataset:
                    tries.append(self._latest("rollouts") if tries else target)
                    return lance.write_dataset(table, tries[-1], mode="append", storage_options=self._opts,
                                               transaction_properties=props(table))

                n, after = table.num_rows, _retry(write)
                since = tries[-1] if self.local else None
            idx.committed(before, after, hashes)
            self._head = after
        self._record("rollouts", after, since)
        self._upkeep("rollouts", after)
        return n

    @writes
    def stage(self, records: Iterable[Rollout] | pa.Table, source: str = "stage", check_existing: bool = True) -> Staged:
        """Write rollouts as data files without a commit; :meth:`commit_staged` (in any process) makes
        them visible. Refuses what :meth:`append` refuses, writing nothing (:mod:`gfcr.store.staging`)."""
        self._writable()
        table = self._as_rollout_table(records, source)
        self._allow_nulls(table, self.dataset("rollouts"))
        return stage(self._latest("rollouts"), table, self.existing_ids if check_existing else None)

    @writes
    def commit_staged(self, staged: Sequence[Staged], check_existing: bool = True) -> int:
        """One commit of many staged batches (:func:`gfcr.store.staging.commit_staged`); returns the rows added."""
        self._writable()
        return commit_staged(self._uri("rollouts"), lambda: self._latest("rollouts"), staged, self._opts,
                             lambda ds: (self._record("rollouts", ds), self._upkeep("rollouts", ds)), check_existing)

    def _allow_nulls(self, table: pa.Table, ds: lance.LanceDataset) -> bool:
        """Stores created before a rollout field became nullable (``finish_reason``: null = not
        recorded by the source) get that field relaxed, once, before the first null is written
        (``ds``: the rollouts table as just opened). Returns whether it changed the schema."""
        changed = False
        need = [f for f in ROLLOUT_SCHEMA if f.nullable and table.column(f.name).null_count]
        if not need or self._relaxed:
            return False
        stored = ds.schema  # (converting Lance's schema costs ~0.05 ms: once per store object)
        self._relaxed = all(stored.field(f.name).nullable for f in ROLLOUT_SCHEMA if f.nullable)
        for f in need:
            if not stored.field(f.name).nullable:
                _retry(lambda f=f: self._latest("rollouts").alter_columns({"path": f.name, "nullable": True}))
                self._record("rollouts")
                changed = True
        return changed

    @writes
    def update(self, records: Iterable[Rollout] | pa.Table) -> int:
        """Replace stored rollouts that have the same ``rollout_id`` (a new version; the old rows stay
        reachable through :meth:`checkout`). Every id must already exist."""
        self._writable()
        table = self._as_rollout_table(records, "update")
        if table.num_rows == 0:
            return 0
        ids = table.column("rollout_id").to_pylist()
        if len(set(ids)) != len(ids):
            raise StoreError("duplicate rollout_id in update batch; nothing was written")
        missing = set(ids) - self.existing_ids(ids)
        if missing:
            raise StoreError(f"{len(missing)} rollout_id(s) not in the store (e.g. {sorted(missing)[0]!r}); use append")
        self._merge("rollouts", table, "rollout_id", insert=False)
        return table.num_rows

    def scan(
        self,
        run: str | None = None,
        steps: tuple[int, int] | None = None,
        verified: bool | None = None,
        prompt_ids: Iterable[str] | None = None,
        task: str | None = None,
        columns: Sequence[str] | None = None,
        where: str | None = None,
    ) -> pa.Table:
        """Rollouts matching every given filter (``steps`` is inclusive; ``where`` is a Lance SQL
        predicate such as ``"reward > 0.5"``), as an Arrow table."""
        flt = rollout_filter(run, steps, verified, prompt_ids, task, where)
        try:
            return self.dataset("rollouts").to_table(columns=list(columns) if columns else None, filter=flt)
        except (ValueError, OSError) as e:
            raise StoreError(f"scan failed (filter {flt!r}): {e}") from e

    def rollouts(self, **filters: Any) -> list[Rollout]:
        """Like :meth:`scan` but returns :class:`~gfcr.records.Rollout` objects."""
        filters.pop("columns", None)
        return table_to_rollouts(self.scan(**filters))

    def get(self, ids: Sequence[str], columns: Sequence[str] | None = None) -> pa.Table:
        """Rows for ``ids`` in the order given (an id may repeat; unknown ids raise ``KeyError``);
        an id look-up, then a take of those rows only (:func:`gfcr.store.reads.take_ids`)."""
        ds = self.dataset("rollouts")
        return take_ids(ds, ids, columns, self._remote_reads(ds))

    def sample(self, n: int, where: str | None = None, seed: int | None = None,
               columns: Sequence[str] | None = None) -> pa.Table:
        """``n`` distinct random rows (all rows if fewer), optionally among rows matching ``where``; the
        same ``seed`` gives the same rows on any backend. On object storage each data file is read by
        ranges, whole, or from the read cache (:func:`gfcr.store.reads.take_planned`)."""
        ds = self.dataset("rollouts")
        return sample_rows(ds, n, where, seed, columns, self._remote_reads(ds))

    def _remote_reads(self, ds: lance.LanceDataset) -> RemoteReads | None:
        """How random-row reads of ``ds`` (the rollouts table) go on object storage (None: local)."""
        if self.local:
            return None
        uri = self._uri("rollouts")
        reopen = lambda block: lance.dataset(  # noqa: E731
            uri, version=ds.version, session=_session(), read_params=READ_PARAMS, block_size=block,
            storage_options=self._opts)
        return RemoteReads(uri, self._opts, reopen, {"read_params": READ_PARAMS, "session": _session()},
                           self.request_bytes, self.read_cache)

    def count(self, table: str = "rollouts", where: str | None = None) -> int:
        return self.dataset(table).count_rows(filter=where)

    # --- prompts and Control state ---------------------------------------------------------------
    @writes
    def upsert_prompts(self, prompts: Iterable[Prompt] | pa.Table) -> int:
        """Insert new prompts or refresh existing ones. An existing prompt keeps its Control state."""
        self._writable()
        table = conform(prompts, PROMPT_SCHEMA, "prompts") if isinstance(prompts, pa.Table) else prompts_to_table(prompts)
        if table.num_rows == 0:
            return 0
        ids = table.column("prompt_id").to_pylist()
        if len(set(ids)) != len(ids):
            raise StoreError("duplicate prompt_id in the batch; nothing was written")
        old = self._prompt_rows(ids, columns=["prompt_id", "control"])
        if old.num_rows:
            keep = dict(zip(old.column("prompt_id").to_pylist(), old.column("control").to_pylist(), strict=True))
            ctrl = [keep.get(pid, c) if c == "{}" else c for pid, c in zip(ids, table.column("control").to_pylist(), strict=True)]
            table = table.set_column(table.schema.get_field_index("control"), "control", pa.array(ctrl, pa.string()))
        self._merge("prompts", table, "prompt_id")
        return table.num_rows

    def _prompt_rows(self, ids: Sequence[str] | None, columns: Sequence[str] | None = None,
                     where: str | None = None) -> pa.Table:
        return rows_in(self.dataset("prompts"), "prompt_id", ids, columns, where)

    def prompts(self, ids: Sequence[str] | None = None, task: str | None = None,
                split: str | None = None) -> list[Prompt]:
        parts = []
        if task is not None:
            parts.append(f"task = {quote(task)}")
        if split is not None:
            parts.append(f"split = {quote(split)}")
        t = self._prompt_rows(ids, where=" AND ".join(parts) or None)
        ps = table_to_prompts(t)
        if ids is not None:
            pos = {p.prompt_id: p for p in ps}
            ps = [pos[i] for i in ids if i in pos]
        return ps

    def get_control(self, name: str) -> dict[str, dict[str, Any]]:
        """Per-prompt Control state of component ``name``: {prompt_id: state}."""
        t = self._prompt_rows(None, columns=["prompt_id", "control"])
        out = {}
        for pid, c in zip(t.column("prompt_id").to_pylist(), t.column("control").to_pylist(), strict=True):
            state = json.loads(c).get(name)
            if state is not None:
                out[pid] = state
        return out

    @writes
    def set_control(self, name: str, states: dict[str, dict[str, Any]]) -> None:
        """Set the Control state of component ``name`` for the given prompts (which must exist)."""
        self._writable()
        if not states:
            return
        t = self._prompt_rows(list(states))
        found = set(t.column("prompt_id").to_pylist())
        missing = set(states) - found
        if missing:
            raise StoreError(
                f"{len(missing)} prompt(s) not in the store's prompts table (e.g. {sorted(missing)[0]!r}); "
                "register prompts with upsert_prompts first"
            )
        ctrl = []
        for pid, c in zip(t.column("prompt_id").to_pylist(), t.column("control").to_pylist(), strict=True):
            d = json.loads(c)
            d[name] = states[pid]
            ctrl.append(json.dumps(d, sort_keys=True))
        t = t.set_column(t.schema.get_field_index("control"), "control", pa.array(ctrl, pa.string()))
        t = t.set_column(
            t.schema.get_field_index("updated_at"), "updated_at", pa.array([utcnow()] * t.num_rows, PROMPT_SCHEMA.field("updated_at").type)
        )
        self._merge("prompts", t, "prompt_id", insert=False)

    def get_state(self, key: str) -> dict[str, Any] | None:
        t = self.dataset("state").to_table(filter=f"key = {quote(key)}")
        return json.loads(t.column("value")[0].as_py()) if t.num_rows else None

    def put_state(self, key: str, value: dict[str, Any]) -> None:
        self.put_states({key: value})
    @writes
    def put_states(self, values: dict[str, dict[str, Any]]) -> None:
        """Set several state keys in one commit."""
        self._writable()
        now = utcnow()
        rows = [{"key": k, "value": json.dumps(v, sort_keys=True), "updated_at": now} for k, v in values.items()]
        self._merge("state", pa.Table.from_pylist(rows, schema=STATE_SCHEMA), "key")

    # --- audits -----------------------------------------------------------------------------
    @writes
    def upsert_audits(self, audits: Iterable[Audit] | pa.Table) -> int:
        self._writable()
        table = conform(audits, AUDIT_SCHEMA, "audits") if isinstance(audits, pa.Table) else audits_to_table(audits)
        if table.num_rows == 0:
            return 0
        self._merge("audits", table, ["rollout_id", "judge", "judge_version"])
        return table.num_rows

    def audits(self, judge: str | None = None, rollout_ids: Sequence[str] | None = None,
               judge_version: str | None = None) -> pa.Table:
        parts = []
        if judge is not None:
            parts.append(f"judge = {quote(judge)}")
        if judge_version is not None:
            parts.append(f"judge_version = {quote(judge_version)}")
        if rollout_ids is not None:
            parts.append(in_list("rollout_id", rollout_ids))
        return self.dataset("audits").to_table(filter=" AND ".join(parts) or None)

    # --- SQL, versions, maintenance --------------------------------------------------------------
    @contextmanager
    def duckdb(self):  # noqa: ANN201 - yields a duckdb connection
        """A DuckDB connection with the store's tables registered as views (read-only use)."""
        import duckdb

        con = duckdb.connect()
        try:
            for name in TABLES:
                con.register(name, self.dataset(name))
            yield con
        finally:
            con.close()

    def sql(self, query: str) -> pa.Table:
        """Run a DuckDB SQL query over the tables ``rollouts``, ``prompts``, ``audits``, ``state``."""
        import duckdb

        with self.duckdb() as con:
            try:
                rel = con.sql(query)
                return rel.to_arrow_table() if rel is not None else pa.table({})
            except duckdb.Error as e:
                raise StoreError(f"SQL error: {e}") from e

    def versions(self) -> list[dict[str, Any]]:
        """Versions of the rollouts table (the store's version): version, timestamp, rows."""
        out = []
        for v in self._latest("rollouts").versions():
            out.append(
                {"version": v["version"], "timestamp": v["timestamp"], "rows": int(v["metadata"].get("total_rows", 0))}
            )
        return out

    @property
    def version(self) -> int:
        return self.dataset("rollouts").version

    def checkout(self, version: int) -> RolloutStore:
        """A read-only view of the store as it was at rollouts version ``version``; the other tables
        are shown at their latest version committed at or before that moment."""
        vs = {v["version"]: v["timestamp"] for v in self._latest("rollouts").versions()}
        if version not in vs:
            raise StoreError(f"no version {version}; available: {min(vs)}..{max(vs)} (see `gfcr store versions`)")
        ts = vs[version]
        pinned = {"rollouts": version}
        for name in TABLES:
            if name == "rollouts":
                continue
            cands = [v["version"] for v in self._latest(name).versions() if v["timestamp"] <= ts]
            pinned[name] = max(cands) if cands else 1
        return RolloutStore(self.location, versions=pinned, auto_compact=0, manifest=self.manifest,
                            read_cache=self.read_cache, request_bytes=self.request_bytes)

    @writes
    def compact(self) -> dict[str, Any]:
        """Merge small fragments of every table (a new version; history stays), then (re)build the
        BTREE index on ``rollout_id`` that :meth:`get` and the duplicate-id check's exact look-ups use.

        Rows appended later are not in the index until the next ``compact()``: Lance scans them
        (as it scans fragments that automatic compaction rewrote), so look-ups stay exact."""
        self._writable()
        out = {}
        for name in TABLES:
            ds = self._latest(name)
            before = len(ds.get_fragments())
            idx = id_index(self._uri(name), "rollout_id") if name == "rollouts" else None
            if idx is not None:
                with idx.lock:
                    idx.catch_up(ds)
                    frags, rows = fragment_set(ds), ds.count_rows()
                    metrics = _retry(lambda ds=ds: ds.optimize.compact_files())
                    idx.compacted(frags, rows, self._latest(name))
            else:
                metrics = _retry(lambda ds=ds: ds.optimize.compact_files())
            self._record(name)
            out[name] = {"fragments_before": before, "fragments_after": len(self._latest(name).get_fragments()),
                         "fragments_removed": getattr(metrics, "fragments_removed", None), "index": None}
        if _retry(lambda: build_id_index(self._uri("rollouts"), self._opts)):
            self._record("rollouts")
            out["rollouts"]["index"] = "rollout_id (BTREE)"
        return out

    @writes
    def index_text(self) -> dict[str, Any]:
        """Build the full-text index over the rollouts' turns, or add the rows appended since
        (:func:`gfcr.store.textindex.build_text_index`; one commit). ``gfcr store index`` runs it."""
        self._writable()
        out = _retry(lambda: build_text_index(self._uri("rollouts"), self._opts))
        if out["action"] != "empty":
            self._record("rollouts")
        return out

    def stats(self, run: str | None = None) -> list[dict[str, Any]]:
        """Per (run, step): ``n_rollouts``, ``gen_tokens``, ``reward_mean``, ``verified_rate`` (the share
        verified among rows with a verdict): the report's names (:data:`gfcr.store.stepstats.STEP_COLUMNS`)
        and definitions, counted in one SQL query."""
        where = f"WHERE run_id = {quote(run)}" if run is not None else ""
        t = self.sql(
            f"""
            SELECT run_id, step, count(*) AS n_rollouts,
                   coalesce(sum(list_sum(token_role)), 0)::BIGINT AS gen_tokens,
                   avg(reward) AS reward_mean,
                   avg(CASE WHEN verified THEN 1.0 WHEN verified = false THEN 0.0 END) AS verified_rate
            FROM rollouts {where} GROUP BY run_id, step ORDER BY run_id, step
            """
        )
        return t.to_pylist()

    def __repr__(self) -> str:
        ro = ", read-only" if self.read_only else ""
        return f"RolloutStore({str(self.path)!r}{ro})"
