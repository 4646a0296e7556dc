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
    engine: Optional[str] = typer.Option(None, help="Engine: hf, openai, vllm, ray."),  # noqa: UP045
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
    from gfcr.generate.cli import config_from_flags

    from .cluster import ScaleError
    from .generate import ray_generate

    cfg = config_from_flags(config, store=store, run_id=run_id, step=step, seed=seed, batch_prompts=batch_prompts,
                            engine=engine, model=model, base_url=base_url, device=device, topology=topology, k=k,
                            task=task, n=n, level=level, max_tokens=max_tokens, temperature=temperature)
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
    from gfcr.filters.cli import open_verify_inputs

    from .cluster import ScaleError
    from .verify import ray_verify

    st, _, cfg = open_verify_inputs(store, verifier, options)
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
