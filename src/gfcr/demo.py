"""``gfcr demo``: the main job, as plain composition of the rooms, each stage timed.

    model    pull/convert the default model (SmolLM2-135M-Instruct) once into the cache
    train    evaluate the base policy on held-out arith, RL a few steps on CPU with every rollout in
             a store under ``runs/``, evaluate again (:func:`gfcr.train.loop.train` does all three)
    ross     audit the run's stored rollouts with the ``arith-steps`` judge, train positive-rollout
             SFT and ROSS, evaluate them next to base and upstream (:func:`gfcr.ross.pipeline.run_ross_demo`)
    report   the HTML report of the run's store (:func:`gfcr.diagnose.report.write_report`)
    summary  where everything is, and the seconds (wall and CPU) of each stage

This module sits above the rooms it composes (Train, ROSS, Diagnose): none of them knows the demo.
Importing it does nothing; :func:`run_demo` runs the stages in this order.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

STAGES = ("model", "train", "ross", "report", "summary")  #: in the order they run


@dataclass
class Demo:
    """What the stages produce: paths, results and timings. ``outputs`` (name → path) is printed at the end."""

    cfg: Any
    full: bool
    model_path: str | None = None
    run_dir: Path | None = None
    store_path: Path | None = None
    result: Any = None
    outputs: dict[str, Any] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    cpu_seconds: dict[str, float] = field(default_factory=dict)


def demo_config(full: bool = False, output_dir: str = "runs", model: str = "default",
                overrides: dict[str, Any] | None = None) -> Any:
    """The demo's :class:`~gfcr.train.config.TrainConfig`: sized for ≤ 10 minutes on 2 CPU cores
    (``full``: a longer run); ``overrides``: dotted fields set on top (``{"steps": 2}``, as ``--set``)."""
    from gfcr.train.config import load_config

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
        "generate": {"topology": {"name": "group", "params": {"k": 4}}, "prompts_per_step": 8 if full else 4, "max_tokens": 64, "temperature": 0.7},
        # SmolLM2-135M rarely writes the 'Answer: N' line the task asks for: the reward falls back to the
        # last number (recorded per verdict as lenient_fallback); a truncated answer is never verified
        "verify": {"verifier": {"name": "numeric", "params": {"lenient_fallback": True}}},
        "loss": {"agg": "seq-mean-token-mean", "clip_low": 0.2, "clip_high": 0.28},
        "optim": {"lr": 2e-6, "micro_batch": 4},
        "checkpoint": {"every": 5 if full else 4},
        "eval": {"before": True, "after": True, "k": 4 if full else 2, "greedy": True, "max_tokens": 64},
    }
    return load_config(None, {**base, **(overrides or {})})


def stage_model(d: Demo, say: Callable[[Any], None]) -> None:
    from gfcr.models import resolve_model

    d.model_path = resolve_model(None if d.cfg.model == "default" else d.cfg.model)
    d.outputs["model"] = d.model_path


def stage_train(d: Demo, say: Callable[[Any], None]) -> None:
    from gfcr.train.loop import train

    res = train(d.cfg, progress=True)
    d.result, d.run_dir, d.store_path = res, res.run_dir, res.store_path
    d.outputs.update({"run dir": res.run_dir, "store": res.store_path, "metrics": res.metrics_path,
                      "checkpoint": res.checkpoint})
    for name, ev in (("base", res.eval_before), ("after RL", res.eval_after)):
        if ev is not None:
            say(f"held-out {name}: {ev.summary()}")
    if res.eval_before is not None and res.eval_after is not None:
        for line in rl_gain_lines(res.eval_after, res.eval_before, steps=res.steps_done, full=d.full):
            say(line)
    for name, file in (("eval (base)", "eval_before.json"), ("eval (after)", "eval_after.json")):
        if (res.run_dir / file).exists():
            d.outputs[name] = res.run_dir / file
    if (res.run_dir / "evals").is_dir():  # every eval generation, as stored rollouts
        d.outputs["eval generations"] = f"{res.run_dir / 'evals'} (gfcr compare {res.run_dir / 'evals'} eval-after eval-before)"


def rl_gain_lines(after: Any, before: Any, steps: int, full: bool) -> list[str]:
    """The RL stage's held-out change, paired per prompt (McNemar for greedy pass@1, paired bootstrap
    for sampled pass@1), and a plain sentence when it is not significant: a few CPU steps on a few
    dozen prompts is too short a run to show a gain."""
    from gfcr.evaluate import compare_paired

    lines, any_sig = [], False
    for metric in ("greedy_pass@1", "pass@1"):
        if metric not in after.metrics or metric not in before.metrics:
            continue
        d = compare_paired(after, before, metric)
        any_sig |= d.significant
        verdict = "significant" if d.significant else "not significant"
        lines.append(f"RL gain, {metric}: {d.diff:+.3f} [{d.ci_low:+.3f}, {d.ci_high:+.3f}] over {d.n} prompts, "
                     f"p = {d.p_value:.2g} ({d.test}): {verdict}")
    if lines and not any_sig:
        lines.append(f"this run is too short to show an RL gain ({steps} steps, {len(after.per_prompt)} held-out prompts): "
                     "the difference is within its noise" + ("" if full else "; `gfcr demo --full` trains 20 steps"))
    return lines


def stage_ross(d: Demo, say: Callable[[Any], None]) -> None:
    """Relearn from the RL run's stored successes (skipped with a note when training left no checkpoint)."""
    from gfcr.ross.pipeline import run_ross_demo

    if d.result is None or d.result.checkpoint is None or d.store_path is None or d.run_dir is None:
        say("ross: skipped, the train stage left no checkpoint or store")
        return
    max_tokens = min(48, d.cfg.eval.max_tokens or 48)  # the demo's eval length
    res = run_ross_demo(
        store=d.store_path, upstream_model=str(d.result.checkpoint), base_model=d.model_path,
        out_dir=d.run_dir / "ross", n_eval=32 if d.full else 8, k=4 if d.full else 2,
        epochs=3 if d.full else 1, max_tokens=max_tokens, verifier_params=d.cfg.verify.verifier.params,
        variants=("positive_sft", "ross_nomask", "ross") if d.full else ("positive_sft", "ross"), log=say,
    )
    d.outputs["ROSS table"] = res.run_dir / "table.md"


def stage_report(d: Demo, say: Callable[[Any], None]) -> None:
    """Write ``<run dir>/report.html`` from the run's store (after ROSS, so it holds the audits)."""
    from gfcr.diagnose.report import write_report
    from gfcr.store import RolloutStore

    if d.store_path is None or d.run_dir is None:
        say("report: skipped, no store from the train stage")
        return
    path = write_report(RolloutStore.open(d.store_path), d.run_dir / "report.html", overwrite=True)
    d.outputs["report"] = path
    say(f"report: {path.resolve()}")


def stage_summary(d: Demo, say: Callable[[Any], None]) -> None:
    from rich.table import Table

    t = Table(title="gfcr demo: where everything is")
    t.add_column("what")
    t.add_column("where")
    for k, v in d.outputs.items():
        t.add_row(k, str(v))
    say(t)
    say("stage seconds (wall): " + ", ".join(f"{k} {v:.0f}" for k, v in d.seconds.items()))
    say("stage seconds (CPU, this process, all threads): "
        + ", ".join(f"{k} {v:.0f}" for k, v in d.cpu_seconds.items()))


def printer(console: Any) -> Callable[[Any], None]:
    """The demo's ``say``: text (the ROSS markdown tables among it) is printed unwrapped, so a table row
    stays one line at any terminal width; rich renderables (the summary table) fit the width as usual."""

    def say(msg: Any) -> None:
        console.print(msg, markup=False, soft_wrap=isinstance(msg, str))

    return say


def run_demo(full: bool = False, output_dir: str = "runs", model: str = "default",
             only: tuple[str, ...] | list[str] | None = None, console: Any = None,
             overrides: dict[str, Any] | None = None) -> Demo:
    """Run the stages in order (``only``: just these, the summary always; ``overrides``: dotted fields of
    the train config, see :func:`demo_config`); returns paths, results and timings."""
    from rich.console import Console

    console = console or Console()
    unknown = sorted(set(only or ()) - set(STAGES))
    if unknown:
        raise ValueError(f"unknown demo stage(s) {unknown}; the stages are {list(STAGES)}")

    say = printer(console)
    d = Demo(cfg=demo_config(full, output_dir, model, overrides), full=full)
    for name, stage in (("model", stage_model), ("train", stage_train), ("ross", stage_ross),
                        ("report", stage_report), ("summary", stage_summary)):
        if only is not None and name not in only and name != "summary":
            continue
        console.rule(f"demo: {name}")
        t0, c0 = time.perf_counter(), time.process_time()
        stage(d, say)
        d.seconds[name] = time.perf_counter() - t0
        d.cpu_seconds[name] = time.process_time() - c0
    return d
