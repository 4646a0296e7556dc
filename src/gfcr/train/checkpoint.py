"""Run checkpoints: model (safetensors) + tokenizer + optimizer + loop state (+ the held partial-rollout
pool), renamed into place."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from gfcr.records import json_safe

CKPT_DIR = "checkpoints"
STATE_FILE = "loop_state.json"


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete checkpoint folder (``checkpoints/step_NNNNNN``), or None."""
    d = Path(run_dir) / CKPT_DIR
    if not d.is_dir():
        return None
    done = sorted(p for p in d.iterdir() if p.is_dir() and p.name.startswith("step_") and (p / STATE_FILE).exists())
    return done[-1] if done else None


def save_checkpoint(t: Any, step: int) -> Path:
    """Write model (safetensors) + tokenizer + optimizer + loop state into a temp folder, then
    rename it into place (a crash never leaves a half checkpoint that resume would pick)."""
    import torch

    d = t.run_dir / CKPT_DIR
    d.mkdir(parents=True, exist_ok=True)
    final = d / f"step_{step:06d}"
    tmp = d / f".tmp_step_{step:06d}"
    if tmp.exists():
        shutil.rmtree(tmp)
    t.model.save_pretrained(tmp, safe_serialization=True)
    t.tokenizer.save_pretrained(tmp)
    torch.save(t.update.optimizer.state_dict(), tmp / "optimizer.pt")
    state = {
        "step": step,
        "run_id": t.run_id,
        "policy_version": t.policy_version,
        "selector": t.selector.state_dict(),
        "buffer": t.buffer.state_dict() if t.buffer is not None else None,
        "store_version": t.store.version,
    }
    if getattr(t, "partial", None) is not None:  # partial rollouts: the held groups, bit-exact
        from gfcr.control.partial import POOL_FILE, save_pool

        save_pool(t.partial.held, tmp / POOL_FILE)
        state["partial_held_groups"] = len(t.partial.held)
    (tmp / STATE_FILE).write_text(json.dumps(json_safe(state)))
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    olds = sorted(p for p in d.iterdir() if p.is_dir() and p.name.startswith("step_"))
    for p in olds[: -t.cfg.checkpoint.keep_last]:
        shutil.rmtree(p)
    return final
