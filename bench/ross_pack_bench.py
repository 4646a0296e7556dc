"""Masked-SFT throughput: packed rows vs length-grouped padded batches (benchmark, not a test).

Same model, same sequences, same number of sequences per step, measured side by side in one run:
the two layouts' steps are interleaved (padded step i, packed step i, …) so machine load hits both
alike. Each step is one forward + backward of :func:`gfcr.train.losses.masked_nll` (the AdamW update
costs the same in both layouts and is left out). Reports real (non-padding) tokens per second and
the padding fraction of each layout, plus that of naive random padded batches for reference.

Lengths are log-normal (median ``--median``, clipped to ``[--min-len, --max-len]``), or the
lengths of a built ROSS dataset (``--lengths-from data.parquet``); token ids are random, the
first 30% of each sequence is context (not supervised).

    .venv/bin/python bench/ross_pack_bench.py [--n 48] [--batch-size 8] [--max-tokens-per-row 1024]

Writes ``bench/out/ross_pack_bench.json``.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path

import numpy as np


def make_rows(args: argparse.Namespace, vocab: int) -> list[dict]:
    rng = np.random.default_rng(args.seed)
    if args.lengths_from:
        import pyarrow.parquet as pq

        col = pq.read_table(args.lengths_from, columns=["input_ids"]).column("input_ids").to_pylist()
        lengths = [len(x) for x in col][: args.n]
    else:
        raw = rng.lognormal(np.log(args.median), args.sigma, args.n)
        lengths = [int(x) for x in np.clip(raw, args.min_len, args.max_len)]
    rows = []
    for n in lengths:
        ctx = max(1, int(0.3 * n))
        rows.append({"input_ids": rng.integers(10, vocab, n).tolist(), "loss_mask": [0] * ctx + [1] * (n - ctx)})
    return rows


def pad_fraction(row_lengths: list[list[int]]) -> float:
    """Per step, the token count of each row; a step is a [rows, longest row] tensor."""
    slots = sum(len(rl) * max(rl) for rl in row_lengths)
    return 1 - sum(map(sum, row_lengths)) / slots


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="HF dir/name (default: the cached SmolLM2-135M-Instruct)")
    ap.add_argument("--n", type=int, default=48, help="sequences")
    ap.add_argument("--batch-size", type=int, default=8, help="sequences per step (both layouts)")
    ap.add_argument("--max-tokens-per-row", type=int, default=1024)
    ap.add_argument("--median", type=float, default=150)
    ap.add_argument("--sigma", type=float, default=0.5)
    ap.add_argument("--min-len", type=int, default=60)
    ap.add_argument("--max-len", type=int, default=400)
    ap.add_argument("--lengths-from", default=None, help="a ROSS data.parquet whose row lengths are used")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="bench/out/ross_pack_bench.json")
    args = ap.parse_args()

    import torch
    from transformers import AutoModelForCausalLM

    from gfcr.models import resolve_model
    from gfcr.train.losses import masked_nll
    from gfcr.train.sft import (
        additive_mask,
        collate,
        collate_packed,
        length_grouped_batches,
            packed_batches,
    )

    torch.set_num_threads(args.threads)
    path = resolve_model(args.model)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model.train()
    impl = model.config._attn_implementation
    rows = make_rows(args, model.config.vocab_size)
    lengths = [len(r["input_ids"]) for r in rows]
    padded = [[b] for b in length_grouped_batches(lengths, args.batch_size, args.seed)]
    packed = packed_batches(lengths, args.batch_size, args.max_tokens_per_row, args.seed)
    order = list(range(len(lengths)))
    random.Random(args.seed).shuffle(order)
    naive = [[order[s : s + args.batch_size]] for s in range(0, len(order), args.batch_size)]

    def step(layout: str, bt: list[list[int]]) -> tuple[float, int, int]:
        if layout == "packed":
            b = collate_packed([[rows[i] for i in row] for row in bt], pad_id=0)
            fwd = {"input_ids": b["input_ids"], "position_ids": b["position_ids"],
                   "attention_mask": additive_mask(b["attention_mask"], torch.float32)}
        else:
            b = collate([rows[i] for i in bt[0]], pad_id=0)
            fwd = {"input_ids": b["input_ids"], "attention_mask": b["attention_mask"]}
        t0 = time.perf_counter()
        model.zero_grad(set_to_none=True)
        loss, _ = masked_nll(model(**fwd).logits, b["input_ids"], b["loss_mask"])
        loss.backward()
        dt = time.perf_counter() - t0
        return dt, sum(lengths[i] for row in bt for i in row), b["input_ids"].numel()

    # warm-up (not timed): one small step of each layout
    step("padded", [sorted(range(len(lengths)), key=lengths.__getitem__)[:2]])
    step("packed", [[0], [1]])
    acc = {k: {"seconds": 0.0, "tokens": 0, "slots": 0, "step_tok_s": []} for k in ("padded", "packed")}
    t_all = time.perf_counter()
    for i, (pb, kb) in enumerate(zip(padded, packed, strict=True)):
        for name, bt in (("padded", pb), ("packed", kb)):
            dt, real, slots = step(name, bt)
            a = acc[name]
            a["seconds"] += dt
            a["tokens"] += real
            a["slots"] += slots
            a["step_tok_s"].append(real / dt)
        print(f"step {i + 1}/{len(padded)}: padded {acc['padded']['step_tok_s'][-1]:.0f} tok/s, "
              f"packed {acc['packed']['step_tok_s'][-1]:.0f} tok/s", flush=True)
    res = {
        "model": str(path), "attn_implementation": impl, "threads": args.threads, "n": len(rows),
        "batch_size": args.batch_size, "max_tokens_per_row": args.max_tokens_per_row,
        "lengths": {"mean": statistics.mean(lengths), "min": min(lengths), "max": max(lengths),
                    "source": args.lengths_from or f"lognormal(median={args.median}, sigma={args.sigma}) "
                                                    f"clipped to [{args.min_len}, {args.max_len}]"},
        "pad_fraction": {"padded_length_grouped": pad_fraction([[lengths[i] for i in b[0]] for b in padded]),
                         "padded_random": pad_fraction([[lengths[i] for i in b[0]] for b in naive]),
                         "packed": pad_fraction([[sum(lengths[i] for i in row) for row in b] for b in packed])},
        "rows_per_step_packed": statistics.mean(len(b) for b in packed),
        "wall_s": time.perf_counter() - t_all,
    }
    for k, a in acc.items():
        res[k] = {"tokens_per_s": a["tokens"] / a["seconds"], "seconds": a["seconds"], "tokens": a["tokens"],
                  "slots": a["slots"], "median_step_tok_s": statistics.median(a["step_tok_s"])}
    res["packed_over_padded"] = res["packed"]["tokens_per_s"] / res["padded"]["tokens_per_s"]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=2))
    pf = res["pad_fraction"]
    print("| layout | real tokens/s | padding fraction |\n|---|---|---|")
    print(f"| padded, length-grouped | {res['padded']['tokens_per_s']:.0f} | {pf['padded_length_grouped']:.1%} |")
    print(f"| packed ({args.max_tokens_per_row}/row) | {res['packed']['tokens_per_s']:.0f} | {pf['packed']:.1%} |")
    print(f"| padded, random batches (not timed) | – | {pf['padded_random']:.1%} |")
    print(f"packed / padded throughput: {res['packed_over_padded']:.2f}×  (attention: {impl}); wrote {args.out}")


if __name__ == "__main__":
    main()
