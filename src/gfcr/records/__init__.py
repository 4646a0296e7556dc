"""The records every gfcr stage reads and writes: rollouts, prompts (tasks) and audits.

A :class:`Rollout` is one trajectory (a single answer, one leaf of a tree, or a whole multi-turn
episode), token-faithful: ``token_ids`` are the tokens the policy actually saw and sampled,
``token_role`` marks each as context (0) or model-generated (1), and ``logprobs`` holds the
behaviour log-prob of each generated token (0.0 on context tokens). Text in ``messages`` is derived
from the tokens; a row whose tokens were rebuilt from text is flagged ``tokens_source="retokenized"``.

Each record has a versioned Arrow schema (:data:`ROLLOUT_SCHEMA`, :data:`PROMPT_SCHEMA`,
:data:`AUDIT_SCHEMA`; :data:`SCHEMA_VERSION`) and a ``validate()`` that names the offending field.

Import every name from here (``from gfcr.records import Rollout``); the modules behind it hold one
meaning each:

- :mod:`gfcr.records.schema`: the vocabularies (token roles, finish reasons, ...) and the Arrow schemas;
- :mod:`gfcr.records.classes`: the record classes and their validation;
- :mod:`gfcr.records.views`: the assistant text and its character ranges, labels from a token mask;
- :mod:`gfcr.records.arrow`: records <-> Arrow tables, :func:`conform`, JSON fields.

This package imports neither torch nor any model library.
"""

from __future__ import annotations

from gfcr.records.arrow import (
    audits_to_table,
    conform,
    json_safe,
    prompts_to_table,
    rollouts_to_table,
    table_to_audits,
    table_to_prompts,
    table_to_rollouts,
)
from gfcr.records.classes import (
    Audit,
    Cost,
    Message,
    Prompt,
    RecordError,
    Rollout,
    Span,
    accuracy,
    new_id,
    utcnow,
)
from gfcr.records.schema import (
    AUDIT_SCHEMA,
    AUDIT_STATUSES,
    CONTEXT,
    COST_TYPE,
    EXCLUSION_CATEGORIES,
    FINISH_REASONS,
    GENERATED,
    MESSAGE_TYPE,
    PROMPT_SCHEMA,
    ROLES,
    ROLLOUT_SCHEMA,
    SCHEMA_VERSION,
    SCHEMAS,
    SPAN_TYPE,
    TOKENS_SOURCES,
    TS_TYPE,
)
from gfcr.records.views import IGNORE_INDEX, assistant_text, assistant_text_ranges, labels_from_mask

__all__ = [
    "AUDIT_SCHEMA", "AUDIT_STATUSES", "CONTEXT", "COST_TYPE", "EXCLUSION_CATEGORIES", "FINISH_REASONS",
    "GENERATED", "IGNORE_INDEX", "MESSAGE_TYPE", "PROMPT_SCHEMA", "ROLES", "ROLLOUT_SCHEMA",
    "SCHEMAS", "SCHEMA_VERSION", "SPAN_TYPE", "TOKENS_SOURCES", "TS_TYPE",
    "Audit", "Cost", "Message", "Prompt", "RecordError", "Rollout", "Span",
    "accuracy", "assistant_text", "assistant_text_ranges", "audits_to_table", "conform", "json_safe",
    "labels_from_mask", "new_id", "prompts_to_table", "rollouts_to_table", "table_to_audits",
    "table_to_prompts", "table_to_rollouts", "utcnow",
]
