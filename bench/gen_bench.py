"""Generation benchmark: hf tokens/s at batch 1, 8, 32; tree vs group generated tokens at equal leaves.

    .venv/bin/python bench/gen_bench.py [--model DIR] [--max-tokens 64] [--prompts 2] [--threads 1]
        [--part all|throughput|tree] [--min-prefix-frac 0 0.5] [--out bench/out/gen.json]

Goals (issue 3): batch 32 >= 5x the tokens/s of batch 1 (same engine, same prompt, measured side by
side); the EPTree topology samples >= 30% fewer tokens than a group with the same number of leaves.
Tokens are counted with ``token_accounting``: ``sampled_tokens`` is what the engine sampled (a tree
child only from its branch point on); ``leaf_tokens`` counts every leaf's whole answer (equal for
tree and group by construction, since a branch gets the rest of the budget).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None, help="HF dir (default: SmolLM2-135M-Instruct, pulled on first use)")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--prompts", type=int, default=2, help="prompts for the tree-vs-group comparison")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch default); 1 is faster on a busy machine")
    ap.add_argument("--part", choices=("all", "throughput", "tree"), default="all")
    ap.add_argument("--min-prefix-frac", type=float, nargs="+", default=[0.0, 0.5],
                    help="EPTree min_prefix_frac values to compare (0 = TreeRL's plain top-n)")
    ap.add_argument("--out", default="bench/out/gen.json")
    a = ap.parse_args()

    import torch

    from gfcr.generate.engines import GenRequest, SamplingParams
    from gfcr.generate.engines.hf import HFEngine
    from gfcr.generate.topologies import EPTree, Group, token_accounting
    from gfcr.tasks.arith import make_arith

    if a.threads:
        torch.set_num_threads(a.threads)
    eng = HFEngine(a.model, max_batch=32)
    prompt = make_arith(n=1, level=2, seed=7).prompts()[0]
    ids = eng.encode_messages([m.to_dict() for m in prompt.messages])
    eng.generate([GenRequest(prompt_ids=ids, params=SamplingParams(max_tokens=4, seed=0))])  # warm-up
    res: dict = {"model": eng.model_name, "max_tokens": a.max_tokens, "threads": torch.get_num_threads()}
    if a.part in ("all", "throughput"):
        res["throughput"] = {}
        for b in (1, 8, 32):
            p = SamplingParams(n=b, temperature=1.0, max_tokens=a.max_tokens, seed=1, stop_token_ids=[])
            t0 = time.perf_counter()
            out = eng.generate([GenRequest(prompt_ids=ids, params=p)])[0]
            dt = time.perf_counter() - t0
            toks = sum(r.n_tokens for r in out)
            res["throughput"][b] = {"tokens": toks, "seconds": round(dt, 2), "tokens_per_s": round(toks / dt, 1)}
            print(f"batch {b:>2}: {toks} tokens in {dt:.1f}s = {toks / dt:.1f} tok/s", flush=True)
        t1, t32 = res["throughput"][1]["tokens_per_s"], res["throughput"][32]["tokens_per_s"]
        res["batch32_over_batch1"] = round(t32 / t1, 2)

    if a.part in ("all", "tree"):
        prompts = make_arith(n=a.prompts, level=2, seed=11).prompts()
        sp = SamplingParams(temperature=1.0, max_tokens=a.max_tokens)
        leaves = EPTree(m=6, n=2, l=1, t=2).leaves_per_prompt
        t0 = time.perf_counter()
        gr = Group(k=leaves, params=sp, seed=0).generate(eng, prompts, run_id="bench")
        g = token_accounting(gr)
        res["group"] = g.to_dict() | {"seconds": round(time.perf_counter() - t0, 1)}
        print(f"group k={leaves}: {res['group']}", flush=True)
        res["tree"] = {}
        for f in a.min_prefix_frac:
            tree = EPTree(m=6, n=2, l=1, t=2, params=sp, seed=0, min_prefix_frac=f)
            t0 = time.perf_counter()
            tr = tree.generate(eng, prompts, run_id="bench")
            t = token_accounting(tr)
            offs = [r.meta["tree"]["fork_offset"] / max(r.meta["tree"]["parent_gen_tokens"], 1) for r in tr if r.parent_id]
            res["tree"][str(f)] = t.to_dict() | {
                "seconds": round(time.perf_counter() - t0, 1),
                "token_saving_per_leaf": round(1 - t.sampled_per_leaf / g.sampled_per_leaf, 3),
                "leaf_token_ratio": round(t.leaf_tokens_per_leaf / g.leaf_tokens_per_leaf, 3),
                "mean_fork_position": round(sum(offs) / max(len(offs), 1), 3),
            }
            print(f"tree min_prefix_frac={f}: {res['tree'][str(f)]}", flush=True)
    print(json.dumps(res, indent=1))
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
