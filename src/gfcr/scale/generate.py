"""``ray_generate``: shard prompts over Ray actors that each hold an engine; commit on the driver.

The same code paths as ``gfcr generate`` (:func:`gfcr.generate.run.build_engine`,
:func:`gfcr.generate.run.build_topology`, ``topology.generate``) run inside each actor; the
driver only cuts the prompts into shards, hands shards to idle actors, and appends finished
rollouts to the store.

* **Shards do not depend on the number of workers.** Shard ``i`` is always prompts
  ``[i·B, (i+1)·B)`` with ``B = config.batch_prompts``, and each shard is one engine call, so the
  engine sees the same batches whatever ``workers`` is; seeds derive from the base seed, the
  prompt id and the step (:func:`gfcr.generate.topologies.derive_seed`), and each actor runs torch
  with the same thread count. Same prompts + seed → the same tokens with 1 or N workers.
* **One commit per batch of shards.** Shards are grouped in order, ``shards_per_commit`` at a
  time (default: ``workers``); a group is appended (its prompts upserted first) as one store commit
  once all its shards are back. The driver is the only writer, and rollout ids are fresh, so a
  commit cannot duplicate rows.
* **A failed shard never leaves half a batch.** A shard whose task raises (or whose actor dies) is
  retried up to ``max_retries`` times (a dead actor is replaced); if it still fails, the run stops
  with a :class:`~gfcr.scale.cluster.ScaleError` naming the shard and its cause, and that batch —
  and every later one — is not written. Batches committed before stay (as with ``gfcr generate``).
"""

from __future__ import annotations

import sys
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from gfcr.generate.config import EngineConfig, GenerateConfig, TopologyConfig
from gfcr.generate.run import save_resolved
from gfcr.records import Prompt, Rollout, new_id

from .cluster import ScaleError, error_cause, init_ray, kill_actors


class GenerateWorker:
    """Actor body: one engine + one topology, built on first use inside the actor process.

    Building lazily makes an engine that fails to load surface as an ordinary task error (with its
    cause) that the driver can retry, instead of a dead actor.
    """

    def __init__(self, engine: dict[str, Any] | Callable[[], Any], topology: dict[str, Any],
                 sampling: dict[str, Any], seed: int | None, torch_threads: int | None):
        self._engine_spec = engine
        self._topology = topology
        self._sampling = sampling
        self._seed = seed
        self._threads = torch_threads
        self._engine: Any = None
        self._topo: Any = None

    def _ensure(self) -> None:
        if self._engine is not None:
            return
        from gfcr.generate.engines.base import SamplingParams
        from gfcr.generate.run import build_engine, build_topology

        spec = self._engine_spec
        engine = spec() if callable(spec) else build_engine(EngineConfig.model_validate(spec))
        if self._threads and "torch" in sys.modules:
            import torch

            torch.set_num_threads(self._threads)
        self._topo = build_topology(TopologyConfig.model_validate(self._topology),
                                    SamplingParams.model_validate(self._sampling), self._seed)
        self._engine = engine

    def generate(self, prompts: list[Prompt], run_id: str, step: int) -> list[Rollout]:
        self._ensure()
        return self._topo.generate(self._engine, prompts, run_id=run_id, step=step)


def shard(items: Sequence[Any], size: int) -> list[list[Any]]:
    """Consecutive chunks of ``size`` (the last may be shorter): ``shard([1,2,3,4,5], 2) == [[1,2],[3,4],[5]]``."""
    if size < 1:
        raise ValueError(f"shard size must be >= 1, got {size}")
    return [list(items[i : i + size]) for i in range(0, len(items), size)]


def ray_generate(
    config: GenerateConfig,
    workers: int = 2,
    *,
    prompts: Sequence[Prompt] | None = None,
    engine_factory: Callable[[], Any] | None = None,
    shards_per_commit: int | None = None,
    max_retries: int = 1,
    torch_threads: int | None = 1,
    actor_options: dict[str, Any] | None = None,
    address: str | None = None,
    num_cpus: int | None = None,
    progress: bool = False,
) -> dict[str, Any]:
    """Run ``config`` on ``workers`` Ray actors; returns a summary like ``run_generate``'s.

    Long because: one dispatch loop: shards go to idle actors, a failed shard is retried on a fresh actor,
    complete groups of shards are committed in order; the three share the loop's queues and counters.

    ``prompts`` replaces ``config.tasks``; ``engine_factory`` (a picklable zero-argument callable
    run inside each actor) replaces ``config.engine`` — e.g. a custom engine class.
    ``actor_options`` go to ``ray.remote`` (default ``{"num_cpus": 1}``; ``{"num_gpus": 1}`` for a
    GPU engine). ``address`` connects to a running cluster; otherwise a local one is started (and
    shut down at the end) unless Ray is already initialised.
    """
    from gfcr.store import RolloutStore

    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    if max_retries < 0:
        raise ValueError(f"max_retries must be >= 0, got {max_retries}")
    if prompts is None:
        from gfcr.tasks import make_source

        prompts = make_source(config.tasks.name, **config.tasks.params).prompts()
    prompts = list(prompts)
    if not prompts:
        raise ValueError("no prompts to generate from")
    ids = [p.prompt_id for p in prompts]
    if len(set(ids)) != len(ids):
        raise ValueError("duplicate prompt_id in the prompts; each prompt must appear once")
    shards = shard(prompts, config.batch_prompts)
    per_commit = shards_per_commit or workers
    if per_commit < 1:
        raise ValueError(f"shards_per_commit must be >= 1, got {per_commit}")
    run_id = config.run_id or new_id()
    resolved = config.model_copy(update={"run_id": run_id})
    store = RolloutStore.open(config.store, create=True)
    cfg_rel = f"runs/{run_id}/generate-step{config.step}.yaml"
    version_before = store.version

    started = init_ray(address, num_cpus)
    import ray

    opts = {"num_cpus": 1, "max_restarts": 0}
    opts.update(actor_options or {})
    actor_cls = ray.remote(**opts)(GenerateWorker)
    engine_spec: Any = engine_factory if engine_factory is not None else config.engine.model_dump(mode="json")
    args = (engine_spec, config.topology.model_dump(mode="json"), config.sampling.model_dump(mode="json"),
            config.seed, torch_threads)
    n_actors = min(workers, len(shards))
    actors = [actor_cls.remote(*args) for _ in range(n_actors)]
    t0 = time.perf_counter()
    done: dict[int, list[Rollout]] = {}
    attempts = [0] * len(shards)
    retries = commits = n_rollouts = n_gen = 0
    policy_version: str | None = None
    todo: deque[int] = deque(range(len(shards)))
    running: dict[Any, tuple[int, int]] = {}  # object ref -> (shard index, actor index)
    idle = deque(range(n_actors))
    next_group = 0
    n_groups = (len(shards) + per_commit - 1) // per_commit
    bar = _progress(progress)
    try:
        with bar:
            task = bar.add_task(f"ray generate ({n_actors} workers)", total=len(prompts))
            while next_group < n_groups:
                while todo and idle:
                    s, a = todo.popleft(), idle.popleft()
                    running[actors[a].generate.remote(shards[s], run_id, config.step)] = (s, a)
                ready, _ = ray.wait(list(running), num_returns=1)
                ref = ready[0]
                s, a = running.pop(ref)
                try:
                    done[s] = ray.get(ref)
                    idle.append(a)
                    bar.update(task, advance=len(shards[s]))
                except (ray.exceptions.RayTaskError, ray.exceptions.RayActorError) as e:
                    attempts[s] += 1
                    if isinstance(e, ray.exceptions.RayActorError):
                        actors[a] = actor_cls.remote(*args)  # the process is gone: replace it
                    idle.append(a)
                    if attempts[s] > max_retries:
                        cause = error_cause(e)
                        lo = shards[s][0].prompt_id
                        raise ScaleError(
                            f"shard {s} ({len(shards[s])} prompts from {lo!r}) failed {attempts[s]} time(s): "
                            f"{type(cause).__name__}: {_first_line(cause)}. Its batch was not written; "
                            f"{commits} earlier batch(es) committed (store version {store.version}). "
                            f"Fix the cause and run again (a new run id)."
                        ) from cause
                    retries += 1
                    todo.appendleft(s)
                # commit every complete group, in order
                while next_group < n_groups:
                    members = range(next_group * per_commit, min((next_group + 1) * per_commit, len(shards)))
                    if not all(i in done for i in members):
                        break
                    batch: list[Rollout] = []
                    for i in members:
                        for r in done.pop(i):
                            r.meta.setdefault("config", cfg_rel)
                            r.meta["shard"] = i
                            batch.append(r)
                    if commits == 0:
                        save_resolved(store, run_id, config.step, resolved.model_dump(mode="json"))
                    store.upsert_prompts([p for i in members for p in shards[i]])
                    store.append(batch)
                    commits += 1
                    n_rollouts += len(batch)
                    n_gen += sum(r.n_generated for r in batch)
                    if batch and policy_version is None:
                        policy_version = batch[0].policy_version
                    next_group += 1
    finally:
        kill_actors(ray, actors)  # also ends any shard still running
        if started:
            ray.shutdown()
    dt = time.perf_counter() - t0
    return {"run_id": run_id, "step": config.step, "prompts": len(prompts), "shards": len(shards),
            "workers": n_actors, "commits": commits, "retries": retries, "rollouts": n_rollouts,
            "generated_tokens": n_gen, "seconds": round(dt, 3), "tokens_per_s": round(n_gen / max(dt, 1e-9), 2),
            "policy_version": policy_version, "store": str(config.store), "config": cfg_rel,
            "version_before": version_before, "version_after": store.version}


def _first_line(e: BaseException) -> str:
    s = str(e).strip()
    return s.splitlines()[0] if s else "(no message)"


def _progress(enabled: bool) -> Any:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    disable=not enabled, console=Console(stderr=True))
