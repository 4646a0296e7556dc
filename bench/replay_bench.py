"""Benchmark run (not a test): no replay vs RePO vs ExGRPO vs AR3PO in `gfcr train`, side by side.

    OMP_NUM_THREADS=1 .venv/bin/python bench/replay_bench.py [--steps 8] [--n-eval 8,24] [--k-eval 4]
        [--config configs/arith-smollm2.yaml] [--set key=value ...]

Every arm trains the same config (same seed, so step 0 draws the same prompts and samples) for the
same number of steps. The arms are **alternated step by step** in one process (arm A step s, arm B
step s, ...), so machine load falls on all of them alike; each arm's wall and CPU seconds are
summed over its own steps. Reported per arm:

* effective samples per generated token: batch rows with a non-zero advantage (fresh and replayed)
  divided by the tokens the arm generated (replayed rows cost no generation);
* held-out pass@1 (mean over ``k_eval`` samples per prompt) of the final policy, and its
  difference from the no-replay arm **paired per prompt** with a 95% bootstrap CI over prompts;
* greedy pass@1, the same way.

Writes ``bench/out/replay_bench.json`` and prints a Markdown table with the load average. What it
does not show: a few CPU steps of a 135M model move held-out accuracy little, so a CI that covers 0
means "no difference detected at this size", not "no difference".
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np

ARMS = {
    "no_replay": {},
    "repo": {"replay.buffer": "repo", "replay.params": {"num_replays": 4, "max_cache_size": 8, "min_cache_to_replay": 4}},
    "exgrpo": {"replay.buffer": "exgrpo", "signals.advantage": "dr_grpo"},
    "ar3po": {"replay.buffer": "ar3po", "control.group_params": {"stages": 2}},
}


def paired_ci(diff: np.ndarray, n_boot: int = 2000, seed: int = 0) -> tuple[float, float, float]:
    """Mean of per-prompt differences and its 95% percentile-bootstrap CI over prompts."""
    rng = np.random.default_rng(seed)
    boots = diff[rng.integers(0, diff.size, (n_boot, diff.size))].mean(axis=1)
    return float(diff.mean()), float(np.percentile(boots, 2.5)), float(np.percentile(boots, 97.5))


def fmt(t: tuple[float, float, float] | None) -> str:
    return f"{t[0]:+.3f} [{t[1]:+.3f}, {t[2]:+.3f}]" if t else "—"


def main() -> None:
    from gfcr.train.config import load_config
    from gfcr.train.loop import TrainingRun, evaluate_policy, prepare_run

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="configs/arith-smollm2.yaml")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--n-eval", default="8,24", help="held-out prompts per task of the config, comma-separated "
                    "(the arith config: one-digit sums, whose test split holds 14, then two-digit sums)")
    ap.add_argument("--k-eval", type=int, default=4)
    ap.add_argument("--arms", default=",".join(ARMS))
    ap.add_argument("--set", action="append", default=[], help="extra dotted overrides for every arm (key=value, JSON values)")
    ap.add_argument("--out", default="bench/out/replay_bench.json")
    args = ap.parse_args()
    extra = {}
    for kv in args.set:
        k, _, v = kv.partition("=")
        try:
            extra[k] = json.loads(v)
        except json.JSONDecodeError:
            extra[k] = v
    base = {"steps": args.steps, "output_dir": "bench/out/runs", "eval.before": False, "eval.after": False,
            "eval.k": args.k_eval, "tensorboard": False, "checkpoint.every": 10**6} | extra
    runs: dict[str, TrainingRun] = {}
    for name in args.arms.split(","):
        cfg = load_config(args.config, base | ARMS[name] | {"run_name": f"replay-bench-{name}"})
        n_eval = [int(x) for x in args.n_eval.split(",")]
        if len(n_eval) != len(cfg.tasks):
            raise SystemExit(f"--n-eval: give one count per task ({len(cfg.tasks)} tasks), got {args.n_eval!r}")
        for t, n in zip(cfg.tasks, n_eval, strict=True):
            t.n_eval = n
        d, _ = prepare_run(cfg)
        runs[name] = TrainingRun(cfg, d, False, progress=False)
        runs[name].setup()
        runs[name]._end = cfg.steps
    stats = {n: {"wall_s": 0.0, "cpu_s": 0.0, "gen_tokens": 0, "effective": 0, "rows": 0, "replayed": 0} for n in runs}
    loads = [os.getloadavg()[0]]
    for step in range(args.steps):
        for name, t in runs.items():  # alternate the arms every step
            w0, c0 = time.perf_counter(), time.process_time()
            row = t.step(step)
            stats[name]["wall_s"] += time.perf_counter() - w0
            stats[name]["cpu_s"] += time.process_time() - c0
            stats[name]["gen_tokens"] += int(row["gen_tokens"])
            stats[name]["effective"] += int(row.get("n_live", 0))  # batch rows with a non-zero advantage
            stats[name]["rows"] += int(row.get("n_seqs", 0))
            stats[name]["replayed"] += int(row.get("n_replayed", 0))
            print(f"step {step} {name}: {row.get('seconds/step', 0):.1f}s reward {row.get('reward_mean', 0):.2f} "
                  f"replayed {row.get('n_replayed', 0)}", flush=True)
        loads.append(os.getloadavg()[0])
    evals = {}
    for name, t in runs.items():
        w0, c0 = time.perf_counter(), time.process_time()
        evals[name] = evaluate_policy(t)
        stats[name]["eval_wall_s"], stats[name]["eval_cpu_s"] = time.perf_counter() - w0, time.process_time() - c0
        t.close()
    base_pp = {p["prompt_id"]: p for p in evals["no_replay"].per_prompt} if "no_replay" in evals else None
    out = {"config": args.config, "steps": args.steps, "k_eval": args.k_eval, "load_avg_1m": loads, "arms": {}}
    for name, ev in evals.items():
        pp = {p["prompt_id"]: p for p in ev.per_prompt}
        s = stats[name]
        arm = s | {"effective_per_1k_tokens": 1000.0 * s["effective"] / max(s["gen_tokens"], 1),
                   "pass@1": ev.metrics["pass@1"].value, "greedy_pass@1": ev.metrics.get("greedy_pass@1").value
                   if "greedy_pass@1" in ev.metrics else None}
        if base_pp is not None and name != "no_replay":
            ids = sorted(pp)
            d1 = np.array([pp[i]["correct"] / pp[i]["n"] - base_pp[i]["correct"] / base_pp[i]["n"] for i in ids])
            arm["pass@1_diff_vs_no_replay"] = paired_ci(d1)
            if "greedy_correct" in pp[ids[0]]:
                dg = np.array([float(pp[i]["greedy_correct"]) - float(base_pp[i]["greedy_correct"]) for i in ids])
                arm["greedy_diff_vs_no_replay"] = paired_ci(dg)
        out["arms"][name] = arm
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2))
    print(f"\nload average (1 min) during the run: {min(loads):.1f}-{max(loads):.1f}")
    print("| arm | gen tokens | effective rows / 1k tokens | replayed rows | pass@1 | Δ pass@1 vs none [95% CI] | "
          "greedy | Δ greedy [95% CI] | wall s | CPU s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, a in out["arms"].items():
        dp = a.get("pass@1_diff_vs_no_replay")
        dg = a.get("greedy_diff_vs_no_replay")
        print(f"| {name} | {a['gen_tokens']} | {a['effective_per_1k_tokens']:.2f} | {a['replayed']} | {a['pass@1']:.3f} | "
              f"{fmt(dp)} | {a['greedy_pass@1'] if a['greedy_pass@1'] is None else round(a['greedy_pass@1'], 3)} | "
              f"{fmt(dg)} | {a['wall_s']:.0f} | {a['cpu_s']:.0f} |")


if __name__ == "__main__":
    main()
