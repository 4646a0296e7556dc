"""Export stored rollouts as SFT datasets that other frameworks read directly (rejection-sampling
fine-tuning / RFT from the store, no glue script).

Formats (one Parquet file each; see ``docs/store.md`` "SFT export"):

- ``tokens``: ``input_ids`` (the stored token ids, unchanged), ``labels`` (``input_ids`` on
  generated tokens, −100 on context tokens) and ``completion_mask`` (int8: 1 = generated). TRL
  SFTTrainer's pre-tokenized path uses an explicit ``labels`` column as-is; AReaL-style loaders
  take ``input_ids`` + a per-token mask. The only token-faithful format: nothing is re-tokenized.
- ``messages``: the conversation as ``[{role, content}]`` (TRL conversational language modeling,
  verl ``MultiTurnSFTDataset`` with ``data.multiturn.messages_key=messages``).
- ``prompt-completion``: ``prompt`` = the turns before the last assistant turn, ``completion`` =
  that turn as a one-message list (TRL conversational prompt-completion). Turns after the last
  assistant turn (e.g. an observation left when ``max_turns`` ran out) carry no target and are not
  written.
- ``slime``: ``messages`` whose every message carries ``step_loss_mask`` (1 on assistant turns, 0
  elsewhere), the per-message flag slime's ``MultiTurnLossMaskGenerator``
  (``slime/utils/mask_utils.py``) reads with ``message.get("step_loss_mask", 1)``; slime's
  ``sft_rollout.generate_rollout`` takes the list from ``--input-key messages``.

Every row also carries provenance: ``rollout_id``, ``run_id``, ``step``, ``policy_version``,
``prompt_id``, ``task`` and ``reward``.

The three text formats are re-rendered by the reading framework's chat template, so their tokens
can differ from the stored ones; only ``tokens`` reproduces what the policy sampled. Text formats
export ``role`` and ``content`` only (messages whose ``tool_calls`` or ``name`` are left out are counted in the
result as ``dropped_fields``). A rollout whose ``messages`` hold no assistant turn gets one
decoded from its generated token ids (``tokenizer`` required).

Rows are taken oldest step first (then prompt, sample index, rollout id). ``dedup`` keeps the first
of the rollouts of one prompt with identical generated token ids (identical assistant text for
rollouts stored without tokens). The Parquet file is written to a temporary name and renamed, so a
failed export leaves nothing; an existing file is never overwritten.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from gfcr.formats.export import refuse_existing, write_new_file
from gfcr.records import GENERATED, IGNORE_INDEX, labels_from_mask
from gfcr.store.core import RolloutStore, StoreError

SFT_FORMATS = ("tokens", "messages", "prompt-completion", "slime")

#: rollout columns the export reads
_COLUMNS = ("rollout_id", "run_id", "step", "policy_version", "prompt_id", "task", "reward", "sample_index",
            "messages", "token_ids", "token_role", "finish_reason", "meta")
#: finish reasons of a generation cut before it ended itself
_TRUNCATED = ("length", "abort")
_PROVENANCE = [("rollout_id", pa.string()), ("run_id", pa.string()), ("step", pa.int64()),
               ("policy_version", pa.string()), ("prompt_id", pa.string()), ("task", pa.string()),
               ("reward", pa.float64())]
_MSG = pa.struct([("role", pa.string()), ("content", pa.string())])
_SLIME_MSG = pa.struct([("role", pa.string()), ("content", pa.string()), ("step_loss_mask", pa.int64())])
_FORMAT_COLUMNS: dict[str, list[tuple[str, pa.DataType]]] = {
    "tokens": [("input_ids", pa.list_(pa.int64())), ("labels", pa.list_(pa.int64())),
               ("completion_mask", pa.list_(pa.int8()))],
    "messages": [("messages", pa.list_(_MSG))],
    "prompt-completion": [("prompt", pa.list_(_MSG)), ("completion", pa.list_(_MSG))],
    "slime": [("messages", pa.list_(_SLIME_MSG))],
}


def sft_schema(fmt: str) -> pa.Schema:
    """The Arrow schema of an export in format ``fmt`` (format columns first, then provenance)."""
    if fmt not in _FORMAT_COLUMNS:
        raise StoreError(f"unknown SFT format {fmt!r}; choose one of {', '.join(SFT_FORMATS)}")
    return pa.schema(_FORMAT_COLUMNS[fmt] + _PROVENANCE)


# ---------------------------------------------------------------------------------------------
# pure per-row transforms
# ---------------------------------------------------------------------------------------------


def token_targets(token_ids: np.ndarray, token_role: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(input_ids, labels, completion_mask)`` of one rollout. Shapes ``[T], [T]`` → three ``[T]``.

    ``input_ids`` are the stored ids as int64; ``labels[t] = input_ids[t]`` where ``token_role[t] == 1``
    else −100; ``completion_mask = (token_role == 1)`` as int8.
    Example: ids [5, 6, 7, 8], roles [0, 1, 0, 1] → labels [-100, 6, -100, 8], mask [0, 1, 0, 1].
    """
    ids = np.asarray(token_ids, np.int64)
    role = np.asarray(token_role)
    if len(ids) != len(role):
        raise ValueError(f"token_ids has {len(ids)} tokens but token_role has {len(role)}")
    mask = (role == GENERATED).astype(np.int8)
    return ids, labels_from_mask(ids, mask), mask


def with_assistant(messages: Sequence[dict[str, Any]], completion: str | None) -> list[dict[str, str]]:
    """The conversation as ``[{role, content}]``; when it holds no assistant turn, ``completion``
    (the decoded generated tokens) is appended as one. Returns ``[]`` when there is no assistant
    turn and no ``completion``.

    Example: ``[user "q"]`` + ``"a"`` → ``[user "q", assistant "a"]``; a conversation that already
    has an assistant turn is returned unchanged (``completion`` ignored).
    """
    conv = [{"role": str(m["role"]), "content": str(m.get("content") or "")} for m in messages]
    if any(m["role"] == "assistant" for m in conv):
        return conv
    if completion is None:
        return []
    return [*conv, {"role": "assistant", "content": completion}]


def split_last_assistant(conv: Sequence[dict[str, str]]) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    """``(prompt, completion)``: the turns before the last assistant turn, and that turn alone.

    Example: [sys, user, asst1, tool, asst2, user] → ([sys, user, asst1, tool], [asst2]).
    """
    last = max((i for i, m in enumerate(conv) if m["role"] == "assistant"), default=None)
    if last is None:
        raise ValueError("the conversation has no assistant turn")
    return [dict(m) for m in conv[:last]], [dict(conv[last])]


def slime_messages(conv: Sequence[dict[str, str]]) -> list[dict[str, Any]]:
    """Each message with ``step_loss_mask``: 1 on assistant turns, 0 on every other turn."""
    return [{**m, "step_loss_mask": int(m["role"] == "assistant")} for m in conv]


def dedup_key(prompt_id: str, generated_ids: np.ndarray, conv: Sequence[dict[str, Any]]) -> tuple[str, str, bytes]:
    """Identity of a sample for dedup: the prompt and the generated token ids (the assistant text
    for rollouts stored without tokens)."""
    if len(generated_ids):
        return (prompt_id, "ids", np.asarray(generated_ids, np.int32).tobytes())
    text = "\x00".join(str(m.get("content") or "") for m in conv if m["role"] == "assistant")
    return (prompt_id, "text", text.encode())


# ---------------------------------------------------------------------------------------------
# export
# ---------------------------------------------------------------------------------------------


def _load_tokenizer(tokenizer: Any) -> Any:
    if isinstance(tokenizer, str | os.PathLike):
        from gfcr.formats._common import load_tokenizer

        return load_tokenizer(str(tokenizer))
    return tokenizer


def _list_slices(col: pa.ChunkedArray, dtype: type) -> list[np.ndarray]:
    """A list column as one numpy view per row (no Python-int lists)."""
    arr = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
    if len(arr) == 0:
        return []
    arr = arr.cast(pa.large_list(arr.type.value_type))
    offsets = arr.offsets.to_numpy()
    values = arr.values.to_numpy(zero_copy_only=False).astype(dtype, copy=False)
    return [values[offsets[i] : offsets[i + 1]] for i in range(len(arr))]


def _select(store: RolloutStore, where: str | None) -> pa.Table:
    cols = ", ".join(_COLUMNS)
    t = store.sql(f"SELECT {cols} FROM rollouts WHERE {where}") if where else store.scan(columns=list(_COLUMNS))
    if t.num_rows == 0:
        return t
    order = [("step", "ascending"), ("prompt_id", "ascending"), ("sample_index", "ascending"),
             ("rollout_id", "ascending")]
    return t.sort_by(order)


def export_sft(
    store: RolloutStore,
    out: str | os.PathLike[str],
    fmt: str,
    where: str | None = None,
    dedup: bool = True,
    tokenizer: Any | None = None,
    include_truncated: bool = False,
) -> dict[str, Any]:
    """Write the rollouts matching the DuckDB predicate ``where`` (all rollouts when ``None``; e.g.
    ``"verified AND reward > 0"``) as one SFT Parquet file ``out`` in format ``fmt`` (see module doc).

    Long because: one pass over the matched rows that applies, in order, the truncation, token, assistant-turn
    and duplicate rules and counts each skip, then writes the file all or nothing.

    ``tokenizer`` (an HF tokenizer, or a name/dir to load) decodes the completion of rollouts whose
    ``messages`` hold no assistant turn; without it such rollouts make the text formats fail.
    A rollout cut by the token limit (``finish_reason`` length/abort; a multi-turn episode that
    only ran out of turns is not cut) is skipped as ``truncated`` unless ``include_truncated``:
    the text formats would close it with an end-of-turn token and teach stopping mid-sentence.

    Returns ``{"path", "format", "rows", "matched", "duplicates_dropped", "skipped", "dropped_fields"}``
    where ``skipped`` counts rows left out by reason (``no_tokens``: stored without token ids, in the
    ``tokens`` format; ``no_assistant_turn``: nothing to supervise; ``truncated``; ``templated_prompt``:
    a prompt an importer kept verbatim with its chat template, ``meta.prompt_format = "templated"``,
    which a text format would template a second time). Raises :class:`StoreError`
    (nothing written) on an unknown format, an existing ``out``, bad SQL or no row to write.
    """
    schema = sft_schema(fmt)
    out = Path(out)
    if out.suffix != ".parquet":
        raise StoreError(f"{out}: SFT exports are Parquet files; give a path ending in .parquet")
    refuse_existing(out)
    t = _select(store, where)
    ids_col, role_col = _list_slices(t.column("token_ids"), np.int64), _list_slices(t.column("token_role"), np.int8)
    meta = {c: t.column(c).to_pylist() for c in ("rollout_id", "run_id", "step", "policy_version", "prompt_id",
                                                   "task", "reward", "messages", "finish_reason", "meta")}
    tok = None
    rows: list[dict[str, Any]] = []
    seen: set[tuple[str, str, bytes]] = set()
    skipped: Counter[str] = Counter()
    dups = dropped_fields = 0
    for i in range(t.num_rows):
        ids, role = ids_col[i], role_col[i]
        msgs = meta["messages"][i]
        rid = meta["rollout_id"][i]
        if not include_truncated and meta["finish_reason"][i] in _TRUNCATED and \
                not json.loads(meta["meta"][i] or "{}").get("max_turns_reached"):
            skipped["truncated"] += 1
            continue
        if fmt == "tokens":
            if len(ids) == 0:
                skipped["no_tokens"] += 1
                continue
            conv: list[dict[str, Any]] = []
        else:
            if json.loads(meta["meta"][i] or "{}").get("prompt_format") == "templated":  # a template kept verbatim
                skipped["templated_prompt"] += 1  # (verl import): re-rendering it would template it twice
                continue
            completion = None
            if not any(m["role"] == "assistant" for m in msgs) and np.any(role == GENERATED):
                if tokenizer is None:
                    raise StoreError(
                        f"rollout {rid!r} has no assistant turn in its messages; pass a tokenizer (--tokenizer) to "
                        "decode its generated tokens, narrow --where, or export --format tokens")
                tok = tok or _load_tokenizer(tokenizer)
                completion = tok.decode(ids[role == GENERATED].tolist(), skip_special_tokens=True)
            conv = with_assistant(msgs, completion)
            if not conv:
                skipped["no_assistant_turn"] += 1
                continue
        if dedup:
            key = dedup_key(meta["prompt_id"][i], ids[role == GENERATED], conv or msgs)
            if key in seen:
                dups += 1
                continue
            seen.add(key)
        row = {k: meta[k][i] for k in ("rollout_id", "run_id", "step", "policy_version", "prompt_id", "task",
                                        "reward")}
        if fmt == "tokens":
            input_ids, labels, mask = token_targets(ids, role)
            row.update(input_ids=input_ids, labels=labels, completion_mask=mask)
        else:
            dropped_fields += sum(1 for m in msgs if m.get("tool_calls") or m.get("name"))
            if fmt == "messages":
                row["messages"] = conv
            elif fmt == "prompt-completion":
                row["prompt"], row["completion"] = split_last_assistant(conv)
            else:
                row["messages"] = slime_messages(conv)
        rows.append(row)
    if not rows:
        raise StoreError(f"no rollouts to export: {t.num_rows} matched"
                         + (f" the predicate {where!r}" if where else "")
                         + (f", {dups} duplicate(s) dropped" if dups else "")
                         + (f", skipped {dict(skipped)}" if skipped else "")
                         + "; nothing written")
    table = _to_table(rows, schema, fmt)
    write_new_file(out, lambda tmp: pq.write_table(table, tmp))
    return {"path": str(out), "format": fmt, "rows": len(rows), "matched": t.num_rows, "duplicates_dropped": dups,
            "skipped": dict(skipped), "dropped_fields": dropped_fields}


def _to_table(rows: list[dict[str, Any]], schema: pa.Schema, fmt: str) -> pa.Table:
    if fmt != "tokens":
        return pa.Table.from_pylist(rows, schema=schema)
    cols: dict[str, pa.Array] = {}
    for name in ("input_ids", "labels", "completion_mask"):
        arrs = [r[name] for r in rows]
        offsets = np.zeros(len(arrs) + 1, np.int64)
        np.cumsum([len(a) for a in arrs], out=offsets[1:])
        value_type = schema.field(name).type.value_type
        values = pa.array(np.concatenate(arrs), type=value_type)
        cols[name] = pa.LargeListArray.from_arrays(pa.array(offsets), values).cast(pa.list_(value_type))
    for name, typ in _PROVENANCE:
        cols[name] = pa.array([r[name] for r in rows], typ)
    return pa.Table.from_arrays([cols[f.name] for f in schema], schema=schema)


__all__ = ["IGNORE_INDEX", "SFT_FORMATS", "dedup_key", "export_sft", "sft_schema", "slime_messages",
           "split_last_assistant", "token_targets", "with_assistant"]
