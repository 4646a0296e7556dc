"""Opening and creating a store on object storage (``s3://``, ``gs://``, ``az://``; local stores:
:meth:`gfcr.store.core.RolloutStore.open`).

**The manifest commits with the rows' table.** A remote store has no ``gfcr-store.json``: its
manifest (format, schema version, creator, commit handler) is the schema metadata
:data:`MANIFEST_KEY` of the ``rollouts`` table, written by that table's first Lance commit, which
the object store accepts only if no version 1 exists (a conditional create: of two racing inits one
wins, the other reads the winner's manifest). Each table declares its key to Lance
(:mod:`gfcr.store.keys`), so that racing imports cannot store one row twice. Lance carries schema metadata into every later
version, so the manifest is written once and never rewritten; no lock, no sidecar.

**Creating.** :func:`init_remote` creates ``prompts``, ``audits`` and ``state`` first and
``rollouts`` (the manifest) last: a store exists once ``rollouts.lance`` does, and an init that
stopped half-way is completed by the next one (tables already there are kept).

**Opening.** :func:`open_local` reads a local store's ``gfcr-store.json`` (creating the store with
``create``); :func:`open_remote` opens ``rollouts.lance`` (one list of ``_versions/`` and one
manifest read), reads the manifest from its schema, and with ``verify`` opens the other tables.
A missing store, an unreachable endpoint, or a prefix holding something else is one line. Nothing
is ever created on local disk.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lance
import pyarrow as pa

from gfcr.records import SCHEMA_VERSION
from gfcr.store.errors import StoreError, lance_reason
from gfcr.store.integrity import (
    MANIFEST,
    CheckReport,
    FragmentReport,
    TableReport,
    doubled_problem,
    new_manifest,
    read_manifest,
    refuse_lost_manifest,
)
from gfcr.store.keys import with_keys
from gfcr.store.location import Location

#: the rollouts table's schema-metadata key holding a remote store's manifest (JSON)
MANIFEST_KEY = "gfcr-store"


def props(table: pa.Table) -> dict[str, str]:
    """What gfcr commits inside an append's Lance transaction (local and remote; readable with
    ``LanceDataset.read_transaction``): the rows it adds, the record schema version, the writer (host:pid)."""
    return {"gfcr.rows": str(table.num_rows), "gfcr.schema_version": str(SCHEMA_VERSION),
            "gfcr.writer": f"{socket.gethostname()}:{os.getpid()}"}


def newer_schema(where: Any, m: dict[str, Any]) -> dict[str, Any]:
    """``m`` (a store's manifest), or :class:`StoreError` when its schema is newer than this gfcr's."""
    if int(m.get("schema_version", 0)) > SCHEMA_VERSION:
        raise StoreError(f"store {where} has schema version {m['schema_version']}, newer than this gfcr "
                         f"({SCHEMA_VERSION}); upgrade gfcr")
    return m


def open_local(p: Path, tables: list[str], create: bool, init: Callable[[Path], None]) -> dict[str, Any]:
    """The manifest (``gfcr-store.json``) of the local store at ``p``, created first by ``init(p)``
    with ``create``; one line when ``p`` is not a store."""
    if not (p / MANIFEST).exists():
        refuse_lost_manifest(p, tables)
        if not create:
            if (p / "store" / MANIFEST).exists():  # a run folder (gfcr train writes RUN/store)
                raise StoreError(f"{p} is not a gfcr store but holds one: did you mean {p / 'store'}?")
            if p.exists() and any(p.iterdir()) if p.is_dir() else p.exists():
                raise StoreError(f"{p} exists but is not a gfcr store (no {MANIFEST}); choose another path")
            raise StoreError(f"no gfcr store at {p}; create one with `gfcr store init {p}` or open(..., create=True)")
        init(p)
    return newer_schema(p, read_manifest(p))  # (read_manifest checks its format)


def _missing(e: BaseException) -> bool:
    return "was not found" in str(e) or "Not found" in str(e)


def _open(loc: Location, name: str) -> lance.LanceDataset:
    return lance.dataset(loc.join(f"{name}.lance"), storage_options=loc.storage_options)


#: where a remote store's endpoint and credentials come from, per scheme (named in the "cannot reach" line)
CREDENTIALS = {"s3": "AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION",
               "gs": "GOOGLE_SERVICE_ACCOUNT (or GOOGLE_APPLICATION_CREDENTIALS)",
               "az": "AZURE_STORAGE_ACCOUNT_NAME, AZURE_STORAGE_ACCOUNT_KEY, AZURE_STORAGE_ENDPOINT"}
#: the object store's answer when the bucket (S3) or container (Azure) of a URI does not exist
_NO_BUCKET = {"NoSuchBucket": "bucket", "ContainerNotFound": "container"}


def _unreachable(loc: Location, e: BaseException) -> StoreError:
    env = CREDENTIALS.get(loc.scheme.split("+")[0], "the object store's environment variables")
    kind = next((v for k, v in _NO_BUCKET.items() if k in str(e)), None)
    if kind is not None:
        name = loc.uri.split("://", 1)[1].split("/", 1)[0]
        return StoreError(f"the {kind} {name!r} of {loc.uri} does not exist at the endpoint; create it first "
                          f"(gfcr creates no {kind}s; endpoint and credentials come from {env}, or storage_options)")
    return StoreError(f"cannot reach the store at {loc.uri}: {lance_reason(e)[:300]} (endpoint and credentials come "
                      f"from {env}, or storage_options; docs/store.md)")


def manifest_of(loc: Location, ds: lance.LanceDataset) -> dict[str, Any]:
    """The manifest in ``ds``'s (the rollouts table's) schema metadata; :class:`StoreError` when absent."""
    raw = (ds.schema.metadata or {}).get(MANIFEST_KEY.encode())
    if raw is None:
        raise StoreError(f"{loc.uri} holds a Lance table rollouts.lance but is not a gfcr store (no {MANIFEST_KEY!r} "
                         "manifest in its schema); choose another URI")
    return json.loads(raw)


def open_remote(loc: Location, tables: dict[str, pa.Schema], create: bool, verify: bool) -> dict[str, Any]:
    """The manifest of the remote store at ``loc`` (created first with ``create``); see the module."""
    try:
        ds = _open(loc, "rollouts")
    except (OSError, ValueError, RuntimeError) as e:
        if not _missing(e):
            raise _unreachable(loc, e) from None
        if not create:
            raise StoreError(f"no gfcr store at {loc.uri}; create one with `gfcr store init {loc.uri}` "
                             "or open(..., create=True)") from None
        init_remote(loc, tables)
        ds = _open(loc, "rollouts")
    m = newer_schema(loc.uri, manifest_of(loc, ds))
    if verify:
        for name in tables:
            if name != "rollouts":
                try:
                    _open(loc, name)
                except (OSError, ValueError, RuntimeError) as e:
                    raise StoreError(f"{loc.join(name + '.lance')}: table {name} of the store does not open "
                                     f"({lance_reason(e)[:200]}); run `gfcr store check {loc.uri}`") from None
    return m


def init_remote(loc: Location, tables: dict[str, pa.Schema]) -> None:
    """Create every table of a new remote store, ``rollouts`` (with the manifest) last; a table that
    exists already (an earlier init that stopped, or a racing one) is kept as it is."""
    manifest = {**new_manifest(list(tables)), "commit_handler": loc.commit_handler}
    for name in sorted(tables, key=lambda n: n == "rollouts"):
        schema = with_keys(name, tables[name])  # (gfcr.store.keys: Lance detects racing inserts of one key)
        if name == "rollouts":
            schema = schema.with_metadata({**(schema.metadata or {}), MANIFEST_KEY: json.dumps(manifest)})
        try:
            lance.write_dataset(pa.Table.from_batches([], schema=schema), loc.join(f"{name}.lance"), mode="create",
                                storage_options=loc.storage_options)
        except (OSError, ValueError, RuntimeError) as e:
            if "already exists" in str(e) or "conflict" in str(e).lower():
                continue  # another init created it first: its table (and manifest) stand
            raise StoreError(f"cannot create table {name} of the store at {loc.uri}: {lance_reason(e)[:300]}") from None


def check_remote(loc: Location, tables: dict[str, pa.Schema]) -> CheckReport:
    """``gfcr store check`` of a remote store: the manifest in the rollouts table's schema, every
    version of every table (its manifest read), every fragment of each newest version read
    whole, and no ``rollout_id`` stored twice. What a local check adds and this cannot (no ``gfcr-store.json`` record to compare with,
    no digest of the files) is in docs/store.md. Never raises for damage."""
    rep = CheckReport(loc.uri)
    try:
        manifest_of(loc, _open(loc, "rollouts"))
    except (StoreError, OSError, ValueError, RuntimeError) as e:
        rep.problems.append(str(e) if isinstance(e, StoreError) else lance_reason(e))
    for name in tables:
        t = TableReport(name, None, None)
        rep.tables.append(t)
        try:
            ds = _open(loc, name)
        except (OSError, ValueError, RuntimeError) as e:
            t.problems.append(f"{loc.join(name + '.lance')} does not open: {lance_reason(e)[:200]}")
            continue
        for v in [int(x["version"]) for x in ds.versions()]:
            try:
                lance.dataset(loc.join(f"{name}.lance"), version=v, storage_options=loc.storage_options)
                t.versions_readable.append(v)
            except (OSError, ValueError, RuntimeError) as e:
                t.problems.append(f"version {v} of table {name} does not read: {lance_reason(e)[:200]}")
        t.version, t.rows = ds.version, ds.count_rows()
        for frag in ds.get_fragments():
            n = frag.count_rows()
            try:
                got = ds.scanner(fragments=[frag]).to_table().num_rows
                problem = None if got == n else f"read {got} rows, {n} recorded"
            except (OSError, ValueError, RuntimeError, pa.ArrowException) as e:
                problem = f"does not read: {lance_reason(e)[:200]}"
            t.fragments.append(FragmentReport(frag.fragment_id, n, problem is None, problem))
            if problem is None:
                t.rows_readable += n
            else:
                t.problems.append(f"fragment {frag.fragment_id} of table {name} ({n} rows) is damaged: {problem}")
        dup = doubled_problem(ds, t) if name == "rollouts" else None
        if dup:
            t.problems.append(dup)
    return rep
