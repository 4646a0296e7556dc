"""gfcr's own JSONL and Parquet, as :func:`gfcr.formats.export.export` writes them: rollouts, and the
prompts beside them (``x.prompts.jsonl`` / ``x.prompts.parquet``), every field bit-exact."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from gfcr.formats._common import (
    INT64_MAX,
    ImportFormatError,
    ImportResult,
    find_files,
    from_record_error,
    read_jsonl,
)
from gfcr.records import (
    PROMPT_SCHEMA,
    ROLLOUT_SCHEMA,
    Prompt,
    RecordError,
    Rollout,
    conform,
    table_to_prompts,
    table_to_rollouts,
)


def _is_prompts(f: Path) -> bool:
    return f.name.endswith((".prompts.jsonl", ".prompts.parquet"))


def _ints(obj: dict[str, Any], key: str, lo: int, hi: int) -> None:
    v = obj[key]
    if not isinstance(v, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in v):
        raise RecordError(key, "expected a list of integers")
    bad = next((x for x in v if not lo <= x <= hi), None)
    if bad is not None:
        raise RecordError(key, f"value {bad} out of range [{lo}, {hi}]")


def _rollout_from_json(obj: dict[str, Any], run_id: str | None) -> Rollout:
    for key in ("rollout_id", "prompt_id", "token_ids", "token_role", "logprobs"):
        if key not in obj:
            raise RecordError(key, "missing")
    lp = obj["logprobs"]
    if not isinstance(lp, list) or not all(isinstance(x, int | float) and not isinstance(x, bool) for x in lp):
        raise RecordError("logprobs", "expected a list of numbers")
    _ints(obj, "token_ids", 0, 2**31 - 1)
    _ints(obj, "token_role", 0, 1)
    msgs = obj.get("messages") or []
    if not isinstance(msgs, list) or not all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in msgs):
        raise RecordError("messages", f"expected a list of {{role, content}} objects, got {type(msgs).__name__}")
    for i, m in enumerate(msgs):
        for k in ("content", "tool_calls", "name"):
            if m.get(k) is not None and not isinstance(m[k], str):
                raise RecordError(f"messages[{i}].{k}", f"expected text, got {type(m[k]).__name__}")
    kw = {k: obj[k] for k in ("step", "policy_version", "group_id", "sample_index", "parent_id", "branch_pos", "task",
                               "reward", "verified", "verifier", "signals", "sampling", "cost",
                               "tokens_source", "meta") if k in obj and obj[k] is not None}
    for k in ("step", "sample_index", "branch_pos"):
        if k in kw and (not isinstance(kw[k], int) or isinstance(kw[k], bool) or not 0 <= kw[k] <= INT64_MAX):
            raise RecordError(k, f"expected an integer in [0, 2^63), got {kw[k]!r}")
    if "reward" in kw and (isinstance(kw["reward"], bool) or not isinstance(kw["reward"], int | float)):
        raise RecordError("reward", f"expected a number, got {kw['reward']!r}")
    for k in ("verifier", "sampling", "meta", "signals"):
        if k in kw and not isinstance(kw[k], dict):
            raise RecordError(k, f"expected an object, got {type(kw[k]).__name__}")
    if "created_at" in obj:
        try:
            kw["created_at"] = datetime.fromisoformat(obj["created_at"])
        except (TypeError, ValueError) as e:
            raise RecordError("created_at", f"not an ISO timestamp: {obj['created_at']!r}") from e
    r = Rollout(rollout_id=obj["rollout_id"], run_id=run_id or obj.get("run_id") or "", prompt_id=obj["prompt_id"],
                token_ids=obj["token_ids"], token_role=obj["token_role"], logprobs=lp, messages=msgs,
                finish_reason=obj.get("finish_reason"), **kw)
    return r.validate()


def _prompt_from_json(obj: dict[str, Any]) -> Prompt:
    for key in ("prompt_id", "task"):
        if not isinstance(obj.get(key), str):
            raise RecordError(key, "missing or not text")
    kw = {k: obj[k] for k in ("answer", "tests", "category", "difficulty", "split", "control", "meta") if obj.get(k) is not None}
    if obj.get("updated_at"):
        kw["updated_at"] = datetime.fromisoformat(obj["updated_at"])
    return Prompt(prompt_id=obj["prompt_id"], task=obj["task"], messages=obj.get("messages") or [], **kw).validate()


def parse_jsonl(paths: list[str], run_id: str | None = None, tokenizer: Any | None = None, **_: Any) -> ImportResult:
    """gfcr's own JSONL (one rollout per line) and its ``*.prompts.jsonl`` sidecars."""
    files = find_files(paths, ("*.jsonl",))
    side = [f.with_name(f"{f.stem}.prompts.jsonl") for f in files if not _is_prompts(f)]
    pfiles = sorted({f for f in files if _is_prompts(f)} | {f for f in side if f.exists()})
    rollouts, prompts = [], []
    for f in files:
        if _is_prompts(f):
            continue
        for i, obj in read_jsonl(f):
            try:
                rollouts.append(_rollout_from_json(obj, run_id))
            except RecordError as e:
                raise from_record_error(e, f, f"line {i}") from e
            except (KeyError, TypeError, ValueError) as e:
                raise ImportFormatError(f, f"line {i}", "-", f"missing or mistyped: {e}") from e
    for f in pfiles:
        for i, obj in read_jsonl(f):
            try:
                prompts.append(_prompt_from_json(obj))
            except (RecordError, KeyError, TypeError, ValueError) as e:
                raise ImportFormatError(f, f"line {i}", getattr(e, "field", "-"), str(e)) from e
    return ImportResult("jsonl", [str(f) for f in files], rollouts, prompts, [])


def _read(f: Path, schema: pa.Schema) -> pa.Table:
    try:
        t = pq.read_table(f)
    except (pa.ArrowInvalid, OSError) as e:
        raise ImportFormatError(f, "file", "-", f"not a readable Parquet file: {e}") from e
    try:
        return conform(t, schema, str(f))
    except RecordError as e:
        raise ImportFormatError(f, "schema", e.field, str(e)) from e


def parse_parquet(paths: list[str], run_id: str | None = None, tokenizer: Any | None = None, **_: Any) -> ImportResult:
    """gfcr's own Parquet and its ``*.prompts.parquet`` sidecars."""
    files = find_files(paths, ("*.parquet",))
    side = [f.with_name(f"{f.stem}.prompts.parquet") for f in files if not _is_prompts(f)]
    pfiles = sorted({f for f in files if _is_prompts(f)} | {f for f in side if f.exists()})
    rollouts: list[Rollout] = []
    prompts: list[Prompt] = []
    for f in files:
        if _is_prompts(f):
            continue
        rs = table_to_rollouts(_read(f, ROLLOUT_SCHEMA))
        for j, r in enumerate(rs):
            if run_id:
                r.run_id = run_id
            try:
                r.validate()
            except RecordError as e:
                raise from_record_error(e, f, f"row {j}") from e
        rollouts.extend(rs)
    for f in pfiles:
        prompts.extend(table_to_prompts(_read(f, PROMPT_SCHEMA)))
    return ImportResult("parquet", [str(f) for f in files], rollouts, prompts, [])
