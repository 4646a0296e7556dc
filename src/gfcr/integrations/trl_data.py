"""TRL dataset rows as gfcr records: prompt ids, prompt records, message conversion.

Shared by the recorder (:mod:`gfcr.integrations.trl`) and the sampler
(:mod:`gfcr.integrations.trl_sampler`), so both name a prompt the same way.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from gfcr.records import Message, Prompt

# ---------------------------------------------------------------------------------------------
# Prompts
# ---------------------------------------------------------------------------------------------


def prompt_id_of(prompt: Any, explicit: Any = None) -> str:
    """The store's prompt id for a TRL dataset prompt: the dataset's own ``prompt_id`` column when
    given, else ``"trl-"`` + the first 16 hex digits of the SHA-1 of the prompt's JSON (so the same
    prompt gets the same id in every run and every process)."""
    if explicit is not None and str(explicit):
        return str(explicit)
    blob = json.dumps(prompt, sort_keys=True, ensure_ascii=False, default=str)
    return "trl-" + hashlib.sha1(blob.encode()).hexdigest()[:16]


def messages_of(x: Any, role: str) -> list[Message]:
    """A TRL prompt/completion (text, or a list of message dicts) as gfcr messages."""
    if isinstance(x, str):
        return [Message(role, x)]
    out = []
    for m in x or []:
        c = m.get("content")
        if not isinstance(c, str):  # content blocks: keep their text parts
            c = "".join(b.get("text", "") for b in c if isinstance(b, dict)) if isinstance(c, list) else str(c or "")
        out.append(Message.coerce({**m, "content": c}))
    return out


def completion_text(completion: Any) -> str:
    """The assistant text of a TRL completion (a string, or the assistant messages' contents)."""
    if isinstance(completion, str):
        return completion
    return "\n".join(m.content for m in messages_of(completion, "assistant") if m.role == "assistant")


@dataclass
class Columns:
    """Dataset columns the integration reads (beside ``prompt``)."""

    prompt_id: str = "prompt_id"
    answer: str = "answer"
    tests: str = "tests"
    category: str = "category"


def prompt_record(example: dict[str, Any], cols: Columns = Columns(), task: str = "trl") -> Prompt:
    """The :class:`~gfcr.records.Prompt` of one TRL dataset example (gold answer and tests kept, so
    the store alone can re-verify its rollouts)."""
    prompt = example.get("prompt")
    ans = example.get(cols.answer)
    return Prompt(
        prompt_id=prompt_id_of(prompt, example.get(cols.prompt_id)),
        task=str(example.get("task") or task),
        messages=messages_of(prompt, "user"),
        answer=None if ans is None else str(ans),
        tests=example.get(cols.tests),
        category=None if example.get(cols.category) is None else str(example.get(cols.category)),
        meta={"source": "trl-live"},
    )
