"""Generation benchmark: hf tokens/s at batch 1, 8, 32; tree vs group at equal leaves.

    OMP_NUM_THREADS=1 .venv/bin/python bench/gen_bench.py [--model DIR] [--max-tokens 48] [--reps 3]
        [--prompts 2] [--threads 1] [--part all|throughput|tree|sampler] [--out bench/out/gen.json]

Every arm is timed in wall and CPU seconds (this process, all torch threads); arms take turns
inside each repetition (the order rotating), every repetition uses fresh seeds, and the report
gives medians over repetitions with the machine load (``os.getloadavg``) seen during each arm.

- throughput: one request of ``n = 1, 8, 32`` samples of the same prompt; tokens per wall second
  and per CPU second. Goal: batch 32 >= 5x batch 1 per CPU second.
- sampler: the sampling step alone at batch 32 on the model's logits (repeated per row), CPU ms per
  decode step: the engine's vectorised step (``DecodeState.step``: one inverse-CDF draw for all rows
  from per-row seeded uniforms) against the rule it replaced (the same log-probs and entropy, then one
  seeded ``torch.multinomial`` per row), alternated.
- tree vs group: EPTree (6x2x1x2, 30 leaves per prompt) decoded as one growing batch, the same tree
  decoded round by round (the engine-independent path), and a group of k = 30: sampled tokens
  (``token_accounting``) and time. Goal: the tree samples >= 30% fewer tokens per leaf and takes
  less wall time than the group.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path


def timed(fn):
    load = os.getloadavg()[0]
    t0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    return out, {"wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0, "load": load}


def med(rows: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def throughput(eng, ids, a) -> dict:
    from gfcr.generate.engines import GenRequest, SamplingParams

    arms = {b: [] for b in (1, 8, 32)}
    order = list(arms)
    for rep in range(a.reps):
        for k in range(len(order)):
            b = order[(rep + k) % len(order)]
            p = SamplingParams(n=b, temperature=1.0, max_tokens=a.max_tokens, seed=1000 * rep + b, stop_token_ids=[])
            out, t = timed(lambda p=p: eng.generate([GenRequest(prompt_ids=ids, params=p)])[0])
            toks = sum(r.n_tokens for r in out)
            arms[b].append(t | {"tokens": toks, "tok_per_s": toks / t["wall_s"], "tok_per_cpu_s": toks / t["cpu_s"]})
            print(f"rep {rep} batch {b:>2}: {toks} tokens, {t['wall_s']:.1f} s wall, {t['cpu_s']:.1f} s CPU, load {t['load']:.1f}", flush=True)
    res = {str(b): {"tok_per_s": med(rows, "tok_per_s"), "tok_per_cpu_s": med(rows, "tok_per_cpu_s"),
                    "load": med(rows, "load"), "reps": rows} for b, rows in arms.items()}
    res["batch32_over_batch1_wall"] = res["32"]["tok_per_s"] / res["1"]["tok_per_s"]
    res["batch32_over_batch1_cpu"] = res["32"]["tok_per_cpu_s"] / res["1"]["tok_per_cpu_s"]
    return res


def _per_row_multinomial(logits, gens) -> list[int]:
    """The sampling rule the vectorised step replaced (reference arm): log-probs, entropy, then one
    seeded ``torch.multinomial`` over the vocabulary and one ``float(lp[t])`` per row."""
    import torch

    from gfcr.generate.engines.hf_sampling import sampling_logprobs

    lp = sampling_logprobs(logits, 1.0)
    probs = lp.exp()
    ent = -torch.where(probs > 0, probs * lp, torch.zeros_like(lp)).sum(-1)
    out = []
    for i, g in enumerate(gens):
        t = int(torch.multinomial(probs[i], 1, generator=g))
        out.append((t, float(lp[i, t]), float(ent[i])))
    return out


def sampler(eng, ids, a) -> dict:
    import torch

    from gfcr.generate.engines import GenRequest, SamplingParams
    from gfcr.generate.engines.decode import DecodeState
    from gfcr.generate.engines.hf_sampling import row_generator

    B, steps = 32, 20
    with torch.no_grad():
        logits = eng.model(input_ids=torch.tensor([ids])).logits[:, -1, :].float().repeat(B, 1)
    arms = {"per-row multinomial (before)": [], "vectorised step": []}
    order = list(arms)
    for rep in range(a.reps):
        sp = SamplingParams(n=B, temperature=1.0, max_tokens=steps, seed=rep)
        rows = [(0, si, ids, sp, GenRequest(prompt_ids=ids, params=sp)) for si in range(B)]
        for k in range(len(order)):
            name = order[(rep + k) % len(order)]
            if name == "vectorised step":
                st = DecodeState(rows, eng.eos_ids, len(eng.tokenizer), eng.model.config)
                live = list(range(B))

                def run(st=st, live=live):
                    for _ in range(steps):
                        toks, *_ = st.step(logits, live)
                        for i, t in zip(live, toks, strict=True):
                            st.toks[i].append(t)
            else:
                gens = [row_generator(rep, si) for si in range(B)]

                def run(gens=gens):
                    for _ in range(steps):
                        _per_row_multinomial(logits, gens)
            _, t = timed(run)
            arms[name].append(t | {"cpu_ms_per_step": 1000 * t["cpu_s"] / steps, "wall_ms_per_step": 1000 * t["wall_s"] / steps})
            print(f"rep {rep} {name}: {arms[name][-1]['cpu_ms_per_step']:.1f} CPU ms/step, load {t['load']:.1f}", flush=True)
    res = {name: {"cpu_ms_per_step": med(rows, "cpu_ms_per_step"), "wall_ms_per_step": med(rows, "wall_ms_per_step"),
                  "load": med(rows, "load"), "reps": rows} for name, rows in arms.items()}
    res["before_over_after_cpu"] = res[order[0]]["cpu_ms_per_step"] / res[order[1]]["cpu_ms_per_step"]
    return res


def tree_vs_group(eng, a) -> dict:
    from gfcr.generate.engines import SamplingParams
    from gfcr.generate.topologies import EPTree, Group, token_accounting
    from gfcr.tasks.arith import make_arith

    prompts = make_arith(n=a.prompts, level=2, seed=11).prompts()
    sp = SamplingParams(temperature=1.0, max_tokens=a.max_tokens)
    leaves = EPTree(m=6, n=2, l=1, t=2).leaves_per_prompt
    arms = {"group": [], "tree (growing batch)": [], "tree (round by round)": []}
    order = list(arms)
    for rep in range(a.reps):
        tree = EPTree(m=6, n=2, l=1, t=2, params=sp, seed=rep, min_prefix_frac=a.min_prefix_frac)
        run = {
            "group": lambda rep=rep: Group(k=leaves, params=sp, seed=rep).generate(eng, prompts, run_id="bench"),
            "tree (growing batch)": lambda tree=tree: tree.generate(eng, prompts, run_id="bench"),
            "tree (round by round)": lambda tree=tree: tree._generate_rounds(eng, prompts, run_id="bench", step=0),
        }
        for k in range(len(order)):
            name = order[(rep + k) % len(order)]
            rs, t = timed(run[name])
            acc = token_accounting(rs)
            arms[name].append(t | {"sampled_per_leaf": acc.sampled_per_leaf, "leaves": len(rs)})
            print(f"rep {rep} {name}: {len(rs)} leaves, {acc.sampled_per_leaf:.1f} sampled tokens/leaf, "
                  f"{t['wall_s']:.1f} s wall, {t['cpu_s']:.1f} s CPU, load {t['load']:.1f}", flush=True)
    res = {name: {"wall_s": med(rows, "wall_s"), "cpu_s": med(rows, "cpu_s"), "sampled_per_leaf": med(rows, "sampled_per_leaf"),
                  "load": med(rows, "load"), "reps": rows} for name, rows in arms.items()}
    g = res["group"]
    for name in ("tree (growing batch)", "tree (round by round)"):
        res[name]["token_saving_per_leaf"] = 1 - res[name]["sampled_per_leaf"] / g["sampled_per_leaf"]
        res[name]["wall_over_group"] = res[name]["wall_s"] / g["wall_s"]
        res[name]["cpu_over_group"] = res[name]["cpu_s"] / g["cpu_s"]
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None, help="HF dir (default: SmolLM2-135M-Instruct, pulled on first use)")
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--reps", type=int, default=3, help="repetitions (fresh seeds) per arm")
    ap.add_argument("--prompts", type=int, default=2, help="prompts for the tree-vs-group comparison")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1 on a shared machine)")
    ap.add_argument("--part", choices=("all", "throughput", "tree", "sampler"), default="all")
    ap.add_argument("--min-prefix-frac", type=float, default=0.5, help="EPTree min_prefix_frac")
    ap.add_argument("--out", default="bench/out/gen.json")
    a = ap.parse_args()

    import torch

    from gfcr.generate.engines import GenRequest, SamplingParams
    from gfcr.generate.engines.hf import HFEngine
    from gfcr.tasks.arith import make_arith

    torch.set_num_threads(a.threads)
    eng = HFEngine(a.model, max_batch=32)
    prompt = make_arith(n=1, level=2, seed=7).prompts()[0]
    ids = eng.encode_messages([m.to_dict() for m in prompt.messages])
    eng.generate([GenRequest(prompt_ids=ids, params=SamplingParams(max_tokens=4, seed=0))])  # warm-up
    res: dict = {"model": eng.model_name, "max_tokens": a.max_tokens, "threads": torch.get_num_threads(),
                 "reps": a.reps, "cpus": os.cpu_count(), "load_start": os.getloadavg()}
    if a.part in ("all", "throughput"):
        res["throughput"] = throughput(eng, ids, a)
    if a.part in ("all", "sampler"):
        res["sampler"] = sampler(eng, ids, a)
    if a.part in ("all", "tree"):
        res["tree_vs_group"] = tree_vs_group(eng, a)
    res["load_end"] = os.getloadavg()
    slim = json.loads(json.dumps(res))
    for part in ("throughput", "sampler", "tree_vs_group"):
        for v in slim.get(part, {}).values():
            if isinstance(v, dict):
                v.pop("reps", None)
    print(json.dumps(slim, indent=1))
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
