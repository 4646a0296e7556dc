"""Control/Replay benchmark through the simulator: 10k prompts, one fixed token budget.

Prints a Markdown table of generated tokens per effective sample and the solve rate at the
budget for each strategy, with ratios to Uniform and to DAPO (measured side by side, same seed).
Goal (issue 4): GRESO and VADE <= 0.6x Uniform and <= 0.8x DAPO in tokens per effective sample,
at equal or better solve rate. The replay strategies (AR3PO, RePO, ExGRPO) report replayed
responses apart; ``--replay-decay`` sets how much a replayed group teaches per step of lag
(default 1: no discount, an assumption of the simulator).

    .venv/bin/python bench/control_bench.py [--seeds 3] [--out DIR]
    .venv/bin/python bench/control_bench.py --retrieval 2000   # embedder throughput instead

``--retrieval N`` times indexing N synthetic solved prompts (with their solution steps) and 100
queries with the hash embedder and with MiniLM, side by side, on this machine's CPU.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from gfcr.sim.simulator import SimConfig, format_table, simulate


def retrieval_bench(n: int, embedders: tuple[str, ...] = ("hash", "minilm"), per_prompt: int = 1) -> None:
    """``per_prompt`` > 1: each prompt solved that many times (one text, so tied distances, as a
    training run's K solved rollouts of a prompt)."""
    from gfcr.records import Rollout
    from gfcr.replay.retrieval import Retrieval

    rng = np.random.default_rng(0)
    rs = []
    for i in range(n):
        a, b, c = (int(x) for x in rng.integers(2, 99, size=3))
        rs += [Rollout(run_id="b", prompt_id=f"p{i}", token_ids=[1], token_role=[1], logprobs=[-0.1], verified=True,
                       rollout_id=f"r{i}-{j}", messages=[
                              {"role": "user", "content": f"A shop sells {a} pens a day for {b} days, then {c} more. How many pens?"},
                              {"role": "assistant", "content": f"{a} * {b} = {a * b}\n{a * b} + {c} = {a * b + c}\nAnswer: {a * b + c}"}])
               for j in range(per_prompt)]
    print("| embedder | index N prompts + steps (s) | rows/s | 100 queries (ms/query) |\n|---|---|---|---|")
    for name in embedders:
        with tempfile.TemporaryDirectory() as d:
            ret = Retrieval(Path(d) / "retrieval.lance", embed=name, segments=True)
            ret.embed(["warm up"])  # model load not timed
            t0 = time.perf_counter()
            ret.add(rs)
            t_index = time.perf_counter() - t0
            rows = len(ret) + ret.n_segments()
            t0 = time.perf_counter()
            for i in range(100):
                ret.nearest(f"How many pens are sold in {i} days?", k=4)
            t_q = (time.perf_counter() - t0) / 100
            print(f"| {name} | {t_index:.1f} | {rows / t_index:.0f} | {1000 * t_q:.1f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n-prompts", type=int, default=10_000)
    ap.add_argument("--budget", type=float, default=3e8, help="generated tokens per strategy")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--replay-decay", type=float, default=1.0, help="SimConfig.replay_decay (sensitivity)")
    ap.add_argument("--retrieval", type=int, default=0, help="time retrieval on N prompts instead (hash vs MiniLM)")
    ap.add_argument("--embedders", default="hash,minilm", help="with --retrieval: which embedders, comma-separated")
    ap.add_argument("--solved-per-prompt", type=int, default=1, help="with --retrieval: solved rollouts per prompt")
    ap.add_argument("--out", default=None, help="new folder for the first seed's JSON and plot")
    args = ap.parse_args()
    if args.retrieval:
        retrieval_bench(args.retrieval, tuple(args.embedders.split(",")), args.solved_per_prompt)
        return
    t0 = time.perf_counter()
    reports = []
    for s in range(args.seeds):
        cfg = SimConfig(n_prompts=args.n_prompts, train_prompts=256, budget_tokens=args.budget, seed=s,
                        replay_decay=args.replay_decay)
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
