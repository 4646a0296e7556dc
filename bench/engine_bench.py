"""Benchmark run (not a test): the ``vllm`` engine vs the ``hf`` engine on the same prompts, and the
``gfcr train`` step split with each. Runs in the vLLM venv (``make vllm``):

    OMP_NUM_THREADS=1 .venv-vllm/bin/python bench/engine_bench.py [--reps 3] [--max-tokens 32]
        [--batches 1,8,32] [--train-steps 2] [--out bench/out/engine_bench.json]

Generation: both engines are built once on the default model (fp32; vLLM with ``enforce_eager`` and
its engine core in its own process, as ``gfcr generate``/``gfcr eval`` run it). For each repetition
and each batch size (1, 8, 32 chat prompts of procedural arithmetic, one sample each, T = 0.7,
``max_tokens`` new tokens, a fresh seed per repetition so neither engine is handed a cached answer) the
two arms run back to back, the one that goes first alternating, so machine load falls on both alike.
Per call: generated tokens, wall seconds and CPU seconds of this process **plus all its child
processes** (vLLM's engine core and worker; ``psutil`` sums user + system time of every live
descendant before and after the call). Reported: medians over repetitions of tokens per wall-second
and per CPU-second, and the load average (``os.getloadavg``) before and after each call.

Train step split: ``gfcr train`` (in-process, :func:`gfcr.train.loop.train`) for ``--train-steps``
steps with ``generate.engine: hf`` (sampling with the policy in place) and ``vllm`` (its own copy,
weights pushed after each update, ``sync: copy``); the median over steps >= 1 (step 0 includes
warm-up) of each ``seconds/<stage>`` metric. The vLLM train arm runs its engine in this process
(``weight_sync=True``), as training needs, so its CPU time is this process's.

Prints a Markdown table and writes ``--out`` (JSON).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path


def cpu_seconds_tree() -> float:
    """User + system CPU seconds of this process and every live descendant (vLLM's engine core)."""
    import psutil

    me = psutil.Process()
    total = sum(me.cpu_times()[:2])
    for c in me.children(recursive=True):
        try:
            total += sum(c.cpu_times()[:2])
        except psutil.NoSuchProcess:
            pass
    return total


def prompts_for(n: int, seed: int) -> list[list[dict[str, str]]]:
    """``n`` chat prompts: level-2 sums drawn with ``seed`` (the same for both arms)."""
    import random

    rng = random.Random(seed)
    return [[{"role": "user", "content": f"What is {rng.randint(10, 99)} + {rng.randint(10, 99)}? Answer briefly."}]
            for _ in range(n)]


def timed_generate(engine, reqs) -> dict[str, float]:
    load0 = os.getloadavg()[0]
    c0, t0 = cpu_seconds_tree(), time.perf_counter()
    res = engine.generate(reqs)
    wall, cpu = time.perf_counter() - t0, cpu_seconds_tree() - c0
    toks = sum(len(r.token_ids) for group in res for r in group)
    return {"tokens": toks, "wall_s": wall, "cpu_s": cpu, "tok_per_wall_s": toks / wall,
            "tok_per_cpu_s": toks / max(cpu, 1e-9), "load_before": load0, "load_after": os.getloadavg()[0]}


def bench_generation(args) -> list[dict]:
    from gfcr.generate.engines import GenRequest, SamplingParams, make_engine

    engines = {"hf": make_engine("hf", model="default", device="cpu", max_batch=max(args.batches)),
               "vllm": make_engine("vllm", model="default", max_model_len=512)}
    engines["hf"].model.float()
    warm = [GenRequest(messages=prompts_for(1, 999)[0], params=SamplingParams(max_tokens=4, seed=0))]
    for e in engines.values():
        e.generate(warm)
    rows = []
    order = ["hf", "vllm"]
    for rep in range(args.reps):
        for b in args.batches:
            params = SamplingParams(n=1, temperature=0.7, max_tokens=args.max_tokens, seed=100 + rep)
            reqs = [GenRequest(messages=m, params=params) for m in prompts_for(b, seed=rep * 1000 + b)]
            for arm in order:
                r = timed_generate(engines[arm], reqs)
                rows.append({"rep": rep, "batch": b, "engine": arm} | r)
                print(f"rep {rep} batch {b:>2} {arm:>4}: {r['tokens']:>5} tok  {r['wall_s']:6.2f} s wall  "
                      f"{r['cpu_s']:6.2f} s CPU  load {r['load_before']:.1f}", flush=True)
            order.reverse()  # the arm that goes first alternates
    return rows


def bench_train(args, root: Path) -> dict[str, dict[str, float]]:
    from gfcr.train.config import load_config
    from gfcr.train.loop import train

    out = {}
    for arm in ("hf", "vllm"):
        extra = {"generate.engine.params": {"max_model_len": 512}} if arm == "vllm" else {}
        cfg = load_config(None, {
            "model": "default", "output_dir": str(root / "runs"), "steps": args.train_steps, "seed": 0,
            "tensorboard": False, "tasks": [{"name": "arith", "n_train": 16, "n_eval": 0, "params": {"level": 2}}],
            "generate.engine": arm, "generate.topology": {"name": "group", "params": {"k": 4}},
            "generate.prompts_per_step": 4,
            "generate.max_tokens": args.max_tokens, "generate.temperature": 0.7, "optim.micro_batch": 4,
            "verify.verifier": {"name": "numeric", "params": {"lenient_fallback": True}}, "checkpoint.every": 1000,
        } | extra)
        load0 = os.getloadavg()[0]
        c0, t0 = cpu_seconds_tree(), time.perf_counter()
        res = train(cfg, run_dir=root / f"train-{arm}", progress=False)
        wall, cpu = time.perf_counter() - t0, cpu_seconds_tree() - c0
        rows = [json.loads(x) for x in res.metrics_path.read_text().splitlines()]
        later = rows[1:] or rows
        keys = sorted({k for r in later for k in r if k.startswith("seconds/")})
        out[arm] = {k: statistics.median(r[k] for r in later if k in r) for k in keys} | {
            "run_wall_s": wall, "run_cpu_s": cpu, "steps": len(rows), "load_before": load0,
            "load_after": os.getloadavg()[0]}
        print(f"train {arm}: " + ", ".join(f"{k.removeprefix('seconds/')} {v:.2f}" for k, v in out[arm].items()
                                             if k.startswith("seconds/")), flush=True)
    return out


def table(rows: list[dict], batches: list[int]) -> str:
    lines = ["| batch | engine | tokens/wall-s | tokens/CPU-s (incl. children) | load (min–max) |", "|---|---|---|---|---|"]
    for b in batches:
        for arm in ("hf", "vllm"):
            rs = [r for r in rows if r["batch"] == b and r["engine"] == arm]
            loads = [r["load_before"] for r in rs] + [r["load_after"] for r in rs]
            lines.append(f"| {b} | {arm} | {statistics.median(r['tok_per_wall_s'] for r in rs):.1f} | "
                         f"{statistics.median(r['tok_per_cpu_s'] for r in rs):.1f} | {min(loads):.1f}–{max(loads):.1f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--train-steps", type=int, default=2, help="0 skips the train step split")
    ap.add_argument("--out", type=Path, default=Path("bench/out/engine_bench.json"))
    args = ap.parse_args()
    args.batches = [int(x) for x in args.batches.split(",")]
    import tempfile

    t0 = time.time()
    rows = bench_generation(args)
    print(table(rows, args.batches), flush=True)
    split = {}
    if args.train_steps:
        with tempfile.TemporaryDirectory() as d:
            split = bench_train(args, Path(d))
        keys = sorted({k for v in split.values() for k in v if k.startswith("seconds/")})
        print("| stage | " + " | ".join(split) + " |\n|---|" + "---|" * len(split))
        for k in keys:
            print(f"| {k.removeprefix('seconds/')} | " + " | ".join(f"{split[a].get(k, float('nan')):.2f}" for a in split) + " |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"generation": rows, "train_split": split, "total_wall_s": time.time() - t0,
                                    "args": {k: v for k, v in vars(args).items() if k != "out"},
                                    "cpus": os.cpu_count()}, indent=1))
    print(f"written: {args.out} ({time.time() - t0:.0f} s)")


if __name__ == "__main__":
    main()
