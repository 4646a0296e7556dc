"""``gfcr demo``: the main job, as a list of named stages other rooms can extend.

Stages run in order over one :class:`DemoContext`:

    model   pull/convert the default model (SmolLM2-135M-Instruct) once into the cache
    train   evaluate the base policy on held-out arith, RL a few steps on CPU with every rollout
            in a store under ``runs/``, evaluate again (``gfcr.train.loop.train`` does all three)
    summary print where everything is

Extending it (ROSS, the HTML report): write ``def my_stage(ctx: DemoContext) -> None`` and register
it with :func:`add_demo_stage` (``after="train"`` to run right after training, default: before the
summary); anything put in ``ctx.outputs`` (name → path) is printed by the summary. A room registers
its stage when its module is imported; list that module in :data:`DEMO_EXTENSIONS` so that
``gfcr demo`` imports it. Every listed module must import: a missing or broken extension stops the
demo before any stage runs (:class:`DemoError`), instead of silently dropping its stage.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gfcr.train.config import TrainConfig, load_config

#: modules imported by ``run_demo`` so that they can call :func:`add_demo_stage` (e.g. "gfcr.ross.demo")
DEMO_EXTENSIONS: list[str] = ["gfcr.ross.demo", "gfcr.diagnose.demo"]


@dataclass
class DemoContext:
    """What the stages share. ``outputs`` (name → path or value) is printed at the end."""

    cfg: TrainConfig
    full: bool
    console: Any
    model_path: str | None = None
    run_dir: Path | None = None
    store_path: Path | None = None
    metrics_path: Path | None = None
    result: Any = None
    outputs: dict[str, Any] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    cpu_seconds: dict[str, float] = field(default_factory=dict)


DemoStage = Callable[[DemoContext], None]


def demo_config(full: bool = False, output_dir: str = "runs", model: str = "default") -> TrainConfig:
    """The demo's config: sized for ≤ 10 minutes on 2 CPU cores (``full``: a longer run)."""
    base = {
        "run_name": "demo-full" if full else "demo",
        "output_dir": output_dir,
        "model": model,
        "steps": 20 if full else 4,
        # one-digit sums (only ~100 exist) and two-digit sums: the base model solves some of each
        "tasks": [
            {"name": "arith", "n_train": 64, "n_eval": 8, "params": {"level": 1}},
            {"name": "arith", "n_train": 192, "n_eval": 56 if full else 24, "params": {"level": 2}},
        ],
        "generate": {"k": 4, "prompts_per_step": 8 if full else 4, "max_tokens": 64, "temperature": 0.7},
        "loss": {"agg": "seq-mean-token-mean", "clip_low": 0.2, "clip_high": 0.28},
        "optim": {"lr": 2e-6, "micro_batch": 4},
        "checkpoint": {"every": 5 if full else 4},
        "eval": {"before": True, "after": True, "k": 4 if full else 2, "greedy": True, "max_tokens": 64},
    }
    return load_config(None, base)


def stage_model(ctx: DemoContext) -> None:
    from gfcr.models import resolve_model

    ctx.model_path = resolve_model(None if ctx.cfg.model == "default" else ctx.cfg.model)
    ctx.outputs["model"] = ctx.model_path


def stage_train(ctx: DemoContext) -> None:
    from gfcr.train.loop import train

    res = train(ctx.cfg, progress=True)
    ctx.result = res
    ctx.run_dir, ctx.store_path, ctx.metrics_path = res.run_dir, res.store_path, res.metrics_path
    ctx.outputs.update({"run dir": res.run_dir, "store": res.store_path, "metrics": res.metrics_path,
                        "checkpoint": res.checkpoint})
    for name, ev in (("base", res.eval_before), ("after RL", res.eval_after)):
        if ev is not None:
            ctx.console.print(f"held-out {name}: {ev.summary()}")
    if (res.run_dir / "eval_before.json").exists():
        ctx.outputs["eval (base)"] = res.run_dir / "eval_before.json"
    if (res.run_dir / "eval_after.json").exists():
        ctx.outputs["eval (after)"] = res.run_dir / "eval_after.json"


def stage_summary(ctx: DemoContext) -> None:
    from rich.table import Table

    t = Table(title="gfcr demo: where everything is")
    t.add_column("what")
    t.add_column("where")
    for k, v in ctx.outputs.items():
        t.add_row(k, str(v))
    ctx.console.print(t)
    ctx.console.print("stage seconds (wall): " + ", ".join(f"{k} {v:.0f}" for k, v in ctx.seconds.items()))
    ctx.console.print("stage seconds (CPU, this process, all threads): "
                      + ", ".join(f"{k} {v:.0f}" for k, v in ctx.cpu_seconds.items()))


DEMO_STAGES: list[tuple[str, DemoStage]] = [("model", stage_model), ("train", stage_train), ("summary", stage_summary)]


def add_demo_stage(name: str, fn: DemoStage, after: str | None = None) -> None:
    """Register a demo stage (idempotent by name); ``after=None`` puts it just before ``summary``."""
    names = [n for n, _ in DEMO_STAGES]
    if name in names:
        DEMO_STAGES[names.index(name)] = (name, fn)
        return
    anchor = after if after is not None else names[names.index("summary") - 1]
    if anchor not in names:
        raise ValueError(f"no demo stage {anchor!r} to insert after; stages: {names}")
    DEMO_STAGES.insert(names.index(anchor) + 1, (name, fn))


class DemoError(RuntimeError):
    """The demo cannot run as configured; the message names the stage or extension."""


def load_extensions(modules: list[str] | None = None) -> None:
    """Import every demo extension module (default :data:`DEMO_EXTENSIONS`) so it registers its stage.

    Raises :class:`DemoError` naming the module when one is missing or fails to import.
    """
    for mod in DEMO_EXTENSIONS if modules is None else modules:
        try:
            importlib.import_module(mod)
        except Exception as e:  # any import failure of an extension is fatal, with its name
            raise DemoError(
                f"demo extension {mod!r} (listed in gfcr.train.demo.DEMO_EXTENSIONS) failed to import: "
                f"{type(e).__name__}: {e}. Fix the module or remove it from DEMO_EXTENSIONS."
            ) from e


def run_demo(full: bool = False, output_dir: str = "runs", model: str = "default",
             only: list[str] | None = None, console: Any = None) -> DemoContext:
    """Run the demo stages in order; returns the context (paths, results, timings)."""
    from rich.console import Console

    console = console or Console()
    load_extensions()
    ctx = DemoContext(cfg=demo_config(full, output_dir, model), full=full, console=console)
    for name, fn in list(DEMO_STAGES):
        if only is not None and name not in only and name != "summary":
            continue
        console.rule(f"demo: {name}")
        t0, c0 = time.perf_counter(), time.process_time()
        fn(ctx)
        ctx.seconds[name] = time.perf_counter() - t0
        ctx.cpu_seconds[name] = time.process_time() - c0
    return ctx
