"""``gfcr scale generate``, ``gfcr scale verify`` and ``gfcr scale import``: generation, verification and
imports on Ray (thin wrappers over :mod:`gfcr.scale`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

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
    echo_json,
    generate_config,
    verify_inputs,
)

scale_app = typer.Typer(help="Scale out on Ray: generation, verification and import workers over one store.",
                        no_args_is_help=True)

Address = Annotated[str | None, typer.Option(
    "--address", help="Ray cluster to join (e.g. 'auto', 'ray://head:10001'); default: start a local one.")]
NumCpus = Annotated[int | None, typer.Option("--num-cpus", min=1, help="CPUs of a local cluster (default: all).")]


@scale_app.command("generate")
def generate_cmd(
    config: GenConfigArg = None,
    store: StoreOpt = None,
    workers: Annotated[int, typer.Option("--workers", "-w", min=1, help="Generation actors (each holds one engine).")] = 2,
    engine: EngineOpt = None,
    model: ModelOpt = None,
    base_url: BaseUrlOpt = None,
    device: DeviceOpt = None,
    topology: TopologyOpt = None,
    k: KOpt = None,
    task: TaskOpt = None,
    n: NOpt = None,
    level: LevelOpt = None,
    max_tokens: MaxTokensOpt = None,
    temperature: TemperatureOpt = None,
    batch_prompts: Annotated[int | None, typer.Option(help="Prompts per shard (one engine call).")] = None,
    shards_per_commit: Annotated[int | None, typer.Option(help="Shards per store commit (default: --workers).")] = None,
    max_retries: Annotated[int, typer.Option(min=0, help="Retries of a failed shard before the run stops.")] = 1,
    run_id: RunIdOpt = None,
    step: StepOpt = None,
    seed: SeedOpt = None,
    gpus_per_worker: Annotated[float, typer.Option(min=0.0, help="GPUs each actor reserves (e.g. 1 for vllm).")] = 0.0,
    address: Address = None,
    num_cpus: NumCpus = None,
    quiet: QuietOpt = False,
) -> None:
    """Generate tasks × topology × engine on N Ray actors into a store (one commit per batch of shards)."""
    from gfcr.scale.cluster import ScaleError
    from gfcr.scale.generate import ray_generate

    cfg = generate_config(config, store=store, run_id=run_id, step=step, seed=seed, batch_prompts=batch_prompts,
                          engine=engine, model=model, base_url=base_url, device=device, topology=topology, k=k,
                          task=task, n=n, level=level, max_tokens=max_tokens, temperature=temperature)
    opts: dict[str, Any] = {"num_gpus": gpus_per_worker} if gpus_per_worker else {}
    try:
        summary = ray_generate(cfg, workers, shards_per_commit=shards_per_commit, max_retries=max_retries,
                               actor_options=opts or None, address=address, num_cpus=num_cpus, progress=not quiet)
    except ScaleError as e:  # a shard failed on the cluster: a run failure, not bad input
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from e
    echo_json(summary, indent=1)


@scale_app.command("verify")
def verify_cmd(
    store: Annotated[str, typer.Argument(help="Path of an existing rollout store.")],
    verifier: Annotated[str, typer.Option("--verifier", "-v", help="Verifier name (math, exact, numeric, format, code, env, composite).")],
    workers: Annotated[int, typer.Option("--workers", "-w", min=1, help="Verification actors.")] = 2,
    where: Annotated[str | None, typer.Option("--where", help="SQL filter on rollouts, e.g. \"task = 'arith'\".")] = None,
    options: Annotated[str | None, typer.Option("--options", help="Verifier config as JSON, e.g. '{\"timeout_s\": 3}'.")] = None,
    chunk_size: Annotated[int, typer.Option(min=1, help="Rollouts per actor call.")] = 256,
    max_retries: Annotated[int, typer.Option(min=0, help="Retries of a failed chunk before the run stops (nothing written).")] = 1,
    address: Address = None,
    num_cpus: NumCpus = None,
) -> None:
    """Re-verify stored rollouts on N Ray actors (one per chunk at most); writes one new store version when
    a verdict changed."""
    from gfcr.scale.cluster import ScaleError
    from gfcr.scale.verify import ray_verify

    st, _, cfg = verify_inputs(store, verifier, options)
    try:
        summary = ray_verify(st, verifier, options=cfg, where=where, workers=workers, chunk_size=chunk_size,
                             max_retries=max_retries, address=address, num_cpus=num_cpus)
    except ScaleError as e:  # a chunk failed on the cluster (nothing written): a run failure, not bad input
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from e
    if summary.get("workers_note"):
        typer.echo(f"note: {summary['workers_note']}", err=True)
    if summary["n"] and not summary["written"]:
        typer.echo(f"note: no verdict or verifier record changed: nothing written (store version {summary['version_after']})",
                   err=True)
    echo_json(summary)


@scale_app.command("import")
def import_cmd(
    store: Annotated[str, typer.Argument(help="Store directory or s3://, gs://, az:// URI (created if missing).")],
    files: Annotated[list[Path], typer.Argument(help="Files or directories of the dump.")],
    from_: Annotated[str, typer.Option("--from", help="Format, as `gfcr store import --from` takes it (verl, trl, jsonl and the others).")],
    workers: Annotated[int, typer.Option("--workers", "-w", min=1, help="Import tasks (each a share of the files).")] = 2,
    run: Annotated[str | None, typer.Option(help="run_id for the imported rows (default import-FORMAT).")] = None,
    tokenizer: Annotated[str | None, typer.Option(help="Tokenizer (HF name or dir) to retokenize text-only formats.")] = None,
    trust_pickle: Annotated[bool, typer.Option("--trust-pickle", help="slime, skyrl: allow unpickling (trusted files only).")] = False,
    verdict_key: Annotated[str | None, typer.Option(help="verl (default acc), trl: the field whose value > 0 means correct.")] = None,
    reward_key: Annotated[str | None, typer.Option(help="slime: the key of a dict reward used for training.")] = None,
    evals: Annotated[str, typer.Option(help="areal, prime-rl, slime: evaluation rollouts into RUN-eval (separate) or skip.")] = "separate",
    vocab: Annotated[int | None, typer.Option(help="Refuse token ids >= this vocabulary size.")] = None,
    address: Address = None,
    num_cpus: NumCpus = None,
) -> None:
    """Import a large dump on N Ray workers that each write data files; one commit makes all rows visible
    (a failed worker commits nothing: the store stays as it was). Same rows as `gfcr store import`."""
    from gfcr.scale.cluster import ScaleError, ray_session
    from gfcr.scale.importing import ray_import
    from gfcr.store import RolloutStore

    missing = [str(f) for f in files if not f.exists()]
    if missing:
        raise typer.BadParameter(f"no such file or folder: {', '.join(missing)}")
    opts = {k: v for k, v in dict(run_id=run, tokenizer=tokenizer, trust_pickle=trust_pickle or None,
                                  verdict_key=verdict_key, reward_key=reward_key, evals=evals, vocab=vocab).items()
            if v is not None}
    # Ray first: its local head is started by fork, which a parent already running Lance's threads can crash
    with ray_session(address, num_cpus):
        st = RolloutStore.open(store, create=True)
        try:
            summary = ray_import(st, from_, [str(f) for f in files], workers=workers, address=address,
                                 num_cpus=num_cpus, **opts)
        except ScaleError as e:  # a worker failed: nothing committed
            typer.echo(f"error: {e}", err=True)
            raise typer.Exit(1) from e
    for n in summary["notes"]:
        typer.echo(f"note: {n}", err=True)
    summary.pop("notes")
    summary["files"] = len(summary["files"])
    echo_json(summary)


def register(app: typer.Typer) -> None:
    """Add this room's commands to the top-level app (``gfcr scale …``)."""
    app.add_typer(scale_app, name="scale")
