"""Benchmark (not a test): what the free entropy signal saves per RL step.

    .venv/bin/python bench/entropy_bench.py [--prompts 4] [--k 4] [--tokens 64] [--repeats 2]

On the default model, one training step's generation (``prompts`` × ``k`` samples of up to
``tokens`` tokens, the group topology, as in configs/arith-smollm2.yaml), side by side in one run:

- generation as the hf engine runs it now (it also returns each token's sampling entropy);
- the same generation with the entropy computation replaced by a no-op (its overhead);
- the no-grad forward the loop used to run to get ``signals["entropy"]`` (what is saved).

Best of ``repeats``. Writes ``bench/out/entropy_bench.json``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()

    import numpy as np
    import torch

    import gfcr.generate.engines.hf as hf
    from gfcr.generate.engines.base import SamplingParams
    from gfcr.generate.topologies import make_topology
    from gfcr.tasks.arith import make_arith
    from gfcr.train.config import LossConfig, OptimConfig
    from gfcr.train.trainer import PolicyTrainer

    eng = hf.HFEngine(None, max_batch=32)
    prompts = make_arith(n=args.prompts, level=2, seed=0).prompts()
    topo = make_topology("group", k=args.k, params=SamplingParams(temperature=0.7, max_tokens=args.tokens), seed=0)
    trainer = PolicyTrainer(eng.model, LossConfig(), OptimConfig(), eng.tokenizer.pad_token_id, temperature=0.7)

    def best(fn):
        out, t_best = None, float("inf")
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            out = fn()
            t_best = min(t_best, time.perf_counter() - t0)
        return out, t_best

    real = hf.entropy_of
    rs, t_gen = best(lambda: topo.generate(eng, prompts, "b", 0))
    hf.entropy_of = lambda lp, probs: torch.zeros(lp.shape[:-1])
    try:
        _, t_gen_noent = best(lambda: topo.generate(eng, prompts, "b", 0))
    finally:
        hf.entropy_of = real
    ents, t_fwd = best(lambda: trainer.rollout_entropy(rs))
    diff = float(np.max(np.abs(np.array([r.signals["entropy"] for r in rs]) - ents)))
    out = {
        "rollouts": len(rs), "gen_tokens": int(sum(r.n_generated for r in rs)),
        "generate_s": round(t_gen, 2), "generate_without_entropy_s": round(t_gen_noent, 2),
        "entropy_overhead": round(t_gen / t_gen_noent - 1.0, 3),
        "forward_entropy_s": round(t_fwd, 2), "forward_over_generate": round(t_fwd / t_gen, 3),
        "max_abs_diff_engine_vs_forward": diff,
    }
    Path("bench/out").mkdir(parents=True, exist_ok=True)
    Path("bench/out/entropy_bench.json").write_text(json.dumps(out, indent=1))
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
