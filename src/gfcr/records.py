"""The records every gfcr stage reads and writes: rollouts, prompts (tasks) and audits.

A :class:`Rollout` is one trajectory (a single answer, one leaf of a tree, or a whole multi-turn
episode), token-faithful: ``token_ids`` are the tokens the policy actually saw and sampled,
``token_role`` marks each as context (0) or model-generated (1), and ``logprobs`` holds the
behaviour log-prob of each generated token (0.0 on context tokens). Text in ``messages`` is derived
from the tokens; a row whose tokens were rebuilt from text is flagged ``tokens_source="retokenized"``.

Token roles and audit masks are ``int8`` lists: Lance (pylance 14) rejects filter pushdown on
tables that hold unsigned-integer lists, so the schema avoids them.

Each record has a versioned Arrow schema (:data:`ROLLOUT_SCHEMA`, :data:`PROMPT_SCHEMA`,
:data:`AUDIT_SCHEMA`; :data:`SCHEMA_VERSION`) and a ``validate()`` that names the offending field.
Conversions between records and Arrow are columnar (token arrays are concatenated with numpy),
so 100k rollouts of 512 tokens convert in seconds, not minutes.

This module imports neither torch nor any model library.
"""

from __future__ import annotations

import dataclasses
import json
import math
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pyarrow as pa

SCHEMA_VERSION = 1

#: token_role values
CONTEXT = 0
GENERATED = 1
ROLES = (CONTEXT, GENERATED)

FINISH_REASONS = ("stop", "length", "abort", "env_done", "error", "unknown")
TOKENS_SOURCES = ("engine", "retokenized", "none")
AUDIT_STATUSES = ("kept", "discarded", "error")
EXCLUSION_CATEGORIES = (
    "corrected_mistake",
    "redundant_exploration",
    "abandoned_attempt",
    "incorrect_claim",
    "other",
)


class RecordError(ValueError):
    """A record failed validation. The message names the record and the field."""

    def __init__(self, field_name: str, message: str, record_id: str | None = None):
        self.field = field_name
        self.record_id = record_id
        where = f"record {record_id!r}: " if record_id else ""
        super().__init__(f"{where}field '{field_name}': {message}")


def new_id() -> str:
    """A new unique id (uuid4 hex; sortable ids are not needed: rows carry ``created_at``)."""
    return uuid.uuid4().hex


def utcnow() -> datetime:
    return datetime.now(UTC)


# ---------------------------------------------------------------------------------------------
# Arrow schemas
# ---------------------------------------------------------------------------------------------

MESSAGE_TYPE = pa.struct(
    [
        ("role", pa.string()),
        ("content", pa.string()),
        ("tool_calls", pa.string()),  # JSON, null when absent
        ("name", pa.string()),
    ]
)
COST_TYPE = pa.struct(
    [("prompt_tokens", pa.int64()), ("gen_tokens", pa.int64()), ("latency_s", pa.float64())]
)
SPAN_TYPE = pa.struct(
    [
        ("start", pa.int64()),  # char offset into the assistant text (see gfcr.ross)
        ("end", pa.int64()),
        ("category", pa.string()),
        ("unit", pa.int64()),  # unit number, null for a free quote
        ("quote", pa.string()),
    ]
)
TS_TYPE = pa.timestamp("us", tz="UTC")


def _schema(fields: list[tuple[str, pa.DataType, bool]], name: str) -> pa.Schema:
    return pa.schema(
        [pa.field(n, t, nullable=nb) for n, t, nb in fields],
        metadata={b"gfcr.record": name.encode(), b"gfcr.schema_version": str(SCHEMA_VERSION).encode()},
    )


ROLLOUT_SCHEMA = _schema(
    [
        ("rollout_id", pa.string(), False),
        ("run_id", pa.string(), False),
        ("step", pa.int64(), False),
        ("policy_version", pa.string(), False),
        ("prompt_id", pa.string(), False),
        ("group_id", pa.string(), False),
        ("sample_index", pa.int64(), False),
        ("parent_id", pa.string(), True),
        ("branch_pos", pa.int64(), True),
        ("task", pa.string(), False),
        ("messages", pa.list_(MESSAGE_TYPE), False),
        ("token_ids", pa.list_(pa.int32()), False),
        ("token_role", pa.list_(pa.int8()), False),
        ("logprobs", pa.list_(pa.float32()), False),
        ("finish_reason", pa.string(), True),  # null = the source did not record it
        ("reward", pa.float64(), False),
        ("verified", pa.bool_(), True),
        ("verifier", pa.string(), False),  # JSON
        ("signals", pa.map_(pa.string(), pa.float64()), False),
        ("sampling", pa.string(), False),  # JSON
        ("cost", COST_TYPE, False),
        ("tokens_source", pa.string(), False),
        ("created_at", TS_TYPE, False),
        ("meta", pa.string(), False),  # JSON
    ],
    "rollout",
)

PROMPT_SCHEMA = _schema(
    [
        ("prompt_id", pa.string(), False),
        ("task", pa.string(), False),
        ("messages", pa.list_(MESSAGE_TYPE), False),
        ("answer", pa.string(), True),  # gold answer (text)
        ("tests", pa.string(), True),  # JSON: code tests / env spec
        ("category", pa.string(), True),
        ("difficulty", pa.float64(), True),
        ("split", pa.string(), True),
        ("control", pa.string(), False),  # JSON: Control state keyed by component name
        ("updated_at", TS_TYPE, False),
        ("meta", pa.string(), False),  # JSON
    ],
    "prompt",
)

AUDIT_SCHEMA = _schema(
    [
        ("rollout_id", pa.string(), False),
        ("judge", pa.string(), False),
        ("judge_version", pa.string(), False),
        ("status", pa.string(), False),
        ("reason", pa.string(), True),
        ("excluded", pa.list_(SPAN_TYPE), False),
        ("mask", pa.list_(pa.int8()), False),  # per token of the rollout: 1 = supervised
        ("ter", pa.float64(), True),  # excluded share of generated tokens
        ("raw_output", pa.string(), True),
        ("cost", COST_TYPE, False),
        ("created_at", TS_TYPE, False),
        ("meta", pa.string(), False),  # JSON
    ],
    "audit",
)

SCHEMAS = {"rollouts": ROLLOUT_SCHEMA, "prompts": PROMPT_SCHEMA, "audits": AUDIT_SCHEMA}


# ---------------------------------------------------------------------------------------------
# Record classes
# ---------------------------------------------------------------------------------------------


@dataclass
class Message:
    """One chat turn. ``tool_calls`` is kept as a JSON string when present."""

    role: str
    content: str
    tool_calls: str | None = None
    name: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"role": self.role, "content": self.content, "tool_calls": self.tool_calls, "name": self.name}

    @classmethod
    def coerce(cls, m: Message | dict[str, Any]) -> Message:
        if isinstance(m, Message):
            return m
        tc = m.get("tool_calls")
        if tc is not None and not isinstance(tc, str):
            tc = json.dumps(tc, sort_keys=True)
        return cls(role=str(m["role"]), content=str(m.get("content") or ""), tool_calls=tc, name=m.get("name"))


def assistant_text_ranges(messages: Iterable[Message | dict[str, Any]]) -> tuple[str, list[tuple[int, int]]]:
    """The *assistant text* and each assistant message's char range ``[a, b)`` in it.

    The assistant text is the contents of the assistant messages joined by ``"\\n"``: the text a
    ROSS judge audits, that audit spans index into (``Span.start``/``end``), that the report and
    the viewer colour, and that ``Rollout.completion`` returns. Messages may be ``Message`` objects
    or dicts (rows read from the store). Example: user "q", assistant "ab", tool "r", assistant
    "c" → ``("ab\\nc", [(0, 2), (3, 4)])``.
    """
    parts = []
    for m in messages:
        role = m["role"] if isinstance(m, dict) else m.role
        if role == "assistant":
            parts.append((m["content"] if isinstance(m, dict) else m.content) or "")
    ranges, pos = [], 0
    for p in parts:
        ranges.append((pos, pos + len(p)))
        pos += len(p) + 1
    return "\n".join(parts), ranges


def assistant_text(messages: Iterable[Message | dict[str, Any]]) -> str:
    """The assistant text of :func:`assistant_text_ranges` (without the ranges)."""
    return assistant_text_ranges(messages)[0]


@dataclass
class Cost:
    prompt_tokens: int = 0
    gen_tokens: int = 0
    latency_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _as_array(x: Any, dtype: np.dtype) -> np.ndarray:
    if isinstance(x, np.ndarray) and x.dtype == dtype:
        return x
    return np.asarray(x if x is not None else [], dtype=dtype)


@dataclass
class Rollout:
    """One trajectory. See DESIGN "The rollout record" and ``docs/records.md``."""

    run_id: str
    prompt_id: str
    token_ids: np.ndarray | Sequence[int]
    token_role: np.ndarray | Sequence[int]
    logprobs: np.ndarray | Sequence[float]
    messages: list[Message] = field(default_factory=list)
    task: str = "unknown"
    step: int = 0
    policy_version: str = "unknown"
    group_id: str = ""
    sample_index: int = 0
    parent_id: str | None = None
    branch_pos: int | None = None
    finish_reason: str | None = "stop"  # None: unknown (an import whose source does not record it)
    reward: float = 0.0
    verified: bool | None = None
    verifier: dict[str, Any] = field(default_factory=dict)
    signals: dict[str, float] = field(default_factory=dict)
    sampling: dict[str, Any] = field(default_factory=dict)
    cost: Cost = field(default_factory=Cost)
    tokens_source: str = "engine"
    created_at: datetime = field(default_factory=utcnow)
    meta: dict[str, Any] = field(default_factory=dict)
    rollout_id: str = field(default_factory=new_id)

    def __post_init__(self) -> None:
        self.token_ids = _as_array(self.token_ids, np.int32)
        self.token_role = _as_array(self.token_role, np.int8)
        self.logprobs = _as_array(self.logprobs, np.float32)
        self.messages = [Message.coerce(m) for m in self.messages]
        if isinstance(self.cost, dict):
            self.cost = Cost(**self.cost)
        if not self.group_id:
            self.group_id = self.prompt_id

    # --- derived views ---------------------------------------------------------------------
    @property
    def n_generated(self) -> int:
        return int(np.count_nonzero(self.token_role == GENERATED))

    @property
    def generated_ids(self) -> np.ndarray:
        return self.token_ids[self.token_role == GENERATED]

    @property
    def completion(self) -> str:
        """The assistant text (:func:`assistant_text`; the one answer of a single-turn rollout)."""
        return assistant_text(self.messages)

    def validate(self) -> Rollout:
        rid = self.rollout_id
        if not isinstance(rid, str) or not rid:
            raise RecordError("rollout_id", "must be a non-empty string", None)
        for name in ("run_id", "prompt_id", "group_id", "policy_version", "task"):
            v = getattr(self, name)
            if not isinstance(v, str) or not v:
                raise RecordError(name, f"must be a non-empty string, got {v!r}", rid)
        if not isinstance(self.step, int | np.integer) or self.step < 0:
            raise RecordError("step", f"must be an integer >= 0, got {self.step!r}", rid)
        if self.sample_index < 0:
            raise RecordError("sample_index", f"must be >= 0, got {self.sample_index}", rid)
        n = len(self.token_ids)
        if len(self.token_role) != n:
            raise RecordError("token_role", f"length {len(self.token_role)} != len(token_ids) {n}", rid)
        if len(self.logprobs) != n:
            raise RecordError("logprobs", f"length {len(self.logprobs)} != len(token_ids) {n}", rid)
        if n and (int(self.token_role.max()) > GENERATED or int(self.token_role.min()) < CONTEXT):
            raise RecordError("token_role", f"values must be 0 (context) or 1 (generated), got {int(self.token_role.max())}", rid)
        if n and int(self.token_ids.min()) < 0:
            raise RecordError("token_ids", "token ids must be >= 0", rid)
        if n and not np.all(np.isfinite(self.logprobs)):
            raise RecordError("logprobs", "must be finite", rid)
        if n and np.any(self.logprobs > 1e-4):
            raise RecordError("logprobs", "log-probabilities must be <= 0", rid)
        if not isinstance(self.reward, int | float | np.floating) or not math.isfinite(float(self.reward)):
            raise RecordError("reward", f"must be a finite number, got {self.reward!r}", rid)
        if self.verified is not None and not isinstance(self.verified, bool | np.bool_):
            raise RecordError("verified", f"must be true, false or null, got {self.verified!r}", rid)
        if self.finish_reason is not None and self.finish_reason not in FINISH_REASONS:
            raise RecordError("finish_reason", f"must be one of {FINISH_REASONS} or null, got {self.finish_reason!r}", rid)
        if self.tokens_source not in TOKENS_SOURCES:
            raise RecordError("tokens_source", f"must be one of {TOKENS_SOURCES}, got {self.tokens_source!r}", rid)
        if self.tokens_source == "none" and n:
            raise RecordError("tokens_source", "'none' requires empty token arrays", rid)
        if self.tokens_source != "none" and n == 0:
            raise RecordError("token_ids", "empty token arrays need tokens_source='none'", rid)
        for k, v in self.signals.items():
            if not isinstance(k, str):
                raise RecordError("signals", f"keys must be strings, got {k!r}", rid)
            if not isinstance(v, int | float | np.floating | np.integer):
                raise RecordError("signals", f"signal {k!r} must be a number, got {v!r}", rid)
        if (self.parent_id is None) != (self.branch_pos is None):
            raise RecordError("branch_pos", "parent_id and branch_pos are set together", rid)
        if self.branch_pos is not None and not (0 <= self.branch_pos <= n):
            raise RecordError("branch_pos", f"must lie in [0, {n}], got {self.branch_pos}", rid)
        for i, m in enumerate(self.messages):
            if not m.role:
                raise RecordError(f"messages[{i}].role", "must be non-empty", rid)
        return self


def accuracy(r: Rollout) -> float:
    """What Control decides on: 1.0 / 0.0 from the verdict (``verified``); the reward when a rollout
    has no verdict. Example: verified True, reward 0.6 (shaped) → 1.0; verified None, reward 0.5 → 0.5."""
    return float(r.verified) if r.verified is not None else float(r.reward)


@dataclass
class Prompt:
    """A task instance: the prompt, its gold answer or tests, and its Control state."""

    prompt_id: str
    task: str
    messages: list[Message]
    answer: str | None = None
    tests: Any = None  # anything JSON-serialisable (code tests, env spec)
    category: str | None = None
    difficulty: float | None = None
    split: str | None = None
    control: dict[str, Any] = field(default_factory=dict)
    updated_at: datetime = field(default_factory=utcnow)
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.messages = [Message.coerce(m) for m in self.messages]

    def validate(self) -> Prompt:
        if not isinstance(self.prompt_id, str) or not self.prompt_id:
            raise RecordError("prompt_id", "must be a non-empty string")
        if not self.task:
            raise RecordError("task", "must be a non-empty string", self.prompt_id)
        if self.difficulty is not None and not math.isfinite(float(self.difficulty)):
            raise RecordError("difficulty", "must be finite", self.prompt_id)
        return self


@dataclass
class Span:
    start: int
    end: int
    category: str = "other"
    unit: int | None = None
    quote: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class Audit:
    """A judge's audit of one rollout (ROSS): what is kept, what is excluded, the token mask."""

    rollout_id: str
    judge: str
    judge_version: str
    status: str
    mask: np.ndarray | Sequence[int]
    reason: str | None = None
    excluded: list[Span] = field(default_factory=list)
    ter: float | None = None
    raw_output: str | None = None
    cost: Cost = field(default_factory=Cost)
    created_at: datetime = field(default_factory=utcnow)
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.mask = _as_array(self.mask, np.int8)
        self.excluded = [s if isinstance(s, Span) else Span(**s) for s in self.excluded]
        if isinstance(self.cost, dict):
            self.cost = Cost(**self.cost)

    def validate(self) -> Audit:
        rid = self.rollout_id
        if not rid:
            raise RecordError("rollout_id", "must be non-empty")
        if not self.judge or not self.judge_version:
            raise RecordError("judge", "judge and judge_version must be non-empty", rid)
        if self.status not in AUDIT_STATUSES:
            raise RecordError("status", f"must be one of {AUDIT_STATUSES}, got {self.status!r}", rid)
        if len(self.mask) and (int(self.mask.max()) > 1 or int(self.mask.min()) < 0):
            raise RecordError("mask", "values must be 0 or 1", rid)
        for s in self.excluded:
            if s.category not in EXCLUSION_CATEGORIES:
                raise RecordError("excluded.category", f"must be one of {EXCLUSION_CATEGORIES}, got {s.category!r}", rid)
            if s.start < 0 or s.end < s.start:
                raise RecordError("excluded", f"bad span [{s.start}, {s.end})", rid)
        if self.ter is not None and not (0.0 <= self.ter <= 1.0):
            raise RecordError("ter", f"must lie in [0, 1], got {self.ter}", rid)
        return self


# ---------------------------------------------------------------------------------------------
# Records <-> Arrow
# ---------------------------------------------------------------------------------------------


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
        "reward": pa.array([float(r.reward) for r in rs], pa.float64()),
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


#: label of a token that is not a training target (the ignore index of PyTorch's cross-entropy)
IGNORE_INDEX = -100


def labels_from_mask(input_ids: np.ndarray, loss_mask: np.ndarray) -> np.ndarray:
    """``labels[t] = input_ids[t]`` where ``loss_mask[t] == 1`` else −100. Shapes ``[T]`` → ``[T]``.

    Example: ids [5, 6, 7], mask [0, 1, 0] → [-100, 6, -100].
    """
    if len(input_ids) != len(loss_mask):
        raise ValueError(f"input_ids has {len(input_ids)} tokens but loss_mask has {len(loss_mask)}")
    return np.where(np.asarray(loss_mask).astype(bool), np.asarray(input_ids, np.int64), IGNORE_INDEX)
