"""The key of each store table, declared to Lance, and the insert-if-absent commit built on it.

A store on object storage has no lock that two processes share, so "look up which ids are stored,
then append the rest" can double a row when two writers import the same rows at once. Lance
detects that race itself when the key is declared as the table's (unenforced) primary key: a
``merge_insert`` that inserts a key which a concurrent, already committed transaction inserted
fails to commit, and Lance re-runs it against the new version, where the key is found and skipped
(measured here: two ``merge_insert``s of the same new keys from one read version leave one copy;
without the declaration, two). New remote stores declare :data:`KEYS` at init
(:func:`with_keys`); :func:`insert_absent` is the commit the importers use on them.

Lance reads the declaration from the field metadata key :data:`PRIMARY_KEY`
(``lance-schema:unenforced-primary-key``; Lance's docs, "unenforced primary key": Lance does not
check uniqueness on append, only merge-insert conflicts use it).
"""

from __future__ import annotations

import lance
import pyarrow as pa

#: table -> its key columns
KEYS = {"rollouts": ["rollout_id"], "prompts": ["prompt_id"], "state": ["key"]}
PRIMARY_KEY = "lance-schema:unenforced-primary-key"


def with_keys(name: str, schema: pa.Schema) -> pa.Schema:
    """``schema`` with table ``name``'s key columns declared as its primary key (field metadata)."""
    keys = KEYS.get(name, [])
    return pa.schema([f.with_metadata({**(f.metadata or {}), PRIMARY_KEY: "true"}) if f.name in keys else f
                      for f in schema], metadata=schema.metadata)


def has_key(ds: lance.LanceDataset, column: str) -> bool:
    """Does ``ds`` declare ``column`` as (part of) its primary key?"""
    md = ds.schema.field(column).metadata or {}
    return md.get(PRIMARY_KEY.encode()) == b"true"


def insert_absent(uri: str, table: pa.Table, key: str, storage_options: dict[str, str] | None) -> int:
    """Insert the rows of ``table`` whose ``key`` is not stored, as one Lance commit (``merge_insert``,
    when-not-matched insert); rows whose key is stored, or is inserted by a concurrent writer first,
    are skipped (see the module). Returns the rows inserted.

    Example: a table holding ids ``a``, ``b`` and ``table`` of ids ``b``, ``c`` → inserts ``c``, returns 1."""
    ds = lance.dataset(uri, storage_options=storage_options)
    out = ds.merge_insert(key).when_not_matched_insert_all().execute(table)
    return int(out["num_inserted_rows"])
