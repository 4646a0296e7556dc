"""``gfcr serve``: a small OpenAI-compatible server over the ``hf`` engine (FastAPI + uvicorn).

Endpoints: ``GET /v1/models``, ``POST /v1/completions`` (prompt as text or token ids),
``POST /v1/chat/completions``, ``GET /health``. Log-probs are the engine's behaviour log-probs.
Extensions (as in vLLM): ``return_token_ids: true`` adds ``token_ids`` and ``prompt_token_ids`` to
each choice, so clients get the exact sampled tokens, and (gfcr's own) ``token_entropies``, the
entropy of the distribution each token was sampled from. It binds to 127.0.0.1 unless told otherwise.

Dynamic batching (:mod:`gfcr.generate.batching`): requests arriving within ``batch_wait_ms``
(``--batch-wait-ms``, default 20) of each other share one engine call of up to ``max_batch`` rows
(``--max-batch``, the sum of ``n``; default 32); each client gets exactly its own results, and a bad
request fails alone. Seeded requests run in their own call (exactly the tokens an unbatched server
gives) unless ``batch_seeded=True`` (``--batch-seeded``: faster for RL, whose requests are all
seeded, but reproducible only up to float rounding across batch shapes). ``batch_wait_ms=0`` serves
one request at a time, as before. One lock is held around every engine call and every weight load.

Weight updates (for RL with the trainer in another process): with ``allow_weight_updates=True``
(``gfcr serve --allow-weight-updates``) ``POST /gfcr/weights {"path": ..., "policy_version": ...}``
loads a safetensors file (or an HF checkpoint folder) into the served model between requests, all or
nothing; ``admin_token`` (``--admin-token`` / ``GFCR_SERVE_ADMIN_TOKEN``) makes the route require
``Authorization: Bearer <token>``. Off by default: a server without it cannot have its weights changed.

For tests and in-process use: ``with serve_in_thread(model) as base_url: ...``.
"""

from __future__ import annotations

import contextlib
import hmac
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from gfcr.generate.engines.base import GenRequest, SamplingParams


class _Common(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str | None = None
    n: int = Field(1, ge=1, le=256)
    temperature: float = Field(1.0, ge=0.0, le=10.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    stop: str | list[str] | None = None
    seed: int | None = None
    return_token_ids: bool = False
    repeat_ngram: int = Field(0, ge=0, le=4096)  # gfcr extension: early exit on repetition (SamplingParams)
    repeat_max: int = Field(4, ge=2, le=4096)

    def params(self, max_tokens: int) -> SamplingParams:
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return SamplingParams(n=self.n, temperature=self.temperature, top_p=self.top_p, max_tokens=max_tokens, stop=stop,
                              seed=self.seed, repeat_ngram=self.repeat_ngram, repeat_max=self.repeat_max)


class CompletionBody(_Common):
    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int = Field(16, ge=1)
    logprobs: int | None = None
    echo: bool = False


class ChatBody(_Common):
    messages: list[dict[str, Any]]
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = None


class WeightsBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: str = Field(..., min_length=1, description="A .safetensors file or a folder of them, as the server sees it.")
    policy_version: str | None = Field(None, max_length=200, description="Version string of the new weights.")


def _cut_at_stop(text: str, stop: list[str]) -> str:
    cut = min((text.find(s) for s in stop if s in text), default=-1)
    return text if cut < 0 else text[:cut]


def create_app(engine: Any, model_name: str = "gfcr", allow_weight_updates: bool = False,
               admin_token: str | None = None, max_batch: int = 32, batch_wait_ms: float = 20.0,
               batch_seeded: bool = False) -> Any:
    """The FastAPI app serving ``engine`` (an :class:`~gfcr.generate.engines.hf.HFEngine`) as ``model_name``;
    ``allow_weight_updates`` adds ``POST /gfcr/weights``; ``max_batch``, ``batch_wait_ms`` and
    ``batch_seeded`` set the dynamic batching (see the module docstring). With batching on, the
    :class:`~gfcr.generate.batching.Batcher` is ``app.state.batcher`` (close it when done)."""
    from fastapi import FastAPI, Header, HTTPException

    from gfcr.generate.batching import Batcher, BatcherClosedError

    if max_batch < 1 or batch_wait_ms < 0:
        raise ValueError(f"need max_batch >= 1 and batch_wait_ms >= 0 (got {max_batch}, {batch_wait_ms})")
    app = FastAPI(title="gfcr serve", version="1")
    lock = threading.Lock()
    tok = engine.tokenizer
    batcher = Batcher(engine, max_batch_rows=max_batch, max_wait_ms=batch_wait_ms, lock=lock,
                      batch_seeded=batch_seeded) if batch_wait_ms > 0 else None
    app.state.batcher = batcher

    def run(reqs: list[GenRequest]) -> list[list[Any]]:
        try:
            if batcher is not None:
                return batcher.generate(reqs)
            with lock:
                return engine.generate(reqs)
        except (ValueError, IndexError) as e:
            raise HTTPException(status_code=400, detail=f"bad request: {e}") from e
        except BatcherClosedError as e:
            raise HTTPException(status_code=503, detail=str(e)) from e

    def text_of(r: Any, stop: list[str]) -> str:
        return _cut_at_stop(tok.decode(r.token_ids.tolist(), skip_special_tokens=True), stop)

    @app.get("/health")
    def health() -> dict[str, Any]:
        return {"status": "ok", "model": model_name}

    @app.get("/v1/models")
    def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": model_name, "object": "model", "owned_by": "gfcr",
                                            "policy_version": engine.policy_version}]}

    @app.post("/v1/completions")
    def completions(body: CompletionBody) -> dict[str, Any]:
        params = body.params(body.max_tokens)
        p = body.prompt
        if isinstance(p, str):
            prompts = [p]
        elif p and all(isinstance(x, int) for x in p):
            prompts = [list(p)]
        else:
            prompts = list(p)
        reqs = []
        for q in prompts:
            ids = list(tok(q, add_special_tokens=False)["input_ids"]) if isinstance(q, str) else [int(t) for t in q]
            if not ids:
                raise HTTPException(status_code=400, detail="empty prompt")
            if max(ids) >= len(tok) or min(ids) < 0:
                raise HTTPException(status_code=400, detail=f"token ids must lie in [0, {len(tok)})")
            reqs.append(GenRequest(prompt_ids=ids, params=params))
        results = run(reqs)
        choices, n_prompt, n_gen = [], 0, 0
        for req, res in zip(reqs, results, strict=True):
            n_prompt += len(req.prompt_ids or [])
            for r in res:
                n_gen += r.n_tokens
                c: dict[str, Any] = {"index": len(choices), "text": text_of(r, params.stop), "finish_reason": r.finish_reason}
                if body.logprobs is not None:
                    toks = [tok.decode([int(t)]) for t in r.token_ids]
                    c["logprobs"] = {"tokens": toks, "token_logprobs": r.logprobs.tolist(), "top_logprobs": None,
                                     "text_offset": None}
                else:
                    c["logprobs"] = None
                if body.return_token_ids:
                    c["token_ids"] = r.token_ids.tolist()
                    c["prompt_token_ids"] = list(req.prompt_ids or [])
                    if r.entropies is not None:
                        c["token_entropies"] = [float(x) for x in r.entropies]
                choices.append(c)
        return {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
                "model": model_name, "choices": choices,
                "usage": {"prompt_tokens": n_prompt, "completion_tokens": n_gen, "total_tokens": n_prompt + n_gen}}

    @app.post("/v1/chat/completions")
    def chat(body: ChatBody) -> dict[str, Any]:
        params = body.params(body.max_completion_tokens or body.max_tokens or 256)
        msgs = [{"role": m.get("role", "user"), "content": m.get("content") or ""} for m in body.messages]
        if not msgs:
            raise HTTPException(status_code=400, detail="messages is empty")
        ids = engine.encode_messages(msgs)
        res = run([GenRequest(prompt_ids=ids, params=params)])[0]
        choices = []
        for i, r in enumerate(res):
            c: dict[str, Any] = {"index": i, "message": {"role": "assistant", "content": text_of(r, params.stop)},
                                 "finish_reason": r.finish_reason}
            if body.logprobs:
                c["logprobs"] = {"content": [
                    {"token": tok.decode([int(t)]), "logprob": float(lp), "bytes": list(tok.decode([int(t)]).encode()),
                     "top_logprobs": []} for t, lp in zip(r.token_ids, r.logprobs, strict=True)]}
            else:
                c["logprobs"] = None
            if body.return_token_ids:
                if r.entropies is not None:
                    c["token_entropies"] = [float(x) for x in r.entropies]
                c["token_ids"] = r.token_ids.tolist()
                c["prompt_token_ids"] = ids
            choices.append(c)
        n_gen = sum(r.n_tokens for r in res)
        return {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
                "model": model_name, "choices": choices,
                "usage": {"prompt_tokens": len(ids), "completion_tokens": n_gen, "total_tokens": len(ids) + n_gen}}

    if allow_weight_updates:
        from gfcr.generate.sync import WEIGHTS_ROUTE, WeightSyncError, read_safetensors, state_dict_bytes

        @app.post(WEIGHTS_ROUTE)
        def load_weights(body: WeightsBody, authorization: str | None = Header(None)) -> dict[str, Any]:
            if admin_token and not hmac.compare_digest((authorization or "").encode(), f"Bearer {admin_token}".encode()):
                raise HTTPException(status_code=401, detail="weight updates need Authorization: Bearer <admin token>")
            t0 = time.perf_counter()
            try:
                sd = read_safetensors(body.path)
                with lock:  # between generations: a request never sees half-loaded weights
                    engine.load_weights(sd, policy_version=body.policy_version)
            except WeightSyncError as e:
                raise HTTPException(status_code=400, detail=str(e)) from e
            n = state_dict_bytes(sd)
            return {"policy_version": engine.policy_version, "tensors": len(sd), "bytes": n,
                    "seconds": round(time.perf_counter() - t0, 4)}

    return app


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _engine_for(model: Any, tokenizer: Any = None, device: str = "cpu", max_batch: int = 32) -> Any:
    from gfcr.generate.engines.hf import HFEngine

    return model if hasattr(model, "generate") and hasattr(model, "tokenizer") and hasattr(model, "policy_version") \
        else HFEngine(model, tokenizer, device=device, max_batch=max_batch)


def serve(model: Any = None, host: str = "127.0.0.1", port: int = 8000, model_name: str | None = None,
          tokenizer: Any = None, device: str = "cpu", log_level: str = "info", allow_weight_updates: bool = False,
          admin_token: str | None = None, max_batch: int = 32, batch_wait_ms: float = 20.0,
          batch_seeded: bool = False) -> None:
    """Serve ``model`` (a path/name, a loaded model or an engine) until interrupted."""
    import uvicorn

    engine = _engine_for(model, tokenizer, device, max_batch)
    name = model_name or _default_name(model)
    app = create_app(engine, name, allow_weight_updates, admin_token, max_batch=max_batch,
                     batch_wait_ms=batch_wait_ms, batch_seeded=batch_seeded)
    try:
        uvicorn.run(app, host=host, port=port, log_level=log_level)
    finally:
        if app.state.batcher is not None:
            app.state.batcher.close()


def _default_name(model: Any) -> str:
    if model is None or isinstance(model, str) and model in ("", "default"):
        return "default"
    return str(model) if isinstance(model, str) else "gfcr"


@contextlib.contextmanager
def serve_in_thread(model: Any = None, host: str = "127.0.0.1", port: int | None = None,
                    model_name: str | None = None, tokenizer: Any = None, device: str = "cpu",
                    startup_timeout_s: float = 60.0, allow_weight_updates: bool = False,
                    admin_token: str | None = None, max_batch: int = 32, batch_wait_ms: float = 20.0,
                    batch_seeded: bool = False) -> Iterator[str]:
    """Run the server in a background thread; yields its base URL (``http://host:port/v1``).

    ``model`` may be a path/name, a loaded model (with ``tokenizer=``) or an engine; the batching
    options are :func:`create_app`'s.
    """
    import uvicorn

    engine = _engine_for(model, tokenizer, device, max_batch)
    port = port or free_port(host)
    app = create_app(engine, model_name or _default_name(model), allow_weight_updates, admin_token,
                     max_batch=max_batch, batch_wait_ms=batch_wait_ms, batch_seeded=batch_seeded)
    config = uvicorn.Config(app, host=host, port=port,
                            log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
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
        if app.state.batcher is not None:
            app.state.batcher.close()
        raise
    try:
        yield f"http://{host}:{port}/v1"
    finally:
        server.should_exit = True
        th.join(timeout=10)
        if app.state.batcher is not None:
            app.state.batcher.close()
