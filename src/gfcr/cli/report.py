"""``gfcr report`` (the HTML report, :mod:`gfcr.diagnose.report`) and ``gfcr view`` (the read-only
browser, :mod:`gfcr.diagnose.viewer`)."""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Annotated

import typer

from .common import fail


def _load_configs(config: Path | None):  # noqa: ANN202 - (MetricsConfig, DetectorConfig)
    from gfcr.diagnose.detectors import DetectorConfig
    from gfcr.diagnose.metrics import MetricsConfig

    if config is None:
        return MetricsConfig(), DetectorConfig()
    from pydantic import ValidationError

    from gfcr.config import read_yaml_mapping

    raw = read_yaml_mapping(config)
    if set(raw) - {"metrics", "detectors"}:
        fail(f"--config {config}: expected a mapping with keys 'metrics' and/or 'detectors'")
    try:
        return MetricsConfig.model_validate(raw.get("metrics") or {}), DetectorConfig.model_validate(raw.get("detectors") or {})
    except ValidationError as e:
        fail(f"--config {config}: " + "; ".join(f"{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors()))


def report(
    store: Annotated[Path, typer.Argument(help="path of the rollout store")],
    out: Annotated[Path, typer.Option("--out", "-o", help="HTML file to write")] = Path("report.html"),
    run: Annotated[str | None, typer.Option("--run", help="only this run (default: every run in the store)")] = None,
    config: Annotated[Path | None, typer.Option("--config", help="YAML with 'metrics:' and 'detectors:' thresholds")] = None,
    samples: Annotated[int, typer.Option("--samples", min=0, help="sample rollouts per bucket")] = 3,
    force: Annotated[bool, typer.Option("--force", help="replace --out if it exists")] = False,
) -> None:
    """Write a self-contained HTML report: metrics over steps, detector findings, ROSS tables, samples."""
    from gfcr.diagnose.detectors import detect
    from gfcr.diagnose.metrics import step_metrics
    from gfcr.diagnose.report import write_report
    from gfcr.store import RolloutStore

    mcfg, dcfg = _load_configs(config)
    st = RolloutStore.open(store)
    path = write_report(st, out, run=run, overwrite=force, metrics_config=mcfg, detector_config=dcfg,
                        samples_per_bucket=samples)
    findings = detect(step_metrics(st, run=run, config=mcfg), dcfg)
    for f in findings:
        typer.echo(f"[{f.severity}] {f.run_id}: {f.title} — {f.message}")
    typer.echo(str(path.resolve()))


def view(
    store: Annotated[Path, typer.Argument(help="path of the rollout store")],
    host: Annotated[str, typer.Option("--host", help="address to listen on (loopback by default)")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=0, max=65535, help="port to listen on")] = 8765,
    tokenizer: Annotated[str | None, typer.Option("--tokenizer", help="HF tokenizer dir/name to decode tokens (optional)")] = None,
) -> None:
    """Browse the store's rollouts in a local, read-only web app."""
    import uvicorn

    from gfcr.diagnose.viewer import create_app

    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host.lower().rstrip(".") == "localhost"
    if not loopback:
        typer.echo(f"warning: listening on {host}: anyone who can reach it can read every rollout in {store}", err=True)
    app = create_app(store, tokenizer=tokenizer,
                     allowed_hosts=sorted({"localhost", "127.0.0.1", "::1", host}) if loopback else None)
    typer.echo(f"gfcr viewer on http://{host}:{port}/ (Ctrl-C to stop)")
    uvicorn.run(app, host=host, port=port, log_level="warning")


def register(app: typer.Typer) -> None:
    """Add ``gfcr report`` and ``gfcr view`` to the top-level app."""
    app.command("report")(report)
    app.command("view")(view)
