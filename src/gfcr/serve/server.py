"""The request handling behind ``gfcr serve`` (:mod:`gfcr.serve`): one :class:`Server` per
app holds the engine, the batcher, the limits and the metrics, and answers completions, chat, tokenize
and weight updates; :func:`gfcr.serve.create_app` routes HTTP requests to it."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import threading
from collections.abc import AsyncIterator
from typing import Any

import numpy as np

from gfcr.generate.engines.base import GenRequest, GenResult, TokenEvent
from gfcr.serve.api import (
    APIError,
    ChatBody,
    CompletionBody,
    DeltaText,
    DetokenizeBody,
    ServeLimits,
    TokenizeBody,
    chat_logprob_entry,
    completion_logprobs,
    context_length,
    cut_at_stop,
    envelope,
    error_body,
    resolve_max_tokens,
    usage,
)
from gfcr.serve.chat import TOOL_PARSERS, chat_messages, render_chat, template_variables
from gfcr.serve.metrics import ServeMetrics


def _sse(obj: Any) -> str:
    return f"data: {json.dumps(obj)}\n\n"


class Server:
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
        from gfcr.serve.batching import BatcherClosedError

        if self.closing:
            raise APIError(503, "the server is shutting down")
        try:
            return self.batcher.submit(reqs, cancel)
        except BatcherClosedError as e:
            raise APIError(503, str(e)) from e

    def outcome(self, fut: Any) -> list[list[GenResult]]:
        from gfcr.serve.batching import BatcherClosedError, RequestCancelledError

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

        Long because: it is one protocol: the opening chunks, one chunk per token as the engine reports it,
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
