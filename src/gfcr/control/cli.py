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
        from gfcr.config import ConfigError
        from gfcr.sim.simulator import format_table, load_config, simulate

        try:
            cfg = load_config(config)
        except ConfigError as e:
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

    @app.command("retrieve")
    def retrieve_cmd(
        store: Path = typer.Argument(..., help="rollout store folder"),
        text: str = typer.Argument(None, help="query text (omit with --index to only index)"),
        k: int = typer.Option(4, "--k", "-k", help="how many neighbours"),
        embed: str = typer.Option("hash", "--embed", help="embedder: hash, minilm, or pkg.mod:obj"),
        segments: bool = typer.Option(False, "--segments", help="index / search solution steps, not whole prompts"),
        index: bool = typer.Option(False, "--index", help="first index the store's solved rollouts (new ones only)"),
        run: str = typer.Option(None, "--run", help="with --index: only this run's rollouts"),
    ) -> None:
        """Nearest solved prompts (or solution steps) to TEXT from the store's retrieval tables."""
        from gfcr.replay.retrieval import Retrieval
        from gfcr.store import RolloutStore, StoreError

        try:
            st = RolloutStore.open(store)
            ret = Retrieval.for_store(st, embed=embed, segments=segments)
        except (StoreError, FileNotFoundError, ValueError, ImportError) as e:
            typer.echo(f"error: {e}", err=True)
            raise typer.Exit(2) from e
        if index:
            rs = st.rollouts(run=run)  # Retrieval keeps the correct ones (verdict, else reward)
            n = ret.add(rs)
            typer.echo(f"indexed {n} new solved rollouts" + (f" ({ret.n_segments()} steps in all)" if segments else ""))
        if text is None:
            if not index:
                typer.echo("error: give a query TEXT or --index", err=True)
                raise typer.Exit(2)
            return
        hits = ret.nearest_segments(text, k) if segments else ret.nearest(text, k)
        if not hits:
            typer.echo("no indexed solved rollouts; run with --index first")
        for h in hits:
            where = f"{h.prompt_id} {h.rollout_id}" + (f" step {h.segment}" if segments else "")
            typer.echo(f"{h.distance:.4f}  {where}  {h.text[:120]!r}")
