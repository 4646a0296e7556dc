"""`gfcr` command line. Every command is a thin wrapper over a public library function.

Each room (store, generate, filters, control, train, ross, diagnose) owns a ``cli.py`` with a
``register(app)`` function that adds its commands; heavy imports (torch, transformers) happen
inside the command bodies so that ``gfcr --help`` and the store commands stay fast.
"""

from __future__ import annotations

import importlib
import os

# OpenMP threads that spin while waiting make torch on a shared or busy CPU several times slower
# (measured here: a 4-prompt greedy eval took 21.9 s with the default spin policy and 8.0 s with
# PASSIVE while one other process was busy). Set before torch loads; an explicit setting wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import typer

app = typer.Typer(
    name="gfcr",
    help="Rollouts as first-class data for LLM RL post-training: Generate, Filter, Control, Replay, ROSS.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

ROOMS = (
    "gfcr.store.cli",
    "gfcr.generate.cli",
    "gfcr.filters.cli",
    "gfcr.control.cli",
    "gfcr.train.cli",
    "gfcr.ross.cli",
    "gfcr.diagnose.cli",
    "gfcr.scale.cli",
)

for _mod in ROOMS:
    importlib.import_module(_mod).register(app)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
