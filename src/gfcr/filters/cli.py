"""CLI commands of gfcr.filters (registered by gfcr.cli)."""

from __future__ import annotations

import json
from typing import Any

import typer


def open_verify_inputs(store: str, verifier: str, options: str | None) -> tuple[Any, Any, dict[str, Any]]:
    """The opened store, the verifier and its options (``--options`` JSON) of a verify command; bad
    input is a usage error naming the option. Shared by ``gfcr verify`` and ``gfcr scale verify``."""
    from gfcr.store import RolloutStore, StoreError

    from .verifiers import get_verifier

    try:
        cfg = json.loads(options) if options else {}
        if not isinstance(cfg, dict):
            raise ValueError("--options must be a JSON object")
        v = get_verifier(verifier, **cfg)
    except (ValueError, TypeError) as e:
        raise typer.BadParameter(str(e)) from e
    try:
        st = RolloutStore.open(store)
    except StoreError as e:
        raise typer.BadParameter(str(e), param_hint="STORE") from e
    return st, v, cfg


def register(app: typer.Typer) -> None:
    """Add this room's commands to the top-level app."""

    @app.command("verify")
    def verify_cmd(
        store: str = typer.Argument(..., help="Path of an existing rollout store."),
        verifier: str = typer.Option(..., "--verifier", "-v", help="Verifier name (math, exact, numeric, format, code, env, composite)."),
        where: str | None = typer.Option(None, "--where", help="SQL filter on rollouts, e.g. \"task = 'arith' AND step >= 3\"."),
        options: str | None = typer.Option(None, "--options", help="Verifier config as JSON, e.g. '{\"timeout_s\": 3}'."),
        workers: int = typer.Option(1, "--workers", "-w", min=1, help="Parallel verification workers."),
    ) -> None:
        """Re-verify stored rollouts against the prompts table's answers/tests; writes a new store version."""
        from .apply import reverify_store

        st, v, _ = open_verify_inputs(store, verifier, options)
        summary = reverify_store(st, v, where=where, workers=workers, progress=True)
        typer.echo(json.dumps(summary))
