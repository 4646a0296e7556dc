"""Take rollouts out of a store in gfcr's own schema (JSONL or Parquet), with the prompts they
reference, so that ``gfcr store import --from jsonl|parquet`` rebuilds a store that can be
re-verified (gold answers and tests included).

``export(store, "jsonl", "x.jsonl")`` writes ``x.jsonl`` (one rollout per line) and
``x.prompts.jsonl`` (one prompt per line); Parquet writes ``x.parquet`` and ``x.prompts.parquet``.
Outputs are never overwritten and never left half-written (a temp file renamed into place).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from gfcr.records import PROMPT_SCHEMA, ROLLOUT_SCHEMA, conform
from gfcr.store.core import RolloutStore, StoreError
from gfcr.store.sql import in_list


def prompts_path(out: str | os.PathLike[str]) -> Path:
    """The prompts file that goes with a rollouts export: ``x.jsonl`` → ``x.prompts.jsonl``."""
    out = Path(out)
    return out.with_name(f"{out.stem}.prompts{out.suffix}")


def refuse_existing(out: str | os.PathLike[str]) -> Path:
    """``out`` as a Path; a :class:`StoreError` when it exists (exports never overwrite)."""
    out = Path(out)
    if out.exists():
        raise StoreError(f"{out} exists; gfcr never overwrites outputs: choose a new path")
    return out


def write_new_file(out: Path, write: Callable[[Path], None]) -> None:
    """Have ``write`` fill a temp file next to ``out``, then rename it into place; a failure leaves
    neither ``out`` nor the temp file behind."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.partial-{os.getpid()}")
    try:
        write(tmp)
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)


def rollout_to_json(row: dict[str, Any]) -> dict[str, Any]:
    """One Arrow row (``to_pylist``) → a JSON-safe dict. float32 logprobs widen exactly to JSON
    doubles and narrow back to the same float32, so the round trip is bit-exact."""
    out = dict(row)
    out["created_at"] = row["created_at"].isoformat()
    out["signals"] = dict(row["signals"]) if isinstance(row["signals"], list) else row["signals"]
    for k in ("verifier", "sampling", "meta"):
        out[k] = json.loads(row[k])
    return out


def prompt_to_json(row: dict[str, Any]) -> dict[str, Any]:
    out = dict(row)
    out["updated_at"] = row["updated_at"].isoformat()
    for k in ("tests", "control", "meta"):
        out[k] = None if row[k] is None else json.loads(row[k])
    return out


def _write_table(t: pa.Table, fmt: str, to_json: Callable[[dict[str, Any]], dict[str, Any]]) -> Callable[[Path], None]:
    def write(tmp: Path) -> None:
        if fmt == "parquet":
            pq.write_table(t, tmp)
            return
        with open(tmp, "w", encoding="utf-8") as fh:
            for batch in t.to_batches(max_chunksize=1024):
                for row in batch.to_pylist():
                    fh.write(json.dumps(to_json(row), ensure_ascii=False) + "\n")

    return write


def export(store: RolloutStore, fmt: str, out: str | os.PathLike[str], where: str | None = None,
           with_prompts: bool = True) -> int:
    """Write rollouts (optionally those matching the DuckDB predicate ``where``) as gfcr JSONL or
    Parquet, and (``with_prompts``) the prompts they reference beside them (:func:`prompts_path`;
    no file when the store holds none of them).
    Refuses to overwrite an existing file. Returns the number of rollouts written."""
    if fmt not in ("jsonl", "parquet", "atif"):
        raise StoreError(f"unknown export format {fmt!r}; choose jsonl, parquet or atif")
    out = refuse_existing(out)
    if fmt == "atif":  # one ATIF v1.8 trajectory per line (gfcr.formats.atif), read back by --from atif
        return _export_atif(store, out, where)
    pout = refuse_existing(prompts_path(out)) if with_prompts else None
    t = store.sql(f"SELECT * FROM rollouts WHERE {where}") if where else store.scan()
    t = conform(t, ROLLOUT_SCHEMA, "export")
    if pout is not None:
        ids = sorted(set(t.column("prompt_id").to_pylist()))
        pt = store.dataset("prompts").to_table(filter=in_list("prompt_id", ids)) if ids else PROMPT_SCHEMA.empty_table()
        pt = conform(pt, PROMPT_SCHEMA, "export")
        if pt.num_rows:
            write_new_file(pout, _write_table(pt, fmt, prompt_to_json))
        else:
            pout = None
    try:
        write_new_file(out, _write_table(t, fmt, rollout_to_json))
    except BaseException:
        if pout is not None:
            pout.unlink(missing_ok=True)
        raise
    return t.num_rows


def _export_atif(store: RolloutStore, out: Path, where: str | None) -> int:
    from gfcr.formats.atif import rollout_to_atif
    from gfcr.records import table_to_rollouts

    t = store.sql(f"SELECT * FROM rollouts WHERE {where}") if where else store.scan()
    t = conform(t, ROLLOUT_SCHEMA, "export")

    def write(tmp: Path) -> None:
        with open(tmp, "w", encoding="utf-8") as fh:
            for batch in t.to_batches(max_chunksize=1024):
                for r in table_to_rollouts(pa.Table.from_batches([batch])):
                    fh.write(json.dumps(rollout_to_atif(r), ensure_ascii=False) + "\n")

    write_new_file(out, write)
    return t.num_rows
