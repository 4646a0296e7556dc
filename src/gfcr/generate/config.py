"""The generation config vocabulary: the engine (:class:`EngineConfig`), the rollout topology
(:class:`TopologyConfig`), retrieval-seeded prompts (:class:`RetrieveConfig`) and ``gfcr generate``'s
whole job (:class:`GenerateConfig`). ``gfcr train`` composes the engine and topology sections
(:mod:`gfcr.train.config`); :mod:`gfcr.generate.run` runs a :class:`GenerateConfig`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import AliasChoices, Field, model_serializer, model_validator

from gfcr.config import ConfigError, StrictModel, note_renamed
from gfcr.generate.engines.base import SamplingParams
from gfcr.tasks import TaskConfig


class EngineConfig(StrictModel):
    """Which engine samples: the one engine vocabulary (``gfcr generate``'s ``engine:``; ``gfcr
    train`` composes it as ``generate.engine`` / ``generate.engine_params``).

    ``params`` are checked at config load against the named engine's parameters
    (:func:`gfcr.config.check_component`); a key ending in ``_env`` names an environment variable
    that gives the parameter without the suffix (``api_key_env: MY_KEY`` → ``api_key``), so no
    secret is written into a resolved config.
    """

    name: Literal["hf", "openai", "vllm"] | str = Field("hf", description="Engine name or 'pkg.mod:Class'.")
    model: str | None = Field(None, description=(
        "Model dir/name (None = the default SmolLM2); for openai, the served name."))
    params: dict[str, Any] = Field(default_factory=dict, validation_alias=AliasChoices("params", "args"),
                                   description=(
        "Other engine keyword arguments (device, max_batch, base_url...); `args` is the deprecated name."))

    #: engines a composer above Generate adds to :data:`gfcr.generate.engines.ENGINES` (train: ray)
    extra_engines: ClassVar[dict[str, str]] = {}
    #: config path of ``params`` in error messages
    params_path: ClassVar[str] = "engine.params"
    #: where the section sits, for the deprecation note of ``args``
    where: ClassVar[str] = "engine"

    def supplied(self) -> tuple[str, ...]:
        """Engine parameters the composer passes itself (not settable in ``params``)."""
        return ()

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, data: Any) -> Any:
        """``args`` (issue 46: one word, ``params``, for a component's keyword arguments) still reads."""
        return note_renamed(data, {"args": "params"}, cls.where)

    @model_validator(mode="after")
    def _check_args(self) -> EngineConfig:
        from gfcr.config import check_component, params_model, resolve_object
        from gfcr.generate.engines import ENGINES

        table = {**ENGINES, **self.extra_engines}
        plain = {k: v for k, v in self.params.items() if not k.endswith("_env")}
        checked = check_component(self.params_path, "engine", self.name, table, plain, self.supplied())
        if self.name in table:
            for k, v in self.params.items():
                if not k.endswith("_env"):
                    continue
                try:
                    known = params_model(resolve_object(self.name, table, "engine")).model_fields
                except ImportError:
                    break
                if k[: -len("_env")] not in known or k[: -len("_env")] in self.supplied():
                    raise ConfigError(f"{self.params_path}: {k!r} names no parameter of engine {self.name!r} "
                                      f"(allowed: {', '.join(x + '_env' for x in known if x not in self.supplied())})")
                if not isinstance(v, str):
                    raise ConfigError(f"{self.params_path}.{k}: give the name of an environment variable, got {v!r}")
        self.params = {k: checked.get(k, v) for k, v in self.params.items()}
        return self

    def kwargs(self) -> dict[str, Any]:
        """``params`` with every ``*_env`` key replaced by the environment variable it names."""
        import os

        kw: dict[str, Any] = {}
        for k, v in self.params.items():
            if k.endswith("_env"):
                if v not in os.environ:
                    raise ConfigError(f"{self.params_path}.{k}: environment variable {v!r} is not set")
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
        default_factory=list, description=(
            "tree: no forking after a generated token containing one of these words.")
    )
    env: str = Field("calculator", description=(
        "multi_turn: env name (calculator, python) or 'pkg.mod:Class'."))
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

    store: str | None = Field(None, description=(
        "Store whose solved rollouts are retrieved (default: the run's own store, as it is when the run "
        "starts)."))
    k: int = Field(2, ge=1, description=(
        "Solved cases per prompt (nearest first, placed nearest last before the question)."))
    embed: str = Field("hash", description=(
        "Embedder name (hash: no model, surface overlap; minilm: paraphrases) or pkg.mod:obj."))
    max_distance: float | None = Field(None, ge=0.0, description=(
        "Drop neighbours farther than this cosine distance (null: keep the k nearest)."))


class GenerateConfig(StrictModel):
    """One generation run into a store."""

    store: str = Field(..., description="Store directory (created if missing).")
    run_id: str | None = Field(None, description="Run id (default: a new id).")
    step: int = Field(0, ge=0, description="Training step recorded with the rollouts.")
    seed: int | None = Field(0, description="Base seed; per-prompt seeds derive from it (None = unseeded).")
    batch_prompts: int = Field(8, ge=1, description="Prompts per engine call and per store commit.")
    tasks: TaskConfig = Field(default_factory=lambda: TaskConfig(params={"n": 8, "level": 1}), description=(
        "Task source."))
    engine: EngineConfig = Field(default_factory=EngineConfig, description="Engine.")
    topology: TopologyConfig = Field(default_factory=TopologyConfig, description="Topology.")
    sampling: SamplingParams = Field(default_factory=lambda: SamplingParams(temperature=0.7, max_tokens=96),
                                     description="Sampling params (n is set by the topology).")
    retrieve: RetrieveConfig | None = Field(None, description=(
        "Retrieval-guided generation: solved cases of a store as in-context seeds before each prompt "
        "(rollouts record them in meta.retrieved); null = off."))

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
