"""Benchmark run (not a test): RL on configs/arith-smollm2.yaml, held-out pass@1 before/after with CIs.

    .venv/bin/python bench/train_bench.py [--steps 20] [--config configs/arith-smollm2.yaml]

Runs ``gfcr train`` as a library with evaluation before and after, then writes
``bench/out/train_bench.json`` (metrics before/after with 95% bootstrap CIs over prompts, seconds
per stage, reward curve) and prints a Markdown table for the docs. On 2 CPU cores expect roughly a
minute per step plus two evaluations.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from gfcr.train.config import load_config
from gfcr.train.loop import train


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="configs/arith-smollm2.yaml")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--output-dir", default="bench/out/runs")
    args = ap.parse_args()
    cfg = load_config(args.config, {"steps": args.steps, "output_dir": args.output_dir,
                                    "eval.before": True, "eval.after": True})
    t0 = time.perf_counter()
    res = train(cfg, progress=True)
    wall = time.perf_counter() - t0
    rows = [json.loads(x) for x in res.metrics_path.read_text().splitlines() if x.strip()]
    stage_s: dict[str, float] = {}
    for r in rows:
        for k, v in r.items():
            if k.startswith("seconds/") and k != "seconds/step":
                stage_s[k[8:]] = stage_s.get(k[8:], 0.0) + v
    out = {
        "config": args.config,
        "steps": args.steps,
        "run_dir": str(res.run_dir),
        "wall_s": round(wall, 1),
        "before": {k: vars(m) for k, m in res.eval_before.metrics.items()} if res.eval_before else None,
        "after": {k: vars(m) for k, m in res.eval_after.metrics.items()} if res.eval_after else None,
        "n_eval_prompts": res.eval_after.n_prompts if res.eval_after else None,
        "stage_seconds_total": {k: round(v, 1) for k, v in stage_s.items()},
        # the per-rollout entropy forward (signals["entropy"]) against the stages it sits between
        "entropy_over_generate": round(stage_s.get("entropy", 0.0) / max(stage_s.get("generate", 0.0), 1e-9), 3),
        "entropy_over_update": round(stage_s.get("entropy", 0.0) / max(stage_s.get("update", 0.0), 1e-9), 3),
        "reward_per_step": [None if r["reward_mean"] is None else round(r["reward_mean"], 3) for r in rows],
        "format_rate_per_step": [round(r["format_rate"], 3) for r in rows],
        "zero_var_share_per_step": [None if r["zero_var_share"] is None else round(r["zero_var_share"], 3) for r in rows],
    }
    p = Path("bench/out/train_bench.json")
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(out, indent=2))
    print(f"\nwritten {p}\n")
    print("| metric | before | after |\n|---|---|---|")
    for k in (out["before"] or {}):
        b, a = out["before"][k], (out["after"] or {}).get(k)
        fa = f"{a['value']:.3f} [{a['ci_low']:.3f}, {a['ci_high']:.3f}]" if a else "-"
        print(f"| {k} | {b['value']:.3f} [{b['ci_low']:.3f}, {b['ci_high']:.3f}] | {fa} |")
    print(f"\nwall {wall:.0f} s; stage seconds {out['stage_seconds_total']}")
    print(f"entropy forward / generate = {out['entropy_over_generate']}, / update = {out['entropy_over_update']}")


if __name__ == "__main__":
    main()
