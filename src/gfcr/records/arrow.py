"""Records <-> Arrow tables, columnar (token arrays are concatenated with numpy, so 100k rollouts of
512 tokens convert in seconds, not minutes), :func:`conform` for tables read from outside, and the
JSON encoding of the free-form fields.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import datetime
from typing import Any

import numpy as np
import pyarrow as pa

from gfcr.records.classes import Audit, Cost, Message, Prompt, RecordError, Rollout, Span
from gfcr.records.schema import (
    AUDIT_SCHEMA,
    COST_TYPE,
    MESSAGE_TYPE,
    PROMPT_SCHEMA,
    ROLLOUT_SCHEMA,
    SPAN_TYPE,
    TS_TYPE,
)


def _jdump(x: Any) -> str:
    return json.dumps(x, sort_keys=True, default=_json_default)


def _json_default(o: Any) -> Any:
    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, datetime):
        return o.isoformat()
    raise TypeError(f"not JSON-serialisable: {type(o).__name__}")


def _lenient_default(o: Any) -> Any:
    try:
        return _json_default(o)
    except TypeError:
        if isinstance(o, set | frozenset):
            return list(o)
        return str(o)


def json_safe(x: Any) -> Any:
    """``x`` as plain JSON data: numpy scalars/arrays and datetimes converted, sets as lists, anything
    else as its ``str``. For free-form evidence and env/task info that goes into JSON fields."""
    return json.loads(json.dumps(x, default=_lenient_default))


def _list_array(arrays: list[np.ndarray], value_type: pa.DataType, np_dtype: np.dtype) -> pa.Array:
    lengths = np.fromiter((len(a) for a in arrays), dtype=np.int64, count=len(arrays))
    offsets = np.zeros(len(arrays) + 1, dtype=np.int32 if lengths.sum() < 2**31 - 1 else np.int64)
    np.cumsum(lengths, out=offsets[1:])
    flat = np.concatenate(arrays).astype(np_dtype, copy=False) if arrays else np.zeros(0, np_dtype)
    values = pa.array(flat, type=value_type)
    if offsets.dtype == np.int64:
        return pa.LargeListArray.from_arrays(pa.array(offsets), values).cast(pa.list_(value_type))
    return pa.ListArray.from_arrays(pa.array(offsets), values)


def _messages_array(msgs: list[list[Message]]) -> pa.Array:
    return pa.array([[m.to_dict() for m in ms] for ms in msgs], type=pa.list_(MESSAGE_TYPE))


def rollouts_to_table(rollouts: Iterable[Rollout], validate: bool = True) -> pa.Table:
    rs = list(rollouts)
    if validate:
        for r in rs:
            r.validate()
    cols: dict[str, pa.Array] = {
        "rollout_id": pa.array([r.rollout_id for r in rs], pa.string()),
        "run_id": pa.array([r.run_id for r in rs], pa.string()),
        "step": pa.array([int(r.step) for r in rs], pa.int64()),
        "policy_version": pa.array([r.policy_version for r in rs], pa.string()),
        "prompt_id": pa.array([r.prompt_id for r in rs], pa.string()),
        "group_id": pa.array([r.group_id for r in rs], pa.string()),
        "sample_index": pa.array([int(r.sample_index) for r in rs], pa.int64()),
        "parent_id": pa.array([r.parent_id for r in rs], pa.string()),
        "branch_pos": pa.array([r.branch_pos for r in rs], pa.int64()),
        "task": pa.array([r.task for r in rs], pa.string()),
        "messages": _messages_array([r.messages for r in rs]),
        "token_ids": _list_array([r.token_ids for r in rs], pa.int32(), np.int32),
        "token_role": _list_array([r.token_role for r in rs], pa.int8(), np.int8),
        "logprobs": _list_array([r.logprobs for r in rs], pa.float32(), np.float32),
        "finish_reason": pa.array([r.finish_reason for r in rs], pa.string()),
        "reward": pa.array([None if r.reward is None else float(r.reward) for r in rs], pa.float64()),
        "verified": pa.array([None if r.verified is None else bool(r.verified) for r in rs], pa.bool_()),
        "verifier": pa.array([_jdump(r.verifier) for r in rs], pa.string()),
        "signals": pa.array(
            [[(k, float(v)) for k, v in sorted(r.signals.items())] for r in rs],
            pa.map_(pa.string(), pa.float64()),
        ),
        "sampling": pa.array([_jdump(r.sampling) for r in rs], pa.string()),
        "cost": pa.array([r.cost.to_dict() for r in rs], COST_TYPE),
        "tokens_source": pa.array([r.tokens_source for r in rs], pa.string()),
        "created_at": pa.array([r.created_at for r in rs], TS_TYPE),
        "meta": pa.array([_jdump(r.meta) for r in rs], pa.string()),
    }
    return pa.Table.from_arrays([cols[f.name] for f in ROLLOUT_SCHEMA], schema=ROLLOUT_SCHEMA)


def _list_column_np(col: pa.ChunkedArray | pa.Array, dtype: np.dtype) -> list[np.ndarray]:
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if len(arr) == 0:
        return []
    offsets = arr.offsets.to_numpy()
    values = arr.values.to_numpy(zero_copy_only=False).astype(dtype, copy=False)
    return [values[offsets[i] : offsets[i + 1]].copy() for i in range(len(arr))]


def table_to_rollouts(table: pa.Table) -> list[Rollout]:
    """Arrow rows (full rollout schema) back to :class:`Rollout` objects, bit-exact."""
    missing = [f.name for f in ROLLOUT_SCHEMA if f.name not in table.column_names]
    if missing:
        raise RecordError(missing[0], "column missing from table (select all columns to rebuild rollouts)")
    tok = _list_column_np(table.column("token_ids"), np.int32)
    role = _list_column_np(table.column("token_role"), np.int8)
    lp = _list_column_np(table.column("logprobs"), np.float32)
    d = {n: table.column(n).to_pylist() for n in table.column_names if n not in ("token_ids", "token_role", "logprobs")}
    out = []
    for i in range(table.num_rows):
        out.append(
            Rollout(
                rollout_id=d["rollout_id"][i],
                run_id=d["run_id"][i],
                step=d["step"][i],
                policy_version=d["policy_version"][i],
                prompt_id=d["prompt_id"][i],
                group_id=d["group_id"][i],
                sample_index=d["sample_index"][i],
                parent_id=d["parent_id"][i],
                branch_pos=d["branch_pos"][i],
                task=d["task"][i],
                messages=[Message(**m) for m in d["messages"][i]],
                token_ids=tok[i],
                token_role=role[i],
                logprobs=lp[i],
                finish_reason=d["finish_reason"][i],
                reward=d["reward"][i],
                verified=d["verified"][i],
                verifier=json.loads(d["verifier"][i]),
                signals=dict(d["signals"][i]),
                sampling=json.loads(d["sampling"][i]),
                cost=Cost(**d["cost"][i]),
                tokens_source=d["tokens_source"][i],
                created_at=d["created_at"][i],
                meta=json.loads(d["meta"][i]),
            )
        )
    return out


def prompts_to_table(prompts: Iterable[Prompt], validate: bool = True) -> pa.Table:
    ps = list(prompts)
    if validate:
        for p in ps:
            p.validate()
    rows = [
        {
            "prompt_id": p.prompt_id,
            "task": p.task,
            "messages": [m.to_dict() for m in p.messages],
            "answer": None if p.answer is None else str(p.answer),
            "tests": None if p.tests is None else _jdump(p.tests),
            "category": p.category,
            "difficulty": None if p.difficulty is None else float(p.difficulty),
            "split": p.split,
            "control": _jdump(p.control),
            "updated_at": p.updated_at,
            "meta": _jdump(p.meta),
        }
        for p in ps
    ]
    return pa.Table.from_pylist(rows, schema=PROMPT_SCHEMA)


def table_to_prompts(table: pa.Table) -> list[Prompt]:
    out = []
    for row in table.to_pylist():
        out.append(
            Prompt(
                prompt_id=row["prompt_id"],
                task=row["task"],
                messages=[Message(**m) for m in row["messages"]],
                answer=row["answer"],
                tests=None if row["tests"] is None else json.loads(row["tests"]),
                category=row["category"],
                difficulty=row["difficulty"],
                split=row["split"],
                control=json.loads(row["control"]),
                updated_at=row["updated_at"],
                meta=json.loads(row["meta"]),
            )
        )
    return out


def audits_to_table(audits: Iterable[Audit], validate: bool = True) -> pa.Table:
    aus = list(audits)
    if validate:
        for a in aus:
            a.validate()
    cols = {
        "rollout_id": pa.array([a.rollout_id for a in aus], pa.string()),
        "judge": pa.array([a.judge for a in aus], pa.string()),
        "judge_version": pa.array([a.judge_version for a in aus], pa.string()),
        "status": pa.array([a.status for a in aus], pa.string()),
        "reason": pa.array([a.reason for a in aus], pa.string()),
        "excluded": pa.array([[s.to_dict() for s in a.excluded] for a in aus], pa.list_(SPAN_TYPE)),
        "mask": _list_array([a.mask for a in aus], pa.int8(), np.int8),
        "ter": pa.array([a.ter for a in aus], pa.float64()),
        "raw_output": pa.array([a.raw_output for a in aus], pa.string()),
        "cost": pa.array([a.cost.to_dict() for a in aus], COST_TYPE),
        "created_at": pa.array([a.created_at for a in aus], TS_TYPE),
        "meta": pa.array([_jdump(a.meta) for a in aus], pa.string()),
    }
    return pa.Table.from_arrays([cols[f.name] for f in AUDIT_SCHEMA], schema=AUDIT_SCHEMA)


def table_to_audits(table: pa.Table) -> list[Audit]:
    masks = _list_column_np(table.column("mask"), np.int8)
    d = {n: table.column(n).to_pylist() for n in table.column_names if n != "mask"}
    return [
        Audit(
            rollout_id=d["rollout_id"][i],
            judge=d["judge"][i],
            judge_version=d["judge_version"][i],
            status=d["status"][i],
            reason=d["reason"][i],
            excluded=[Span(**s) for s in d["excluded"][i]],
            mask=masks[i],
            ter=d["ter"][i],
            raw_output=d["raw_output"][i],
            cost=Cost(**d["cost"][i]),
            created_at=d["created_at"][i],
            meta=json.loads(d["meta"][i]),
        )
        for i in range(table.num_rows)
    ]


def conform(table: pa.Table, schema: pa.Schema, source: str = "table") -> pa.Table:
    """Check that ``table`` has exactly the columns of ``schema`` (any order) and cast it to it.

    Raises :class:`RecordError` naming the first missing, unexpected or mistyped column.
    """
    if table.schema.equals(schema, check_metadata=True):  # (the common case: only the null check)
        for f in schema:
            if not f.nullable and (n := table.column(f.name).null_count):
                raise RecordError(f.name, f"{n} null value(s) in {source}; the field is required")
        return table
    names = set(table.column_names)
    for f in schema:
        if f.name not in names:
            raise RecordError(f.name, f"missing from {source}")
    extra = names - set(schema.names)
    if extra:
        raise RecordError(sorted(extra)[0], f"unexpected column in {source}")
    cols = []
    for f in schema:
        col = table.column(f.name)
        if not f.nullable and col.null_count:
            raise RecordError(f.name, f"{col.null_count} null value(s) in {source}; the field is required")
        if col.type != f.type:
            try:
                col = col.cast(f.type)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
                raise RecordError(f.name, f"type {col.type} in {source} cannot be read as {f.type}: {e}") from e
        cols.append(col)
    return pa.Table.from_arrays(cols, schema=schema)
