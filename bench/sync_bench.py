"""Benchmark (not a test): what a weight push costs next to the training step it follows.

    .venv/bin/python bench/sync_bench.py [--repeats 3] [--tokens 128] [--batch 4]

On the default model (SmolLM2-135M-Instruct, fp32 trainer) it times, side by side in one process:

- the baseline: one forward+backward of the policy over ``batch x tokens`` tokens (a small update);
- ``in_place``: the hf engine on the training module (only the version string moves);
- ``copy`` into an fp32 and a bf16 hf engine (the path vLLM's colocated sync takes in process);
- ``http``: write a safetensors file, then ``gfcr serve --allow-weight-updates`` (in a thread, on
  loopback) reads and loads it.

Writes ``bench/out/sync_bench.json`` and prints each sync's median seconds and its ratio to the
baseline.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path


def _median_time(fn, repeats: int) -> float:
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--batch", type=int, default=4)
    args = ap.parse_args()

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from gfcr.generate.engines.hf import HFEngine
    from gfcr.generate.engines.openai import OpenAIEngine
    from gfcr.generate.sync import HTTPSync, InPlaceSync, StateDictSync
    from gfcr.models import resolve_model
    from gfcr.serve import serve_in_thread

    path = resolve_model(None)
    tok = AutoTokenizer.from_pretrained(path)
    policy = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    n_bytes = sum(p.numel() * p.element_size() for p in policy.parameters())
    x = torch.randint(0, len(tok), (args.batch, args.tokens))

    def fwd_bwd() -> None:
        policy.zero_grad(set_to_none=True)
        policy(input_ids=x, labels=x).loss.backward()

    out: dict[str, float | int | str] = {"model": Path(path).name, "param_bytes": int(n_bytes),
                                         "baseline": f"forward+backward over {args.batch}x{args.tokens} tokens"}
    out["baseline_s"] = _median_time(fwd_bwd, args.repeats)
    in_place = InPlaceSync(HFEngine(policy, tok))
    out["in_place_s"] = _median_time(lambda: in_place.push(policy, "v"), args.repeats)
    for dtype in ("float32", "bfloat16"):
        eng = HFEngine(path, tok, dtype=dtype)
        sync = StateDictSync(eng)
        out[f"copy_{dtype}_s"] = _median_time(lambda sync=sync: sync.push(policy, "v"), args.repeats)
        del eng
    served = HFEngine(path, tok)
    with tempfile.TemporaryDirectory() as d, serve_in_thread(served, model_name="m", allow_weight_updates=True) as url:
        sync = HTTPSync(OpenAIEngine(url, "m"), d)
        out["http_s"] = _median_time(lambda: sync.push(policy, "v"), args.repeats)
    for k in ("in_place_s", "copy_float32_s", "copy_bfloat16_s", "http_s"):
        out[k.replace("_s", "_over_baseline")] = round(float(out[k]) / float(out["baseline_s"]), 3)
    out = {k: round(v, 4) if isinstance(v, float) else v for k, v in out.items()}
    Path("bench/out").mkdir(parents=True, exist_ok=True)
    Path("bench/out/sync_bench.json").write_text(json.dumps(out, indent=1))
    print(f"baseline ({out['baseline']}): {out['baseline_s']:.3f} s; weights {n_bytes / 2**20:.0f} MiB")
    for k in ("in_place", "copy_float32", "copy_bfloat16", "http"):
        print(f"  {k:14s} {out[k + '_s']:.3f} s  = {out[k + '_over_baseline']:.3f} x baseline")


if __name__ == "__main__":
    main()
