"""``gfcr serve``: a small OpenAI-compatible server over the ``hf`` engine (FastAPI + uvicorn).

Endpoints: ``GET /v1/models``, ``POST /v1/completions`` (prompt as text or token ids),
``POST /v1/chat/completions``, ``GET /health``. Log-probs are the engine's behaviour log-probs.
Extensions (as in vLLM): ``return_token_ids: true`` adds ``token_ids`` and ``prompt_token_ids`` to
each choice, so clients get the exact sampled tokens. Requests are served one at a time (one
engine, one lock). It binds to 127.0.0.1 unless told otherwise.

For tests and in-process use: ``with serve_in_thread(model) as base_url: ...``.
"""

from __future__ import annotations

import contextlib
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

    def params(self, max_tokens: int) -> SamplingParams:
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return SamplingParams(n=self.n, temperature=self.temperature, top_p=self.top_p, max_tokens=max_tokens, stop=stop, seed=self.seed)


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


def _cut_at_stop(text: str, stop: list[str]) -> str:
    cut = min((text.find(s) for s in stop if s in text), default=-1)
    return text if cut < 0 else text[:cut]


def create_app(engine: Any, model_name: str = "gfcr") -> Any:
    """The FastAPI app serving ``engine`` (an :class:`~gfcr.generate.engines.hf.HFEngine`) as ``model_name``."""
    from fastapi import FastAPI, HTTPException

    app = FastAPI(title="gfcr serve", version="1")
    lock = threading.Lock()
    tok = engine.tokenizer

    def run(reqs: list[GenRequest]) -> list[list[Any]]:
        try:
            with lock:
                return engine.generate(reqs)
        except (ValueError, IndexError) as e:
            raise HTTPException(status_code=400, detail=f"bad request: {e}") from e

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
                c["token_ids"] = r.token_ids.tolist()
                c["prompt_token_ids"] = ids
            choices.append(c)
        n_gen = sum(r.n_tokens for r in res)
        return {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
                "model": model_name, "choices": choices,
                "usage": {"prompt_tokens": len(ids), "completion_tokens": n_gen, "total_tokens": len(ids) + n_gen}}

    return app


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _engine_for(model: Any, tokenizer: Any = None, device: str = "cpu") -> Any:
    from gfcr.generate.engines.hf import HFEngine

    return model if hasattr(model, "generate") and hasattr(model, "tokenizer") and hasattr(model, "policy_version") \
        else HFEngine(model, tokenizer, device=device)


def serve(model: Any = None, host: str = "127.0.0.1", port: int = 8000, model_name: str | None = None,
          tokenizer: Any = None, device: str = "cpu", log_level: str = "info") -> None:
    """Serve ``model`` (a path/name, a loaded model or an engine) until interrupted."""
    import uvicorn

    engine = _engine_for(model, tokenizer, device)
    name = model_name or _default_name(model)
    uvicorn.run(create_app(engine, name), host=host, port=port, log_level=log_level)


def _default_name(model: Any) -> str:
    if model is None or isinstance(model, str) and model in ("", "default"):
        return "default"
    return str(model) if isinstance(model, str) else "gfcr"


@contextlib.contextmanager
def serve_in_thread(model: Any = None, host: str = "127.0.0.1", port: int | None = None,
                    model_name: str | None = None, tokenizer: Any = None, device: str = "cpu",
                    startup_timeout_s: float = 60.0) -> Iterator[str]:
    """Run the server in a background thread; yields its base URL (``http://host:port/v1``).

    ``model`` may be a path/name, a loaded model (with ``tokenizer=``) or an engine.
    """
    import uvicorn

    engine = _engine_for(model, tokenizer, device)
    port = port or free_port(host)
    config = uvicorn.Config(create_app(engine, model_name or _default_name(model)), host=host, port=port,
                            log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    th = threading.Thread(target=server.run, name=f"gfcr-serve-{port}", daemon=True)
    th.start()
    t0 = time.monotonic()
    while not server.started:
        if not th.is_alive():
            raise RuntimeError(f"gfcr serve failed to start on {host}:{port} (is the port in use?)")
        if time.monotonic() - t0 > startup_timeout_s:
            server.should_exit = True
            raise TimeoutError(f"gfcr serve did not start on {host}:{port} within {startup_timeout_s}s")
        time.sleep(0.02)
    try:
        yield f"http://{host}:{port}/v1"
    finally:
        server.should_exit = True
        th.join(timeout=10)
