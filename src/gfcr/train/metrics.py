"""Per-step metrics (JSONL row), TensorBoard writer, progress bar."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

from gfcr.records import Rollout


def step_metrics(step: int, generated: list[list[Rollout]], kept: list[list[Rollout]], replayed: list[Any],
                 ustats: dict[str, float], seconds: dict[str, float], info: dict[str, Any]) -> dict[str, Any]:
    """The JSONL row of one step (rewards, pass rate, zero-variance share, tokens, update stats, timings)."""
    rs = [r for g in generated for r in g]
    rewards = np.array([r.reward for r in rs]) if rs else np.zeros(0)
    lens = np.array([r.n_generated for r in rs]) if rs else np.zeros(0)
    zero_var = [g for g in generated if len(g) > 1 and np.std([r.reward for r in g]) == 0]
    out: dict[str, Any] = {
        "step": step,
        "time": datetime.now().isoformat(timespec="seconds"),
        "n_prompts": len(generated),
        "n_rollouts": len(rs),
        "n_trained": sum(len(g) for g in kept),
        "n_replayed": len(replayed),
        "reward_mean": float(rewards.mean()) if rs else 0.0,
        "pass_rate": float(np.mean([bool(r.verified) for r in rs])) if rs else 0.0,
        "format_rate": float(np.mean([r.signals.get("format", 0.0) for r in rs])) if rs else 0.0,
        "zero_variance_share": len(zero_var) / max(len(generated), 1),
        "zero_variance_tokens": int(sum(r.n_generated for g in zero_var for r in g)),  # spent on groups with no signal
        "gen_tokens": int(lens.sum()),
        "length_mean": float(lens.mean()) if rs else 0.0,
        "length_max": int(lens.max()) if rs else 0,
        "truncated_share": float(np.mean([r.finish_reason == "length" for r in rs])) if rs else 0.0,
    }
    ents = [r.signals["entropy"] for r in rs if "entropy" in r.signals]
    if ents:  # mean token entropy of what the sampling policy generated (the update's `entropy` is its forward's)
        out["rollout_entropy"] = float(np.mean(ents))
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
            prog.update(task, completed=step + 1, description=(
                f"reward {m.get('reward_mean', 0):.2f} pass {m.get('pass_rate', 0):.2f} "
                f"zero-var {m.get('zero_variance_share', 0):.2f} {m.get('seconds/step', 0):.1f}s/step"))

        yield update
