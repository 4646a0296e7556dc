"""``gfcr ross run|select|audit|align|build|train|evaluate|analyze``: thin wrappers over :mod:`gfcr.ross`.

Every command reads the same YAML config (:class:`gfcr.ross.config.RossConfig`); stages after
``audit`` read and write a run folder (``--run-dir``; ``run`` creates a new one).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from .common import echo_json, parse_sets

ross_app = typer.Typer(help="ROSS: relearn from stored self-generated rollouts with selective, token-masked SFT.",
                       no_args_is_help=True)

Config = Annotated[Path, typer.Argument(help="ROSS config YAML (see configs/ross-*.yaml).", exists=True, dir_okay=False)]
Sets = Annotated[list[str] | None, typer.Option(
    "--set", help="Override a config field, e.g. --set train.epochs=1 (value parsed as YAML).")]
RunDir = Annotated[Path, typer.Option("--run-dir", help="The run folder (written by `gfcr ross run` or an earlier stage).")]


def _cfg(path: Path, sets: list[str] | None) -> Any:
    from gfcr.ross.config import load_config

    return load_config(path, parse_sets(sets))


def _print(obj: Any) -> None:
    echo_json(obj, indent=2)


@ross_app.command("run")
def run_cmd(config: Config, set_: Sets = None, run_dir: Annotated[Path | None, typer.Option(
        "--run-dir", help="Reuse this run folder instead of creating a new one.")] = None) -> None:
    """Run every configured stage; prints the comparison table."""
    from gfcr.ross.pipeline import run_ross

    res = run_ross(_cfg(config, set_), run_dir=run_dir, progress=True, log=typer.echo)
    typer.echo(res.table)
    typer.echo(f"run folder: {res.run_dir}")


@ross_app.command("select")
def select_cmd(config: Config, set_: Sets = None) -> None:
    """Count the verified-successful rollouts of the window (after dedup)."""
    from gfcr.ross.pipeline import open_store, stage_select

    cfg = _cfg(config, set_)
    rs = stage_select(cfg, open_store(cfg))
    steps = sorted({r.step for r in rs})
    _print({"rollouts": len(rs), "prompts": len({r.prompt_id for r in rs}),
            "steps": [steps[0], steps[-1]] if steps else None})


@ross_app.command("audit")
def audit_cmd(config: Config, set_: Sets = None) -> None:
    """Audit the selected rollouts with the configured judge; resumes where it stopped."""
    from gfcr.ross.pipeline import load_tokenizer, open_store, stage_audit, stage_select

    cfg = _cfg(config, set_)
    store = open_store(cfg)
    _print(stage_audit(cfg, store, stage_select(cfg, store), load_tokenizer(cfg, store), progress=True))


@ross_app.command("align")
def align_cmd(config: Config, set_: Sets = None) -> None:
    """Recompute the stored audits' token masks and TER from their excluded spans."""
    from gfcr.ross.audit import realign
    from gfcr.ross.pipeline import load_tokenizer, make_configured_judge, open_store

    cfg = _cfg(config, set_)
    j = make_configured_judge(cfg)
    store = open_store(cfg)
    _print(realign(store, load_tokenizer(cfg, store), j.name, j.version, eos_rule=cfg.judge.eos_rule))


@ross_app.command("build")
def build_cmd(config: Config, run_dir: RunDir, set_: Sets = None,
              no_mask: Annotated[bool, typer.Option("--no-mask", help="Build only the 'ROSS w/o mask' ablation "
                                                    "(the judge's kept rollouts, every generated token supervised).")] = False) -> None:
    """Write the SFT datasets (Parquet + HF) of every variant into RUN_DIR/data."""
    from gfcr.ross.pipeline import open_store, stage_build

    cfg = _cfg(config, set_)
    if no_mask:
        cfg = cfg.model_copy(update={"variants": ["ross_nomask"]})
    _print(stage_build(cfg, open_store(cfg), run_dir))


@ross_app.command("train")
def train_cmd(config: Config, run_dir: RunDir, set_: Sets = None) -> None:
    """Masked SFT of every variant into RUN_DIR/models."""
    from gfcr.ross.pipeline import load_tokenizer, stage_train

    cfg = _cfg(config, set_)
    _print(stage_train(cfg, run_dir, load_tokenizer(cfg), progress=True))


@ross_app.command("evaluate")
def evaluate_cmd(config: Config, run_dir: RunDir, set_: Sets = None) -> None:
    """pass@k with CIs of base, upstream, continued RL and the trained variants; prints the table."""
    from gfcr.ross.analyze import comparison_table
    from gfcr.ross.pipeline import load_tokenizer, open_store, stage_evaluate

    cfg = _cfg(config, set_)
    typer.echo(comparison_table(stage_evaluate(cfg, open_store(cfg), run_dir, load_tokenizer(cfg))))


@ross_app.command("analyze")
def analyze_cmd(config: Config, run_dir: RunDir, set_: Sets = None) -> None:
    """TER by step window vs entropy, exclusion categories early vs late, compatibility, complementarity."""
    from gfcr.ross.pipeline import RossRun, load_tokenizer, open_store, render_report, stage_analyze

    cfg = _cfg(config, set_)
    res = stage_analyze(cfg, open_store(cfg), run_dir, load_tokenizer(cfg))
    typer.echo(render_report(RossRun(run_dir, results={"analyze": res})))


def register(app: typer.Typer) -> None:
    """Add ``gfcr ross …`` to the top-level app."""
    app.add_typer(ross_app, name="ross")
