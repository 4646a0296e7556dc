"""The ``gfcr simulate`` config: the simulated world, the budget and the strategies to compare.

A strategy chooses its methods in the one shape of :class:`gfcr.config.Method`, as ``gfcr train``
does: ``selector``, ``group`` and ``buffer`` are each ``NAME`` or ``{name: NAME, params: {...}}``,
the params checked against the named method's own parameters at load (``.typed()`` gives them with
every default). The older flat keys (``selector_params``, ``group_params``, ``buffer_params``) load
through :func:`migrate`, one note per key. Example::

    strategies:
      - {name: greso, selector: {name: greso, params: {p_min: 0.01}}, control: dynamic_sampling}
      - {name: repo, control: repo, buffer: {name: repo, params: {strategy: highest}}}
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from pydantic import Field, field_validator, model_validator

from gfcr.config import ConfigError, StrictModel, move_old_params
from gfcr.control.methods import GroupMethod, SelectorMethod
from gfcr.replay.methods import BufferMethod


class SimSelectorMethod(SelectorMethod):
    """``strategies[].selector``: :class:`gfcr.control.methods.SelectorMethod` under this config's path."""

    path: ClassVar[str] = "strategies[].selector"


class SimGroupMethod(GroupMethod):
    """``strategies[].group``: :class:`gfcr.control.methods.GroupMethod` under this config's path."""

    path: ClassVar[str] = "strategies[].group"


class SimBufferMethod(BufferMethod):
    """``strategies[].buffer``: :class:`gfcr.replay.methods.BufferMethod` under this config's path."""

    path: ClassVar[str] = "strategies[].buffer"


#: the ``control`` shorthand of a strategy → (group policy, replay buffer): the names ``gfcr train`` uses
CONTROLS: dict[str, tuple[str, str | None]] = {
    "none": ("single", None), "dynamic_sampling": ("dynamic_sampling", None), "ar3po": ("ar3po", "ar3po"),
    "adaptive_k": ("adaptive_k", None), "repo": ("single", "repo"), "exgrpo": ("single", "exgrpo"),
}


class StrategyConfig(StrictModel):
    """One strategy: a prompt selector, a group policy and a replay buffer, each ``NAME`` or
    ``{name: NAME, params: {...}}`` as ``gfcr train`` names them (``control.selector``,
    ``control.group``, ``replay.buffer``). ``control`` is the older shorthand for a group policy +
    buffer pair (``repo`` = ``single`` + buffer ``repo``); its per-method fields (``gen_factor``,
    ``stages``, ``k_min`` ...) fill the implied group policy's params (``group.params``, naming the
    same policy, win)."""

    name: str = Field(description="label in the report (e.g. 'dapo', 'greso')")
    selector: SimSelectorMethod = Field(default_factory=lambda: SimSelectorMethod(name="uniform"), description=(
        "prompt selector (gfcr.control.selectors) and its params"))
    group: SimGroupMethod | None = Field(None, description=(
        "group policy (gfcr.control.policies) and its params; null = what `control` implies"))
    buffer: SimBufferMethod | None = Field(None, description=(
        "replay buffer (gfcr.replay.buffers) and its params; null = what `control` implies"))
    control: str = Field("none", description=(
        f"shorthand for a group policy + buffer pair, one of {tuple(CONTROLS)}"))
    gen_factor: float = Field(3.0, gt=0, description=(
        "dynamic sampling: generation batch = gen_factor x train batch"))
    adaptive_gen: bool = Field(False, description="dynamic sampling: GRESO's adaptive generation batch size")
    max_num_gen_batches: int = Field(10, ge=1, description=(
        "dynamic sampling: generation rounds per step at most"))
    stages: int = Field(2, ge=1, description="ar3po: sampling stages")
    per_stage: int = Field(4, ge=1, description="ar3po: responses per prompt per stage")
    k_min: int = Field(2, ge=2, description=(
        "adaptive_k: fewest responses per prompt (2: a group needs two to differ)"))
    k_max: int = Field(16, ge=2, description="adaptive_k: most responses per prompt")

    @model_validator(mode="before")
    @classmethod
    def _old_shape(cls, data: Any) -> Any:
        """A strategy in the older flat shape (``selector_params``...) in the one method shape, one
        note per old key (:func:`migrate_strategy`)."""
        return migrate_strategy(data, note=True) if isinstance(data, dict) else data

    @field_validator("control")
    @classmethod
    def _known_control(cls, v: str) -> str:
        if v not in CONTROLS:
            raise ValueError(f"unknown control {v!r}; choose one of {tuple(CONTROLS)} (or name a group policy: group)")
        return v

    @model_validator(mode="after")
    def _k_range(self) -> StrategyConfig:
        if self.k_max < self.k_min:
            raise ValueError(f"k_max ({self.k_max}) must be >= k_min ({self.k_min})")
        return self

    @model_validator(mode="after")
    def _params(self) -> StrategyConfig:
        implied_group = CONTROLS[self.control][0]
        if self.group is not None and self.control not in ("none", "repo", "exgrpo") \
                and self.group.name != implied_group:
            raise ConfigError(f"strategies[]: give either group ({self.group.name!r}) or control "
                              f"({self.control!r}), not both")
        return self

    def resolved(self, train_prompts: int) -> tuple[str, dict[str, Any], str | None]:
        """(group policy, its keyword arguments, buffer name) this strategy runs: the named group
        policy and buffer, else what ``control`` implies; the shorthand's fields fill the implied
        policy's keyword arguments, its own ``params`` over them."""
        group, buffer = CONTROLS[self.control]
        if self.buffer is not None:
            buffer = self.buffer.name
        params: dict[str, Any] = {}
        if self.group is None or self.group.name == group:
            params = {"dynamic_sampling": {"gen_prompts": int(round(self.gen_factor * train_prompts)),
                                           "max_num_gen_batches": self.max_num_gen_batches,
                                           "adaptive_gen": self.adaptive_gen},
                      "ar3po": {"stages": self.stages, "per_stage": self.per_stage},
                      "adaptive_k": {"k_min": self.k_min, "k_max": self.k_max}}.get(group, {})
        if self.group is not None:
            group, params = self.group.name, params | self.group.params
        return group, params, buffer


def default_strategies() -> list[StrategyConfig]:
    return [
        StrategyConfig(name="uniform"),
        StrategyConfig(name="dapo", control="dynamic_sampling"),
        StrategyConfig(name="greso", selector="greso", control="dynamic_sampling", adaptive_gen=True),
        StrategyConfig(name="vade", selector="vade"),
        StrategyConfig(name="vcrl", selector="vcrl"),
        StrategyConfig(name="sec", selector="sec"),
        StrategyConfig(name="ar3po", control="ar3po"),
        StrategyConfig(name="adaptive_k", control="adaptive_k"),
        StrategyConfig(name="repo", control="repo"),
        StrategyConfig(name="exgrpo", control="exgrpo"),
    ]


class SimConfig(StrictModel):
    """The simulated world, the budget and the strategies to compare."""

    n_prompts: int = Field(2000, ge=10, description="number of prompts in the pool")
    category_beta: list[tuple[float, float]] = Field(
        default_factory=lambda: [(6.0, 1.0), (3.0, 2.0), (1.5, 3.0), (0.6, 4.0), (0.3, 8.0)],
        description="per category (easy -> hard), Beta(a, b) of the initial solve probability",
    )
    group_size: int = Field(8, ge=2, description="responses per prompt (G)")
    train_prompts: int = Field(64, ge=1, description="groups in one training batch")
    budget_tokens: float = Field(2e7, gt=0, description="generated-token budget per strategy")
    max_steps: int = Field(100000, ge=1, description="hard cap on training steps per strategy")
    len_mean: float = Field(300.0, gt=0, description="mean response length of the easiest category (tokens)")
    len_growth: float = Field(1.3, gt=0, description="mean length multiplier per harder category")
    len_sigma: float = Field(0.4, ge=0, description="log-normal sigma of response lengths")
    wrong_len_factor: float = Field(1.5, gt=0, description="wrong answers are this much longer on average")
    len_max: int = Field(2048, ge=1, description="truncation length; truncated responses count as wrong")
    lr: float = Field(0.6, ge=0, description="logit step of a prompt per effective group, times 4q(1-q)")
    transfer: float = Field(0.05, ge=0, description=(
        "logit step of a category per effective group share of the batch"))
    forget: float = Field(0.002, ge=0, le=1, description=(
        "per-step drift of untrained prompts toward their initial logit"))
    train_cost: float = Field(0.0005, ge=0, description="wall-time proxy units per trained token")
    replay_decay: float = Field(1.0, ge=0, le=1, description=(
        "a group made effective by replayed responses learns replay_decay ** lag (steps) as much as a "
        "fresh group; 1 = stale samples teach as much as fresh ones (an assumption: the world has no "
        "off-policy ratio)"))
    seed: int = Field(0, description="seed of the world and of every strategy's sampling")
    strategies: list[StrategyConfig] = Field(default_factory=default_strategies, description=(
        "strategies to compare"))

    @field_validator("strategies")
    @classmethod
    def _unique(cls, v: list[StrategyConfig]) -> list[StrategyConfig]:
        names = [s.name for s in v]
        if len(set(names)) != len(names):
            raise ValueError(f"strategy names must be unique, got {names}")
        if not v:
            raise ValueError("give at least one strategy")
        return v


def load_config(path: str | Path) -> SimConfig:
    """Read a YAML config; unknown keys and bad values fail with the field named."""
    from gfcr.config import load_config_model

    return load_config_model(SimConfig, path)


#: a strategy's older flat keys -> the method key each moves under
OLD_PARAMS: tuple[tuple[str, str], ...] = (
    ("selector_params", "selector"), ("group_params", "group"), ("buffer_params", "buffer"))


def migrate_strategy(data: dict[str, Any], note: bool = False) -> dict[str, Any]:
    """One strategy mapping with each older flat key under its method as ``{name, params}``
    (:func:`gfcr.config.move_old_params`; ``note``: one line per key); ``data`` is not changed. A
    method not named is the one the strategy runs: selector ``uniform``, else what ``control``
    implies (a buffer's params where ``control`` implies none are refused in one line). Example:
    ``{"name": "r", "control": "repo", "buffer_params": {"strategy": "highest"}}`` gets
    ``"buffer": {"name": "repo", "params": {"strategy": "highest"}}``."""
    if not any(old in data for old, _ in OLD_PARAMS):
        return data
    data = dict(data)
    group, buffer = CONTROLS.get(str(data.get("control", "none")), (None, None))
    defaults = {"selector": "uniform", "group": group, "buffer": buffer}
    where = f"strategies[{data['name']}]" if isinstance(data.get("name"), str) else "strategies[]"
    for old, key in OLD_PARAMS:
        move_old_params(data, where, old, key, defaults[key], note)
    return data


def migrate(data: dict[str, Any], note: bool = False) -> dict[str, Any]:
    """``data`` (a ``gfcr simulate`` config mapping) with every strategy in the one method shape
    (:func:`migrate_strategy`); ``data`` itself is not changed."""
    strategies = data.get("strategies")
    if not isinstance(strategies, list):
        return data
    return {**data, "strategies": [migrate_strategy(s, note) if isinstance(s, dict) else s for s in strategies]}


