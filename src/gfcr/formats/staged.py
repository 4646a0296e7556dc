"""An import split across workers, committed once: each worker runs the ordinary importer on its share
of a dump's files with its writes staged (:func:`stage_import`), and one :func:`commit_import` makes all
the workers' rows visible in one rollouts commit (:mod:`gfcr.store.staging`). ``gfcr scale import``
runs the workers on Ray (:mod:`gfcr.scale.importing`); nothing here needs Ray.

A worker parses and validates exactly as ``gfcr store import`` does (the same
:func:`~gfcr.formats.import_rollouts`, the same ids, the same rows, rows already stored skipped), but
through a :class:`StagingStore`: reads go to the store, rollout appends become staged data files
(written, not committed), prompt upserts and file records (the verl path's state rows) are kept and
returned. The commit then, under the store's import lock on local disk:

1. refuses, committing nothing, a rollout id that two workers staged (a format that keeps one
   rollout in two files, such as prime-rl's ``all/`` and ``effective/``, must be imported by
   ``gfcr store import``) or that another writer stored since the workers read the store;
2. upserts the workers' prompts (one merge commit; the last file's copy of a prompt wins, as in a
   serial import);
3. commits every worker's staged rollouts as one Append (all of them or none);
4. records the imported files' signatures (the verl path's "unchanged file" skip), one state write.

So a worker that fails leaves the store as it was: nothing is committed until every worker has
finished (its staged files stay unreferenced, :mod:`gfcr.store.staging`). On object storage there is
no import lock: the commit re-checks the ids just before it commits, and since check and commit are
separate requests (Lance's Append has no key check), an import of the same rows may commit between
them; the later commit then drops its own copies of those rows in a follow-up commit
(:func:`gfcr.store.staging.drop_raced_copies`), so each rollout stays once, and its result says how
many it dropped (``skipped`` and a note).

Not staged: a re-import that would *replace* stored rows (prime-rl's advantage-less copies, a
prime-rl-stream trace that gained annotations) is refused in one line; use ``gfcr store import``.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from gfcr.formats import import_rollouts
from gfcr.records import PROMPT_SCHEMA, conform, prompts_to_table
from gfcr.store.core import RolloutStore, StoreError
from gfcr.store.integrity import file_lock
from gfcr.store.staging import Staged


class StagingStore:
    """A store for one importing worker: reads from ``store``, rollout appends staged (not committed),
    prompt upserts and state writes kept (:attr:`staged`, :attr:`prompts`, :attr:`states`)."""

    local = False  # the importer takes no lock of its own here: the committer does (commit_import)

    def __init__(self, store: RolloutStore):
        self.store, self.path, self.if_absent = store, store.path, False
        self.staged: list[Staged] = []
        self.prompts: list[pa.Table] = []
        self.states: dict[str, dict[str, Any]] = {}
        self._ids: set[str] = set()

    def existing_ids(self, ids: list[str], table: str = "rollouts", column: str = "rollout_id") -> set[str]:
        return self.store.existing_ids(ids, table, column) | (self._ids & set(ids) if table == "rollouts" else set())

    def get(self, ids: list[str], columns: list[str] | None = None) -> pa.Table:
        return self.store.get(ids, columns)

    def dataset(self, name: str) -> Any:
        return self.store.dataset(name)

    def count(self, table: str = "rollouts", where: str | None = None) -> int:
        return self.store.count(table, where)

    def append(self, records: Any, source: str = "append", check_existing: bool = True) -> int:
        s = self.store.stage(records, source=source, check_existing=False)  # (the importer skipped stored ids)
        self.staged.append(s)
        self._ids.update(s.ids)
        return s.rows

    def upsert_prompts(self, prompts: Any) -> int:
        t = conform(prompts, PROMPT_SCHEMA, "prompts") if isinstance(prompts, pa.Table) else prompts_to_table(prompts)
        self.prompts.append(t)
        return t.num_rows

    def update(self, records: Any) -> int:
        raise StoreError("this import would replace stored rollouts with better copies, which a staged import "
                         "cannot do; import this dump with `gfcr store import`")

    def put_state(self, key: str, value: dict[str, Any]) -> None:
        self.states[key] = value

    def put_states(self, values: dict[str, dict[str, Any]]) -> None:
        self.states.update(values)


@dataclass
class StagedImport:
    """What one worker staged: its files, staged rollout batches, prompts and file records (to
    commit), and its counts and notes (``written``: rows staged; ``skipped``: rows found stored)."""

    files: list[str]
    staged: list[Staged]
    prompts: pa.Table | None
    states: dict[str, dict[str, Any]]
    written: int = 0
    skipped: int = 0
    notes: list[str] = field(default_factory=list)
    tokens: str = ""
    how: dict[str, str] = field(default_factory=dict)  #: per file, as ImportResult.how (verl: ``unchanged``…)
    cpu_s: float = 0.0  #: CPU seconds of the staging process (all its threads)


def stage_import(store: RolloutStore, fmt: str, files: list[str], scope_roots: list[str],
                 **opts: Any) -> StagedImport:
    """Import ``files`` (a share of the dump under ``scope_roots``) into ``store`` with every write
    staged (see the module); ``opts`` as :func:`~gfcr.formats.import_rollouts` takes them."""
    proxy = StagingStore(store)
    c0 = time.process_time()
    res = import_rollouts(proxy, fmt, files, scope_roots=scope_roots, **opts)  # type: ignore[arg-type]
    prompts = pa.concat_tables(proxy.prompts) if proxy.prompts else None
    return StagedImport([str(f) for f in files], proxy.staged, prompts, proxy.states, res.written, res.skipped,
                        list(res.notes), res.tokens_source, dict(res.how), time.process_time() - c0)


def last_per_id(prompts: pa.Table) -> pa.Table:
    """The last row of each ``prompt_id`` (what upserting the rows one after another leaves).

    Example: ids [a, b, a] → rows 1 and 2 (b, then the second a)."""
    last = {pid: i for i, pid in enumerate(prompts.column("prompt_id").to_pylist())}
    return prompts.take(pa.array(sorted(last.values()), pa.int64()))


@contextlib.contextmanager
def _import_lock(store: RolloutStore) -> Iterator[None]:
    """The local store's import lock (the same ``flock`` a serial import takes); none on object storage."""
    if store.local:
        with file_lock(Path(store.path) / ".import.lock"):
            yield
    else:
        yield


def commit_import(store: RolloutStore, parts: Iterable[StagedImport]) -> dict[str, Any]:
    """Commit what the workers staged (steps 1–4 of the module); returns ``written`` (rows committed),
    ``skipped``, ``files`` and ``notes``. Refused in one line, nothing committed, as the module says."""
    parts = list(parts)
    staged = [s for p in parts for s in p.staged if s.rows]
    owner: dict[str, str] = {}
    for p in parts:
        for s in p.staged:
            for i in s.ids:
                if i in owner:
                    raise StoreError(f"rollout id {i!r} was read by two workers (files {owner[i]} and {', '.join(p.files)}): "
                                     "this dump holds one rollout in two files; nothing was committed: import it with "
                                     "`gfcr store import`")
                owner[i] = ", ".join(p.files)
    with _import_lock(store):
        ids = list(owner)
        clash = store.existing_ids(ids) if ids else set()
        if clash:
            raise StoreError(f"{len(clash)} rollout(s) were stored by another writer while the workers ran "
                             f"(e.g. {sorted(clash)[0]!r}); nothing was committed: run the import again "
                             "(rows already stored are skipped)")
        prompts = [p.prompts for p in parts if p.prompts is not None and p.prompts.num_rows]
        if staged and prompts:
            store.upsert_prompts(last_per_id(pa.concat_tables(prompts)))
        written = store.commit_staged(staged)  # (after a racing import of the same rows: its copies dropped)
        states = {k: v for p in parts for k, v in p.states.items()}
        if states:
            store.put_states(states)
    notes: list[str] = []
    for p in parts:  # (the per-worker counts are said once, for the whole import)
        notes.extend(n for n in p.notes if n not in notes and "already in the store" not in n and "unchanged since" not in n)
    raced = len(owner) - written if staged else 0
    if raced:
        notes.append(f"{raced} rollout(s) were committed by a racing import first: this import's copies were dropped")
    unchanged = sum(v == "unchanged" for p in parts for v in p.how.values())
    if unchanged:
        notes.append(f"{unchanged} file(s) unchanged since they were imported: skipped unread")
    return {"written": written, "skipped": sum(p.skipped for p in parts) + raced, "files": [f for p in parts for f in p.files],
            "notes": notes, "tokens": next((p.tokens for p in parts if p.tokens), ""),
            "worker_cpu_s": [round(p.cpu_s, 3) for p in parts]}


__all__ = ["StagedImport", "StagingStore", "commit_import", "last_per_id", "stage_import"]
