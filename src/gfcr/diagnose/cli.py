"""CLI commands of gfcr.diagnose (registered by gfcr.cli)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add this room's commands to the top-level app."""
