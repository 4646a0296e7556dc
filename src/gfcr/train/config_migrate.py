"""``gfcr train`` configs in the older flat shape, read in the one method shape (issue 46).

Every method a config chooses is written ``KEY: NAME`` or ``KEY: {name: NAME, params: {...}}``
(:class:`gfcr.config.Method`). Before, a method's parameters sat beside it under a key of their own,
and ``gfcr train`` wrote ``generate`` differently from ``gfcr generate``:

=================================================  =====================================================
old key                                            written now
=================================================  =====================================================
``control.selector_params``                        ``control.selector: {name, params}``
``control.group_params``                           ``control.group: {name, params}``
``signals.advantage_params``                       ``signals.advantage: {name, params}``
``signals.length_params``                          ``signals.length_reward: {name, params}``
``verify.params``                                  ``verify.verifier: {name, params}``
``replay.params``                                  ``replay.buffer: {name, params}``
``generate.engine_params``                         ``generate.engine: {name, params}``
``generate.k``, ``generate.params``                ``generate.topology: {name, params: {k, ...}}``
``generate.topology: {name: tree, m: 6}``          ``generate.topology: {name: tree, params: {m: 6}}``
=================================================  =====================================================

:func:`migrate` moves each old key (given both ways, the old key wins: a ``--set`` in the old
spelling over a file in the new one) and, with ``note``, says so in one line per key
(:func:`gfcr.config.note_old_shape`); ``gfcr config migrate FILE`` prints a file rewritten. A
parameter dict whose method is not named goes to the method the run defaults to (the numeric
verifier, the uniform selector, the estimator the topology implies: treerl for a tree, reward with
adapt_think, else grpo); one for a method off by default (a group policy, a buffer, a length
reward) is refused in one line.
"""

from __future__ import annotations

from typing import Any

from gfcr.config import flow_yaml, move_old_params, note_old_shape
from gfcr.generate.config import migrate_topology

#: section -> (old parameter key, the method key it moves under)
OLD_PARAMS: dict[str, tuple[tuple[str, str], ...]] = {
    "control": (("selector_params", "selector"), ("group_params", "group")),
    "signals": (("advantage_params", "advantage"), ("length_params", "length_reward")),
    "verify": (("params", "verifier"),),
    "replay": (("params", "buffer"),),
}


#: methods a run names when its config does not (the advantage estimator's depends on the config)
DEFAULT_NAME: dict[str, str | None] = {"verifier": "numeric", "selector": "uniform", "advantage": None}


def _method(value: Any) -> dict[str, Any]:
    """A method as ``{name, params}`` (written by its name alone, or already a mapping)."""
    if isinstance(value, str):
        return {"name": value}
    return dict(value) if isinstance(value, dict) else {}


def migrate(data: dict[str, Any], note: bool = False) -> dict[str, Any]:
    """``data`` (a ``gfcr train`` config mapping) with every old key of the table above in its
    current place; ``data`` itself is not changed. Example: ``migrate({"control": {"selector": "vcrl",
    "selector_params": {"kappa": 0.3}}})`` is ``{"control": {"selector": {"name": "vcrl", "params":
    {"kappa": 0.3}}}}``."""
    data = dict(data)
    if isinstance(data.get("generate"), dict):
        data["generate"] = _migrate_generate(dict(data["generate"]), note)
    for section, moves in OLD_PARAMS.items():
        if not isinstance(data.get(section), dict) or not any(old in data[section] for old, _ in moves):
            continue
        sec = data[section] = dict(data[section])
        for old, key in moves:
            default = _default_advantage(data) if key == "advantage" else DEFAULT_NAME.get(key)
            move_old_params(sec, section, old, key, default, note)
    return data


def _migrate_generate(gen: dict[str, Any], note: bool) -> dict[str, Any]:
    """``engine_params`` under the engine; ``k``, ``params`` and flat topology keys under the topology."""
    if "engine_params" in gen:
        engine = _method(gen.get("engine", "hf"))
        engine.setdefault("name", "hf")
        if note:
            note_old_shape("generate.engine_params",
                           f"generate.engine: {{name: {engine['name']}, params: {_flow(gen['engine_params'])}}}")
        engine["params"] = {**(engine.get("params") or {}), **(gen.pop("engine_params") or {})}
        gen["engine"] = engine
    if isinstance(gen.get("engine"), dict) and "args" in gen["engine"]:
        engine = dict(gen["engine"])
        if note:
            note_old_shape("generate.engine.args", "generate.engine.params")
        engine["params"] = {**(engine.pop("args") or {}), **(engine.get("params") or {})}
        gen["engine"] = engine
    topo = migrate_topology(_method(gen.get("topology", "group")), "generate.topology", note)
    name = topo.get("name", "group")
    extra: dict[str, Any] = {}
    for old in ("params", "k"):
        if old not in gen:
            continue
        value = gen.pop(old)
        if note:
            shown = _flow({"k": value} if old == "k" else value or {})
            note_old_shape(f"generate.{old}", f"generate.topology: {{name: {name}, params: {shown}}}")
        if old == "k":
            extra.setdefault("k", value)  # generate.params.k, given both ways, wins
        else:
            extra.update(value or {})
    if name == "tree":
        extra.pop("k", None)  # a tree's size is its shape (m, n, l, t); k never applied to it
    if extra:
        topo = {"name": name, "params": {**(topo.get("params") or {}), **extra}}
    if topo and (extra or "topology" in gen):
        gen["topology"] = topo
    return gen


_flow = flow_yaml


def _default_advantage(data: dict[str, Any]) -> str:
    """The estimator a run defaults to (as :class:`gfcr.train.config.TrainConfig` resolves it)."""
    topo = _method((data.get("generate") or {}).get("topology", "group")).get("name", "group")
    adapt_think = (data.get("signals") or {}).get("adapt_think")
    return "treerl" if topo == "tree" else "reward" if adapt_think else "grpo"


def config_kind(data: dict[str, Any]) -> str:
    """Which command a config mapping is for, told apart by its top-level keys: ``simulate``,
    ``ross``, ``generate`` or ``train``."""
    keys = set(data)
    if "strategies" in keys or "n_prompts" in keys:
        return "simulate"
    if "upstream_model" in keys or ("store" in keys and "sampling" not in keys and "batch_prompts" not in keys):
        return "ross"
    if keys & {"sampling", "batch_prompts", "engine", "topology"}:
        return "generate"
    return "train"


def migrate_any(data: dict[str, Any], note: bool = False) -> tuple[str, dict[str, Any]]:
    """``(kind, data in the current shape)`` for a ``gfcr train`` or ``gfcr generate`` config mapping
    (:func:`config_kind`); a ``gfcr simulate`` or ROSS config is returned as it is (their rooms migrate
    them: :func:`gfcr.sim.config.migrate`, :func:`gfcr.ross.config.migrate`; ``gfcr config migrate``
    calls each). Nothing is validated here: load the result with the kind's config model."""
    kind = config_kind(data)
    if kind == "train":
        return kind, migrate(data, note)
    if kind != "generate":
        return kind, data
    data = dict(data)
    if isinstance(data.get("engine"), dict) and "args" in data["engine"]:
        engine = dict(data["engine"])
        if note:
            note_old_shape("engine.args", "engine.params")
        engine["params"] = {**(engine.pop("args") or {}), **(engine.get("params") or {})}
        data["engine"] = engine
    if "topology" in data:
        data["topology"] = migrate_topology(data["topology"], "topology", note)
    return kind, data
