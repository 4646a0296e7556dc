"""Benchmark (not a test): generation through RayEngine actors against the in-process hf engine.

    .venv/bin/python bench/ray_engine_bench.py [--prompts 16] [--k 2] [--tokens 32]

Same seeded requests on the default model (SmolLM2-135M-Instruct), side by side in one run: the
in-process ``HFEngine`` with 1 and 2 torch threads (the baseline), then ``RayEngine`` with 1 and 2
workers (1 thread each) on a local loopback-only cluster of 2 CPUs. Best of 2 timed calls after a
warm-up call. Also times the engine start and one ``load_weights`` of the whole model (the weight
sync the training loop does after each update). Writes ``bench/out/ray_engine_bench.json``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--k", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=32)
    args = ap.parse_args()

    import torch

    from gfcr.generate.engines.base import GenRequest, SamplingParams
    from gfcr.generate.engines.hf import HFEngine
    from gfcr.scale import init_ray
    from gfcr.scale.engine import RayEngine

    def requests(engine):
        sp = SamplingParams(temperature=1.0, max_tokens=args.tokens, n=args.k)
        return [GenRequest(prompt_ids=engine.encode_messages([{"role": "user", "content": f"What is {i} + {i + 3}? Think step by step."}]),
                           params=sp.model_copy(update={"seed": i})) for i in range(args.prompts)]

    def timed(engine) -> dict[str, float]:
        engine.generate(requests(engine)[:1])  # warm-up
        best, toks = float("inf"), 0
        for _ in range(2):
            t0 = time.perf_counter()
            out = engine.generate(requests(engine))
            best = min(best, time.perf_counter() - t0)
            toks = sum(len(r.token_ids) for rs in out for r in rs)
        return {"seconds": round(best, 3), "tokens": toks, "tokens_per_s": round(toks / best, 1)}

    res: dict[str, dict[str, float]] = {}
    for threads in (1, 2):
        torch.set_num_threads(threads)
        eng = HFEngine(None, max_batch=32)
        res[f"hf_in_process_{threads}_threads"] = timed(eng)
        del eng
    torch.set_num_threads(1)
    init_ray(num_cpus=2)
    weights = HFEngine(None).model.state_dict()
    for w in (1, 2):
        t0 = time.perf_counter()
        eng = RayEngine(model=None, workers=w, inner_params={"max_batch": 32})
        start = time.perf_counter() - t0
        t1 = time.perf_counter()
        eng.load_weights(weights, "bench")
        sync = time.perf_counter() - t1
        res[f"ray_{w}_workers"] = timed(eng) | {"start_s": round(start, 2), "load_weights_s": round(sync, 2)}
        eng.close()
    base = res["hf_in_process_2_threads"]["tokens_per_s"]
    for v in res.values():
        v["x_in_process_2_threads"] = round(v["tokens_per_s"] / base, 2)
    Path("bench/out").mkdir(parents=True, exist_ok=True)
    Path("bench/out/ray_engine_bench.json").write_text(json.dumps(res, indent=1))
    for k, v in res.items():
        print(f"{k:28s} {v['seconds']:7.2f} s {v['tokens_per_s']:7.1f} tok/s  {v['x_in_process_2_threads']:.2f}x"
              + (f"  start {v['start_s']} s, load_weights {v['load_weights_s']} s" if "start_s" in v else ""))


if __name__ == "__main__":
    main()
