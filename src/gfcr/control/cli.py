"""CLI commands of gfcr.control (registered by gfcr.cli)."""

from __future__ import annotations

from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    """Add this room's commands to the top-level app."""

    @app.command("simulate")
    def simulate_cmd(
        config: Path = typer.Argument(..., help="YAML simulator config (see configs/simulate-*.yaml)"),
        out: Path = typer.Option(None, "--out", "-o", help="new output folder for results.json and the plot"),
        no_plot: bool = typer.Option(False, "--no-plot", help="skip the matplotlib PNG"),
    ) -> None:
        """Compare Control/Replay strategies in a model-free simulator (same seed and token budget)."""
        from pydantic import ValidationError

        from gfcr.sim.simulator import format_table, load_config, simulate

        try:
            cfg = load_config(config)
        except (FileNotFoundError, ValidationError) as e:
            typer.echo(f"error: {e}", err=True)
            raise typer.Exit(2) from e
        try:
            report = simulate(cfg, out_dir=out, plot=not no_plot)
        except FileExistsError as e:
            typer.echo(f"error: {e}", err=True)
            raise typer.Exit(2) from e
        typer.echo(format_table(report))
        if out is not None:
            typer.echo(f"wrote {out / 'results.json'}" + ("" if no_plot else f" and {out / 'learning_curves.png'}"))
