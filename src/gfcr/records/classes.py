"""The record classes: :class:`Rollout`, :class:`Prompt`, :class:`Audit` and their parts, each with a
``validate()`` that raises :class:`RecordError` naming the record and the field.
"""

from __future__ import annotations

import dataclasses
import json
import math
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import numpy as np

from gfcr.records.schema import (
    AUDIT_STATUSES,
    CONTEXT,
    EXCLUSION_CATEGORIES,
    FINISH_REASONS,
    GENERATED,
    TOKENS_SOURCES,
)
from gfcr.records.views import assistant_text


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
    reward: float | None = 0.0  # None: unknown (an import whose dump does not hold it)
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
        if self.reward is not None and (not isinstance(self.reward, int | float | np.floating)
                                        or not math.isfinite(float(self.reward))):
            raise RecordError("reward", f"must be a finite number or null, got {self.reward!r}", rid)
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
    if r.verified is not None:
        return float(r.verified)
    if r.reward is None:
        raise ValueError(f"rollout {r.rollout_id!r} has neither a verdict nor a reward (null: its dump held none)")
    return float(r.reward)


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
