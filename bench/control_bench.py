"""Control/Replay benchmark through the simulator: 10k prompts, one fixed token budget.

Prints a Markdown table of generated tokens per effective sample and the solve rate at the
budget for each strategy, with ratios to Uniform and to DAPO (measured side by side, same seed).
Goal (issue 4): GRESO and VADE <= 0.6x Uniform and <= 0.8x DAPO in tokens per effective sample,
at equal or better solve rate.

    .venv/bin/python bench/control_bench.py [--seeds 3] [--out DIR]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from gfcr.sim.simulator import SimConfig, format_table, simulate


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n-prompts", type=int, default=10_000)
    ap.add_argument("--budget", type=float, default=3e8, help="generated tokens per strategy")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--out", default=None, help="new folder for the first seed's JSON and plot")
    args = ap.parse_args()
    t0 = time.perf_counter()
    reports = []
    for s in range(args.seeds):
        cfg = SimConfig(n_prompts=args.n_prompts, train_prompts=256, budget_tokens=args.budget, seed=s)
        rep = simulate(cfg, args.out if s == 0 else None)
        reports.append(rep)
        print(f"## seed {s}\n\n{format_table(rep)}\n")
    names = [r["name"] for r in reports[0]["results"]]
    print("## mean over seeds\n")
    print("| strategy | tokens/effective vs uniform | vs dapo | solve rate @budget | goal met (<=0.6x U, <=0.8x D, solve >= U and D) |")
    print("|---|---|---|---|---|")
    for n in names:
        vu = np.mean([r["ratios"][n]["tpe_vs_uniform"] for r in reports])
        vd = np.mean([r["ratios"][n]["tpe_vs_dapo"] for r in reports])
        sr = np.mean([next(x for x in r["results"] if x["name"] == n)["solve_rate_at_budget"] for r in reports])
        su = np.mean([r["ratios"][n]["solve_minus_uniform"] for r in reports])
        sd = np.mean([r["ratios"][n]["solve_minus_dapo"] for r in reports])
        met = vu <= 0.6 and vd <= 0.8 and su >= 0 and sd >= 0
        print(f"| {n} | {vu:.2f} | {vd:.2f} | {sr:.3f} | {'yes' if met else 'no'} |")
    print(f"\n{args.seeds} seeds x {len(names)} strategies in {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
