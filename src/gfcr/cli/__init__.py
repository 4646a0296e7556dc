"""`gfcr` command line: the only place that imports typer. Every command is a thin wrapper over a
public library function.

One module per command group, each with a ``register(app)`` that adds its commands:

    store     gfcr store init|import|export|export-sft|stats|query|versions|compact|walkthrough
    generate  gfcr generate, gfcr serve, gfcr model pull
    verify    gfcr verify
    train     gfcr train, gfcr eval, gfcr demo
    ross      gfcr ross run|select|audit|align|build|train|evaluate|analyze
    simulate  gfcr simulate, gfcr retrieve
    report    gfcr report, gfcr view
    scale     gfcr scale generate|verify
    config    gfcr config migrate

They share :mod:`gfcr.cli.common` (the error helper, the clean-up guard, option helpers) and import
no other CLI module. Heavy imports (torch, transformers) happen inside the command bodies so that
``gfcr --help`` and the store commands stay fast.
"""

from __future__ import annotations

import os
from typing import Annotated

# OpenMP threads that spin while waiting make torch on a shared or busy CPU several times slower
# (measured here: a 4-prompt greedy eval took 21.9 s with the default spin policy and 8.0 s with
# PASSIVE while one other process was busy). Set before torch loads; an explicit setting wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import warnings  # noqa: E402

import typer  # noqa: E402

_format_warning = warnings.formatwarning


def _one_line_note(message, category, filename, lineno, line=None) -> str:  # noqa: ANN001
    """A config note (``FutureWarning``: an old key read, what to write instead) as one ``note:`` line
    on stderr, not Python's two-line warning with the source line."""
    if issubclass(category, FutureWarning):
        return f"note: {message}\n"
    return _format_warning(message, category, filename, lineno, line)


from . import config, generate, report, ross, scale, simulate, store, train, verify  # noqa: E402
from .common import DEBUG, GfcrGroup, strip_internal_help  # noqa: E402

app = typer.Typer(
    name="gfcr",
    cls=GfcrGroup,
    help="Rollouts as first-class data for LLM RL post-training: Generate, Filter, Control, Replay, ROSS.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # click's plain help layout: it wraps option help under long option names at any width (rich's
    # option table cut names such as --allow-weight-updates at 80 columns)
    rich_markup_mode=None,
)


def _version(value: bool) -> None:
    """``gfcr --version``: the installed package's version (its metadata, as pip reports it)."""
    if not value:
        return
    from importlib.metadata import PackageNotFoundError, version

    try:
        typer.echo(f"gfcr {version('gfcr')}")
    except PackageNotFoundError:  # run from a source tree that was never installed
        from gfcr import __version__

        typer.echo(f"gfcr {__version__} (source tree, not installed)")
    raise typer.Exit(0)


@app.callback()
def _root(
    debug: Annotated[bool, typer.Option("--debug", help="Show the full traceback of an error (also GFCR_DEBUG=1).")] = False,
    version: Annotated[bool, typer.Option("--version", is_eager=True, callback=_version, expose_value=True,
                                          help="Print gfcr's version and exit.")] = False,
) -> None:
    """Rollouts as first-class data for LLM RL post-training: Generate, Filter, Control, Replay, ROSS."""
    if debug:
        DEBUG["on"] = True
    warnings.formatwarning = _one_line_note  # type: ignore[assignment]


for _group in (store, generate, verify, train, ross, simulate, report, scale, config):
    _group.register(app)
strip_internal_help(app)  # "Long because" notes are for the code's readers, not --help


def main() -> None:
    app()


if __name__ == "__main__":
    main()
