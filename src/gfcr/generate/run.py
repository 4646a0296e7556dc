"""``gfcr generate``: tasks × topology × engine → a rollout store, with full provenance.

:class:`~gfcr.generate.config.GenerateConfig` is the typed config (YAML in, resolved config written next to the store
under ``runs/<run_id>/generate.yaml`` inside the store directory); :func:`run_generate` is the
library entry point the CLI wraps. Prompts are upserted into the store's ``prompts`` table, then
generated in batches of ``batch_prompts``; each batch is appended as one store commit, so an
interrupted run keeps every finished batch.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from gfcr.generate.config import EngineConfig, GenerateConfig, TopologyConfig
from gfcr.generate.engines.base import SamplingParams
from gfcr.records import new_id


def build_engine(cfg: EngineConfig, engines: Mapping[str, Any] | None = None) -> Any:
    """The engine of ``cfg``; ``engines`` adds a composer's engines to the named ones (e.g. ``ray``)."""
    from gfcr.generate.engines import make_engine

    kw = cfg.kwargs()
    if cfg.model is not None or cfg.name in ("hf", "vllm"):
        kw.setdefault("model", cfg.model)
    return make_engine(cfg.name, engines, **kw)


def build_topology(cfg: TopologyConfig, sampling: SamplingParams, seed: int | None, **override: Any) -> Any:
    """The topology of ``cfg`` (``override`` replaces some of its keys, e.g. a per-prompt ``k``)."""
    from gfcr.generate.topologies import make_topology

    kw = cfg.kwargs() | override
    if "no_fork_after" in kw:
        kw["no_fork_after"] = tuple(kw["no_fork_after"])
    return make_topology(cfg.name, params=sampling, seed=seed, **kw)


def run_generate(config: GenerateConfig, engine: Any = None, progress: bool = True,
                 engines: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Run ``config``; returns a summary (run id, counts, tokens/s, store version).

    ``engine`` overrides ``config.engine`` (e.g. the policy being trained, wrapped in an HFEngine);
    ``engines`` adds engines of rooms above Generate to the names ``config.engine`` may use.
    """
    from gfcr.store import RolloutStore
    from gfcr.tasks import make_source

    prompts = make_source(config.tasks.name, **config.tasks.params).prompts()
    if not prompts:
        raise ValueError(f"task source {config.tasks.name!r} produced no prompts")
    run_id = config.run_id or new_id()
    resolved = config.model_copy(update={"run_id": run_id})
    engine = engine if engine is not None else build_engine(config.engine, engines)
    topo = build_topology(config.topology, config.sampling, config.seed)
    store = RolloutStore.open(config.store, create=True)
    store.upsert_prompts(prompts)
    seeder = None
    if config.retrieve is not None:
        from gfcr.replay.retrieval import RetrievalSeeder

        rc = config.retrieve
        src = store if rc.store is None else RolloutStore.open(rc.store)
        seeder = RetrievalSeeder(src, k=rc.k, embed=rc.embed, max_distance=rc.max_distance)
    cfg_rel = save_resolved(store, run_id, config.step, resolved.model_dump(mode="json"))
    n_rollouts = n_gen = 0
    t0 = time.perf_counter()
    bar = _progress(progress)
    with bar:
        task = bar.add_task(f"generate {config.topology.name}", total=len(prompts), tps="")
        for i in range(0, len(prompts), config.batch_prompts):
            batch = prompts[i : i + config.batch_prompts]
            seeded = seeder.seed(batch) if seeder is not None else batch
            rollouts = topo.generate(engine, seeded, run_id=run_id, step=config.step)
            retrieved = {p.prompt_id: p.meta.get("retrieved") for p in seeded}
            for r in rollouts:
                r.meta.setdefault("config", cfg_rel)
                if seeder is not None:
                    r.meta["retrieved"] = retrieved.get(r.prompt_id) or []
            store.append(rollouts)
            n_rollouts += len(rollouts)
            n_gen += sum(r.n_generated for r in rollouts)
            tps = n_gen / max(time.perf_counter() - t0, 1e-9)
            bar.update(task, advance=len(batch), tps=f"{tps:,.1f} tok/s")
    dt = time.perf_counter() - t0
    return {"run_id": run_id, "step": config.step, "prompts": len(prompts), "rollouts": n_rollouts,
            "generated_tokens": n_gen, "seconds": round(dt, 3), "tokens_per_s": round(n_gen / max(dt, 1e-9), 2),
            "policy_version": engine.policy_version, "store": str(config.store),
            "config": str(Path(store.path) / cfg_rel) if store.local else f"{store.path} (state {cfg_rel})"}


def save_resolved(store: Any, run_id: str, step: int, resolved: dict[str, Any]) -> str:
    """Keep a run's resolved generate config with its store, as ``runs/RUN/generate-stepN.yaml``
    (returned): a file in a local store's folder, or, for a store on object storage (where gfcr
    writes nothing beside the tables), the store's state under that name (``store.get_state``)."""
    rel = f"runs/{run_id}/generate-step{step}.yaml"
    if not store.local:
        store.put_state(rel, resolved)
        return rel
    path = Path(store.path) / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(resolved, sort_keys=False))
    return rel


def _progress(enabled: bool) -> Any:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    # stderr: `gfcr generate … > out.json` keeps the JSON summary alone on stdout
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[tps]}"),
                    TimeElapsedColumn(), disable=not enabled, console=Console(stderr=True))
