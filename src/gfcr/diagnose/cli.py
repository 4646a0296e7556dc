"""CLI commands of gfcr.diagnose (registered by gfcr.cli): ``gfcr report`` and ``gfcr view``."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import typer


def _load_configs(config: Path | None):  # noqa: ANN202 - (MetricsConfig, DetectorConfig)
    from gfcr.diagnose.detectors import DetectorConfig
    from gfcr.diagnose.metrics import MetricsConfig

    if config is None:
        return MetricsConfig(), DetectorConfig()
    from pydantic import ValidationError

    from gfcr.config import ConfigError, read_yaml_mapping

    try:
        raw = read_yaml_mapping(config)
    except ConfigError as e:
        raise typer.BadParameter(str(e)) from e
    if set(raw) - {"metrics", "detectors"}:
        raise typer.BadParameter(f"{config}: expected a mapping with keys 'metrics' and/or 'detectors'")
    try:
        return MetricsConfig.model_validate(raw.get("metrics") or {}), DetectorConfig.model_validate(raw.get("detectors") or {})
    except ValidationError as e:
        raise typer.BadParameter(f"{config}: {e}") from e


def report(
    store: Path = typer.Argument(..., help="path of the rollout store"),
    out: Path = typer.Option(Path("report.html"), "--out", "-o", help="HTML file to write"),
    run: str | None = typer.Option(None, "--run", help="only this run (default: every run in the store)"),
    config: Path | None = typer.Option(None, "--config", help="YAML with 'metrics:' and 'detectors:' thresholds"),
    samples: int = typer.Option(3, "--samples", min=0, help="sample rollouts per bucket"),
    force: bool = typer.Option(False, "--force", help="replace --out if it exists"),
) -> None:
    """Write a self-contained HTML report: metrics over steps, detector findings, ROSS tables, samples."""
    from gfcr.diagnose.detectors import detect
    from gfcr.diagnose.metrics import step_metrics
    from gfcr.diagnose.report import write_report
    from gfcr.store import RolloutStore, StoreError

    mcfg, dcfg = _load_configs(config)
    try:
        st = RolloutStore.open(store)
        path = write_report(st, out, run=run, overwrite=force, metrics_config=mcfg, detector_config=dcfg,
                            samples_per_bucket=samples)
    except (StoreError, FileExistsError, ValueError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from e
    findings = detect(step_metrics(st, run=run, config=mcfg), dcfg)
    for f in findings:
        typer.echo(f"[{f.severity}] {f.run_id}: {f.title} — {f.message}")
    typer.echo(str(path.resolve()))


def view(
    store: Path = typer.Argument(..., help="path of the rollout store"),
    host: str = typer.Option("127.0.0.1", "--host", help="address to listen on (loopback by default)"),
    port: int = typer.Option(8765, "--port", min=0, max=65535, help="port to listen on"),
    tokenizer: str | None = typer.Option(None, "--tokenizer", help="HF tokenizer dir/name to decode tokens (optional)"),
) -> None:
    """Browse the store's rollouts in a local, read-only web app."""
    import uvicorn

    from gfcr.diagnose.viewer import create_app
    from gfcr.store import StoreError

    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host == "localhost"
    if not loopback:
        typer.echo(f"warning: listening on {host}: anyone who can reach it can read every rollout in {store}", err=True)
    try:
        app = create_app(store, tokenizer=tokenizer,
                         allowed_hosts=sorted({"localhost", "127.0.0.1", "::1", host}) if loopback else None)
    except StoreError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from e
    typer.echo(f"gfcr viewer on http://{host}:{port}/ (Ctrl-C to stop)")
    uvicorn.run(app, host=host, port=port, log_level="warning")


def register(app: typer.Typer) -> None:
    """Add this room's commands to the top-level app."""
    app.command("report")(report)
    app.command("view")(view)
