"""`gfcr train` end to end on a tiny model through the CLI, and SIGKILL + --resume."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from gfcr.testing import save_tiny

GFCR = [sys.executable, "-m", "gfcr.cli"]


def _config(tmp: Path, steps: int) -> Path:
    model = tmp / "model"
    if not model.exists():
        save_tiny(str(model))
    cfg = {
        "run_name": "tiny",
        "output_dir": str(tmp / "runs"),
        "model": str(model),
        "steps": steps,
        "tasks": [{"name": "arith", "n_train": 16, "n_eval": 4, "params": {"level": 1}}],
        "generate": {"k": 2, "prompts_per_step": 2, "max_tokens": 6},
        "optim": {"lr": 1e-3, "micro_batch": 2},
        "control": {"selector": "greso"},
        "checkpoint": {"every": 1, "keep_last": 2},
        "tensorboard": False,
    }
    p = tmp / "cfg.yaml"
    p.write_text(yaml.safe_dump(cfg))
    return p


def _metric_steps(run_dir: Path) -> list[int]:
    return [json.loads(ln)["step"] for ln in (run_dir / "metrics.jsonl").read_text().splitlines() if ln.strip()]


@pytest.mark.slow
def test_gfcr_train_two_steps_cli(tmp_path):
    cfg = _config(tmp_path, steps=2)
    run_dir = tmp_path / "run"
    proc = subprocess.run([*GFCR, "train", str(cfg), "--run-dir", str(run_dir), "--no-progress",
                           "--set", "eval.after=true", "--set", "eval.k=2"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert _metric_steps(run_dir) == [0, 1]
    resolved = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert resolved["eval"]["after"] is True and resolved["loss"]["agg"] == "seq-mean-token-mean"
    assert (run_dir / "checkpoints" / "step_000001" / "model.safetensors").exists()
    ev = json.loads((run_dir / "eval_after.json").read_text())
    assert ev["n_prompts"] == 4 and "pass@2" in ev["metrics"]
    from gfcr.store import RolloutStore

    t = RolloutStore.open(run_dir / "store").scan(columns=["step", "token_role", "policy_version"])
    assert sorted(t.column("step").to_pylist()) == [0, 0, 0, 0, 1, 1, 1, 1]
    # a second run into the same folder is refused (never overwrite)
    again = subprocess.run([*GFCR, "train", str(cfg), "--run-dir", str(run_dir)], capture_output=True, text=True, timeout=120)
    assert again.returncode == 2 and "never overwrites" in again.stderr


def test_train_bad_config_is_a_clear_error(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("steps: 2\ngenerate:\n  kk: 3\n")
    proc = subprocess.run([*GFCR, "train", str(p)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "generate.kk" in proc.stderr


@pytest.mark.slow
def test_sigkill_then_resume_continues_at_the_right_step(tmp_path):
    steps = 15
    cfg = _config(tmp_path, steps=steps)
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([*GFCR, "train", str(cfg), "--run-dir", str(run_dir), "--no-progress"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    metrics = run_dir / "metrics.jsonl"
    deadline = time.time() + 240
    while time.time() < deadline:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= 3:
            break
        if proc.poll() is not None:
            pytest.fail(f"training ended early: {proc.stderr.read().decode()[-2000:]}")
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    killed_at = len(_metric_steps(run_dir))
    assert killed_at < steps, "the run finished before it could be killed; make steps slower"
    ckpts = sorted((run_dir / "checkpoints").glob("step_*"))
    last_ckpt = int(ckpts[-1].name.split("_")[1])
    res = subprocess.run([*GFCR, "train", str(cfg), "--resume", str(run_dir), "--no-progress"],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert _metric_steps(run_dir) == list(range(steps))  # none repeated, none lost
    state = json.loads((sorted((run_dir / "checkpoints").glob("step_*"))[-1] / "loop_state.json").read_text())
    assert state["step"] == steps - 1
    assert last_ckpt >= 0
    from gfcr.store import RolloutStore

    t = RolloutStore.open(run_dir / "store").scan(columns=["step", "group_id", "sample_index", "rollout_id"])
    rows = t.to_pylist()
    per_step = {}
    for r in rows:
        per_step[r["step"]] = per_step.get(r["step"], 0) + 1
    assert per_step == {s: 4 for s in range(steps)}  # 2 prompts x K=2 per step, exactly once
    keys = {(r["step"], r["group_id"], r["sample_index"]) for r in rows}
    assert len(keys) == len(rows)


@pytest.mark.slow
def test_gfcr_eval_cli_writes_json(tmp_path):
    model = tmp_path / "model"
    save_tiny(str(model))
    out = tmp_path / "eval.json"
    proc = subprocess.run([*GFCR, "eval", "--model", str(model), "--tasks", "arith", "--task-arg", "level=1",
                           "--n", "3", "--k", "2", "--max-tokens", "4", "--out", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    d = json.loads(out.read_text())
    assert d["n_prompts"] == 3 and d["n_samples"] == 2
    assert set(d["metrics"]) == {"pass@1", "pass@2", "avg@2", "greedy_pass@1"}
    bad = subprocess.run([*GFCR, "eval", "--model", str(model), "--tasks", "nosuchtask", "--n", "2"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "nosuchtask" in bad.stderr
