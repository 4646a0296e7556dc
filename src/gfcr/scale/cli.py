"""CLI commands of gfcr.scale (registered by gfcr.cli): ``scale generate``, ``scale verify``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import typer

scale_app = typer.Typer(help="Scale out on Ray: generation and verification actors over one store.",
                        no_args_is_help=True)

_ADDRESS = typer.Option(None, "--address", help="Ray cluster to join (e.g. 'auto', 'ray://head:10001'); default: start a local one.")
_NUM_CPUS = typer.Option(None, "--num-cpus", min=1, help="CPUs of a local cluster (default: all).")


@scale_app.command("generate")
def generate_cmd(
    config: Optional[Path] = typer.Argument(None, help="YAML GenerateConfig (flags override it)."),  # noqa: UP045
    store: Optional[str] = typer.Option(None, help="Store directory (created if missing)."),  # noqa: UP045
    workers: int = typer.Option(2, "--workers", "-w", min=1, help="Generation actors (each holds one engine)."),
    engine: Optional[str] = typer.Option(None, help="Engine: hf, openai, vllm."),  # noqa: UP045
    model: Optional[str] = typer.Option(None, help="Model dir/name (default: SmolLM2-135M-Instruct)."),  # noqa: UP045
    base_url: Optional[str] = typer.Option(None, help="openai engine: server URL."),  # noqa: UP045
    device: Optional[str] = typer.Option(None, help="hf engine device (cpu, cuda)."),  # noqa: UP045
    topology: Optional[str] = typer.Option(None, help="group, tree or multi_turn."),  # noqa: UP045
    k: Optional[int] = typer.Option(None, help="Samples per prompt (group/multi_turn)."),  # noqa: UP045
    task: Optional[str] = typer.Option(None, help="Task source (arith, reasoning_gym, jsonl_math, jsonl_code)."),  # noqa: UP045
    n: Optional[int] = typer.Option(None, help="Number of prompts (arith/reasoning_gym)."),  # noqa: UP045
    level: Optional[int] = typer.Option(None, help="arith difficulty level."),  # noqa: UP045
    max_tokens: Optional[int] = typer.Option(None, help="Most new tokens per sample."),  # noqa: UP045
    temperature: Optional[float] = typer.Option(None, help="Sampling temperature."),  # noqa: UP045
    batch_prompts: Optional[int] = typer.Option(None, help="Prompts per shard (one engine call)."),  # noqa: UP045
    shards_per_commit: Optional[int] = typer.Option(None, help="Shards per store commit (default: --workers)."),  # noqa: UP045
    max_retries: int = typer.Option(1, min=0, help="Retries of a failed shard before the run stops."),
    run_id: Optional[str] = typer.Option(None, help="Run id (default: new)."),  # noqa: UP045
    step: Optional[int] = typer.Option(None, help="Training step to record."),  # noqa: UP045
    seed: Optional[int] = typer.Option(None, help="Base seed."),  # noqa: UP045
    gpus_per_worker: float = typer.Option(0.0, min=0.0, help="GPUs each actor reserves (e.g. 1 for vllm)."),
    address: Optional[str] = _ADDRESS,  # noqa: UP045
    num_cpus: Optional[int] = _NUM_CPUS,  # noqa: UP045
    quiet: bool = typer.Option(False, help="No progress bar."),
) -> None:
    """Generate tasks × topology × engine on N Ray actors into a store (one commit per batch of shards)."""
    from pydantic import ValidationError

    from gfcr.generate.run import GenerateConfig

    from .cluster import ScaleError
    from .generate import ray_generate

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
        cfg = GenerateConfig.model_validate(data)
    except ValidationError as e:
        typer.echo(f"error: invalid generate config:\n{e}", err=True)
        raise typer.Exit(2) from e
    opts: dict[str, Any] = {"num_gpus": gpus_per_worker} if gpus_per_worker else {}
    try:
        summary = ray_generate(cfg, workers, shards_per_commit=shards_per_commit, max_retries=max_retries,
                               actor_options=opts or None, address=address, num_cpus=num_cpus, progress=not quiet)
    except ScaleError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from e
    typer.echo(json.dumps(summary, indent=1))


@scale_app.command("verify")
def verify_cmd(
    store: str = typer.Argument(..., help="Path of an existing rollout store."),
    verifier: str = typer.Option(..., "--verifier", "-v", help="Verifier name (math, exact, numeric, format, code, env, composite)."),
    workers: int = typer.Option(2, "--workers", "-w", min=1, help="Verification actors."),
    where: Optional[str] = typer.Option(None, "--where", help="SQL filter on rollouts, e.g. \"task = 'arith'\"."),  # noqa: UP045
    options: Optional[str] = typer.Option(None, "--options", help="Verifier config as JSON, e.g. '{\"timeout_s\": 3}'."),  # noqa: UP045
    chunk_size: int = typer.Option(256, min=1, help="Rollouts per actor call."),
    max_retries: int = typer.Option(1, min=0, help="Retries of a failed chunk before the run stops (nothing written)."),
    address: Optional[str] = _ADDRESS,  # noqa: UP045
    num_cpus: Optional[int] = _NUM_CPUS,  # noqa: UP045
) -> None:
    """Re-verify stored rollouts on N Ray actors; writes one new store version."""
    from gfcr.filters.verifiers import get_verifier
    from gfcr.store import RolloutStore, StoreError

    from .cluster import ScaleError
    from .verify import ray_verify

    try:
        cfg = json.loads(options) if options else {}
        if not isinstance(cfg, dict):
            raise ValueError("--options must be a JSON object")
        get_verifier(verifier, **cfg)
    except (ValueError, TypeError) as e:
        raise typer.BadParameter(str(e)) from e
    try:
        st = RolloutStore.open(store)
    except StoreError as e:
        raise typer.BadParameter(str(e), param_hint="STORE") from e
    try:
        summary = ray_verify(st, verifier, options=cfg, where=where, workers=workers, chunk_size=chunk_size,
                             max_retries=max_retries, address=address, num_cpus=num_cpus)
    except ScaleError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from e
    typer.echo(json.dumps(summary))


def register(app: typer.Typer) -> None:
    """Add this room's commands to the top-level app (``gfcr scale …``)."""
    app.add_typer(scale_app, name="scale")
