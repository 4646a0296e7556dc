"""The OpenAI wire format of ``gfcr serve``: request bodies and their checks, the error schema, and the
builders of responses and stream chunks. Pure functions over a tokenizer; the app is in
:mod:`gfcr.serve`.

Errors follow OpenAI's and vLLM's schema (vLLM ``ErrorResponse``/``ErrorInfo``,
``vllm/entrypoints/openai/engine/protocol.py``): status 400/404/413/503 with
``{"error": {"message", "type", "param", "code"}}``, ``type`` a class name as vLLM writes it
(``BadRequestError``, ``NotFoundError`` …) and ``code`` the status. The official ``openai`` client shows
``Error code: 400 - <message>``.

Parameters the server cannot honour are refused with a 400 that names them, never ignored
(vLLM logs and ignores unknown fields; gfcr refuses them: a sampler whose settings are silently dropped
produces rollouts that are not what the caller asked for).
"""

from __future__ import annotations

import ipaddress
import json
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from gfcr.config import StrictModel
from gfcr.generate.engines.base import SamplingParams

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")

ERROR_TYPES = {400: "BadRequestError", 401: "AuthenticationError", 403: "PermissionDeniedError",
               404: "NotFoundError", 405: "MethodNotAllowed", 413: "RequestEntityTooLarge",
               500: "InternalServerError", 503: "ServiceUnavailableError"}

# Known OpenAI/vLLM parameters gfcr serve cannot honour, with the reason given back to the client.
UNSUPPORTED = {
    "tools": "tools are for chat completions only",
    "tool_choice": "tools are for chat completions only",
    "functions": "the deprecated functions API is not supported (use tools)",
    "function_call": "the deprecated functions API is not supported (use tool_choice)",
    "parallel_tool_calls": "tools are for chat completions only",
    "response_format": "structured output (response_format) is not supported",
    "suffix": "suffix is not currently supported",
    "best_of": "best_of is not supported (sample n and choose)",
    "use_beam_search": "beam search is not supported",
    "prompt_logprobs": "use echo=true with logprobs for prompt log-probs",
    "audio": "audio output is not supported",
    "modalities": "only text output is supported",
}


class APIError(Exception):
    """An error answered in OpenAI's schema: ``status``, a one-line ``message``, the offending ``param``."""

    def __init__(self, status: int, message: str, param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param = int(status), message, param


def error_body(status: int, message: str, param: str | None = None) -> dict[str, Any]:
    """``{"error": {"message", "type", "param", "code"}}`` (vLLM's ``ErrorResponse``)."""
    return {"error": {"message": message, "type": ERROR_TYPES.get(status, "BadRequestError"), "param": param,
                      "code": int(status)}}


@dataclass
class ServeLimits:
    """Bounds a request must stay inside (each refusal is a 400 naming the bound).

    ``max_n``: samples per request; ``max_tokens``: new tokens per sample (``None``: only the context
    bounds it); ``max_logprobs``: top log-probs per token (vLLM's default ``--max-logprobs`` is 20);
    ``max_prompts``: prompts in one completions request; ``max_request_bytes``: request body size (413).
    ``default_max_tokens``: chat requests without ``max_tokens`` (capped by what the context leaves).
    """

    max_n: int = 64
    max_tokens: int | None = None
    max_logprobs: int = 20
    max_prompts: int = 256
    max_request_bytes: int = 4 * 2**20
    default_max_tokens: int = 256


class StreamOptions(StrictModel):
    include_usage: bool = False
    continuous_usage_stats: bool = False


class _Common(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str | None = None
    n: int = Field(1, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=10.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=-1)
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    seed: int | None = None
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    # OpenAI SDK fields that change no tokens: accepted, recorded nowhere, ignored
    user: str | None = None
    metadata: dict[str, Any] | None = None
    store: bool | None = None
    service_tier: str | None = None
    # vLLM's sampling extras (vllm/sampling_params.py; the hf engine applies them, SamplingParams)
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    repetition_penalty: float | None = Field(None, gt=0.0, le=10.0)
    min_tokens: int = Field(0, ge=0)
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    return_token_ids: bool = False  # vLLM extension: token_ids and prompt_token_ids per choice
    return_tokens_as_token_ids: bool = False  # vLLM extension: tokens in log-probs named "token_id:N"
    repeat_ngram: int = Field(0, ge=0, le=4096)  # gfcr extension: early exit on repetition (SamplingParams)
    repeat_max: int = Field(4, ge=2, le=4096)

    def check_common(self, model_name: str, limits: ServeLimits, vocab: int) -> None:
        """The checks both endpoints share (raises :class:`APIError`)."""
        extra = sorted((self.model_extra or {}).keys())
        refused = [k for k in extra if not _harmless(k, (self.model_extra or {})[k])]
        if refused:
            why = "; ".join(f"{k}: {UNSUPPORTED[k]}" if k in UNSUPPORTED else f"{k}: unknown parameter" for k in refused)
            raise APIError(400, f"unsupported parameter(s) {', '.join(refused)} ({why})", refused[0])
        if self.model not in (None, "", model_name):
            raise APIError(404, f"The model `{self.model}` does not exist.", "model")
        if self.n > limits.max_n:
            raise APIError(400, f"n = {self.n} is more than this server's limit of {limits.max_n}", "n")
        if self.stream_options is not None and not self.stream:
            raise APIError(400, "Stream options can only be defined when `stream=True`.", "stream_options")
        if self.stream_options is not None and self.stream_options.continuous_usage_stats:
            raise APIError(400, "continuous_usage_stats is not supported", "stream_options")
        for t in self.stop_token_ids or []:
            if not 0 <= t < vocab:
                raise APIError(400, f"stop_token_ids: {t} is outside the vocabulary [0, {vocab})", "stop_token_ids")
        for k, v in (self.logit_bias or {}).items():
            if not k.lstrip("-").isdigit() or not 0 <= int(k) < vocab:
                raise APIError(400, f"logit_bias: key {k!r} is not a token id in [0, {vocab})", "logit_bias")
            if not -100.0 <= v <= 100.0:
                raise APIError(400, f"logit_bias: value {v} for token {k} is outside [-100, 100]", "logit_bias")

    def params(self, max_tokens: int, top_logprobs: int = 0) -> SamplingParams:
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if any(not s for s in stop):
            raise APIError(400, "stop strings must be non-empty", "stop")
        if self.min_tokens > max(1, max_tokens):
            raise APIError(400, f"min_tokens ({self.min_tokens}) must be less than or equal to max_tokens "
                                f"({max(1, max_tokens)})", "min_tokens")
        return SamplingParams(
            n=self.n, temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p, top_k=max(0, self.top_k or 0),
            max_tokens=max(1, max_tokens), stop=stop, stop_token_ids=list(self.stop_token_ids or []), seed=self.seed,
            repeat_ngram=self.repeat_ngram, repeat_max=self.repeat_max,
            frequency_penalty=self.frequency_penalty or 0.0, presence_penalty=self.presence_penalty or 0.0,
            logit_bias={int(k): float(v) for k, v in (self.logit_bias or {}).items()}, top_logprobs=top_logprobs,
            min_p=self.min_p or 0.0, repetition_penalty=1.0 if self.repetition_penalty is None else self.repetition_penalty,
            min_tokens=self.min_tokens, ignore_eos=self.ignore_eos)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


def _harmless(key: str, value: Any) -> bool:
    """Extra parameters accepted because their value asks for nothing (``tool_choice: "none"``, a text
    ``response_format``, ``best_of`` 1, beam search off, null values)."""
    if value is None:
        return True
    if key == "tool_choice":
        return value == "none"
    if key == "response_format":
        return isinstance(value, dict) and value.get("type") == "text" and len(value) == 1
    if key == "best_of":
        return value == 1
    if key in ("use_beam_search", "parallel_tool_calls"):
        return value is False
    return False


class CompletionBody(_Common):
    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int | None = Field(16, ge=0)
    logprobs: int | None = Field(None, ge=0)
    echo: bool = False


class ChatBody(_Common):
    messages: list[dict[str, Any]]
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None  # accepted; the hermes parser returns every call it finds
    chat_template_kwargs: dict[str, Any] | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False

    def resolved_tool_choice(self) -> str | None:
        """``tool_choice`` as vLLM resolves it: ``"auto"`` when tools are given without one; checked
        against ``tools`` (a 400 naming the problem). Returns ``"none"``, ``"auto"`` or None (no tools)."""
        tc = self.tool_choice
        if tc is None:
            return "auto" if self.tools else None
        if tc == "none":
            return "none"
        if not self.tools:
            raise APIError(400, "When using `tool_choice`, `tools` must be set.", "tool_choice")
        if tc == "auto":
            return "auto"
        if tc == "required" or isinstance(tc, dict):
            raise APIError(400, f"tool_choice {json.dumps(tc)} needs constrained decoding, which gfcr serve does "
                                "not do (use \"auto\" with --tool-call-parser, or \"none\")", "tool_choice")
        raise APIError(400, f"tool_choice must be \"none\", \"auto\", \"required\" or a named function, not "
                            f"{json.dumps(tc)}", "tool_choice")

    def check_chat(self) -> None:
        if self.add_generation_prompt and self.continue_final_message:
            raise APIError(400, "Cannot set both `continue_final_message` and `add_generation_prompt` to True.",
                           "continue_final_message")
        bad = sorted(set(self.chat_template_kwargs or {}) & RESERVED_TEMPLATE_KWARGS)
        if bad:
            raise APIError(400, f"chat_template_kwargs may not set {', '.join(bad)} (set by the request itself)",
                           "chat_template_kwargs")
        for i, t in enumerate(self.tools or []):
            f = t.get("function") if isinstance(t, dict) else None
            if not isinstance(t, dict) or t.get("type", "function") != "function" or not isinstance(f, dict) \
                    or not isinstance(f.get("name"), str) or not f["name"]:
                raise APIError(400, f"tools[{i}] must be {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}",
                               "tools")


# Names apply_chat_template gets from the request itself; chat_template_kwargs may not override them.
RESERVED_TEMPLATE_KWARGS = frozenset({"messages", "conversation", "tools", "documents", "add_generation_prompt",
                                      "continue_final_message", "tokenize", "return_dict", "chat_template",
                                      "tokenizer", "return_assistant_tokens_mask", "padding", "truncation"})


class WeightsBody(StrictModel):
    """Body of ``POST /gfcr/weights`` (the weight-update route)."""

    path: str = Field(..., min_length=1, description=(
        "A .safetensors file or a folder of them, as the server sees it."))
    policy_version: str | None = Field(None, max_length=200, description="Version string of the new weights.")




def context_length(engine: Any) -> int:
    """The most tokens (prompt + completion) the served model takes: ``engine.max_context`` if set, else the
    model config's ``max_position_embeddings`` (else the tokenizer's ``model_max_length`` when sane)."""
    n = getattr(engine, "max_context", None)
    if n:
        return int(n)
    cfg = getattr(getattr(engine, "model", None), "config", None)
    for k in ("max_position_embeddings", "n_positions", "max_seq_len"):
        v = getattr(cfg, k, None)
        if isinstance(v, int) and v > 0:
            return v
    v = getattr(engine.tokenizer, "model_max_length", None)
    return int(v) if isinstance(v, int) and 0 < v < 10**7 else 2048


def resolve_max_tokens(asked: int | None, prompt_len: int, context: int, limits: ServeLimits,
                       default: int | None = None) -> int:
    """New tokens to generate for a prompt of ``prompt_len`` tokens, or a 400 with the numbers.

    ``asked`` None: ``default`` (or the limit), capped by what the context leaves (at least 1).
    Example: context 1024, prompt 1000, asked 100 → 400 "… maximum context length is 1024 tokens. However,
    you requested 1100 tokens (1000 in the messages, 100 in the completion) …".
    """
    if prompt_len >= context:
        raise APIError(400, f"This model's maximum context length is {context} tokens. However, your prompt has "
                            f"{prompt_len} tokens, which leaves no room for the completion.", "messages")
    if asked is None:
        want = default if default is not None else limits.default_max_tokens
        cap = min(context - prompt_len, limits.max_tokens or context)
        return max(1, min(want, cap))
    if limits.max_tokens is not None and asked > limits.max_tokens:
        raise APIError(400, f"max_tokens = {asked} is more than this server's limit of {limits.max_tokens}",
                       "max_tokens")
    if prompt_len + asked > context:
        raise APIError(400, f"This model's maximum context length is {context} tokens. However, you requested "
                            f"{prompt_len + asked} tokens ({prompt_len} in the messages, {asked} in the completion). "
                            "Please reduce the length of the messages or completion.", "max_tokens")
    return asked


def cut_at_stop(text: str, stop: list[str], keep: bool = False) -> str:
    """``text`` up to the first stop string, without it (``keep``: with it, vLLM's
    ``include_stop_str_in_output``). Example: ("ab\\ncd", ["\\n"]) → "ab"; with ``keep`` → "ab\\n"."""
    hits = [(text.find(s), s) for s in stop if s in text]
    if not hits:
        return text
    at, s = min(hits, key=lambda h: (h[0], -len(h[1])))
    return text[: at + len(s)] if keep else text[:at]


class DeltaText:
    """The text of one streamed choice, given out in pieces that always concatenate to the final text.

    :meth:`push` adds a token and returns the new text that is safe to send: decoded so far, cut at a stop
    string, without a trailing incomplete character (U+FFFD) and holding back the last ``max(len(stop)) - 1``
    characters (they may begin a stop string). :meth:`finish` returns the rest of the final text.
    Example: stop ``["##"]`` (one character held back), tokens decoding to "a", "a#", "a##b": pushes give
    "", "a", "" and ``finish("a")`` gives "" (the text is "a" in total).
    """

    def __init__(self, decode: Any, stop: list[str], keep: bool = False):
        self.decode, self.stop, self.ids, self.sent, self.keep = decode, stop, [], "", keep
        self.hold = max((len(s) for s in stop), default=1) - 1

    def push(self, token: int) -> str:
        self.ids.append(int(token))
        text = cut_at_stop(self.decode(self.ids), self.stop, self.keep).rstrip("\ufffd")
        safe = text[: len(text) - self.hold] if self.hold else text
        if len(safe) > len(self.sent) and safe.startswith(self.sent):
            d, self.sent = safe[len(self.sent):], safe
            return d
        return ""

    def finish(self, final: str) -> str:
        if final.startswith(self.sent):
            d, self.sent = final[len(self.sent):], final
            return d
        return ""


def chat_logprob_entry(tok: Any, token: int, logprob: float, top_ids: Any = None, top_lps: Any = None) -> dict[str, Any]:
    """One ``logprobs.content`` entry of a chat choice (OpenAI format)."""
    s = tok.decode([int(token)])
    e: dict[str, Any] = {"token": s, "logprob": float(logprob), "bytes": list(s.encode()), "top_logprobs": []}
    if top_ids is not None:
        for t, lp in zip(top_ids, top_lps, strict=True):
            ts = tok.decode([int(t)])
            e["top_logprobs"].append({"token": ts, "logprob": float(lp), "bytes": list(ts.encode())})
    return e


def completion_logprobs(tok: Any, tokens: list[int], lps: list[float | None], tops: list[Any] | None,
                        offset: int = 0) -> dict[str, Any]:
    """A completions choice's ``logprobs``: ``tokens``, ``token_logprobs``, ``top_logprobs`` (per token a
    dict of the top-N token strings and the sampled one, OpenAI's "up to logprobs + 1" entries; None
    where there is no log-prob, e.g. the first echoed prompt token) and ``text_offset`` (from ``offset``).

    ``tops``: per token ``(top_ids, top_lps)`` or None.
    """
    strs = [tok.decode([int(t)]) for t in tokens]
    offsets, at = [], offset
    for s in strs:
        offsets.append(at)
        at += len(s)
    top_out: list[dict[str, float] | None] = []
    for k, (s, lp) in enumerate(zip(strs, lps, strict=True)):
        if lp is None:
            top_out.append(None)
            continue
        d: dict[str, float] = {}
        if tops is not None and tops[k] is not None:
            for t, v in zip(*tops[k], strict=True):
                d.setdefault(tok.decode([int(t)]), float(v))
        d.setdefault(s, float(lp))
        top_out.append(d)
    return {"tokens": strs, "token_logprobs": [None if x is None else float(x) for x in lps],
            "top_logprobs": top_out, "text_offset": offsets}


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def envelope(kind: str, model_name: str, rid: str | None = None, created: int | None = None) -> dict[str, Any]:
    """The fields every response/chunk starts with; ``kind``: ``chat``, ``chat.chunk``, ``text``."""
    obj = {"chat": "chat.completion", "chat.chunk": "chat.completion.chunk", "text": "text_completion"}[kind]
    prefix = "chatcmpl" if kind.startswith("chat") else "cmpl"
    return {"id": rid or f"{prefix}-{uuid.uuid4().hex}", "object": obj, "created": created or int(time.time()),
            "model": model_name}


# --- HTTP guards ------------------------------------------------------------------------------


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or ``localhost``) is a loopback address."""
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return host.lower().rstrip(".") == "localhost"


def host_allowed(header: str | None, allowed: Sequence[str]) -> bool:
    """Whether a ``Host`` header names one of ``allowed`` (case-insensitive; port ignored; IPv6 in
    brackets; one trailing dot of a DNS name removed, so ``localhost.`` is ``localhost``). The header must
    be exactly ``host`` or ``host:port`` (RFC 9110 section 7.2): anything after an IPv6 address's ``]``
    other than ``:port``, a non-numeric port or a second dot makes it a look-alike, refused. A missing or
    empty header is refused.

    Examples (allowed = ``LOOPBACK_NAMES``): ``"127.0.0.1:8000"`` → True, ``"[::1]:8000"`` → True,
    ``"LOCALHOST"`` → True, ``"localhost.:8000"`` → True, ``"evil.example:8000"`` (DNS rebinding) → False,
    ``"[::1]evil.example"`` → False, ``"localhost..:80"`` → False, ``"localhost:80x"`` → False, ``None`` → False.
    """
    if not header:
        return False
    h = header.strip().lower()
    port: str | None = None  # the text after the host's ':' (None: no port given)
    if h.startswith("["):
        end = h.find("]")
        if end < 0:
            return False
        h, rest = h[1:end], h[end + 1 :]
        if rest and not rest.startswith(":"):
            return False
        port = rest[1:] if rest else None
    elif h.count(":") == 1:
        h, port = h.split(":", 1)
    elif ":" in h:  # a bare IPv6 address (no port)
        try:
            ipaddress.IPv6Address(h)
        except ValueError:
            return False
    if port is not None and not port.isdigit():
        return False
    if h.endswith(".") and not h.endswith(".."):
        h = h[:-1]
    return bool(h) and h in {a.lower().strip("[]") for a in allowed}


DOC_PATHS = frozenset({"/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json"})
METRIC_ROUTES = frozenset({"/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/ping", "/version",
                           "/metrics", "/tokenize", "/detokenize", "/gfcr/weights"})


class RequestGuard:
    """ASGI middleware: the ``Host`` check (when ``allowed_hosts`` is given), the body-size limit, the
    token on the API docs (``/docs``, ``/redoc``, ``/openapi.json``: 401 without ``Authorization: Bearer
    <token>`` when ``token`` is set) and the request counts of ``/metrics`` (by route and status; other
    paths are counted as ``other``)."""

    def __init__(self, app: Any, allowed_hosts: Sequence[str] | None, max_bytes: int, token: str | None = None,
                 metrics: Any = None):
        self.app, self.allowed, self.max_bytes = app, allowed_hosts, int(max_bytes)
        self.token, self.metrics = token, metrics

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope.get("path", "")
        if self.metrics is not None:
            route = path if path in METRIC_ROUTES else "other"
            inner_send = send

            async def send(msg: Any) -> None:  # noqa: F811 - wraps the server's send to see the status
                if msg.get("type") == "http.response.start":
                    self.metrics.request(route, int(msg["status"]))
                await inner_send(msg)

        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        if self.allowed is not None and not host_allowed(headers.get("host"), self.allowed):
            return await _send_error(send, 400, f"invalid Host header {headers.get('host')!r}: this server only "
                                                f"answers requests addressed to {', '.join(self.allowed)}")
        if self.token and path in DOC_PATHS:
            import hmac

            if not hmac.compare_digest(headers.get("authorization", "").encode(), f"Bearer {self.token}".encode()):
                return await _send_error(send, 401, "the API docs need Authorization: Bearer <admin token>")
        length = headers.get("content-length", "")
        if length.isdigit() and int(length) > self.max_bytes:
            return await _send_error(send, 413, f"request body of {int(length)} bytes is over this server's limit "
                                                f"of {self.max_bytes} bytes")
        seen = 0

        async def limited() -> Any:
            nonlocal seen
            msg = await receive()
            seen += len(msg.get("body", b""))
            if seen > self.max_bytes:
                from fastapi import HTTPException

                raise HTTPException(413, f"request body is over this server's limit of {self.max_bytes} bytes")
            return msg

        await self.app(scope, limited, send)


async def _send_error(send: Any, status: int, message: str) -> None:
    body = json.dumps(error_body(status, message)).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})



# --- /metrics ---------------------------------------------------------------------------------



class TokenizeBody(StrictModel):
    """``POST /tokenize`` (vLLM's ``TokenizeCompletionRequest`` / ``TokenizeChatRequest``,
    ``vllm/entrypoints/serve/tokenize/protocol.py``): ``prompt`` or ``messages``."""

    model: str | None = None
    prompt: str | None = None
    messages: list[dict[str, Any]] | None = None
    add_special_tokens: bool | None = None  # vLLM: True for a prompt, False for messages
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    return_token_strs: bool = False


class DetokenizeBody(StrictModel):
    """``POST /detokenize`` (vLLM's ``DetokenizeRequest``): ``tokens`` → ``{"prompt": text}``."""

    model: str | None = None
    tokens: list[int]
