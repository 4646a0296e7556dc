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
  the same request gives unstreamed (:class:`gfcr.serve.api.DeltaText`).
- Errors use OpenAI's schema (``{"error": {"message", "type", "param", "code"}}``): 400 for bad
  parameters (never FastAPI's 422), 404 for an unknown model, 413 for a body over the size limit, 503
  while shutting down. Prompt + ``max_tokens`` over the context, ``n`` / ``max_tokens`` / log-probs over
  the server's limits (:class:`~gfcr.serve.api.ServeLimits`) and parameters it cannot honour
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

Dynamic batching (:mod:`gfcr.serve.batching`): requests arriving within ``batch_wait_ms`` of each
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
import hmac
import socket
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

from gfcr.serve.api import (
    LOOPBACK_NAMES,
    APIError,
    ChatBody,
    CompletionBody,
    DetokenizeBody,
    RequestGuard,
    ServeLimits,
    TokenizeBody,
    WeightsBody,
    error_body,
    host_allowed,
    is_loopback,
)
from gfcr.serve.chat import TOOL_PARSERS
from gfcr.serve.metrics import ServeMetrics
from gfcr.serve.server import Server

__all__ = ["LOOPBACK_NAMES", "create_app", "free_port", "host_allowed", "is_loopback", "serve", "serve_in_thread"]

try:  # module level, so that FastAPI can resolve the endpoints' ``request: Request`` annotations
    from starlette.requests import Request
except ImportError:  # pragma: no cover - gfcr serve needs the serve extra (fastapi, uvicorn)
    Request = Any  # type: ignore[misc,assignment]


def create_app(engine: Any, model_name: str = "gfcr", allow_weight_updates: bool = False,
               admin_token: str | None = None, max_batch: int = 32, batch_wait_ms: float = 20.0,
               batch_seeded: bool = True, limits: ServeLimits | None = None,
               allowed_hosts: Sequence[str] | None = None, batch_stretch: float = 4.0,
               tool_call_parser: str | None = None) -> Any:
    """The FastAPI app serving ``engine`` (an :class:`~gfcr.generate.engines.hf.HFEngine`) as ``model_name``.

    Long because: its routes are closures over the engine, batcher and lock; request logic is in ``Server``.

    ``allow_weight_updates`` adds ``POST /gfcr/weights``; ``max_batch``, ``batch_wait_ms`` and
    ``batch_seeded`` set the dynamic batching (its :class:`~gfcr.serve.batching.Batcher` is
    ``app.state.batcher``; close it when done, or call ``app.state.shutdown()``, which also makes
    requests in flight end with 503); ``limits`` bound requests; ``allowed_hosts``: the ``Host`` names
    accepted (``None``: any; :func:`serve` passes the loopback names on a loopback bind);
    ``batch_stretch``: the window closes once no request has come for ``batch_wait_ms``, at most this many
    times ``batch_wait_ms`` after the first (1 = a fixed window; the Batcher's ``stretch``);
    ``tool_call_parser``: a name in :data:`~gfcr.serve.chat.TOOL_PARSERS` (``"hermes"``) to parse
    tool calls out of chat replies when a request gives ``tools`` (``tool_choice`` auto). With
    ``admin_token`` set, ``/docs``, ``/redoc`` and ``/openapi.json`` need the token too.
    ``app.state.drain(timeout_s)`` refuses new requests (503) and lets those in flight finish first.
    """
    from fastapi import FastAPI, Header
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse
    from starlette.exceptions import HTTPException as StarletteHTTPException

    from gfcr.serve.batching import Batcher

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
    srv = Server(engine, model_name, limits, batcher, lock, tool_parser=tool_call_parser, metrics=metrics)
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

    class Server(uvicorn.Server):
        async def shutdown(self, sockets: Any = None) -> None:
            if drain_s > 0:
                await asyncio.to_thread(app.state.drain, drain_s)
            app.state.shutdown(0.0)
            await super().shutdown(sockets=sockets)

    cfg = uvicorn.Config(app, host=host, port=port, log_level=log_level, lifespan="off", timeout_graceful_shutdown=5)
    return Server(cfg)


def serve(model: Any = None, host: str = "127.0.0.1", port: int = 8000, model_name: str | None = None,
          tokenizer: Any = None, device: str = "cpu", log_level: str = "info", allow_weight_updates: bool = False,
          admin_token: str | None = None, max_batch: int = 32, batch_wait_ms: float = 20.0,
          batch_seeded: bool = True, limits: ServeLimits | None = None, batch_stretch: float = 4.0,
          tool_call_parser: str | None = None, drain_s: float = 30.0) -> None:
    """Serve ``model`` (a path/name, a loaded model or an engine) until interrupted. On a loopback ``host``
    only requests whose ``Host`` header names a loopback host are answered.

    SIGTERM (and Ctrl-C) stop it gracefully: new requests get 503, those in flight finish (at most
    ``drain_s`` seconds, then they are cancelled), and the function returns, so ``gfcr serve`` exits 0.
    (uvicorn re-raises the signal it caught once it has stopped; the SIGTERM and SIGINT handlers
    installed here absorb it, where the defaults would end the process with status 143 or 130.)
    """
    import signal

    engine = _engine_for(model, tokenizer, device, max_batch)
    name = model_name or _default_name(model)
    app = create_app(engine, name, allow_weight_updates, admin_token, max_batch=max_batch,
                     batch_wait_ms=batch_wait_ms, batch_seeded=batch_seeded, limits=limits,
                     allowed_hosts=_hosts_for(host), batch_stretch=batch_stretch, tool_call_parser=tool_call_parser)
    main = threading.current_thread() is threading.main_thread()
    # uvicorn re-raises the signal that stopped it: absorbed here for SIGTERM and SIGINT alike, so a
    # Ctrl-C after a clean shutdown exits 0 (Python's own SIGINT handler would raise KeyboardInterrupt: 130)
    before = {s: signal.signal(s, lambda *_: None) for s in (signal.SIGTERM, signal.SIGINT)} if main else {}
    try:
        _uvicorn_server(app, host, port, log_level, drain_s=drain_s).run()
    finally:
        app.state.shutdown(1.0)
        for sig, handler in before.items():
            signal.signal(sig, handler)


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
