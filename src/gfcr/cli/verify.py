"""``gfcr verify``: re-verify stored rollouts (a thin wrapper over :func:`gfcr.filters.apply.reverify_store`)."""

from __future__ import annotations

from typing import Annotated

import typer

from .common import echo_json, verify_inputs

VERIFIERS_HELP = "Verifier name (math, exact, numeric, format, code, env, composite)."


def verify_cmd(
    store: Annotated[str, typer.Argument(help="Path of an existing rollout store.")],
    verifier: Annotated[str, typer.Option("--verifier", "-v", help=VERIFIERS_HELP)],
    where: Annotated[str | None, typer.Option(
        "--where", help="SQL filter on rollouts, e.g. \"task = 'arith' AND step >= 3\".")] = None,
    options: Annotated[str | None, typer.Option(
        "--options", help="Verifier config as JSON, e.g. '{\"timeout_s\": 3}'.")] = None,
    workers: Annotated[int, typer.Option("--workers", "-w", min=1, help="Parallel verification workers.")] = 1,
) -> None:
    """Re-verify stored rollouts against the prompts table's answers/tests; writes a new store version."""
    from gfcr.filters.apply import reverify_store

    st, v, _ = verify_inputs(store, verifier, options)
    echo_json(reverify_store(st, v, where=where, workers=workers, progress=True))


def register(app: typer.Typer) -> None:
    """Add ``gfcr verify`` to the top-level app."""
    app.command("verify")(verify_cmd)
