"""``gfcr report`` (the HTML report, :mod:`gfcr.diagnose.report`), ``gfcr diagnose`` (findings and
rollout health on the terminal, :mod:`gfcr.diagnose.health`) and ``gfcr view`` (the read-only
browser, :mod:`gfcr.diagnose.viewer`)."""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Annotated

import typer

from .common import check_port, cli_tokenizer, fail


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
    store: Annotated[str, typer.Argument(help="the rollout store: a directory or an s3://, gs://, az:// URI")],
    out: Annotated[Path, typer.Option("--out", "-o", help="HTML file to write")] = Path("report.html"),
    run: Annotated[str | None, typer.Option("--run", help="only this run (default: every run in the store)")] = None,
    config: Annotated[Path | None, typer.Option("--config", help="YAML with 'metrics:' and 'detectors:' thresholds")] = None,
    samples: Annotated[int, typer.Option("--samples", min=0, help="sample rollouts per bucket")] = 3,
    force: Annotated[bool, typer.Option("--force", help="replace --out if it exists")] = False,
    tokenizer: Annotated[str | None, typer.Option("--tokenizer", help="HF tokenizer dir/name, or 'default' (the default model's), for the token/text check")] = None,
    judge: Annotated[str | None, typer.Option("--judge", help="whose ROSS audits to show (default: the ROSS judge, "
                                              "not the keep-all control; most audits, then name)")] = None,
) -> None:
    """Write a self-contained HTML report: metrics over steps, detector findings, rollout health, ROSS
    tables, samples."""
    from gfcr.diagnose.audits import resolve_judge
    from gfcr.diagnose.report import write_report
    from gfcr.store import RolloutStore

    mcfg, dcfg = _load_configs(config)
    st = RolloutStore.open(store)
    if out.exists() and not force:
        fail(f"{out} exists; choose another --out or pass --force to replace it")
    try:
        mcfg = mcfg.model_copy(update={"judge": resolve_judge(st, judge or mcfg.judge)[0]})
    except ValueError as e:
        fail(str(e))
    metrics, findings, health = _diagnose(st, run, mcfg, dcfg, cli_tokenizer(tokenizer))
    path = write_report(st, out, run=run, overwrite=force, metrics_config=mcfg, detector_config=dcfg,
                        samples_per_bucket=samples, metrics=metrics, findings=findings, health=health)
    _print(findings, health)
    typer.echo(str(path.resolve()))


def _diagnose(st, run, mcfg, dcfg, tokenizer):  # noqa: ANN001, ANN202 - (metrics, findings, HealthReport)
    """Metrics (once), findings and health checks for ``report`` and ``diagnose``."""
    from gfcr.diagnose.detectors import detect
    from gfcr.diagnose.health import run_health_checks
    from gfcr.diagnose.metrics import step_metrics
    from gfcr.diagnose.report import store_runs

    runs = store_runs(st)
    if run is not None and run not in runs:
        fail(f"no rollouts for run {run!r} in {st.path}; runs in the store: {runs}")
    metrics = step_metrics(st, run=run, config=mcfg)
    return metrics, detect(metrics, dcfg), run_health_checks(st, run=run, tokenizer=tokenizer)


def _print(findings, health) -> None:  # noqa: ANN001
    from gfcr.diagnose.health import CHECKS, TITLES

    for f in findings:
        typer.echo(f"[{f.severity}] {f.run_id}: {f.title} — {f.message}")
    for c in CHECKS:
        if health.counts[c]:
            typer.echo(f"[health] {TITLES[c]}: {health.counts[c]} of {health.checked[c]} rollouts")
            for i in [i for i in health.issues if i.check == c][:5]:
                typer.echo(f"    {i.rollout_id} (run {i.run_id}, step {i.step}): {i.message}")
    for c, why in health.skipped.items():
        typer.echo(f"[health] {TITLES[c]}: skipped — {why}")


def diagnose(
    store: Annotated[str, typer.Argument(help="the rollout store: a directory or an s3://, gs://, az:// URI")],
    run: Annotated[str | None, typer.Option("--run", help="only this run (default: every run in the store)")] = None,
    config: Annotated[Path | None, typer.Option("--config", help="YAML with 'metrics:' and 'detectors:' thresholds")] = None,
    tokenizer: Annotated[str | None, typer.Option("--tokenizer", help="HF tokenizer dir/name, or 'default' (the default model's), for the token/text check")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print findings and health as JSON")] = False,
) -> None:
    """Print the detector findings and the rollout health checks (each with its evidence)."""
    import json

    from gfcr.store import RolloutStore

    mcfg, dcfg = _load_configs(config)
    st = RolloutStore.open(store)
    _, findings, health = _diagnose(st, run, mcfg, dcfg, cli_tokenizer(tokenizer))
    if as_json:
        from gfcr.diagnose.viewer import jsonable

        typer.echo(json.dumps(jsonable({"findings": [f.to_dict() for f in findings], "health": health.to_dict()}),
                              default=str, allow_nan=False))
        return
    _print(findings, health)
    if not findings and health.clean:
        typer.echo("no finding, no health issue")


def view(
    store: Annotated[str, typer.Argument(help="the rollout store: a directory or an s3://, gs://, az:// URI")],
    host: Annotated[str, typer.Option("--host", help="address to listen on (loopback by default)")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=0, max=65535, help="port to listen on")] = 8765,
    tokenizer: Annotated[str | None, typer.Option("--tokenizer", help="HF tokenizer dir/name, or 'default', to decode tokens (optional)")] = None,
) -> None:
    """Browse the store's rollouts in a local, read-only web app."""
    import uvicorn

    from gfcr.diagnose.viewer import create_app

    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host.lower().rstrip(".") == "localhost"
    check_port(host, port)  # before the store opens and before a URL is announced
    if not loopback:
        typer.echo(f"warning: listening on {host}: anyone who can reach it can read every rollout in {store}", err=True)
    app = create_app(store, tokenizer=cli_tokenizer(tokenizer),
                     allowed_hosts=sorted({"localhost", "127.0.0.1", "::1", host}) if loopback else None)
    typer.echo(f"gfcr viewer on http://{host}:{port}/ (Ctrl-C to stop)")
    uvicorn.run(app, host=host, port=port, log_level="warning")


def register(app: typer.Typer) -> None:
    """Add ``gfcr report`` and ``gfcr view`` to the top-level app."""
    app.command("report")(report)
    app.command("diagnose")(diagnose)
    app.command("view")(view)
