"""Masked-SFT padding and throughput: one-tensor steps vs micro-batches of at most 5% padding (benchmark, not a test).

Four arms over the same model and sequences, ``batch_size`` sequences per step in each:

- ``padded-1``: the length-grouped batch as one right-padded tensor (the earlier layout);
- ``padded-5``: the same batch as micro-batches of at most ``--max-pad-fraction`` padding
  (:func:`gfcr.train.sft.split_by_padding`), gradients accumulated (:func:`gfcr.train.sft.sft_step`);
- ``packed-1`` / ``packed-5``: seeded random batches packed into rows of at most
  ``--max-tokens-per-row`` tokens (block-diagonal attention), as one tensor or as micro-batches.

Every arm runs :func:`~gfcr.train.sft.sft_step` (forward + backward; the AdamW update is the same in
all arms and is left out). The arms' steps are alternated (step i of each arm in turn, the arm order
rotating every step) so machine load hits them alike. Reported per arm: padding fraction (padding /
tokens processed), forwards, wall and CPU seconds (``time.process_time``: this process, all its
threads), real tokens per wall- and per CPU-second, and the median over steps of the paired per-step
ratio against the arm's one-tensor counterpart; the load average is recorded at the start and end.

Lengths: ``--lengths-from`` (a ROSS ``data.parquet``, or a store folder whose rollouts' token counts
are used; repeatable), else short rows uniform in ``[--short-min, --short-max]`` (70-129 tokens: the
arithmetic rollouts of SmolLM2-135M in ``make demo``'s store); then ``--tail-frac`` of the rows are
replaced by a log-normal tail (median ``--tail-median``, sigma ``--tail-sigma``, clipped to
``[--short-max, --max-len]``). Token ids are random; the first 30% of each sequence is context.

    OMP_NUM_THREADS=1 .venv/bin/python bench/ross_pack_bench.py [--n 48] [--batch-size 8] [--threads 1]
        [--layers 8] [--arms padded-1,padded-5]

The padding of all four layouts is also computed from the plans alone (no model) and reported.

Writes ``bench/out/ross_pack_bench.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import numpy as np


def read_lengths(paths: list[str]) -> list[int]:
    out: list[int] = []
    for p in map(Path, paths):
        if p.suffix == ".parquet" or (p / "data.parquet").exists():
            import pyarrow.parquet as pq

            f = p if p.suffix == ".parquet" else p / "data.parquet"
            out += [len(x) for x in pq.read_table(f, columns=["input_ids"]).column("input_ids").to_pylist()]
        else:
            import lance

            col = lance.dataset(str(p / "rollouts.lance")).to_table(columns=["token_ids"]).column("token_ids")
            out += [len(x) for x in col.to_pylist() if len(x) > 1]
    return out


def make_rows(args: argparse.Namespace, vocab: int) -> tuple[list[dict], str]:
    rng = np.random.default_rng(args.seed)
    if args.lengths_from:
        pool = read_lengths(args.lengths_from)
        short = [int(x) for x in rng.choice(pool, args.n)]
        src = f"{len(pool)} real lengths ({min(pool)}-{max(pool)}) from {len(args.lengths_from)} source(s)"
    else:
        short = [int(x) for x in rng.integers(args.short_min, args.short_max + 1, args.n)]
        src = f"uniform [{args.short_min}, {args.short_max}]"
    n_tail = int(round(args.tail_frac * args.n))
    tail = np.clip(rng.lognormal(np.log(args.tail_median), args.tail_sigma, n_tail), args.short_max, args.max_len)
    lengths = short[: args.n - n_tail] + [int(x) for x in tail]
    rng.shuffle(lengths)
    if n_tail:
        src += (f" + {n_tail} tail rows lognormal(median={args.tail_median}, sigma={args.tail_sigma}) "
                f"clipped to [{args.short_max}, {args.max_len}]")
    rows = []
    for n in lengths:
        ctx = max(1, int(0.3 * n))
        rows.append({"input_ids": rng.integers(10, vocab, n).tolist(), "loss_mask": [0] * ctx + [1] * (n - ctx)})
    return rows, src


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="HF dir/name (default: the cached SmolLM2-135M-Instruct)")
    ap.add_argument("--n", type=int, default=48, help="sequences")
    ap.add_argument("--batch-size", type=int, default=8, help="sequences per step (every arm)")
    ap.add_argument("--max-tokens-per-row", type=int, default=1024)
    ap.add_argument("--max-pad-fraction", type=float, default=0.05)
    ap.add_argument("--lengths-from", action="append", default=None,
                    help="a ROSS data.parquet (or its folder) or a store folder; repeatable")
    ap.add_argument("--short-min", type=int, default=70)
    ap.add_argument("--short-max", type=int, default=129)
    ap.add_argument("--tail-frac", type=float, default=0.25)
    ap.add_argument("--tail-median", type=float, default=300)
    ap.add_argument("--tail-sigma", type=float, default=0.6)
    ap.add_argument("--max-len", type=int, default=1024)
    ap.add_argument("--arms", default="padded-1,padded-5,packed-1,packed-5")
    ap.add_argument("--layers", type=int, default=None,
                    help="keep only the model's first N decoder layers (same widths, vocabulary and attention)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="bench/out/ross_pack_bench.json")
    args = ap.parse_args()

    import torch
    from transformers import AutoModelForCausalLM

    from gfcr.models import resolve_model
    from gfcr.train.sft import length_grouped_batches, packed_batches, sft_step, split_by_padding

    torch.set_num_threads(args.threads)
    path = resolve_model(args.model)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    if args.layers:
        model.model.layers = model.model.layers[: args.layers]
        model.config.num_hidden_layers = args.layers
        if getattr(model.config, "layer_types", None):
            model.config.layer_types = model.config.layer_types[: args.layers]
    model.train()
    rows, src = make_rows(args, model.config.vocab_size)
    lengths = [len(r["input_ids"]) for r in rows]
    plans = {"padded": [[[i] for i in b] for b in length_grouped_batches(lengths, args.batch_size, args.seed)],
             "packed": packed_batches(lengths, args.batch_size, args.max_tokens_per_row, args.seed)}
    arms = args.arms.split(",")
    limit = {"1": 1.0, "5": args.max_pad_fraction}
    planned = {}  # every layout's padding from the plans alone (no model), timed or not
    for a in ("padded-1", "padded-5", "packed-1", "packed-5"):
        layout, lim = a.split("-")
        real = slots = 0
        for bt in plans[layout]:
            rl = [sum(lengths[i] for i in row) for row in bt]
            for g in split_by_padding(rl, limit[lim]):
                real += sum(rl[k] for k in g)
                slots += len(g) * max(rl[k] for k in g)
        planned[a] = 1 - real / slots

    def step(arm: str, i: int) -> dict:
        layout, lim = arm.split("-")
        model.zero_grad(set_to_none=True)
        w0, c0 = time.perf_counter(), time.process_time()
        st = sft_step(model, rows, plans[layout][i], 0, packing=layout == "packed", max_pad_fraction=limit[lim])
        return {**st, "wall": time.perf_counter() - w0, "cpu": time.process_time() - c0}

    step("padded-1", 0)  # warm-up, not counted
    load0 = os.getloadavg()
    log: dict[str, list[dict]] = {a: [] for a in arms}
    n_steps = len(plans["padded"])
    for i in range(n_steps):
        for a in arms[i % len(arms):] + arms[: i % len(arms)]:
            log[a].append(step(a, i))
        print(f"step {i + 1}/{n_steps}: " + ", ".join(f"{a} {log[a][-1]['real'] / log[a][-1]['wall']:.0f} tok/s"
                                                       for a in arms), flush=True)
    res = {"model": str(path), "attn_implementation": model.config._attn_implementation, "threads": args.threads,
           "n": len(rows), "batch_size": args.batch_size, "max_tokens_per_row": args.max_tokens_per_row,
           "max_pad_fraction": args.max_pad_fraction, "loadavg_start": load0, "loadavg_end": os.getloadavg(),
           "layers": model.config.num_hidden_layers, "planned_pad_fraction": planned,
           "lengths": {"mean": statistics.mean(lengths), "median": statistics.median(lengths),
                       "min": min(lengths), "max": max(lengths), "source": src}, "arms": {}}
    for a, st in log.items():
        tot = {k: sum(s[k] for s in st) for k in ("wall", "cpu", "real", "slots", "forwards")}
        base = log.get(a.split("-")[0] + "-1")
        pairs = list(zip(st, base, strict=True)) if base else []
        res["arms"][a] = {
            "pad_fraction": 1 - tot["real"] / tot["slots"], "forwards": tot["forwards"],
            "wall_s": tot["wall"], "cpu_s": tot["cpu"], "tokens_per_wall_s": tot["real"] / tot["wall"],
            "tokens_per_cpu_s": tot["real"] / tot["cpu"],
            "median_step_speedup_wall": statistics.median(b["wall"] / s["wall"] for s, b in pairs) if pairs else None,
            "median_step_speedup_cpu": statistics.median(b["cpu"] / s["cpu"] for s, b in pairs) if pairs else None,
            "max_loss_diff_vs_one_tensor": max(abs(s["loss"] - b["loss"]) for s, b in pairs) if pairs else None,
        }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=2))
    print(f"lengths: {src}; mean {res['lengths']['mean']:.0f}, max {res['lengths']['max']}; "
          f"load {load0[0]:.1f} -> {res['loadavg_end'][0]:.1f}")
    print("| arm | padding | forwards | wall s | CPU s | tok/wall-s | tok/CPU-s | median step speed-up wall / CPU |")
    print("|---|---|---|---|---|---|---|---|")
    for a, r in res["arms"].items():
        sp = (f"{r['median_step_speedup_wall']:.2f}× / {r['median_step_speedup_cpu']:.2f}×"
              if r["median_step_speedup_wall"] else "-")
        print(f"| {a} | {r['pad_fraction']:.1%} | {r['forwards']} | {r['wall_s']:.1f} | {r['cpu_s']:.1f} | "
              f"{r['tokens_per_wall_s']:.0f} | {r['tokens_per_cpu_s']:.0f} | {sp} |")
    print("planned padding (all layouts): " + ", ".join(f"{a} {p:.1%}" for a, p in planned.items()))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
