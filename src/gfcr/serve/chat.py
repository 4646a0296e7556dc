"""Chat requests of ``gfcr serve`` rendered as vLLM renders them: the messages (with assistant
``tool_calls`` and ``tool`` turns) through the tokenizer's chat template, and the ``hermes`` tool-call
parser of replies. Pure functions over a tokenizer; the wire format is :mod:`gfcr.serve.api`."""

from __future__ import annotations

import json
import uuid
from typing import Any

from gfcr.serve.api import APIError


def chat_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages for the chat template: ``{"role", "content"}`` each, content parts joined, plus an
    assistant message's ``tool_calls``, a tool message's ``tool_call_id`` and a ``name``.

    ``content`` may be a string, ``None`` or a list of parts; text parts (``{"type": "text", "text": …}``)
    are joined with newlines (as vLLM does for text-only content); any other part type is refused.
    Example: ``[{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]``
    → ``[{"role": "user", "content": "a\\nb"}]``.

    Tool calls are passed on as vLLM passes them to the template (``vllm/entrypoints/chat_utils.py``,
    ``_postprocess_messages``): each call's ``function.arguments``, a JSON string on the wire, becomes the
    object it encodes (HF chat templates expect a dict), and content ``None`` becomes ``""``. Example:
    ``{"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function",
    "function": {"name": "add", "arguments": "{\\"a\\": 1}"}}]}`` → ``{"role": "assistant", "content": "",
    "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "add", "arguments": {"a": 1}}}]}``.
    A template that does not use ``tool_calls`` drops them from the prompt, as under vLLM.
    """
    if not messages:
        raise APIError(400, "messages is empty", "messages")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not m["role"]:
            raise APIError(400, f"messages[{i}] needs a string 'role'", "messages")
        extra: dict[str, Any] = {}
        if m.get("tool_calls"):
            extra["tool_calls"] = _template_tool_calls(m["tool_calls"], i)
        if isinstance(m.get("tool_call_id"), str):
            extra["tool_call_id"] = m["tool_call_id"]
        if isinstance(m.get("name"), str):
            extra["name"] = m["name"]
        c = m.get("content")
        if isinstance(c, list):
            texts = []
            for j, part in enumerate(c):
                if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                    kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                    raise APIError(400, f"messages[{i}].content[{j}]: part type {kind!r} is not supported (text only)",
                                   "messages")
                texts.append(part["text"])
            c = "\n".join(texts)
        elif c is not None and not isinstance(c, str):
            raise APIError(400, f"messages[{i}].content must be a string or a list of text parts", "messages")
        out.append({"role": m["role"], "content": c or ""} | extra)
    return out


def _template_tool_calls(calls: Any, i: int) -> list[dict[str, Any]]:
    """An assistant message's ``tool_calls`` checked, with each ``arguments`` JSON string decoded."""
    if not isinstance(calls, list):
        raise APIError(400, f"messages[{i}].tool_calls must be a list", "messages")
    out = []
    for j, c in enumerate(calls):
        f = c.get("function") if isinstance(c, dict) else None
        if not isinstance(f, dict) or not isinstance(f.get("name"), str):
            raise APIError(400, f"messages[{i}].tool_calls[{j}] needs function.name", "messages")
        args = f.get("arguments", "{}")
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except json.JSONDecodeError as e:
                raise APIError(400, f"messages[{i}].tool_calls[{j}].function.arguments is not valid JSON: {e}",
                               "messages") from e
        out.append({"id": c.get("id"), "type": c.get("type", "function"),
                    "function": {"name": f["name"], "arguments": args}})
    return out


def template_variables(tok: Any) -> set[str] | None:
    """The variables the tokenizer's chat template reads (``tools``, ``tool_calls`` is not one: it is read
    from a message; ``enable_thinking`` …), or None when there is no template or it cannot be parsed."""
    src = getattr(tok, "chat_template", None)
    if isinstance(src, dict):
        src = src.get("tool_use") or src.get("default")
    if not isinstance(src, str):
        return None
    import jinja2
    from jinja2 import meta
    from jinja2.ext import loopcontrols

    try:
        return set(meta.find_undeclared_variables(jinja2.Environment(extensions=[loopcontrols]).parse(src)))
    except jinja2.TemplateSyntaxError:  # e.g. a {% generation %} tag: read the names from the source
        import re

        return set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", src))


def render_chat(tok: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
                add_generation_prompt: bool = True, continue_final_message: bool = False,
                template_kwargs: dict[str, Any] | None = None) -> list[int]:
    """Token ids of ``messages`` (from :func:`chat_messages`) rendered by the tokenizer's chat template,
    as vLLM renders a chat request (``tokenizer.apply_chat_template`` with the request's ``tools``,
    ``add_generation_prompt``, ``continue_final_message`` and ``chat_template_kwargs``; the text is then
    tokenized without adding special tokens). A template error is a 400 naming it.

    Example (ChatML): ``[{"role": "user", "content": "hi"}]`` renders
    ``"<|im_start|>user\\nhi<|im_end|>\\n<|im_start|>assistant\\n"``; with ``add_generation_prompt=False``
    the last line is left out; ``[..., {"role": "assistant", "content": "The answer"}]`` with
    ``continue_final_message=True`` ends in ``"…assistant\\nThe answer"`` (no end of turn).
    """
    kw = dict(template_kwargs or {})
    if tools:
        kw["tools"] = tools
    try:
        text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt,
                                       continue_final_message=continue_final_message, **kw)
    except Exception as e:  # noqa: BLE001 - jinja's errors, transformers' ValueErrors: all the request's fault
        raise APIError(400, f"the chat template could not render these messages: {type(e).__name__}: {e}",
                       "messages") from e
    return list(tok(text, add_special_tokens=False)["input_ids"])


def parse_hermes_tool_calls(text: str) -> tuple[str | None, list[dict[str, Any]]] | None:
    """Tool calls in a reply, as vLLM's ``hermes`` parser reads them (``Hermes2ProToolParser.extract_tool_calls``,
    ``vllm/tool_parsers/hermes_tool_parser.py``): every ``<tool_call>{json}</tool_call>`` (the last one may
    be unclosed) holds ``{"name": ..., "arguments": {...}}``; the content is the text before the first
    ``<tool_call>`` (None when empty). Returns ``(content, calls)`` with each call OpenAI's
    ``{"id", "type": "function", "function": {"name", "arguments": JSON string}}``, or None when there is no
    tool call or one does not parse (then the whole text is content, as in vLLM).

    Example: ``'Let me add.<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>'`` →
    ``("Let me add.", [{"id": "chatcmpl-tool-…", "type": "function", "function": {"name": "add",
    "arguments": '{"a": 1}'}}])``.
    """
    import re

    start = "<tool_call>"
    if start not in text:
        return None
    try:
        raw = [json.loads(a or b) for a, b in re.findall(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)", text, re.DOTALL)]
        calls = [{"id": f"chatcmpl-tool-{uuid.uuid4().hex}", "type": "function",
                  "function": {"name": str(c["name"]), "arguments": json.dumps(c["arguments"], ensure_ascii=False)}}
                 for c in raw]
    except (json.JSONDecodeError, KeyError, TypeError):
        return None
    content = text[: text.find(start)]
    return (content or None), calls


TOOL_PARSERS = {"hermes": parse_hermes_tool_calls}  # --tool-call-parser NAME -> text -> (content, calls) | None
