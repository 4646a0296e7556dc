"""Benchmark run (not a test): partial rollouts (Kimi k1.5) against full rollouts on the long tail.

    .venv/bin/python bench/partial_bench.py [--steps 50] [--budgets 512,1024] [--seeds 0,1,2,3,4]
        [--loop-steps 6]

Two parts, each timed (wall and CPU seconds) with the load average recorded:

1. **Simulator** (``gfcr.sim.long_tail.long_tail``): the simulated world's response lengths
   (64 prompts × 8 responses per step, log-normal, wrong answers 1.5× longer, capped at 2048) run
   step by step full or with a per-step budget. Reports the step wall time in decode steps (the
   longest new segment: a synchronous batch waits for it) and the decode slot-tokens left idle
   while it waits (the long tail's waste), medians over ``--seeds`` fresh draws. The world is a
   model: lengths do not respond to training and a decode step costs the same at any batch size.
2. **Loop** (``gfcr train`` on the tiny random model in ``gfcr.testing``, CPU): the same config
   with and without ``generate.partial_budget`` for ``--loop-steps`` steps, the arms alternated step
   by step; reports median seconds of the ``generate`` stage per step (wall) and process CPU seconds.
   A tiny random model never stops early, so every rollout reaches ``max_tokens``: this shows the
   mechanism's own cost per step, not a long-tail saving.

Writes ``bench/out/partial_bench.json`` and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import tempfile
import time
from pathlib import Path

import numpy as np


def _cpu() -> float:
    s = resource.getrusage(resource.RUSAGE_SELF)
    return s.ru_utime + s.ru_stime


def simulator(steps: int, budgets: list[int | None], seeds: list[int]) -> dict:
    from gfcr.sim.long_tail import long_tail
    from gfcr.sim.simulator import SimConfig

    t0, c0 = time.perf_counter(), _cpu()
    runs = [long_tail(SimConfig(seed=s), budgets, steps=steps) for s in seeds]
    out = {}
    for arm in runs[0]:
        keys = runs[0][arm]
        out[arm] = {k: float(np.median([r[arm][k] for r in runs])) for k in keys}
    return {"arms": out, "seeds": seeds, "steps": steps, "wall_s": time.perf_counter() - t0, "cpu_s": _cpu() - c0}


def loop(steps: int, budget: int, max_tokens: int) -> dict:
    from gfcr.testing import save_tiny
    from gfcr.train.config import load_config
    from gfcr.train.loop import TrainingRun, prepare_run

    tmp = Path(tempfile.mkdtemp(prefix="partial_bench_"))
    model = save_tiny(str(tmp / "tiny"), seed=0)
    base = {"model": model, "output_dir": str(tmp / "runs"), "steps": steps, "tensorboard": False,
            "tasks": [{"name": "arith", "n_train": 16, "n_eval": 0, "params": {"level": 1}}],
            "generate.topology": {"name": "group", "params": {"k": 4}}, "generate.prompts_per_step": 4, "generate.max_tokens": max_tokens, "signals.entropy": False}
    arms = {"full": base, f"partial_{budget}": base | {"generate.partial_budget": budget}}
    runs = {}
    for name, over in arms.items():
        cfg = load_config(None, over)
        d, _ = prepare_run(cfg, run_dir=tmp / name)
        t = TrainingRun(cfg, d, False, progress=False)
        t.setup()
        t._end = steps
        runs[name] = t
    res = {n: {"gen_s": [], "step_s": [], "cpu_s": 0.0, "trained": 0} for n in runs}
    for s in range(steps):
        for name, t in runs.items():  # arms alternated step by step
            c0 = _cpu()
            row = t.step(s)
            res[name]["cpu_s"] += _cpu() - c0
            res[name]["gen_s"].append(row.get("seconds/generate", 0.0))
            res[name]["step_s"].append(row["seconds/step"])
            res[name]["trained"] += int(row.get("n_rollouts", 0))
    for t in runs.values():
        t.close()
    return {n: {"generate_s_median": float(np.median(r["gen_s"])), "step_s_median": float(np.median(r["step_s"])),
                "cpu_s": r["cpu_s"], "rollouts": r["trained"]} for n, r in res.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--budgets", default="512,1024")
    ap.add_argument("--seeds", default="0,1,2,3,4")
    ap.add_argument("--loop-steps", type=int, default=6)
    ap.add_argument("--out", default="bench/out/partial_bench.json")
    args = ap.parse_args()
    load0 = os.getloadavg()
    budgets: list[int | None] = [None] + [int(b) for b in args.budgets.split(",")]
    sim = simulator(args.steps, budgets, [int(s) for s in args.seeds.split(",")])
    lp = loop(args.loop_steps, budget=4, max_tokens=12) if args.loop_steps else {}
    out = {"simulator": sim, "loop": lp, "load_start": load0, "load_end": os.getloadavg()}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2))
    print(f"load {load0[0]:.2f} -> {out['load_end'][0]:.2f}; simulator {sim['wall_s']:.1f} s wall, {sim['cpu_s']:.1f} s CPU")
    print("| arm | step wall (decode steps) | idle slot-tokens / all slot-tokens | rollouts done per 1k decode steps | carried at end | lag (steps) |")
    print("|---|---|---|---|---|---|")
    for arm, m in sim["arms"].items():
        print(f"| {arm} | {m['step_wall_mean']:.0f} | {m['idle_share']:.1%} | {m['completed_per_kstep']:.0f} | "
              f"{m['carried']:.0f} | {m['lag_mean']:.2f} |")
    for arm, m in lp.items():
        print(f"loop {arm}: generate {m['generate_s_median']:.3f} s/step, step {m['step_s_median']:.3f} s, "
              f"CPU {m['cpu_s']:.1f} s, rollouts trained {m['rollouts']}")


if __name__ == "__main__":
    main()
