"""Benchmark run (not a test): retrieval-guided generation vs plain generation, paired per prompt.

    OMP_NUM_THREADS=1 .venv/bin/python bench/retrieval_bench.py [--model default] [--n-train 200] [--k-train 4]
        [--n-eval 100] [--k 4] [--seeds 2] [--max-tokens 64] [--embed hash]

Stages, each timed (wall and CPU seconds), load average at start and end:

1. **source store**: ``gfcr generate`` on ``--n-train`` prompts of the arith task's *train* split
   (``--k-train`` samples each), then ``reverify_store`` with the numeric verifier (lenient
   fallback), so the store holds verified solved cases;
2. **held-out prompts**: ``--n-eval`` prompts of the *test* split (never in the store);
3. **plain**: ``evaluate_model`` (``--k`` samples at T = 0.7 + greedy) on the prompts as they are;
4. **retrieval**: the same prompts through ``RetrievalSeeder`` (the ``--seeds`` nearest solved cases
   of the source store as in-context turns; what ``gfcr generate``'s ``retrieve:`` option does), same
   sampling seeds;
5. paired comparisons: sampled pass@1 (paired bootstrap + sign-flip test), greedy pass@1 (McNemar),
   and the share of all-wrong groups (a prompt whose ``--k`` samples are all wrong: no GRPO signal),
   McNemar over prompts.

Also reported: the share of held-out prompts one of whose seeds solved a prompt with the same
answer (a seed that hands the answer over rather than the method). Writes
``bench/out/retrieval_bench.json`` and prints the table. What it can show: whether seeds move
held-out accuracy and the all-wrong share at this model size; not: anything about training with
seeds (no update is taken), or about other tasks or embedders.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import tempfile
import time
from pathlib import Path
from typing import Any


def _cpu() -> float:
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


def main() -> None:
    from gfcr.evaluate import compare_paired, eval_prompts, evaluate_model, mcnemar
    from gfcr.filters.apply import reverify_store
    from gfcr.filters.verifiers import get_verifier
    from gfcr.generate.engines.hf import HFEngine
    from gfcr.generate.run import GenerateConfig, run_generate
    from gfcr.models import resolve_model
    from gfcr.replay.retrieval import RetrievalSeeder
    from gfcr.store import RolloutStore

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="default")
    ap.add_argument("--n-train", type=int, default=200)
    ap.add_argument("--k-train", type=int, default=4)
    ap.add_argument("--n-eval", type=int, default=100)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--level", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--embed", default="hash")
    ap.add_argument("--out", default="bench/out/retrieval_bench.json")
    args = ap.parse_args()
    load0, timings, out = os.getloadavg(), {}, {"args": vars(args)}

    def stage(name: str, fn: Any) -> Any:
        t0, c0 = time.perf_counter(), _cpu()
        res = fn()
        timings[name] = {"wall_s": round(time.perf_counter() - t0, 1), "cpu_s": round(_cpu() - c0, 1)}
        return res

    model = resolve_model(None if args.model == "default" else args.model)
    tmp = Path(tempfile.mkdtemp(prefix="retrieval_bench_"))
    vparams = {"lenient_fallback": True}
    gen = GenerateConfig.model_validate({
        "store": str(tmp / "src"), "tasks": {"name": "arith", "params": {"n": args.n_train, "level": args.level, "split": "train"}},
        "engine": {"name": "hf", "params": {"model": model}}, "topology": {"name": "group", "k": args.k_train},
        "sampling": {"temperature": 0.7, "max_tokens": args.max_tokens}})
    stage("source_generate", lambda: run_generate(gen, progress=False))
    src = RolloutStore.open(tmp / "src")
    stage("source_verify", lambda: reverify_store(src, get_verifier("numeric", **vparams)))
    solved = sum(bool(r.verified) for r in src.rollouts())
    prompts, notes = eval_prompts("arith", args.n_eval, split="test", level=args.level)
    seeder = stage("index", lambda: RetrievalSeeder(src, k=args.seeds, embed=args.embed))
    seeded = stage("seed", lambda: seeder.seed(prompts))
    engine = HFEngine(model)
    kw = {"k": args.k, "verifier": "numeric", "verifier_params": vparams, "max_tokens": args.max_tokens, "seed": 0}
    plain = stage("eval_plain", lambda: evaluate_model(engine, prompts, **kw))
    retr = stage("eval_retrieval", lambda: evaluate_model(engine, seeded, **kw))

    def all_wrong(res: Any) -> dict[str, bool]:
        return {r["prompt_id"]: int(r["correct"]) == 0 for r in res.per_prompt}

    aw_p, aw_r = all_wrong(plain), all_wrong(retr)
    ids = sorted(aw_p)
    cmp = {"pass@1": compare_paired(retr, plain, "pass@1"), "greedy_pass@1": compare_paired(retr, plain, "greedy_pass@1"),
           "all_wrong": mcnemar([aw_r[i] for i in ids], [aw_p[i] for i in ids], metric="all_wrong")}
    # a seed that solved a prompt with the same answer hands the answer over (e.g. 3 + 4 seeding 4 + 3)
    from gfcr.records import table_to_rollouts

    seed_rs = {r.rollout_id: r for r in table_to_rollouts(src.get(sorted({i for p in seeded for i in p.meta.get("retrieved", [])})))}
    src_ans = {q.prompt_id: str(q.answer) for q in src.prompts(ids=sorted({r.prompt_id for r in seed_rs.values()}))}
    same = [any(src_ans.get(seed_rs[i].prompt_id) == str(p.answer) for i in p.meta.get("retrieved", [])) for p in seeded]
    out["seed_with_the_same_answer_share"] = sum(same) / max(len(same), 1)
    out |= {"notes": notes, "source_rollouts": len(src.rollouts()), "source_solved": solved,
            "seeded_prompts": sum(1 for p in seeded if p.meta.get("retrieved")),
            "plain": {k: m.value for k, m in plain.metrics.items()}, "retrieval": {k: m.value for k, m in retr.metrics.items()},
            "all_wrong_share": {"plain": sum(aw_p.values()) / len(ids), "retrieval": sum(aw_r.values()) / len(ids)},
            "paired": {k: str(v) for k, v in cmp.items()}, "timings": timings, "load_start": load0, "load_end": os.getloadavg()}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2, default=str))
    print(json.dumps({k: out[k] for k in ("source_solved", "seeded_prompts", "seed_with_the_same_answer_share", "plain", "retrieval", "all_wrong_share", "paired",
                                          "timings", "load_start", "load_end")}, indent=1, default=str))


if __name__ == "__main__":
    main()
