"""Typed configs from YAML: one loader for every room's pydantic config, the strict base model
every config section derives from, the one shape of a chosen method (:class:`Method`: ``KEY: NAME``
or ``KEY: {name: NAME, params: {...}}``), object resolution (a name in a room's table, or a user's
``pkg.module:name``), the typed parameters of a named component, and new run folders.

``load_config_model(Model, path, overrides)`` reads a YAML mapping (``None`` = all defaults),
applies dotted overrides (``{"optim.lr": 1e-5}``, as given by ``--set optim.lr=1e-5``) and
validates; any failure is a :class:`ConfigError` whose message names the file and the field.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import typing
import warnings
from collections.abc import Iterable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, model_validator

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


def lazy_public(package: str, public: Mapping[str, str]) -> Any:
    """A package's module ``__getattr__`` that imports each public name from its defining module on first
    use (PEP 562), so importing one module of the package loads none of the others. ``public``: name ->
    module. Example: ``__getattr__ = lazy_public(__name__, {"train": "gfcr.train.loop"})``; then
    ``gfcr.train.train`` imports ``gfcr.train.loop`` and returns its ``train``."""
    from importlib import import_module

    def getattr_(name: str) -> Any:
        if name in public:
            return getattr(import_module(public[name]), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return getattr_


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


@functools.cache
def params_model(target: Any, skip: tuple[str, ...] = ()) -> type[BaseModel]:
    """The pydantic model of a component's keyword parameters.

    A component that declares its own model (a ``Config`` class, as every verifier does) gives
    that; any other class or factory gets one built once from its signature: each keyword
    parameter not in ``skip`` (those its caller supplies, e.g. a selector's prompt ids) becomes a
    field of its annotated type and default (un-annotated: any value); a ``**kwargs`` parameter
    lets other keys through (e.g. the vllm engine's ``vllm.LLM`` arguments). Example: for
    ``def f(a: int = 1, b: float = 0.5)``, ``params_model(f).model_validate({"a": "x"})`` fails
    on ``a``; ``{"c": 1}`` fails as an extra key.
    """
    own = getattr(target, "Config", None)
    if isinstance(own, type) and issubclass(own, BaseModel):
        return own
    try:
        sig = inspect.signature(target)
    except (TypeError, ValueError):
        return create_model(f"{_label(target)}Params", __config__=ConfigDict(extra="allow"))
    fn = target.__init__ if inspect.isclass(target) else target
    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # an annotation naming what only type checkers import: check keys, not types
        hints = {}
    fields: dict[str, Any] = {}
    extra = "forbid"
    for p in sig.parameters.values():
        if p.kind is p.VAR_KEYWORD:
            extra = "allow"
        elif p.kind is not p.VAR_POSITIONAL and p.name not in skip:
            # a parameter without a default is left to the component to ask for (its caller may supply it)
            fields[p.name] = (hints.get(p.name, Any), None if p.default is p.empty else p.default)
    return create_model(f"{_label(target)}Params", __config__=ConfigDict(extra=extra, arbitrary_types_allowed=True),
                        **fields)


def _label(target: Any) -> str:
    return "".join(c for c in getattr(target, "__name__", type(target).__name__).title() if c.isalnum())


def check_params(where: str, kind: str, name: str, target: Any, params: Mapping[str, Any],
                 skip: Iterable[str] = ()) -> dict[str, Any]:
    """``params`` checked against the parameters of the component ``target`` (:func:`params_model`),
    the values coerced to their declared types (YAML's ``1e-5`` string becomes a float).

    ``where`` is the config path of the dict, ``kind`` and ``name`` say which component: an error
    is one :class:`ConfigError` line naming all three, e.g. ``replay.params: unknown key
    'num_replay' for buffer 'repo'; allowed: strategy, num_replays, max_cache_size, ...`` or
    ``replay.params.num_replays: input should be a valid integer, ..., got 'many' for buffer
    'repo'``. Only the keys given are returned (defaults stay the component's).
    """
    model = params_model(target, tuple(sorted(skip)))
    params = dict(params or {})
    skipped = set(skip)
    allowed = [k for k in model.model_fields if k not in skipped]
    if model.model_config.get("extra") != "allow":
        for key in params:
            if key not in allowed:
                listed = ", ".join(allowed) if allowed else "none (it takes no parameters)"
                raise ConfigError(f"{where}: unknown key {key!r} for {kind} {name!r}; allowed: {listed}")
    try:
        checked = model.model_validate(params)
    except ValidationError as e:
        errors = [err for err in e.errors() if err["type"] != "missing"]
        if not errors:  # only a required parameter is missing: the component asks for it when built
            return params
        err = errors[0]
        loc = ".".join(str(x) for x in err["loc"])
        got = f", got {err['input']!r}" if "input" in err and not isinstance(err["input"], dict) else ""
        raise ConfigError(f"{where}.{loc}: {err['msg'][0].lower()}{err['msg'][1:]}{got} for {kind} {name!r}") from None
    return checked.model_dump(include=set(params))  # extra keys (a ``**kwargs`` component's) included


def check_component(where: str, kind: str, name: str | None, table: Mapping[str, Any],
                    params: Mapping[str, Any], skip: Iterable[str] = ()) -> dict[str, Any]:
    """:func:`check_params` for the component ``name`` of a room's ``table`` (see
    :func:`resolve_object`). A user's own ``pkg.module:name`` is not imported at config load (its
    own signature checks its call), nor is an entry whose optional dependency is missing (the run
    says what to install); both keep ``params`` as given."""
    if name is None or name not in table:
        return dict(params or {})
    try:
        target = resolve_object(name, table, kind)
    except ImportError:
        return dict(params or {})
    return check_params(where, kind, name, target, params, skip)


class Method(StrictModel):
    """A chosen method and its parameters: the one shape of every component a config names.

    Written ``KEY: NAME`` (short for ``{name: NAME}``) or ``KEY: {name: NAME, params: {...}}``, e.g.
    ``control: {selector: {name: greso, params: {p_min: 0.01}}}``. A subclass says where names are
    looked up (:meth:`table`, a room's name → class table), what the method is called in errors
    (``kind``), the section's config path (``path``) and what the caller supplies itself (``skip``).
    ``params`` are checked at load against the method's own parameter model, looked up by name
    (:func:`params_model`: its ``Config`` class, or a model of its constructor's signature, so each
    default stays on the method's class) and kept as given; :meth:`typed` gives the full model with
    the defaults filled in. Example: ``SelectorMethod.model_validate("vcrl").typed().kappa`` (gfcr.control.methods) is
    VCRL's default ``kappa``; ``{"name": "vcrl", "params": {"kapa": 1}}`` fails with
    ``control.selector.params: unknown key 'kapa' for selector 'vcrl'; allowed: key, kappa, floor``.
    """

    name: str = Field(description="The method's name in its room's table.")
    params: dict[str, Any] = Field(default_factory=dict, description=(
        "The method's keyword arguments, checked against its parameters at config load."))

    #: what the method is called in error lines ("selector", "buffer"...)
    kind: ClassVar[str] = "method"
    #: config path of the section, in error lines
    path: ClassVar[str] = "method"
    #: parameters the caller passes itself (not settable in params)
    skip: ClassVar[tuple[str, ...]] = ()
    #: whether a user's own ``pkg.module:name`` may be named
    allow_path: ClassVar[bool] = False

    @classmethod
    def table(cls) -> Mapping[str, Any]:
        """The room's name → method table (imported on use: config load loads no method code)."""
        return {}

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data: Any) -> Any:
        return {"name": data} if isinstance(data, str) else data

    @model_validator(mode="after")
    def _check(self) -> Method:
        table = self.table()
        if self.name not in table and not (self.allow_path and ":" in self.name):
            extra = " or 'pkg.module:object'" if self.allow_path else ""
            raise ConfigError(f"{self.path} {self.name!r} does not exist; choose one of {sorted(table)}{extra}")
        self.params = check_component(f"{self.path}.params", self.kind, self.name, table, self.params, self.skip)
        return self

    def typed(self) -> BaseModel:
        """The method's parameter model with ``params`` and every default (:func:`params_model`)."""
        target = resolve_object(self.name, self.table(), self.kind)
        return params_model(target, tuple(sorted(self.skip))).model_validate(self.params)


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
    """Set dotted keys in a nested mapping (in place; returns it). A method written by its name alone
    opens into ``{name: NAME}`` when a key below it is set (``selector: greso`` with
    ``control.selector.params.p_min=0.01`` is ``{name: greso, params: {p_min: 0.01}}``)."""
    for key, value in (overrides or {}).items():
        node = data
        parts = key.split(".")
        for part in parts[:-1]:
            if isinstance(node.get(part), str):
                node[part] = {"name": node[part]}
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
        lines = [_error_line(err) for err in e.errors()]
        raise ConfigError(f"invalid {model.__name__}{where}:\n" + "\n".join(lines)) from e


def _error_line(err: Any) -> str:
    """One line of a validation error: the field and what is wrong; a :class:`ConfigError` raised
    by a validator already names its config path and is shown as it is."""
    cause = (err.get("ctx") or {}).get("error")
    if isinstance(cause, ConfigError):
        return f"  {cause}"
    return f"  {'.'.join(str(x) for x in err['loc']) or '(top level)'}: {err['msg']} [{err['type']}]"


def note_old_shape(old: str, write: str) -> None:
    """The one-line note (``FutureWarning``) of a config key read in an old shape: what was given and
    what to write instead. Example: ``note_old_shape("control.selector_params", "control.selector:
    {name: greso, params: {...}}")``."""
    warnings.warn(f"{old} is the old config shape: write {write} (read that way for now; "
                  "`gfcr config migrate FILE` rewrites a file)", FutureWarning, stacklevel=3)


def flow_yaml(value: Any) -> str:
    """``value`` as one line of YAML (``{kappa: 0.3}``), as a note shows what to write."""
    return yaml.safe_dump(value, default_flow_style=True, width=10**6).strip()


def move_old_params(section: dict[str, Any], where: str, old: str, key: str, default: str | None = None,
                    note: bool = False) -> None:
    """In place: a method's parameters written beside it in the older flat shape (``section[old]``)
    moved under the method (``section[key]: {name, params}``), the one shape of :class:`Method`.

    The method keeps its name; one not named gets ``default`` (the method the config defaults to;
    ``None``: none, and non-empty parameters are refused in one line). Given both ways, the old
    key wins (a ``--set`` in the old spelling over a file in the new one). ``note``: one line per
    key (:func:`note_old_shape`). Example: ``{"verifier": "numeric", "verifier_params": {"lenient_fallback":
    True}}`` becomes ``{"verifier": {"name": "numeric", "params": {"lenient_fallback": True}}}``.
    """
    if old not in section:
        return
    params = section.pop(old) or {}
    given = section.get(key)
    method = {"name": given} if isinstance(given, str) else dict(given) if isinstance(given, dict) else {}
    name = method.get("name", default)
    if name is None:
        if params:
            raise ConfigError(f"{where}.{old} is set but {where}.{key} is not (name the {key} the parameters "
                              f"are for: {where}.{key}: {{name: NAME, params: {{...}}}})")
        return
    if note:
        note_old_shape(f"{where}.{old}", f"{where}.{key}: {{name: {name}, params: {flow_yaml(params)}}}")
    if not params and given is None:
        return  # nothing to move: the method stays the config's default
    method["name"] = name
    method["params"] = {**(method.get("params") or {}), **params}
    section[key] = method


def note_renamed(data: Any, renames: dict[str, str], where: str) -> Any:
    """A one-line deprecation note (``FutureWarning``) for each old key of ``data``, a mapping about to be
    validated by a model that still reads it (its field's ``validation_alias``); ``data`` is returned as is.

    Example: ``note_renamed({"args": {}}, {"args": "params"}, "engine")`` warns "engine.args is
    deprecated: write engine.params (read as engine.params for now)".
    """
    if isinstance(data, dict):
        for old, new in renames.items():
            if old in data:
                warnings.warn(f"{where}.{old} is deprecated: write {where}.{new} (read as {where}.{new} for now)",
                              FutureWarning, stacklevel=2)
    return data

