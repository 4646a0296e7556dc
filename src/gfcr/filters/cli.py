"""CLI commands of gfcr.filters (registered by gfcr.cli)."""

from __future__ import annotations

import json

import typer


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
        from gfcr.store import RolloutStore, StoreError

        from .apply import reverify_store
        from .verifiers import get_verifier

        try:
            cfg = json.loads(options) if options else {}
            v = get_verifier(verifier, **cfg)
        except (ValueError, TypeError) as e:
            raise typer.BadParameter(str(e)) from e
        try:
            st = RolloutStore.open(store)
        except StoreError as e:
            raise typer.BadParameter(str(e), param_hint="STORE") from e
        summary = reverify_store(st, v, where=where, workers=workers, progress=True)
        typer.echo(json.dumps(summary))
