"""Per-step metrics (JSONL row), TensorBoard writer, progress bar.

The row's rollout statistics are the store's per-step summary of the step's own rollouts
(:func:`gfcr.store.stepstats.summarize`, the function behind ``gfcr report`` and ``gfcr diagnose``):
the same names and the same definitions, so the progress bar and the report agree on the same rows.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

from gfcr.records import Rollout, rollouts_to_table
from gfcr.store.stepstats import summarize


def step_metrics(step: int, generated: list[list[Rollout]], kept: list[list[Rollout]], replayed: list[Any],
                 ustats: dict[str, float], seconds: dict[str, float], info: dict[str, Any]) -> dict[str, Any]:
    """The JSONL row of one step: the step's rollout statistics under the store's names
    (:data:`gfcr.store.stepstats.STEP_COLUMNS`: ``reward_mean``, ``verified_rate``,
    ``zero_var_share``, ``wasted_tokens``, ``len_mean``, ``trunc_rate``, ``entropy_mean``...; a value
    that is undefined for the step is None), what only the loop knows (``n_prompts``, ``n_trained``,
    ``n_replayed``: replayed samples trained at this step, ``format_rate``, ``teacher_kl``), the
    update's stats and the timings.

    Example: groups a [1, 1], b [1, 0], c [0, 0, 0], d [0] (one row) → ``zero_var_share`` 2/3 (a
    and c among the three groups of two or more), ``n_prompts`` 4."""
    rs = [r for g in generated for r in g]
    out: dict[str, Any] = {
        "step": step,
        "time": datetime.now().isoformat(timespec="seconds"),
        "n_prompts": len(generated),
        "n_trained": sum(len(g) for g in kept),
        "n_replayed": len(replayed),
        "format_rate": float(np.mean([r.signals.get("format", 0.0) for r in rs])) if rs else 0.0,
        **summarize(rollouts_to_table(rs)),
    }
    kls = [r.signals["teacher_kl"] for r in rs if "teacher_kl" in r.signals]
    if kls:  # on-policy distillation: mean sampled-token reverse KL to the teacher (gfcr.train.distill)
        out["teacher_kl"] = float(np.mean(kls))
    out.update({k: float(v) for k, v in ustats.items()})
    out.update({f"seconds/{k}": round(v, 4) for k, v in seconds.items()})
    out.update(info)
    return out


# ---------------------------------------------------------------------------------------------


def truncate_metrics(path: Path, start_step: int) -> None:
    """Drop metric rows of steps >= start_step (they are redone after a resume)."""
    if not path.exists():
        return
    keep = [ln for ln in path.read_text().splitlines() if ln.strip() and json.loads(ln)["step"] < start_step]
    path.write_text("".join(ln + "\n" for ln in keep))


def tensorboard_writer(run_dir: Path) -> Any:
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:  # tensorboard not installed: JSONL only
        return None
    return SummaryWriter(str(run_dir / "tb"))


#: what the progress bar shows: keys of the step row, shown under these names (the report's)
BAR_FIELDS = ("reward_mean", "verified_rate", "zero_var_share")


def bar_text(m: dict[str, Any]) -> str:
    """The progress bar's text for a step row: :data:`BAR_FIELDS` under the report's names (an
    undefined value as ``-``) and the step's seconds.
    Example: {reward_mean: 0.5, verified_rate: None, zero_var_share: 0.25, seconds/step: 2} →
    ``reward_mean 0.50 verified_rate - zero_var_share 0.25 2.0s/step``."""
    parts = [f"{key} {'-' if m.get(key) is None else format(m[key], '.2f')}" for key in BAR_FIELDS]
    return " ".join(parts) + f" {m.get('seconds/step', 0):.1f}s/step"


@contextlib.contextmanager
def progress_bar(enabled: bool, total: int, start: int) -> Iterator[Callable[[int, dict[str, Any]], None]]:
    if not enabled:
        yield lambda step, m: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("{task.description}"), console=Console(stderr=True)) as prog:
        task = prog.add_task("", total=total, completed=start)

        def update(step: int, m: dict[str, Any]) -> None:
            prog.update(task, completed=step + 1, description=bar_text(m))

        yield update
