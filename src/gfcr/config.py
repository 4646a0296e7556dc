"""Typed configs from YAML: one loader for every room's pydantic config, the strict base model
every config section derives from, object resolution (a name in a room's table, or a user's
``pkg.module:name``), and new run folders.

``load_config_model(Model, path, overrides)`` reads a YAML mapping (``None`` = all defaults),
applies dotted overrides (``{"optim.lr": 1e-5}``, as given by ``--set optim.lr=1e-5``) and
validates; any failure is a :class:`ConfigError` whose message names the file and the field.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

M = TypeVar("M", bound=BaseModel)


class ConfigError(ValueError):
    """A config file could not be read or failed validation; the message names the field."""


class StrictModel(BaseModel):
    """The base of every config section: an unknown key is an error (a typo never passes silently)."""

    model_config = ConfigDict(extra="forbid")


def new_run_dir(base: str | Path, name: str) -> Path:
    """A new, empty folder ``base/name-YYYYmmdd-HHMMSS[-n]`` (``base`` created if missing): runs
    never overwrite each other, also when two start in the same second (``mkdir`` decides)."""
    base = Path(base)
    base.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    for i in range(10_000):
        d = base / (f"{name}-{stamp}" if i == 0 else f"{name}-{stamp}-{i}")
        try:
            d.mkdir()
            return d
        except FileExistsError:
            continue
    raise ConfigError(f"{base}: no free run folder name for {name}-{stamp}")


def resolve_object(name: str, table: Mapping[str, Any] | None = None, kind: str = "object") -> Any:
    """The object a config names: an entry of ``table`` (a room's visible name → object table), or
    an import path ``"pkg.module:attr"`` (a user's own code, at the edge).

    A table value that is itself a ``"pkg.module:attr"`` string is imported on use (heavy or
    optional modules stay unloaded until asked for); its ImportError propagates (a missing optional
    dependency). An unknown name, or a user import path that does not import, is a
    :class:`ConfigError` naming ``kind`` and the choices. Example: ``resolve_object("math:sqrt")``
    is :func:`math.sqrt`; ``resolve_object("nope", {"a": 1}, "verifier")`` raises "unknown verifier
    'nope'; choose one of ['a'] or give 'pkg.module:name'".
    """
    table = table or {}
    if name in table:
        target = table[name]
        if not isinstance(target, str):
            return target
        mod, _, attr = target.partition(":")
        return getattr(importlib.import_module(mod), attr)
    mod, sep, attr = str(name).partition(":")
    if not sep or not mod or not attr:
        choices = f"choose one of {sorted(table)} or give" if table else "give"
        raise ConfigError(f"unknown {kind} {name!r}; {choices} 'pkg.module:name'")
    try:
        return getattr(importlib.import_module(mod), attr)
    except (ImportError, AttributeError) as e:
        raise ConfigError(f"cannot import {kind} {name!r}: {e}") from e


def parse_sets(sets: list[str] | None) -> dict[str, Any]:
    """``["optim.lr=1e-5", "steps=4"]`` → ``{"optim.lr": 1e-5, "steps": 4}`` (values parsed as YAML)."""
    out: dict[str, Any] = {}
    for s in sets or []:
        if "=" not in s:
            raise ConfigError(f"--set {s!r}: expected KEY=VALUE, e.g. --set optim.lr=1e-5")
        k, v = s.split("=", 1)
        out[k.strip()] = yaml.safe_load(v)
    return out


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one mapping (plain YAML keeps the last silently)."""


def _unique_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"key {key!r} appears twice in one mapping (lines {seen[key]} and "
                f"{key_node.start_mark.line + 1}); keep one", key_node.start_mark)
        seen[key] = key_node.start_mark.line + 1
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _unique_mapping)


def read_yaml_mapping(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file not found: {p}")
    try:
        data = yaml.load(p.read_text(), Loader=_UniqueKeyLoader) or {}  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as e:
        raise ConfigError(f"{p}: not valid YAML: {e}") from e
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: the top level must be a mapping of fields")
    return data


def apply_overrides(data: dict[str, Any], overrides: dict[str, Any] | None) -> dict[str, Any]:
    """Set dotted keys in a nested mapping (in place; returns it)."""
    for key, value in (overrides or {}).items():
        node = data
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {key!r}: {part!r} is not a section")
        node[parts[-1]] = value
    return data


def load_config_model(model: type[M], path: str | Path | None = None,
                      overrides: dict[str, Any] | None = None) -> M:
    """Read, override and validate a config of type ``model``."""
    data = read_yaml_mapping(path) if path is not None else {}
    apply_overrides(data, overrides)
    try:
        return model.model_validate(data)
    except ValidationError as e:
        where = f" in {path}" if path else ""
        lines = [f"  {'.'.join(str(x) for x in err['loc']) or '(top level)'}: {err['msg']} [{err['type']}]" for err in e.errors()]
        raise ConfigError(f"invalid {model.__name__}{where}:\n" + "\n".join(lines)) from e
