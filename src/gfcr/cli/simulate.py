"""``gfcr simulate`` (the model-free Control/Replay simulator, :mod:`gfcr.sim`) and ``gfcr retrieve``
(nearest solved prompts or solution steps, :mod:`gfcr.replay.retrieval`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from .common import fail


def simulate_cmd(
    config: Annotated[Path, typer.Argument(help="YAML simulator config (see configs/simulate-*.yaml)")],
    out: Annotated[Path | None, typer.Option("--out", "-o", help="new output folder for results.json and the plot")] = None,
    no_plot: Annotated[bool, typer.Option("--no-plot", help="skip the matplotlib PNG")] = False,
) -> None:
    """Compare Control/Replay strategies in a model-free simulator (same seed and token budget)."""
    from gfcr.sim.simulator import format_table, load_config, simulate

    report = simulate(load_config(config), out_dir=out, plot=not no_plot)
    typer.echo(format_table(report))
    if out is not None:
        typer.echo(f"wrote {out / 'results.json'}" + ("" if no_plot else f" and {out / 'learning_curves.png'}"))


def retrieve_cmd(
    store: Annotated[Path, typer.Argument(help="rollout store folder")],
    text: Annotated[str | None, typer.Argument(help="query text (omit with --index to only index)")] = None,
    k: Annotated[int, typer.Option("--k", "-k", help="how many neighbours")] = 4,
    embed: Annotated[str, typer.Option("--embed", help="embedder: hash, minilm, or pkg.mod:obj")] = "hash",
    segments: Annotated[bool, typer.Option("--segments", help="index / search solution steps, not whole prompts")] = False,
    index: Annotated[bool, typer.Option("--index", help="first index the store's solved rollouts (new ones only)")] = False,
    run: Annotated[str | None, typer.Option("--run", help="with --index: only this run's rollouts")] = None,
) -> None:
    """Nearest solved prompts (or solution steps) to TEXT from the store's retrieval tables."""
    from gfcr.replay.retrieval import Retrieval
    from gfcr.store import RolloutStore

    if text is None and not index:
        fail("give a query TEXT or --index")
    st = RolloutStore.open(store)
    ret = Retrieval.for_store(st, embed=embed, segments=segments)
    if index:
        rs = st.rollouts(run=run)  # Retrieval keeps the correct ones (verdict, else reward)
        n = ret.add(rs)
        typer.echo(f"indexed {n} new solved rollouts" + (f" ({ret.n_segments()} steps in all)" if segments else ""))
    if text is None:
        return
    hits = ret.nearest_segments(text, k) if segments else ret.nearest(text, k)
    if not hits:
        typer.echo("no indexed solved rollouts; run with --index first")
    for h in hits:
        where = f"{h.prompt_id} {h.rollout_id}" + (f" step {h.segment}" if segments else "")
        typer.echo(f"{h.distance:.4f}  {where}  {h.text[:120]!r}")


def register(app: typer.Typer) -> None:
    """Add ``gfcr simulate`` and ``gfcr retrieve`` to the top-level app."""
    app.command("simulate")(simulate_cmd)
    app.command("retrieve")(retrieve_cmd)
