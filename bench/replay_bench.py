"""Benchmark run (not a test): `gfcr train` arms side by side — no replay vs RePO vs ExGRPO vs AR3PO,
or prompt selectors (uniform vs GRESO).

    OMP_NUM_THREADS=1 .venv/bin/python bench/replay_bench.py [--steps 8] [--n-eval 8,24] [--k-eval 4]
        [--config configs/arith-smollm2.yaml] [--set key=value ...]
    # GRESO on the real model: a 24-prompt pool seen four times, no held-out evaluation
    OMP_NUM_THREADS=1 .venv/bin/python bench/replay_bench.py --arms no_replay,greso --steps 24 --no-eval \
        --n-train 6,18 --out bench/out/greso_bench.json

Every arm trains the same config (same seed, so step 0 draws the same prompts and samples) for the
same number of steps. The arms are **alternated step by step** in one process (arm A step s, arm B
step s, ...), so machine load falls on all of them alike; each arm's wall and CPU seconds are
summed over its own steps. Reported per arm:

* effective samples per generated token: batch rows with a non-zero advantage (fresh and replayed)
  divided by the tokens the arm generated (replayed rows cost no generation);
* zero-variance waste: the share of generated groups whose rewards were all equal, and the share of
  generated tokens they cost (the gradient gets nothing from them);
* held-out pass@1 (mean over ``k_eval`` samples per prompt) of the final policy, and its
  difference from the baseline (the first of ``--arms``) **paired per prompt** with a 95% bootstrap CI over prompts;
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
    "repo": {"replay.buffer": {"name": "repo", "params": {"num_replays": 4, "max_cache_size": 8, "min_cache_to_replay": 4}}},
    "exgrpo": {"replay.buffer": "exgrpo", "signals.advantage": "dr_grpo"},
    "ar3po": {"replay.buffer": "ar3po", "control.group": {"name": "ar3po", "params": {"stages": 2}}},
    "greso": {"control.selector": "greso"},  # no replay; the selector skips prompts predicted zero-variance
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
    ap.add_argument("--arms", default="no_replay,repo,exgrpo,ar3po", help=f"comma-separated, the first is the "
                    f"baseline the others are paired against; known: {', '.join(ARMS)}")
    ap.add_argument("--n-train", default=None, help="training prompts per task, comma-separated (a small pool "
                    "makes prompts come back, which history-based selectors such as GRESO need)")
    ap.add_argument("--no-eval", dest="eval", action="store_false", help="skip the held-out evaluation")
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
    arms = args.arms.split(",")
    unknown = [a for a in arms if a not in ARMS]
    if unknown:
        raise SystemExit(f"--arms: unknown arm {unknown[0]!r}; known: {', '.join(ARMS)}")
    for name in arms:
        cfg = load_config(args.config, base | ARMS[name] | {"run_name": f"replay-bench-{name}"})
        for flag, value, attr in (("--n-eval", args.n_eval, "n_eval"), ("--n-train", args.n_train, "n_train")):
            if value is None:
                continue
            counts = [int(x) for x in value.split(",")]
            if len(counts) != len(cfg.tasks):
                raise SystemExit(f"{flag}: give one count per task ({len(cfg.tasks)} tasks), got {value!r}")
            for t, n in zip(cfg.tasks, counts, strict=True):
                setattr(t, attr, n)
        d, _ = prepare_run(cfg)
        runs[name] = TrainingRun(cfg, d, False, progress=False)
        runs[name].setup()
        runs[name]._end = cfg.steps
    stats = {n: {"wall_s": 0.0, "cpu_s": 0.0, "gen_tokens": 0, "effective": 0, "rows": 0, "replayed": 0,
                 "groups": 0, "zero_var_groups": 0, "zero_var_tokens": 0} for n in runs}
    loads = [os.getloadavg()[0]]
    per_step: dict[str, list[float]] = {n: [] for n in runs}  # zero-variance share of each step's groups
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
            zv = row["zero_var_share"] or 0.0  # (None: no group of two or more this step)
            stats[name]["groups"] += int(row["n_groups"])
            stats[name]["zero_var_groups"] += round(zv * row["n_groups"])
            stats[name]["zero_var_tokens"] += int(row["wasted_tokens"])
            per_step[name].append(float(zv))
            print(f"step {step} {name}: {row.get('seconds/step', 0):.1f}s reward {row.get('reward_mean') or 0:.2f} "
                  f"replayed {row.get('n_replayed', 0)} zero-var {zv:.2f}", flush=True)
        loads.append(os.getloadavg()[0])
    evals = {}
    for name, t in runs.items():
        if args.eval:
            w0, c0 = time.perf_counter(), time.process_time()
            evals[name] = evaluate_policy(t)
            stats[name]["eval_wall_s"], stats[name]["eval_cpu_s"] = time.perf_counter() - w0, time.process_time() - c0
        t.close()
    out = {"config": args.config, "steps": args.steps, "k_eval": args.k_eval if args.eval else None,
           "baseline": arms[0], "load_avg_1m": loads,
           "arms": {name: arm_summary(stats[name], evals.get(name), evals.get(arms[0]), per_step[name],
                                      per_step[arms[0]], name == arms[0]) for name in arms}}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2))
    print(f"\nload average (1 min) during the run: {min(loads):.1f}-{max(loads):.1f}")
    print(markdown_table(out))


def arm_summary(s: dict, ev, base_ev, zv: list[float], base_zv: list[float], is_base: bool) -> dict:
    """One arm's row: its sums, rates, and (not for the baseline) differences from the baseline, paired
    per held-out prompt for pass@1 and per step for the zero-variance share."""
    arm = s | {"effective_per_1k_tokens": 1000.0 * s["effective"] / max(s["gen_tokens"], 1),
               "zero_var_group_share": s["zero_var_groups"] / max(s["groups"], 1),
               "zero_var_token_share": s["zero_var_tokens"] / max(s["gen_tokens"], 1)}
    if not is_base:
        arm["zero_var_share_diff_by_step"] = paired_ci(np.array(zv) - np.array(base_zv))
    if ev is None:
        return arm
    arm["pass@1"] = ev.metrics["pass@1"].value
    arm["greedy_pass@1"] = ev.metrics["greedy_pass@1"].value if "greedy_pass@1" in ev.metrics else None
    if base_ev is not None and not is_base:
        pp = {p["prompt_id"]: p for p in ev.per_prompt}
        bp = {p["prompt_id"]: p for p in base_ev.per_prompt}
        ids = sorted(pp)
        arm["pass@1_diff_vs_baseline"] = paired_ci(np.array([pp[i]["correct"] / pp[i]["n"] - bp[i]["correct"] / bp[i]["n"]
                                                             for i in ids]))
        if "greedy_correct" in pp[ids[0]]:
            arm["greedy_diff_vs_baseline"] = paired_ci(np.array([float(pp[i]["greedy_correct"]) - float(bp[i]["greedy_correct"])
                                                                 for i in ids]))
    return arm


def markdown_table(out: dict) -> str:
    """The arms as a Markdown table (held-out columns only when the run evaluated)."""
    evald = out["k_eval"] is not None
    head = ("| arm | gen tokens | live rows / 1k tokens | replayed rows | zero-variance groups | their token share | "
            "Δ zero-var share vs baseline, by step [95% CI] |")
    if evald:
        head += " pass@1 | Δ pass@1 [95% CI] | greedy | Δ greedy [95% CI] |"
    lines = [head + " wall s | CPU s |", "|" + "---|" * (head.count("|") + 1)]
    for name, a in out["arms"].items():
        line = (f"| {name} | {a['gen_tokens']} | {a['effective_per_1k_tokens']:.2f} | {a['replayed']} | "
                f"{a['zero_var_groups']}/{a['groups']} | {a['zero_var_token_share']:.1%} | "
                f"{fmt(a.get('zero_var_share_diff_by_step'))} |")
        if evald:
            g = a.get("greedy_pass@1")
            line += (f" {a['pass@1']:.3f} | {fmt(a.get('pass@1_diff_vs_baseline'))} | "
                     f"{'—' if g is None else round(g, 3)} | {fmt(a.get('greedy_diff_vs_baseline'))} |")
        lines.append(line + f" {a['wall_s']:.0f} | {a['cpu_s']:.0f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
