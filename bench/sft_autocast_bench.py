"""Masked-SFT autocast benchmark: one ``sft_step`` in float32 against bfloat16 autocast.

    python bench/sft_autocast_bench.py                      # SmolLM2-135M, 8 rows x 150 tokens, 5 rounds
    python bench/sft_autocast_bench.py --rows 8 --tokens 120 --rounds 8 --model default

Two arms, each its own copy of the model (loaded once per arm; loading is not timed):

- ``float32``: ``sft_step(..., autocast=None)``, the default;
- ``bfloat16``: ``sft_step(..., autocast="bfloat16")``: the forwards under ``torch.autocast``, weights
  and gradients in float32.

Each round times one step (forward, backward and an AdamW update) per arm on the same fresh batch
(random token ids, the last two thirds supervised), the arms' order alternating every round so
machine load hits them alike. One untimed step per arm warms the kernels first. Per arm: the medians
(fresh samples, never the best of repeats) of wall and CPU seconds, their ratio, the loss of each
arm's first step on each batch, and the 1-minute load average at each sample. The gain depends on
the CPU: bfloat16 matrix units (AMX, AVX512-BF16) are what make it faster; without them autocast
can be slower.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import time

import torch

from gfcr.train.sft import sft_step

ARMS = ("float32", "bfloat16")


def cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def load_model(name: str):
    from transformers import AutoModelForCausalLM

    from gfcr.models import resolve_model

    return AutoModelForCausalLM.from_pretrained(resolve_model(name), dtype=torch.float32)


def batch(rows: int, tokens: int, vocab: int, seed: int) -> list[dict]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, vocab, (rows, tokens), generator=g).tolist()
    ctx = tokens // 3
    return [{"input_ids": r, "loss_mask": [0] * ctx + [1] * (tokens - ctx)} for r in ids]


def one_step(model, opt, rows, autocast):
    opt.zero_grad(set_to_none=True)
    t0, c0 = time.perf_counter(), cpu_s()
    st = sft_step(model, rows, [[i] for i in range(len(rows))], 0, max_pad_fraction=1.0, autocast=autocast)
    opt.step()
    return time.perf_counter() - t0, cpu_s() - c0, st["loss"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="default")
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=150)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    models = {a: load_model(args.model) for a in ARMS}
    opts = {a: torch.optim.AdamW(models[a].parameters(), lr=1e-6) for a in ARMS}
    vocab = models[ARMS[0]].config.vocab_size
    for a in ARMS:  # warm-up, untimed
        one_step(models[a], opts[a], batch(args.rows, args.tokens, vocab, -1), None if a == "float32" else a)
    samples = {a: [] for a in ARMS}
    for r in range(args.rounds):
        rows = batch(args.rows, args.tokens, vocab, r)
        for a in (ARMS if r % 2 == 0 else ARMS[::-1]):
            w, c, loss = one_step(models[a], opts[a], rows, None if a == "float32" else a)
            samples[a].append({"wall_s": w, "cpu_s": c, "loss": loss, "load_1m": os.getloadavg()[0]})
            print(f"round {r} {a}: {w:.2f} s wall, {c:.2f} s CPU, loss {loss:.4f}", flush=True)
    out = {"args": vars(args), "threads": torch.get_num_threads(), "arms": {}}
    for a in ARMS:
        s = samples[a]
        out["arms"][a] = {"wall_s": statistics.median(x["wall_s"] for x in s),
                          "cpu_s": statistics.median(x["cpu_s"] for x in s),
                          "load_1m": [round(x["load_1m"], 2) for x in s], "losses": [round(x["loss"], 4) for x in s]}
    f, b = out["arms"]["float32"], out["arms"]["bfloat16"]
    out["speedup_wall"] = f["wall_s"] / b["wall_s"]
    out["speedup_cpu"] = f["cpu_s"] / b["cpu_s"]
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
