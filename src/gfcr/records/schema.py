"""The record vocabularies and the versioned Arrow schemas of the three tables.

:data:`ROLLOUT_SCHEMA`, :data:`PROMPT_SCHEMA` and :data:`AUDIT_SCHEMA` carry their record name and
:data:`SCHEMA_VERSION` in their metadata. Token roles and audit masks are ``int8`` lists: Lance
(pylance 14) rejects filter pushdown on tables that hold unsigned-integer lists, so the schema
avoids them.
"""

from __future__ import annotations

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
        ("reward", pa.float64(), True),  # null = the source did not record it (an import)
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
