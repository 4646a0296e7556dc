"""``gfcr generate``: tasks × topology × engine → a rollout store, with full provenance.

:class:`GenerateConfig` is the typed config (YAML in, resolved config written next to the store
under ``runs/<run_id>/generate.yaml`` inside the store directory); :func:`run_generate` is the
library entry point the CLI wraps. Prompts are upserted into the store's ``prompts`` table, then
generated in batches of ``batch_prompts``; each batch is appended as one store commit, so an
interrupted run keeps every finished batch.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar, Literal

import yaml
from pydantic import Field, model_serializer, model_validator

from gfcr.config import ConfigError, StrictModel
from gfcr.generate.engines.base import SamplingParams
from gfcr.records import new_id
from gfcr.tasks import TaskConfig


class EngineConfig(StrictModel):
    """Which engine samples: the one engine vocabulary (``gfcr generate``'s ``engine:``; ``gfcr
    train`` composes it as ``generate.engine`` / ``generate.engine_params``).

    ``args`` are checked at config load against the named engine's parameters
    (:func:`gfcr.config.check_component`); a key ending in ``_env`` names an environment variable
    that gives the parameter without the suffix (``api_key_env: MY_KEY`` → ``api_key``), so no
    secret is written into a resolved config.
    """

    name: Literal["hf", "openai", "vllm"] | str = Field("hf", description="Engine name or 'pkg.mod:Class'.")
    model: str | None = Field(None, description="Model dir/name (None = the default SmolLM2); for openai, the served name.")
    args: dict[str, Any] = Field(default_factory=dict, description="Other engine keyword arguments (device, max_batch, base_url...).")

    #: engines a composer above Generate adds to :data:`gfcr.generate.engines.ENGINES` (train: ray)
    extra_engines: ClassVar[dict[str, str]] = {}
    #: config path of ``args`` in error messages
    args_path: ClassVar[str] = "engine.args"

    def supplied(self) -> tuple[str, ...]:
        """Engine parameters the composer passes itself (not settable in ``args``)."""
        return ()

    @model_validator(mode="after")
    def _check_args(self) -> EngineConfig:
        from gfcr.config import check_component, params_model, resolve_object
        from gfcr.generate.engines import ENGINES

        table = {**ENGINES, **self.extra_engines}
        plain = {k: v for k, v in self.args.items() if not k.endswith("_env")}
        checked = check_component(self.args_path, "engine", self.name, table, plain, self.supplied())
        if self.name in table:
            for k, v in self.args.items():
                if not k.endswith("_env"):
                    continue
                try:
                    known = params_model(resolve_object(self.name, table, "engine")).model_fields
                except ImportError:
                    break
                if k[: -len("_env")] not in known or k[: -len("_env")] in self.supplied():
                    raise ConfigError(f"{self.args_path}: {k!r} names no parameter of engine {self.name!r} "
                                      f"(allowed: {', '.join(x + '_env' for x in known if x not in self.supplied())})")
                if not isinstance(v, str):
                    raise ConfigError(f"{self.args_path}.{k}: give the name of an environment variable, got {v!r}")
        self.args = {k: checked.get(k, v) for k, v in self.args.items()}
        return self

    def kwargs(self) -> dict[str, Any]:
        """``args`` with every ``*_env`` key replaced by the environment variable it names."""
        import os

        kw: dict[str, Any] = {}
        for k, v in self.args.items():
            if k.endswith("_env"):
                if v not in os.environ:
                    raise ConfigError(f"{self.args_path}.{k}: environment variable {v!r} is not set")
                kw[k[: -len("_env")]] = os.environ[v]
            else:
                kw[k] = v
        return kw


#: the keys of each topology (its constructor's parameters less ``params`` and ``seed``)
TOPOLOGY_KEYS: dict[str, tuple[str, ...]] = {
    "group": ("k",),
    "tree": ("m", "n", "l", "t", "min_prefix_frac", "no_fork_after"),
    "multi_turn": ("env", "k", "max_turns", "obs_role"),
}


class TopologyConfig(StrictModel):
    """How prompts become rollouts: the one topology vocabulary (``gfcr generate``'s ``topology:``;
    ``gfcr train`` composes it as ``generate.topology`` / ``generate.k`` / ``generate.params``).
    A key that the named topology does not take is an error at config load; only the named
    topology's keys are written out."""

    name: Literal["group", "tree", "multi_turn"] = Field("group", description="Topology.")
    k: int = Field(4, ge=1, description="group/multi_turn: samples (episodes) per prompt.")
    m: int = Field(6, ge=1, description="tree: root paths per prompt.")
    n: int = Field(2, ge=0, description="tree: forking points per tree per round.")
    l: int = Field(1, ge=1, description="tree: continuations per forking point.")  # noqa: E741
    t: int = Field(2, ge=0, description="tree: branching rounds.")
    min_prefix_frac: float = Field(
        0.5, ge=0.0, lt=1.0,
        description="tree: fork only at or after this fraction of the parent's answer (0 = TreeRL's rule).",
    )
    no_fork_after: list[str] = Field(
        default_factory=list, description="tree: no forking after a generated token containing one of these words."
    )
    env: str = Field("calculator", description="multi_turn: env name (calculator, python) or 'pkg.mod:Class'.")
    max_turns: int = Field(4, ge=1, description="multi_turn: most policy turns per episode.")
    obs_role: str = Field("user", description="multi_turn: role of the env's observations in the chat.")

    #: config path of this section in error messages
    path: ClassVar[str] = "topology"

    @model_validator(mode="before")
    @classmethod
    def _keys(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("name", "group") in TOPOLOGY_KEYS:
            name = data.get("name", "group")
            allowed = TOPOLOGY_KEYS[name]
            for key in data:
                if key not in ("name", *allowed):
                    raise ConfigError(f"{cls.path}: unknown key {key!r} for topology {name!r}; allowed: {', '.join(allowed)}")
        return data

    @model_serializer(mode="wrap")
    def _only_own_keys(self, handler: Any) -> dict[str, Any]:
        keep = {"name", *TOPOLOGY_KEYS[self.name]}
        return {k: v for k, v in handler(self).items() if k in keep}

    def kwargs(self) -> dict[str, Any]:
        """The named topology's keyword arguments (``make_topology(name, params=..., seed=..., **kwargs())``)."""
        return {k: getattr(self, k) for k in TOPOLOGY_KEYS[self.name]}


class RetrieveConfig(StrictModel):
    """Retrieval-guided generation (:class:`gfcr.replay.retrieval.RetrievalSeeder`): each prompt gets the
    ``k`` nearest solved prompts of a store, with one verified solution each, as in-context examples."""

    store: str | None = Field(None, description="Store whose solved rollouts are retrieved (default: the run's own store, as it is when the run starts).")
    k: int = Field(2, ge=1, description="Solved cases per prompt (nearest first, placed nearest last before the question).")
    embed: str = Field("hash", description="Embedder name (hash: no model, surface overlap; minilm: paraphrases) or pkg.mod:obj.")
    max_distance: float | None = Field(None, ge=0.0, description="Drop neighbours farther than this cosine distance (null: keep the k nearest).")


class GenerateConfig(StrictModel):
    """One generation run into a store."""

    store: str = Field(..., description="Store directory (created if missing).")
    run_id: str | None = Field(None, description="Run id (default: a new id).")
    step: int = Field(0, ge=0, description="Training step recorded with the rollouts.")
    seed: int | None = Field(0, description="Base seed; per-prompt seeds derive from it (None = unseeded).")
    batch_prompts: int = Field(8, ge=1, description="Prompts per engine call and per store commit.")
    tasks: TaskConfig = Field(default_factory=lambda: TaskConfig(params={"n": 8, "level": 1}), description="Task source.")
    engine: EngineConfig = Field(default_factory=EngineConfig, description="Engine.")
    topology: TopologyConfig = Field(default_factory=TopologyConfig, description="Topology.")
    sampling: SamplingParams = Field(default_factory=lambda: SamplingParams(temperature=0.7, max_tokens=96),
                                     description="Sampling params (n is set by the topology).")
    retrieve: RetrieveConfig | None = Field(None, description="Retrieval-guided generation: solved cases of a store as in-context seeds before each prompt (rollouts record them in meta.retrieved); null = off.")

    @model_validator(mode="before")
    @classmethod
    def _default_task_params(cls, data: Any) -> Any:
        """A ``tasks`` section without params keeps the small default job (8 level-1 sums)."""
        if isinstance(data, dict) and isinstance(data.get("tasks"), dict) and not {"params", "args"} & set(data["tasks"]):
            data = {**data, "tasks": {**data["tasks"], "params": {"n": 8, "level": 1}}}
        return data

    @classmethod
    def from_yaml(cls, path: str | Path, **overrides: Any) -> GenerateConfig:
        from gfcr.config import read_yaml_mapping

        data = read_yaml_mapping(path)
        data.update({k: v for k, v in overrides.items() if v is not None})
        return cls.model_validate(data)


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
