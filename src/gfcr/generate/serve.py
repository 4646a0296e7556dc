"""``gfcr serve``: an OpenAI-compatible server over the ``hf`` engine (FastAPI + uvicorn).

Endpoints: ``GET /v1/models``, ``POST /v1/completions`` (prompt as text or token ids, one or many),
``POST /v1/chat/completions``, ``GET /health``, and vLLM's ``POST /tokenize``, ``POST /detokenize``,
``GET /version``, ``GET|POST /ping``, ``GET /metrics`` (Prometheus text). It behaves as the official
``openai`` client expects of an OpenAI/vLLM server (the compatibility table is in docs/generate.md):

- Chat histories may hold assistant ``tool_calls`` and ``tool`` messages, rendered through the chat
  template as vLLM renders them; ``tools`` go to the template (400 when it takes none); with
  ``tool_call_parser="hermes"`` a ``tool_choice: auto`` reply is parsed into ``message.tool_calls``.
- vLLM's sampling extras ``min_p``, ``repetition_penalty``, ``min_tokens``, ``ignore_eos``,
  ``include_stop_str_in_output``, ``chat_template_kwargs``, ``add_generation_prompt`` /
  ``continue_final_message``; the SDK's no-op ``metadata``, ``store``, ``service_tier``, ``user``.

- ``stream: true`` answers server-sent events (``data: {chunk}`` … ``data: [DONE]``), one chunk per
  token, with a usage chunk when ``stream_options.include_usage``; the chunks concatenate to the text
  the same request gives unstreamed (:class:`gfcr.generate.serve_api.DeltaText`).
- Errors use OpenAI's schema (``{"error": {"message", "type", "param", "code"}}``): 400 for bad
  parameters (never FastAPI's 422), 404 for an unknown model, 413 for a body over the size limit, 503
  while shutting down. Prompt + ``max_tokens`` over the context, ``n`` / ``max_tokens`` / log-probs over
  the server's limits (:class:`~gfcr.generate.serve_api.ServeLimits`) and parameters it cannot honour
  (``tool_choice: required``, ``response_format``, ``suffix`` …) are refused with a message naming them.
- Sampling: ``temperature``, ``top_p``, ``top_k``, ``stop``, ``stop_token_ids``, ``seed``,
  ``frequency_penalty``, ``presence_penalty``, ``logit_bias``; ``logprobs`` with ``top_logprobs`` (chat)
  or ``logprobs=N`` (completions), at most ``max_logprobs`` (20, as vLLM); completions ``echo`` with the
  prompt's log-probs (``max_tokens: 0`` scores a prompt without generating: a served teacher for
  on-policy distillation). Extensions (as in vLLM): ``return_token_ids`` adds ``token_ids`` and
  ``prompt_token_ids`` to each choice, and (gfcr's own) ``token_entropies``.
- Cancellation: a client that disconnects (or times out) has its samples dropped from the batch at the
  next decode step. :func:`serve` drains on SIGTERM (new requests 503, those in flight finish within
  ``drain_s``) and returns (exit 0); :func:`serve_in_thread` cancels everything in flight on leaving.
- Safety: binds 127.0.0.1 unless told otherwise; on a loopback bind the ``Host`` header must name a
  loopback host (against DNS rebinding; look-alikes refused, ``localhost.`` accepted); request bodies are
  limited in size; with an admin token the API docs need it too.

Dynamic batching (:mod:`gfcr.generate.batching`): requests arriving within ``batch_wait_ms`` of each
other (at most ``batch_stretch x batch_wait_ms`` after the first) share one engine call of up to
``max_batch`` rows; seeded requests share calls too unless ``batch_seeded=False``; ``batch_wait_ms=0``
serves one request per call. One lock is held around every engine call, prompt scoring and weight load.

Weight updates (RL with the trainer in another process): with ``allow_weight_updates=True``
``POST /gfcr/weights {"path": ..., "policy_version": ...}`` loads a safetensors file (or an HF checkpoint
folder) between requests, all or nothing; ``admin_token`` makes the route require
``Authorization: Bearer <token>``.

For tests and in-process use: ``with serve_in_thread(model) as base_url: ...``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hmac
import json
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

import numpy as np

from gfcr.generate.engines.base import GenRequest, GenResult, TokenEvent
from gfcr.generate.serve_api import (
    LOOPBACK_NAMES,
    TOOL_PARSERS,
    APIError,
    ChatBody,
    CompletionBody,
    DeltaText,
    DetokenizeBody,
    RequestGuard,
    ServeLimits,
    ServeMetrics,
    TokenizeBody,
    WeightsBody,
    chat_logprob_entry,
    chat_messages,
    completion_logprobs,
    context_length,
    cut_at_stop,
    envelope,
    error_body,
    host_allowed,
    is_loopback,
    render_chat,
    resolve_max_tokens,
    template_variables,
    usage,
)

__all__ = ["LOOPBACK_NAMES", "create_app", "free_port", "host_allowed", "is_loopback", "serve", "serve_in_thread"]

try:  # module level, so that FastAPI can resolve the endpoints' ``request: Request`` annotations
    from starlette.requests import Request
except ImportError:  # pragma: no cover - gfcr serve needs the serve extra (fastapi, uvicorn)
    Request = Any  # type: ignore[misc,assignment]


def _sse(obj: Any) -> str:
    return f"data: {json.dumps(obj)}\n\n"


class _Server:
    """The state and handlers behind :func:`create_app` (one per app)."""

    def __init__(self, engine: Any, model_name: str, limits: ServeLimits, batcher: Any, lock: threading.Lock,
                 tool_parser: str | None = None, metrics: ServeMetrics | None = None):
        self.engine, self.name, self.limits, self.batcher, self.lock = engine, model_name, limits, batcher, lock
        self.tok = engine.tokenizer
        self.vocab = len(self.tok)
        self.context = context_length(engine)
        self.closing = False
        self.tool_parser = tool_parser
        self.metrics = metrics or ServeMetrics()
        self.template_vars = template_variables(self.tok)

    def decode(self, ids: Any) -> str:
        """The text of ``ids``, without special tokens and without the tokenizer's space clean-up (which
        would make the text of a prefix differ from a prefix of the text, as " '" → "'s"; vLLM's
        incremental detokenizer does not clean up either)."""
        return self.tok.decode([int(t) for t in ids], skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def text_of(self, r: GenResult, stop: list[str], keep: bool = False) -> str:
        return cut_at_stop(self.decode(r.token_ids), stop, keep)

    # --- running work -------------------------------------------------------------------------
    def submit(self, reqs: list[GenRequest], cancel: threading.Event) -> Any:
        from gfcr.generate.batching import BatcherClosedError

        if self.closing:
            raise APIError(503, "the server is shutting down")
        try:
            return self.batcher.submit(reqs, cancel)
        except BatcherClosedError as e:
            raise APIError(503, str(e)) from e

    def outcome(self, fut: Any) -> list[list[GenResult]]:
        from gfcr.generate.batching import BatcherClosedError, RequestCancelledError

        try:
            res = fut.result()
        except (ValueError, IndexError) as e:
            raise APIError(400, f"bad request: {e}") from e
        except (BatcherClosedError, RequestCancelledError) as e:
            raise APIError(503, str(e)) from e
        if self.closing and any(r.meta.get("cancelled") for rs in res for r in rs):
            raise APIError(503, "the server is shutting down; the request was cancelled")
        self.metrics.tokens(sum(len(r.prompt_ids) if r.prompt_ids is not None else 0 for rs in res for r in rs[:1]),
                            sum(r.n_tokens for rs in res for r in rs))
        return res

    async def run(self, reqs: list[GenRequest], request: Any) -> list[list[GenResult]]:
        """Run ``reqs`` as one batcher job; cancel it if the client disconnects while it waits."""
        cancel = threading.Event()
        afut = asyncio.wrap_future(self.submit(reqs, cancel))
        self.metrics.running += 1
        try:
            while True:
                done, _ = await asyncio.wait({afut}, timeout=0.1)
                if done:
                    break
                if await request.is_disconnected():
                    cancel.set()
                    raise APIError(400, "the client disconnected")
        except asyncio.CancelledError:
            cancel.set()
            raise
        finally:
            self.metrics.running -= 1
        return self.outcome(afut)

    async def exclusive(self, fn: Any) -> Any:
        """``fn()`` in a worker thread under the engine lock (prompt scoring)."""

        def go() -> Any:
            with self.lock:
                return fn()

        return await asyncio.to_thread(go)

    async def prompt_scores(self, prompts: list[list[int]], n_top: int) -> list[Any]:
        """Teacher-forced log-probs of each prompt's tokens after its first (for ``echo``)."""
        if not hasattr(self.engine, "score_batch"):
            raise APIError(400, "this engine cannot score prompts (echo with logprobs)", "echo")
        return await self.exclusive(lambda: self.engine.score_batch([(p[:1], p[1:]) for p in prompts], top_n=n_top))

    # --- request preparation ------------------------------------------------------------------
    def completion_prompts(self, body: CompletionBody) -> list[tuple[list[int], str]]:
        """``(token ids, prompt text)`` per prompt of a completions request."""
        p = body.prompt
        items: list[Any]
        if isinstance(p, str):
            items = [p]
        elif p and all(isinstance(x, int) for x in p):
            items = [list(p)]
        else:
            items = list(p)
        if not items:
            raise APIError(400, "prompt is empty", "prompt")
        if len(items) > self.limits.max_prompts:
            raise APIError(400, f"{len(items)} prompts is more than this server's limit of {self.limits.max_prompts}",
                           "prompt")
        out = []
        for q in items:
            ids = list(self.tok(q, add_special_tokens=False)["input_ids"]) if isinstance(q, str) else [int(t) for t in q]
            if not ids:
                raise APIError(400, "prompt is empty", "prompt")
            if max(ids) >= self.vocab or min(ids) < 0:
                raise APIError(400, f"prompt token ids must lie in [0, {self.vocab})", "prompt")
            out.append((ids, q if isinstance(q, str) else self.decode(ids)))
        return out

    def n_top(self, n: int | None, param: str) -> int:
        if n is not None and n > self.limits.max_logprobs:
            raise APIError(400, f"Requested {param} of {n}, which is greater than max allowed: "
                                f"{self.limits.max_logprobs}", param)
        return int(n or 0)

    # --- completions --------------------------------------------------------------------------
    async def completions(self, body: CompletionBody, request: Any) -> Any:
        from fastapi.responses import StreamingResponse

        body.check_common(self.name, self.limits, self.vocab)
        n_top = self.n_top(body.logprobs, "logprobs")
        prompts = self.completion_prompts(body)
        if body.max_tokens == 0 and not body.echo:
            raise APIError(400, "max_tokens = 0 needs echo = true (it scores the prompt without generating)",
                           "max_tokens")
        asked = 16 if body.max_tokens is None else body.max_tokens
        reqs = [GenRequest(prompt_ids=ids, params=body.params(resolve_max_tokens(asked or 1, len(ids), self.context,
                                                                                  self.limits), n_top))
                for ids, _ in prompts]
        scored = await self.prompt_scores([ids for ids, _ in prompts], n_top) \
            if body.echo and body.logprobs is not None else None
        if body.stream:
            return StreamingResponse(self.stream("text", body, reqs, request, prompts, scored),
                                     media_type="text/event-stream")
        if asked == 0:
            results = [[GenResult(np.zeros(0, np.int32), np.zeros(0, np.float32), "length") for _ in range(body.n)]
                       for _ in reqs]
        else:
            results = await self.run(reqs, request)
        choices, n_gen = [], 0
        for k, (req, res) in enumerate(zip(reqs, results, strict=True)):
            for r in res:
                n_gen += r.n_tokens
                choices.append(self.completion_choice(len(choices), body, req, r, prompts[k], scored[k] if scored else None))
        n_prompt = sum(len(ids) for ids, _ in prompts)
        return envelope("text", self.name) | {"choices": choices, "usage": usage(n_prompt, n_gen)}

    def completion_choice(self, index: int, body: CompletionBody, req: GenRequest, r: GenResult,
                          prompt: tuple[list[int], str], scored: Any) -> dict[str, Any]:
        text = self.text_of(r, req.params.stop, body.include_stop_str_in_output)
        c: dict[str, Any] = {"index": index, "text": (prompt[1] + text) if body.echo else text,
                             "finish_reason": r.finish_reason, "logprobs": None}
        if body.logprobs is not None:
            toks, lps, tops = list(r.token_ids), list(r.logprobs), _tops(r)
            if body.echo:
                ids = prompt[0]
                toks = ids + toks
                lps = [None, *scored.logprobs.tolist(), *lps]
                tops = _prompt_tops(ids, scored) + (tops or [None] * r.n_tokens)
            c["logprobs"] = completion_logprobs(self.tok_for(body), toks, lps, tops)
        self.add_extensions(c, body, req, r)
        return c

    def tok_for(self, body: Any) -> Any:
        """What names tokens in log-probs: the tokenizer, or ``token_id:N`` strings when the request asks
        for ``return_tokens_as_token_ids`` (vLLM's extension)."""
        return _IdNames() if body.return_tokens_as_token_ids else self.tok

    def prompt_logprobs(self, body: Any, ids: list[int], scored: Any) -> dict[str, Any]:
        """Completions ``logprobs`` of an echoed prompt (the first token has none)."""
        return completion_logprobs(self.tok_for(body), ids, [None, *scored.logprobs.tolist()], _prompt_tops(ids, scored))

    def add_extensions(self, c: dict[str, Any], body: Any, req: GenRequest, r: GenResult) -> None:
        if body.return_token_ids:
            c["token_ids"] = r.token_ids.tolist()
            c["prompt_token_ids"] = list(req.prompt_ids or [])
            if r.entropies is not None:
                c["token_entropies"] = [float(x) for x in r.entropies]

    # --- chat ---------------------------------------------------------------------------------
    def chat_prompt(self, body: Any, messages: list[dict[str, Any]]) -> list[int]:
        """Token ids of a chat request's (or a ``/tokenize`` request's) messages through the chat template,
        with its ``tools`` (a 400 when the template takes none), generation prompt and template kwargs."""
        if body.tools and self.template_vars is not None and "tools" not in self.template_vars:
            raise APIError(400, "this model's chat template does not take `tools` (it never shows them to the "
                                "model); describe the tools in a message instead", "tools")
        return render_chat(self.tok, chat_messages(messages), body.tools, body.add_generation_prompt,
                           body.continue_final_message, body.chat_template_kwargs)

    def tool_calls_wanted(self, body: ChatBody) -> bool:
        """Whether the reply is parsed for tool calls (tools given, tool_choice auto); a 400 as vLLM's when
        auto tool choice is asked of a server started without a parser."""
        choice = body.resolved_tool_choice()
        if choice != "auto":
            return False
        if self.tool_parser is None:
            raise APIError(400, '"auto" tool choice requires --tool-call-parser to be set (gfcr serve '
                                '--tool-call-parser hermes; vLLM: --enable-auto-tool-choice --tool-call-parser)',
                           "tool_choice")
        return True

    def chat_message(self, text: str, parse: bool, finish: str) -> tuple[dict[str, Any], str]:
        """The assistant message of a reply, and its finish reason (``tool_calls`` when calls were parsed)."""
        found = TOOL_PARSERS[self.tool_parser](text) if parse and self.tool_parser else None
        if found is None:
            return {"role": "assistant", "content": text}, finish
        content, calls = found
        return {"role": "assistant", "content": content, "tool_calls": calls}, "tool_calls"

    async def chat(self, body: ChatBody, request: Any) -> Any:
        from fastapi.responses import StreamingResponse

        body.check_common(self.name, self.limits, self.vocab)
        body.check_chat()
        if body.top_logprobs and not body.logprobs:  # as vLLM: 0 without logprobs is accepted
            raise APIError(400, "when using `top_logprobs`, `logprobs` must be set to true.", "top_logprobs")
        n_top = self.n_top(body.top_logprobs, "top_logprobs") if body.logprobs else 0
        ids = self.chat_prompt(body, body.messages)
        parse = self.tool_calls_wanted(body)
        m = resolve_max_tokens(body.max_completion_tokens or body.max_tokens, len(ids), self.context, self.limits)
        req = GenRequest(prompt_ids=ids, params=body.params(m, n_top))
        if body.stream:
            return StreamingResponse(self.stream("chat", body, [req], request, parse=parse),
                                     media_type="text/event-stream")
        res = (await self.run([req], request))[0]
        choices = []
        for i, r in enumerate(res):
            msg, finish = self.chat_message(self.text_of(r, req.params.stop, body.include_stop_str_in_output), parse,
                                            r.finish_reason)
            c: dict[str, Any] = {"index": i, "message": msg, "finish_reason": finish, "logprobs": None}
            if body.logprobs:
                tops = _tops(r) or [None] * r.n_tokens
                c["logprobs"] = {"content": [chat_logprob_entry(self.tok_for(body), t, lp, *(tp or (None, None)))
                                             for t, lp, tp in zip(r.token_ids, r.logprobs, tops, strict=True)]}
            self.add_extensions(c, body, req, r)
            choices.append(c)
        return envelope("chat", self.name) | {"choices": choices,
                                               "usage": usage(len(ids), sum(r.n_tokens for r in res))}

    # --- tokenizer endpoints ------------------------------------------------------------------
    def tokenize(self, body: TokenizeBody) -> dict[str, Any]:
        """``POST /tokenize`` (vLLM's): ``{"count", "max_model_len", "tokens", "token_strs"}``."""
        if body.model not in (None, "", self.name):
            raise APIError(404, f"The model `{body.model}` does not exist.", "model")
        if (body.prompt is None) == (body.messages is None):
            raise APIError(400, "give exactly one of `prompt` or `messages`", "prompt")
        if body.messages is not None:
            if body.add_generation_prompt and body.continue_final_message:
                raise APIError(400, "Cannot set both `continue_final_message` and `add_generation_prompt` to True.",
                               "continue_final_message")
            ids = self.chat_prompt(body, body.messages)
            if body.add_special_tokens:  # vLLM: False for messages unless asked
                ids = list(self.tok.build_inputs_with_special_tokens(ids))
        else:
            ids = list(self.tok(body.prompt, add_special_tokens=body.add_special_tokens is not False)["input_ids"])
        out: dict[str, Any] = {"count": len(ids), "max_model_len": self.context, "tokens": ids, "token_strs": None}
        if body.return_token_strs:
            out["token_strs"] = self.tok.convert_ids_to_tokens(ids)
        return out

    def detokenize(self, body: DetokenizeBody) -> dict[str, Any]:
        """``POST /detokenize`` (vLLM's): ``{"prompt": text}``."""
        if body.model not in (None, "", self.name):
            raise APIError(404, f"The model `{body.model}` does not exist.", "model")
        if any(not 0 <= t < self.vocab for t in body.tokens):
            raise APIError(400, f"tokens must lie in [0, {self.vocab})", "tokens")
        return {"prompt": self.tok.decode(body.tokens)}

    # --- streaming ----------------------------------------------------------------------------
    async def stream(self, kind: str, body: Any, reqs: list[GenRequest], request: Any,
                     prompts: list[tuple[list[int], str]] | None = None, scored: Any = None,
                     parse: bool = False) -> AsyncIterator[str]:
        """Server-sent events of one request (chat: ``kind="chat"``; completions: ``"text"``).

        Long because it is one protocol: the opening chunks, one chunk per token as the engine reports it,
        each choice's last chunk with its finish reason, the usage chunk, ``[DONE]``. With ``parse`` (tool
        calls wanted) a choice's text is held back and its last chunk carries the whole message: the content
        and the parsed ``tool_calls`` (departure: vLLM streams the calls' arguments piece by piece)."""
        loop = asyncio.get_running_loop()
        q: asyncio.Queue = asyncio.Queue()
        cancel = threading.Event()
        n = body.n
        chat = kind == "chat"
        head = envelope("chat.chunk" if chat else "text", self.name)
        stop = reqs[0].params.stop
        keep = body.include_stop_str_in_output
        texts = [DeltaText(self.decode, stop, keep) for _ in range(len(reqs) * n)]
        offsets = [len(prompts[k // n][1]) if prompts and body.echo else 0 for k in range(len(reqs) * n)]
        logprobs = bool(body.logprobs) if chat else body.logprobs is not None

        def hook(ri: int) -> Any:
            return lambda ev: loop.call_soon_threadsafe(q.put_nowait, (ri, ev))

        def chunk(choices: list[dict[str, Any]], **extra: Any) -> str:
            return _sse(head | {"choices": choices} | extra)

        self.metrics.running += 1
        try:
            if chat:
                yield chunk([{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                              "finish_reason": None} for i in range(n)])
            elif body.echo:
                for k in range(len(reqs) * n):
                    ids, text = prompts[k // n]
                    lp = self.prompt_logprobs(body, ids, scored[k // n]) if logprobs else None
                    yield chunk([{"index": k, "text": text, "logprobs": lp, "finish_reason": None}])
            if body.max_tokens == 0 and not chat:
                results: list[list[GenResult]] | None = [[GenResult(np.zeros(0, np.int32), np.zeros(0, np.float32),
                                                                    "length")] * n for _ in reqs]
            else:
                try:
                    fut = self.submit([dataclasses.replace(r, on_token=hook(ri)) for ri, r in enumerate(reqs)], cancel)
                except APIError as e:  # shutting down between the checks and the start of the stream
                    yield _sse(error_body(e.status, e.message, e.param))
                    yield "data: [DONE]\n\n"
                    return
                fut.add_done_callback(lambda f: loop.call_soon_threadsafe(q.put_nowait, (None, f)))
                results = None
            while results is None:
                ri, item = await q.get()
                if ri is None:
                    try:
                        results = self.outcome(item)
                    except APIError as e:
                        yield _sse(error_body(e.status, e.message, e.param))
                        yield "data: [DONE]\n\n"
                        return
                    break
                c = self.token_choice(chat, ri * n + item.sample, item, texts, offsets, logprobs, body, parse)
                if c is not None:
                    yield chunk([c])
            for k in range(len(reqs) * n):
                r = results[k // n][k % n]
                if parse:
                    msg, finish = self.chat_message(self.text_of(r, stop, keep), True, r.finish_reason)
                    delta = {"content": msg["content"]} if msg["content"] else {}
                    if msg.get("tool_calls"):
                        delta["tool_calls"] = [{"index": j} | tc for j, tc in enumerate(msg["tool_calls"])]
                    yield chunk([{"index": k, "delta": delta, "logprobs": None, "finish_reason": finish}])
                    continue
                rest = texts[k].finish(self.text_of(r, stop, keep))
                if chat:
                    c = {"index": k, "delta": {"content": rest} if rest else {}, "logprobs": None,
                         "finish_reason": r.finish_reason}
                else:
                    c = {"index": k, "text": rest, "logprobs": None, "finish_reason": r.finish_reason}
                yield chunk([c])
            if body.include_usage:
                n_prompt = sum(len(r.prompt_ids or []) for r in reqs)
                n_gen = sum(r.n_tokens for res in results for r in res)
                yield chunk([], usage=usage(n_prompt, n_gen))
            yield "data: [DONE]\n\n"
        finally:
            self.metrics.running -= 1
            cancel.set()  # finished: a no-op; client gone: its samples leave the batch at the next step

    def token_choice(self, chat: bool, k: int, ev: TokenEvent, texts: list[DeltaText], offsets: list[int],
                     logprobs: bool, body: Any, parse: bool = False) -> dict[str, Any] | None:
        """The stream choice for one token (None when there is nothing to send yet; with ``parse`` the
        text waits for the last chunk)."""
        d = "" if parse else texts[k].push(ev.token)
        if not (d or logprobs or body.return_token_ids):
            return None
        top = (ev.top_ids, ev.top_logprobs) if ev.top_ids is not None else None
        if chat:
            c: dict[str, Any] = {"index": k, "delta": {"content": d}, "finish_reason": None,
                                 "logprobs": {"content": [chat_logprob_entry(self.tok_for(body), ev.token, ev.logprob, *(top or (None, None)))]}
                                 if logprobs else None}
        else:
            lp = completion_logprobs(self.tok_for(body), [ev.token], [ev.logprob], [top], offsets[k]) if logprobs else None
            if lp is not None:
                offsets[k] += len(lp["tokens"][0])
            c = {"index": k, "text": d, "logprobs": lp, "finish_reason": None}
        if body.return_token_ids:
            c["token_ids"] = [ev.token]
        return c


class _IdNames:
    """Names tokens ``token_id:N`` (vLLM's ``return_tokens_as_token_ids``)."""

    def decode(self, ids: list[int]) -> str:
        return f"token_id:{int(ids[0])}"


def _prompt_tops(ids: list[int], scored: Any) -> list[Any]:
    if scored.top_ids is None:
        return [None] * len(ids)
    return [None, *zip(scored.top_ids, scored.top_logprobs, strict=True)]


def _tops(r: GenResult) -> list[tuple[Any, Any]] | None:
    if r.top_ids is None or r.top_logprobs is None:
        return None
    return list(zip(r.top_ids, r.top_logprobs, strict=True))


def create_app(engine: Any, model_name: str = "gfcr", allow_weight_updates: bool = False,
               admin_token: str | None = None, max_batch: int = 32, batch_wait_ms: float = 20.0,
               batch_seeded: bool = True, limits: ServeLimits | None = None,
               allowed_hosts: Sequence[str] | None = None, batch_stretch: float = 4.0,
               tool_call_parser: str | None = None) -> Any:
    """The FastAPI app serving ``engine`` (an :class:`~gfcr.generate.engines.hf.HFEngine`) as ``model_name``.

    Long because: its routes are closures over the engine, batcher and lock; request logic is in ``_Server``.

    ``allow_weight_updates`` adds ``POST /gfcr/weights``; ``max_batch``, ``batch_wait_ms`` and
    ``batch_seeded`` set the dynamic batching (its :class:`~gfcr.generate.batching.Batcher` is
    ``app.state.batcher``; close it when done, or call ``app.state.shutdown()``, which also makes
    requests in flight end with 503); ``limits`` bound requests; ``allowed_hosts``: the ``Host`` names
    accepted (``None``: any; :func:`serve` passes the loopback names on a loopback bind);
    ``batch_stretch``: the window closes once no request has come for ``batch_wait_ms``, at most this many
    times ``batch_wait_ms`` after the first (1 = a fixed window; the Batcher's ``stretch``);
    ``tool_call_parser``: a name in :data:`~gfcr.generate.serve_api.TOOL_PARSERS` (``"hermes"``) to parse
    tool calls out of chat replies when a request gives ``tools`` (``tool_choice`` auto). With
    ``admin_token`` set, ``/docs``, ``/redoc`` and ``/openapi.json`` need the token too.
    ``app.state.drain(timeout_s)`` refuses new requests (503) and lets those in flight finish first.
    """
    from fastapi import FastAPI, Header
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse
    from starlette.exceptions import HTTPException as StarletteHTTPException

    from gfcr.generate.batching import Batcher

    if max_batch < 1 or batch_wait_ms < 0:
        raise ValueError(f"need max_batch >= 1 and batch_wait_ms >= 0 (got {max_batch}, {batch_wait_ms})")
    if tool_call_parser is not None and tool_call_parser not in TOOL_PARSERS:
        raise ValueError(f"unknown tool call parser {tool_call_parser!r} (known: {', '.join(sorted(TOOL_PARSERS))})")
    limits = limits or ServeLimits()
    app = FastAPI(title="gfcr serve", version=_version())
    lock = threading.Lock()
    metrics = ServeMetrics()
    batcher = Batcher(engine, max_batch_rows=max_batch, max_wait_ms=batch_wait_ms, lock=lock, batch_seeded=batch_seeded,
                      stretch=batch_stretch, on_batch=metrics.batch)
    srv = _Server(engine, model_name, limits, batcher, lock, tool_parser=tool_call_parser, metrics=metrics)
    app.state.batcher = batcher
    app.state.server = srv

    def shutdown(timeout_s: float = 0.0) -> None:
        srv.closing = True
        batcher.close(timeout_s=timeout_s)

    def drain(timeout_s: float = 30.0) -> bool:
        srv.closing = True
        return batcher.drain(timeout_s)

    app.state.shutdown = shutdown
    app.state.drain = drain
    app.add_middleware(RequestGuard, allowed_hosts=allowed_hosts, max_bytes=limits.max_request_bytes,
                       token=admin_token, metrics=metrics)

    def err(status: int, message: str, param: str | None = None, headers: Any = None) -> JSONResponse:
        return JSONResponse(error_body(status, message, param), status_code=status, headers=headers)

    @app.exception_handler(APIError)
    async def _api_error(request: Request, e: APIError) -> JSONResponse:
        return err(e.status, e.message, e.param)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, e: RequestValidationError) -> JSONResponse:
        errs = e.errors()
        if errs and errs[0].get("type") == "json_invalid":
            why = (errs[0].get("ctx") or {}).get("error", "")
            return err(400, f"the request body is not valid JSON{': ' + str(why) if why else ''}")
        loc = [str(x) for x in errs[0].get("loc", ()) if x != "body"] if errs else []
        msg = (f"{'.'.join(loc)}: " if loc else "") + (errs[0].get("msg", "invalid request") if errs else "invalid request")
        more = f" (and {len(errs) - 1} more problem(s))" if len(errs) > 1 else ""
        return err(400, msg + more, loc[0] if loc and not loc[0].isdigit() else None)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, e: StarletteHTTPException) -> JSONResponse:
        return err(e.status_code, str(e.detail), headers=getattr(e, "headers", None))

    @app.exception_handler(Exception)
    async def _crash(request: Request, e: Exception) -> JSONResponse:
        return err(500, f"internal error: {type(e).__name__}: {e}")

    @app.get("/health")
    def health() -> dict[str, Any]:
        return {"status": "ok", "model": model_name}

    def ping() -> Any:  # vLLM's: 200 with an empty body while healthy
        from starlette.responses import Response

        return Response(status_code=503 if srv.closing else 200)

    app.add_api_route("/ping", ping, methods=["GET"], operation_id="ping_get")
    app.add_api_route("/ping", ping, methods=["POST"], operation_id="ping_post")

    @app.get("/version")
    def version() -> dict[str, str]:
        return {"version": _version()}

    @app.get("/metrics")
    def prometheus() -> Any:
        from starlette.responses import Response

        return Response(metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.post("/tokenize")
    def tokenize(body: TokenizeBody) -> dict[str, Any]:
        return srv.tokenize(body)

    @app.post("/detokenize")
    def detokenize(body: DetokenizeBody) -> dict[str, Any]:
        return srv.detokenize(body)

    @app.get("/v1/models")
    def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": model_name, "object": "model", "owned_by": "gfcr",
                                            "max_model_len": srv.context, "policy_version": engine.policy_version}]}

    @app.post("/v1/completions")
    async def completions(body: CompletionBody, request: Request) -> Any:
        return await srv.completions(body, request)

    @app.post("/v1/chat/completions")
    async def chat(body: ChatBody, request: Request) -> Any:
        return await srv.chat(body, request)

    if allow_weight_updates:
        from gfcr.generate.sync import WEIGHTS_ROUTE, WeightSyncError, read_safetensors, state_dict_bytes

        @app.post(WEIGHTS_ROUTE)
        def load_weights(body: WeightsBody, authorization: str | None = Header(None)) -> dict[str, Any]:
            if admin_token and not hmac.compare_digest((authorization or "").encode(), f"Bearer {admin_token}".encode()):
                raise APIError(401, "weight updates need Authorization: Bearer <admin token>")
            t0 = time.perf_counter()
            try:
                sd = read_safetensors(body.path)
                with lock:  # between generations: a request never sees half-loaded weights
                    engine.load_weights(sd, policy_version=body.policy_version)
            except WeightSyncError as e:
                raise APIError(400, str(e), "path") from e
            n = state_dict_bytes(sd)
            return {"policy_version": engine.policy_version, "tensors": len(sd), "bytes": n,
                    "seconds": round(time.perf_counter() - t0, 4)}

    return app


def _version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("gfcr")
    except PackageNotFoundError:  # a source checkout that is not installed
        return "0+unknown"


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _engine_for(model: Any, tokenizer: Any = None, device: str = "cpu", max_batch: int = 32) -> Any:
    from gfcr.generate.engines.hf import HFEngine

    return model if hasattr(model, "generate") and hasattr(model, "tokenizer") and hasattr(model, "policy_version") \
        else HFEngine(model, tokenizer, device=device, max_batch=max_batch)


def _uvicorn_server(app: Any, host: str, port: int, log_level: str, drain_s: float = 0.0) -> Any:
    """A uvicorn server that, when asked to stop, first lets the work in flight finish for at most
    ``drain_s`` seconds (new requests get 503), cancels what is left (so it never waits for abandoned
    generations) and then gives open requests at most 5 s to be written out."""
    import uvicorn

    class _Server(uvicorn.Server):
        async def shutdown(self, sockets: Any = None) -> None:
            if drain_s > 0:
                await asyncio.to_thread(app.state.drain, drain_s)
            app.state.shutdown(0.0)
            await super().shutdown(sockets=sockets)

    cfg = uvicorn.Config(app, host=host, port=port, log_level=log_level, lifespan="off", timeout_graceful_shutdown=5)
    return _Server(cfg)


def serve(model: Any = None, host: str = "127.0.0.1", port: int = 8000, model_name: str | None = None,
          tokenizer: Any = None, device: str = "cpu", log_level: str = "info", allow_weight_updates: bool = False,
          admin_token: str | None = None, max_batch: int = 32, batch_wait_ms: float = 20.0,
          batch_seeded: bool = True, limits: ServeLimits | None = None, batch_stretch: float = 4.0,
          tool_call_parser: str | None = None, drain_s: float = 30.0) -> None:
    """Serve ``model`` (a path/name, a loaded model or an engine) until interrupted. On a loopback ``host``
    only requests whose ``Host`` header names a loopback host are answered.

    SIGTERM (and Ctrl-C) stop it gracefully: new requests get 503, those in flight finish (at most
    ``drain_s`` seconds, then they are cancelled), and the function returns, so ``gfcr serve`` exits 0.
    (uvicorn re-raises the signal it caught once it has stopped; the SIGTERM handler installed here
    absorbs it, where the default one would kill the process with status 143.)
    """
    import signal

    engine = _engine_for(model, tokenizer, device, max_batch)
    name = model_name or _default_name(model)
    app = create_app(engine, name, allow_weight_updates, admin_token, max_batch=max_batch,
                     batch_wait_ms=batch_wait_ms, batch_seeded=batch_seeded, limits=limits,
                     allowed_hosts=_hosts_for(host), batch_stretch=batch_stretch, tool_call_parser=tool_call_parser)
    main = threading.current_thread() is threading.main_thread()
    before = signal.signal(signal.SIGTERM, lambda *_: None) if main else None
    try:
        _uvicorn_server(app, host, port, log_level, drain_s=drain_s).run()
    finally:
        app.state.shutdown(1.0)
        if main:
            signal.signal(signal.SIGTERM, before)


def _hosts_for(host: str) -> list[str] | None:
    return sorted({*LOOPBACK_NAMES, host.strip("[]").lower()}) if is_loopback(host) else None


def _default_name(model: Any) -> str:
    if model is None or isinstance(model, str) and model in ("", "default"):
        return "default"
    return str(model) if isinstance(model, str) else "gfcr"


@contextlib.contextmanager
def serve_in_thread(model: Any = None, host: str = "127.0.0.1", port: int | None = None,
                    model_name: str | None = None, tokenizer: Any = None, device: str = "cpu",
                    startup_timeout_s: float = 60.0, allow_weight_updates: bool = False,
                    admin_token: str | None = None, max_batch: int = 32, batch_wait_ms: float = 20.0,
                    batch_seeded: bool = True, limits: ServeLimits | None = None,
                    batch_stretch: float = 4.0, tool_call_parser: str | None = None) -> Iterator[str]:
    """Run the server in a background thread; yields its base URL (``http://host:port/v1``).

    ``model`` may be a path/name, a loaded model (with ``tokenizer=``) or an engine; the other options
    are :func:`create_app`'s. Leaving the block cancels whatever is still running.
    """
    engine = _engine_for(model, tokenizer, device, max_batch)
    port = port or free_port(host)
    app = create_app(engine, model_name or _default_name(model), allow_weight_updates, admin_token,
                     max_batch=max_batch, batch_wait_ms=batch_wait_ms, batch_seeded=batch_seeded, limits=limits,
                     allowed_hosts=_hosts_for(host), batch_stretch=batch_stretch, tool_call_parser=tool_call_parser)
    server = _uvicorn_server(app, host, port, "warning")
    th = threading.Thread(target=server.run, name=f"gfcr-serve-{port}", daemon=True)
    th.start()
    t0 = time.monotonic()
    try:
        while not server.started:
            if not th.is_alive():
                raise RuntimeError(f"gfcr serve failed to start on {host}:{port} (is the port in use?)")
            if time.monotonic() - t0 > startup_timeout_s:
                server.should_exit = True
                raise TimeoutError(f"gfcr serve did not start on {host}:{port} within {startup_timeout_s}s")
            time.sleep(0.02)
    except BaseException:
        app.state.shutdown(1.0)
        raise
    try:
        yield f"http://{host}:{port}/v1"
    finally:
        app.state.shutdown(0.0)
        server.should_exit = True
        th.join(timeout=10)
        app.state.shutdown(1.0)
