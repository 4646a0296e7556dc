"""What every ``gfcr`` command shares: the error helper, the clean-up guard and the option helpers
that more than one command group uses. The command modules import this module and no other CLI
module.

Errors. A *user error* (bad config value, missing path, unknown name, a typo in an option value)
ends the command with one line on stderr, ``error: <what is wrong and what to do>``, and exit code
2; ``gfcr --debug CMD`` shows the traceback instead. A command reports its own checks with
:func:`fail`; library exceptions that mean bad input (:func:`is_user_error`) are turned into the
same one line by :class:`GfcrGroup`, the top-level command group. Anything else is a bug and keeps
its traceback (exit code 1).

Nothing left behind. A command that may create a folder (a store, a run folder) wraps its work
in :func:`removed_on_failure`: if the command fails, whatever it created there is removed again.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from typer.core import TyperGroup

#: set by the global ``--debug`` option (or ``GFCR_DEBUG=1``): show tracebacks of user errors
DEBUG = {"on": os.environ.get("GFCR_DEBUG", "") not in ("", "0")}

#: exit code of every user error
USAGE_EXIT = 2

# Library exceptions that mean "the input is wrong", by module and class name. They are checked only
# when their module is already loaded (an exception of a module that was never imported cannot have
# been raised), so that naming them here imports nothing heavy. ``ValueError`` covers ConfigError,
# ImportFormatError, RecordError, AlignError, VerdictError and the library's argument checks;
# ``OSError`` covers missing, unreadable and already-existing paths.
_USER_ERRORS = (
    ("gfcr.store.core", "StoreError"),
    ("gfcr.models", "ModelError"),
    ("gfcr.train.run_setup", "TrainError"),
    ("gfcr.scale.cluster", "ScaleError"),
    ("gfcr.sandbox", "SandboxUnavailable"),
    ("gfcr.generate.sync", "WeightSyncError"),
    ("gfcr.generate.engines.openai", "OpenAIEngineError"),
)


class UserError(Exception):
    """Raised by a command for bad input; printed as one line (prefer :func:`fail` in commands)."""


def one_line(msg: object) -> str:
    """``msg`` on one line: its lines joined (after a colon with a space, else with ``; ``)."""
    parts = [p.strip() for p in str(msg).splitlines() if p.strip()]
    out = ""
    for p in parts:
        out = p if not out else out + (" " if out.endswith(":") else "; ") + p
    return out or type(msg).__name__


def port_in_use(host: str, port: int) -> bool:
    """Whether another socket listens on ``host:port``: a bind test as the server would bind
    (``SO_REUSEADDR``, as uvicorn sets it, so a port left in TIME_WAIT counts as free). Port 0
    (any free port) and a host that does not resolve are left to the server to report."""
    import socket

    if port == 0:
        return False
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror:
        return False
    family, _, _, _, addr = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(addr)
        except OSError:
            return True
    return False


def check_port(host: str, port: int) -> None:
    """End the command in one line when ``port`` on ``host`` is taken (before anything loads)."""
    if port_in_use(host, port):
        fail(f"port {port} on {host} is in use; pick another with --port")


def cli_tokenizer(name: str | None) -> Any:
    """``--tokenizer NAME`` loaded (:func:`gfcr.models.load_tokenizer`: ``default`` is the default
    model's; an uncached hub name offline fails at once), or None; a failure ends the command in one line."""
    if name is None:
        return None
    from gfcr.models import ModelError, load_tokenizer

    try:
        return load_tokenizer(name)
    except (ModelError, OSError, ValueError) as e:
        fail(f"--tokenizer {name!r}: {e}")


def public_help(doc: str) -> str:
    """A command's docstring as ``--help`` shows it: dedented, without the paragraphs written for
    the code's readers (those that start ``Long because``, the house style's note on a long function).

    Example: ``"Do x.\n\n    Long because: y."`` → ``"Do x."``.
    """
    import inspect

    paras = inspect.cleandoc(doc).split("\n\n")
    return "\n\n".join(p for p in paras if not p.lstrip().startswith("Long because")).strip()


def strip_internal_help(app: typer.Typer) -> None:
    """Set every command's help (of ``app`` and its sub-apps) to :func:`public_help` of its docstring."""
    for info in app.registered_commands:
        doc = info.help or (info.callback.__doc__ if info.callback else None)
        if doc and "Long because" in doc:
            info.help = public_help(doc)
    for group in app.registered_groups:
        if group.typer_instance is not None:
            strip_internal_help(group.typer_instance)


def fail(msg: object) -> NoReturn:
    """End the command with ``error: msg`` (one line) on stderr and exit code 2."""
    typer.echo(f"error: {one_line(msg)}", err=True)
    raise typer.Exit(USAGE_EXIT)


def is_user_error(e: BaseException) -> bool:
    """Whether ``e`` means bad input (see the module docstring), not a bug."""
    if isinstance(e, UserError | ValueError | OSError | ImportError):
        return True
    for mod_name, cls_name in _USER_ERRORS:
        mod = sys.modules.get(mod_name)
        cls = getattr(mod, cls_name, None) if mod is not None else None
        if cls is not None and isinstance(e, cls):
            return True
    return False


def _read_damage(e: BaseException) -> str | None:
    """The store's one line for a read that failed inside a damaged data file (None otherwise)."""
    integrity = sys.modules.get("gfcr.store.integrity")  # only when a store was used at all
    return integrity.read_damage(e) if integrity is not None else None


def _describe(e: BaseException) -> str:
    if isinstance(e, FileNotFoundError) and e.filename:
        return f"no such file or folder: {e.filename}; check the path"
    if isinstance(e, ImportError) and not isinstance(e, ModuleNotFoundError):
        return f"{e}; check the 'pkg.module:name' path"
    if isinstance(e, ModuleNotFoundError):
        return f"{e}; install the package or check the 'pkg.module:name' path"
    return str(e) or type(e).__name__


class GfcrGroup(TyperGroup):
    """The top-level ``gfcr`` group: every error ends as one line on stderr (see the module docstring)."""

    def main(self, args: Any = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, **extra: Any) -> Any:
        try:
            rv = super().main(args=args, prog_name=prog_name, complete_var=complete_var, standalone_mode=False,
                              **extra)
            code = rv if isinstance(rv, int) else 0  # an Exit(code) comes back as its code
        except typer.TyperException as e:  # a bad command, option or argument: one line naming it
            code = e.exit_code
            if type(e).__name__ != "NoArgsIsHelpError":  # that one has printed the help already
                ctx = getattr(e, "ctx", None)
                where = f" (see '{ctx.command_path} --help')" if ctx is not None else ""
                typer.echo(f"error: {one_line(e.format_message())}{where}", err=True)
        except typer.Abort:
            typer.echo("error: aborted", err=True)
            code = 1
        except Exception as e:
            damage = _read_damage(e)
            if DEBUG["on"] or not (damage or is_user_error(e)):
                raise
            typer.echo(f"error: {one_line(damage or _describe(e))}", err=True)
            code = USAGE_EXIT
        if standalone_mode:
            sys.exit(code)
        return code


def topmost_new(p: Path) -> Path | None:
    """The highest missing folder on the way to ``p`` (what creating ``p`` would create), or None."""
    p = p.absolute()
    if p.exists():
        return None
    while not p.parent.exists() and p.parent != p:
        p = p.parent
    return p


@contextlib.contextmanager
def removed_on_failure(*paths: str | os.PathLike[str] | None) -> Iterator[None]:
    """Run the body; if it fails, remove what it created at ``paths`` (and at missing folders above
    them). A path that existed before is never touched, nor a remote store URI (``s3://…``: nothing
    local was created). ``typer.Exit(0)`` is not a failure."""
    from gfcr.store.location import is_uri

    new = [t for t in (topmost_new(Path(p)) for p in paths if p is not None and not is_uri(os.fspath(p))) if t is not None]
    try:
        yield
    except BaseException as e:
        if not (isinstance(e, typer.Exit) and e.exit_code == 0):
            for t in new:
                if t.is_dir() and not t.is_symlink():
                    shutil.rmtree(t, ignore_errors=True)
                elif t.exists() or t.is_symlink():
                    t.unlink()
        raise


# ---------------------------------------------------------------------------------------------
# Option helpers shared by several command groups
# ---------------------------------------------------------------------------------------------


def parse_sets(sets: list[str] | None, option: str = "--set") -> dict[str, Any]:
    """``KEY=VALUE`` overrides (values parsed as YAML); a malformed one is a user error."""
    from gfcr.config import ConfigError
    from gfcr.config import parse_sets as _parse

    try:
        return _parse(sets)
    except ConfigError as e:
        fail(str(e).replace("--set", option))


def validated(model: type, data: dict[str, Any], what: str, flags: dict[str, str] | None = None) -> Any:
    """``model.model_validate(data)``; a failure is a user error naming each field (as its flag,
    ``flags``: field → option name, where the values came from flags)."""
    from pydantic import ValidationError

    try:
        return model.model_validate(data)
    except ValidationError as e:
        flags = flags or {}
        fail(f"invalid {what}: " + "; ".join(
            f"{flags.get('.'.join(map(str, err['loc'])), '.'.join(map(str, err['loc'])) or '(top level)')}: {err['msg']}"
            for err in e.errors()))


def echo_json(obj: Any, indent: int | None = None) -> None:
    """Print ``obj`` as JSON on stdout (dates, paths and other objects as strings)."""
    typer.echo(json.dumps(obj, indent=indent, default=json_default))


def json_default(o: Any) -> Any:
    if hasattr(o, "isoformat"):
        return o.isoformat()
    if isinstance(o, bytes):
        return o.hex()
    return str(o)


def quiet_transformers() -> None:
    """No per-file weight loading/saving bars from transformers in our console output."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def foreign_engine_args(engine: str, args: dict[str, Any]) -> list[str]:
    """The keys of ``args`` that engine ``engine`` (a name of :data:`gfcr.generate.engines.ENGINES`)
    does not take, e.g. ``("openai", {"device": "cpu", "max_batch": 32, "timeout_s": 9})`` →
    ``["device", "max_batch"]``. A key ``X_env`` counts as ``X``; an engine that takes ``**kwargs``, one
    not in the table or one whose module does not import keeps them all (it says so when built)."""
    from gfcr.config import params_model, resolve_object
    from gfcr.generate.engines import ENGINES

    if engine not in ENGINES:
        return []
    try:
        model = params_model(resolve_object(engine, ENGINES, "engine"))
    except ImportError:
        return []
    if model.model_config.get("extra") == "allow":
        return []
    allowed = set(model.model_fields)
    return [k for k in args if k not in allowed and not (k.endswith("_env") and k[:-4] in allowed)]


def generate_config(config: Path | None, *, store: str | None = None, run_id: str | None = None,
                    step: int | None = None, seed: int | None = None, batch_prompts: int | None = None,
                    engine: str | None = None, model: str | None = None, base_url: str | None = None,
                    device: str | None = None, topology: str | None = None, k: int | None = None,
                    task: str | None = None, n: int | None = None, level: int | None = None,
                    max_tokens: int | None = None, temperature: float | None = None) -> Any:
    """The ``GenerateConfig`` of a YAML file (optional) with the given flags laid over it (``None`` =
    not given); bad input is a user error. Used by ``gfcr generate`` and ``gfcr scale generate``."""
    from gfcr.config import read_yaml_mapping
    from gfcr.generate.config import GenerateConfig

    data: dict[str, Any] = read_yaml_mapping(config) if config is not None else {}
    for key, val in (("store", store), ("run_id", run_id), ("step", step), ("seed", seed), ("batch_prompts", batch_prompts)):
        if val is not None:
            data[key] = val
    for section in ("engine", "topology"):  # a method written by its name alone opens into {name: NAME}
        if isinstance(data.get(section), str):
            data[section] = {"name": data[section]}
    eng = data.setdefault("engine", {})
    key = "args" if "args" in eng else "params"  # args: the old name (noted when the config loads)
    if engine is not None and engine != eng.get("name", "hf") and eng.get(key):
        dropped = foreign_engine_args(engine, eng[key])
        if dropped:
            eng[key] = {k: v for k, v in eng[key].items() if k not in dropped}
            typer.echo(f"note: --engine {engine}: dropped the config's {eng.get('name', 'hf')} engine params "
                       f"{', '.join(dropped)} ({engine} does not take them)", err=True)
    for key, val in (("name", engine), ("model", model)):
        if val is not None:
            eng[key] = val
    for key, val in (("base_url", base_url), ("device", device)):
        if val is not None:
            eng.setdefault("args" if "args" in eng else "params", {})[key] = val  # args: the old name (noted)
    from gfcr.generate.config import migrate_topology

    topo = data["topology"] = migrate_topology(data.get("topology", {}), "topology", note=True)  # before --k
    if topology is not None:
        topo["name"] = topology
    if k is not None and topo.get("name") != "tree":  # --k is the group/multi_turn size; a tree's is its shape
        topo.setdefault("params", {})["k"] = k
    tasks = data.setdefault("tasks", {})
    if "source" in tasks:  # the older spellings of name/params
        tasks["name"] = tasks.pop("source")
    if "args" in tasks:
        tasks["params"] = tasks.pop("args")
    if task is not None:
        tasks["name"] = task
    targs = tasks.setdefault("params", {} if task is not None else {"n": 8, "level": 1})
    if n is not None:
        targs["n"] = n
    if level is not None:
        targs["level"] = level
    samp = data.setdefault("sampling", {"temperature": 0.7, "max_tokens": 96})
    if max_tokens is not None:
        samp["max_tokens"] = max_tokens
    if temperature is not None:
        samp["temperature"] = temperature
    if "store" not in data:
        fail("give --store or 'store:' in the config")
    return validated(GenerateConfig, data, "generate config")


def verify_inputs(store: str, verifier: str, options: str | None) -> tuple[Any, Any, dict[str, Any]]:
    """The opened store, the verifier and its options (``--options`` JSON) of a verify command; bad
    input is a user error naming the option. Used by ``gfcr verify`` and ``gfcr scale verify``."""
    from gfcr.filters.verifiers import get_verifier
    from gfcr.store import RolloutStore

    try:
        cfg = json.loads(options) if options else {}
    except json.JSONDecodeError as e:
        fail(f"--options is not valid JSON ({e}); e.g. --options '{{\"timeout_s\": 3}}'")
    if not isinstance(cfg, dict):
        fail("--options must be a JSON object, e.g. --options '{\"timeout_s\": 3}'")
    try:
        v = get_verifier(verifier, **cfg)
    except (ValueError, TypeError) as e:
        fail(f"--verifier {verifier!r}: {e}")
    return RolloutStore.open(store), v, cfg


# --- the sampling flags `gfcr generate` and `gfcr scale generate` share (they override a GenerateConfig) ---
GenConfigArg = Annotated[Path | None, typer.Argument(help="YAML GenerateConfig (flags override it).")]
StoreOpt = Annotated[str | None, typer.Option(help="Store directory or s3://, gs://, az:// URI (created if missing).")]
ModelOpt = Annotated[str | None, typer.Option(help="Model dir/name (default: SmolLM2-135M-Instruct).")]
EngineOpt = Annotated[str | None, typer.Option(help="Engine: hf, openai, vllm, ray.")]
BaseUrlOpt = Annotated[str | None, typer.Option(help="openai engine: server URL (http://127.0.0.1:8000/v1).")]
DeviceOpt = Annotated[str | None, typer.Option(help="hf engine device (cpu, cuda).")]
TopologyOpt = Annotated[str | None, typer.Option(help="group, tree or multi_turn.")]
KOpt = Annotated[int | None, typer.Option(help="Samples per prompt (group/multi_turn; a tree's shape sets its size).")]
TaskOpt = Annotated[str | None, typer.Option(help="Task source (arith, reasoning_gym, jsonl_math, jsonl_code).")]
NOpt = Annotated[int | None, typer.Option(help="Number of prompts (arith/reasoning_gym).")]
LevelOpt = Annotated[int | None, typer.Option(help="arith difficulty level.")]
MaxTokensOpt = Annotated[int | None, typer.Option(help="Most new tokens per sample.")]
TemperatureOpt = Annotated[float | None, typer.Option(help="Sampling temperature.")]
RunIdOpt = Annotated[str | None, typer.Option(help="Run id (default: new).")]
StepOpt = Annotated[int | None, typer.Option(help="Training step to record.")]
SeedOpt = Annotated[int | None, typer.Option(help="Base seed.")]
QuietOpt = Annotated[bool, typer.Option(help="No progress bar.")]


@contextlib.contextmanager
def import_progress(enabled: bool, console: Any = None) -> Iterator[Callable[[str, int, int], None] | None]:
    """A bar on stderr over an import's files, ``reading`` (parsed and checked) then ``writing``
    (committed), removed when done; yields the ``progress`` callback of
    :func:`gfcr.formats.import_rollouts` (None when not ``enabled``, e.g. stderr is no terminal)."""
    if not enabled:
        yield None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("files"),
                   TimeElapsedColumn(), console=console or Console(stderr=True), transient=True)
    tasks: dict[str, Any] = {}

    def progress(stage: str, done: int, total: int) -> None:
        if stage not in tasks:
            tasks[stage] = bar.add_task("reading" if stage == "read" else "writing", total=total)
        bar.update(tasks[stage], completed=done)
        if stage == "read" and done == total and "write" not in tasks:  # "writing 0/N" while it commits
            tasks["write"] = bar.add_task("writing", total=total)

    progress.bar = bar  # type: ignore[attr-defined] - for a caller that looks at the counts
    with bar:
        yield progress
