"""The generation config vocabulary: the engine (:class:`EngineConfig`), the rollout topology
(:class:`TopologyConfig`, its parameters typed per topology), retrieval-seeded prompts
(:class:`RetrieveConfig`) and ``gfcr generate``'s whole job (:class:`GenerateConfig`). ``gfcr train``
composes the engine and topology sections as they are (``generate.engine``, ``generate.topology``:
one shape in both commands, :mod:`gfcr.train.config`); :mod:`gfcr.generate.run` runs a
:class:`GenerateConfig`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import AliasChoices, Field, ValidationError, model_validator

from gfcr.config import ConfigError, StrictModel, note_renamed
from gfcr.generate.engines.base import SamplingParams
from gfcr.tasks import TaskConfig


class EngineConfig(StrictModel):
    """Which engine samples, in the one method shape: ``engine: NAME`` or ``engine: {name: NAME,
    model: ..., params: {...}}`` (``gfcr generate``'s ``engine:``, ``gfcr train``'s ``generate.engine``).

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
        """``NAME`` is ``{name: NAME}``; ``args`` (issue 46: one word, ``params``) still reads, with a note."""
        if isinstance(data, str):
            return {"name": data}
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


class GroupParams(StrictModel):
    """The group topology's parameters (:class:`gfcr.generate.topologies.Group`; the config default K is 4)."""

    k: int = Field(4, ge=1, description="Samples per prompt (the group size K).")


class TreeParams(StrictModel):
    """The tree topology's parameters (:class:`gfcr.generate.topologies.EPTree`, TreeRL)."""

    m: int = Field(6, ge=1, description="Root paths per prompt.")
    n: int = Field(2, ge=0, description="Forking points per tree per round.")
    l: int = Field(1, ge=1, description="Continuations per forking point.")  # noqa: E741
    t: int = Field(2, ge=0, description="Branching rounds.")
    min_prefix_frac: float = Field(0.5, ge=0.0, lt=1.0, description=(
        "Fork only at or after this fraction of the parent's answer (0 = TreeRL's rule)."))
    no_fork_after: list[str] = Field(default_factory=list, description=(
        "No forking after a generated token containing one of these words."))


class MultiTurnParams(StrictModel):
    """The multi_turn topology's parameters (policy-env episodes, :class:`gfcr.generate.topologies.MultiTurn`)."""

    env: str = Field("calculator", description="Env name (calculator, python, retry) or 'pkg.mod:Class'.")
    k: int = Field(4, ge=1, description="Episodes per prompt.")
    max_turns: int = Field(4, ge=1, description="Most policy turns per episode.")
    obs_role: str = Field("user", description="Role of the env's observations in the chat.")


#: each topology's parameter model (the lookup by name that types ``topology.params``)
TOPOLOGY_PARAMS: dict[str, type[StrictModel]] = {"group": GroupParams, "tree": TreeParams, "multi_turn": MultiTurnParams}
#: the keys of each topology (its constructor's parameters less ``params`` and ``seed``)
TOPOLOGY_KEYS: dict[str, tuple[str, ...]] = {name: tuple(m.model_fields) for name, m in TOPOLOGY_PARAMS.items()}


class TopologyConfig(StrictModel):
    """How prompts become rollouts, in the one method shape (:class:`gfcr.config.Method`):
    ``topology: NAME`` or ``topology: {name: NAME, params: {...}}`` in ``gfcr generate`` and as
    ``generate.topology`` in ``gfcr train``. ``params`` are checked against the named topology's
    model (:data:`TOPOLOGY_PARAMS`: :class:`GroupParams`, :class:`TreeParams`,
    :class:`MultiTurnParams`, where the defaults live), then written with every default filled in
    (the resolved config names the whole shape; every key has a default). The old shape, the keys beside ``name`` (``{name: tree, m: 6}``), is read with a
    one-line note."""

    name: Literal["group", "tree", "multi_turn"] = Field("group", description=(
        "Topology: group, tree or multi_turn."))
    params: dict[str, Any] = Field(default_factory=dict, description=(
        "The topology's parameters: group: k; tree: m, n, l, t, min_prefix_frac, no_fork_after; "
        "multi_turn: env, k, max_turns, obs_role."))

    #: config path of this section in error messages
    path: ClassVar[str] = "topology"

    @model_validator(mode="before")
    @classmethod
    def _shape(cls, data: Any) -> Any:
        """``NAME`` is ``{name: NAME}``; the old flat keys move under ``params`` (one note)."""
        if isinstance(data, str):
            return {"name": data}
        return migrate_topology(data, cls.path, note=True)

    @model_validator(mode="after")
    def _params(self) -> TopologyConfig:
        model = TOPOLOGY_PARAMS[self.name]
        for key in self.params:
            if key not in model.model_fields:
                raise ConfigError(f"{self.path}.params: unknown key {key!r} for topology {self.name!r}; "
                                  f"allowed: {', '.join(model.model_fields)}")
        try:
            checked = model.model_validate(self.params)
        except ValidationError as e:
            err = e.errors()[0]
            raise ConfigError(f"{self.path}.params.{'.'.join(str(x) for x in err['loc'])}: "
                              f"{err['msg'][0].lower()}{err['msg'][1:]}, got {err['input']!r} for topology "
                              f"{self.name!r}") from None
        self.require(set(self.params))
        self.params = checked.model_dump()
        return self

    def require(self, given: set[str]) -> None:
        """Refuse what a composer needs spelled out (``given``: the keys the config named); none here."""

    def typed(self) -> StrictModel:
        """The topology's parameter model (typed access: ``cfg.topology.typed().env``)."""
        return TOPOLOGY_PARAMS[self.name].model_validate(self.params)

    @property
    def k(self) -> int:
        """Samples (episodes) per prompt. A tree's size is its shape (``make_topology`` drops ``k``);
        there it is the group default, as before the one shape (what a group policy is handed)."""
        return int(getattr(self.typed(), "k", GroupParams().k))

    def kwargs(self) -> dict[str, Any]:
        """The named topology's keyword arguments (``make_topology(name, params=..., seed=..., **kwargs())``)."""
        return self.typed().model_dump()


def migrate_topology(data: Any, where: str, note: bool = False) -> Any:
    """A topology section in the old shape (its keys beside ``name``: ``{name: tree, m: 6}``) in the
    current one (``{name: tree, params: {m: 6}}``); the keys under ``params`` win over none (given
    both ways, the flat key wins, as ``--set`` in the old spelling over a current file). ``note``:
    say it in one line. Anything else is returned as it is."""
    if not isinstance(data, dict):
        return data
    flat = {k: v for k, v in data.items() if k not in ("name", "params")}
    if not flat:
        return data
    name = data.get("name", "group")
    if note:
        import yaml

        from gfcr.config import note_old_shape

        shown = yaml.safe_dump(flat, default_flow_style=True, width=10**6).strip()[1:-1]
        note_old_shape(f"{where}: {{name: {name}, {shown}}}", f"{where}: {{name: {name}, params: {{{shown}}}}}")
    return {"name": name, "params": {**(data.get("params") or {}), **flat}}


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
