"""ROSS on the CPU miniature: SmolLM2-135M-Instruct, two-digit arithmetic, paired statistics.

Per seed: (1) upstream RL with ``gfcr.train`` for ``--steps`` steps on ``--train-levels`` prompts,
every rollout kept in the run's store; (2) continued RL: the same run resumed for
``--extra-steps`` more steps (the "continued RL" row; its rollouts are outside the ROSS window);
(3) ROSS over the upstream window with the ``arith-steps`` judge: positive-rollout SFT, ROSS w/o
mask (trained only when its data differ from positive SFT's), ROSS, each masked SFT from the
upstream checkpoint; (4) every model on the same ``--n-eval`` distinct held-out prompts
(``--eval-level``, test split, disjoint from training), greedy pass@1 (and pass@k with
``--k-eval``), with every comparison paired per prompt (exact McNemar / paired bootstrap).

Verdicts: the RL reward, the ROSS selection and the evaluation read the tasks' stated ``Answer: N``
line strictly and never verify a truncated generation. ``--rl-lenient`` lets the RL reward fall
back to the last number (the ROSS window is then re-verified strictly); ``--lenient`` also lets the
selection and the evaluation fall back to it (SmolLM2-135M wrote the ``Answer:`` line in none of
the first step's 32 samples here, so strict reading scores every model 0). A truncated generation
is never verified in any mode.

Prints one table per seed and writes ``bench/out/ross/<time>/summary.json`` + ``summary.md`` after
every seed (a partial run leaves what finished). A benchmark, not a test: one seed takes of the
order of an hour on 2 shared cores.

    OMP_NUM_THREADS=1 .venv/bin/python bench/ross_bench.py --seeds 0
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np


def run_seed(seed: int, args: argparse.Namespace, out: Path) -> dict:
    from gfcr.ross.config import RossConfig
    from gfcr.ross.pipeline import run_ross
    from gfcr.train.config import load_config as load_train_config
    from gfcr.train.loop import train

    sd = out / f"seed{seed}"
    verify = {"verifier": "numeric", "params": {"lenient_fallback": True} if args.rl_lenient else {}}
    tcfg = load_train_config(None, {
        "seed": seed, "steps": args.steps, "output_dir": str(sd / "rl"), "run_name": "upstream",
        "model": args.model,
        "tasks": [{"name": "arith", "n_train": args.n_train, "n_eval": 0,
                   "params": {"level": lv, **({"system": args.system} if args.system else {})}}
                  for lv in args.train_levels],
        "generate": {"k": args.k_rl, "prompts_per_step": args.prompts_per_step, "max_tokens": args.max_tokens},
        "verify": verify,
        "optim": {"lr": args.rl_lr, "micro_batch": 8}, "checkpoint": {"every": args.steps, "keep_last": 1},
        "eval": {"before": False, "after": False}, "tensorboard": False,
    })
    t0, c0 = time.perf_counter(), time.process_time()
    upstream = sd / "upstream_model"
    cont_path = None
    if args.from_rl:  # reuse a finished upstream RL run (its store and upstream checkpoint)
        src = Path(args.from_rl)
        store_path = next(src.glob("rl/*/store"))
        upstream = src / "upstream_model"
        t_rl = c_rl = 0.0
    else:
        up = train(tcfg, progress=False)
        t_rl, c_rl = time.perf_counter() - t0, time.process_time() - c0
        store_path = up.store_path
        shutil.copytree(up.checkpoint, upstream, ignore=shutil.ignore_patterns("optimizer.pt"))
        if args.extra_steps:
            cont = train(tcfg.model_copy(update={"steps": args.steps + args.extra_steps}), resume=up.run_dir,
                         progress=False)
            cont_path = str(cont.checkpoint)
    benches = [{"name": f"arith-L{args.eval_level}", "source": "arith",
                "params": {"level": args.eval_level, **({"system": args.system} if args.system else {})},
                "n_prompts": args.n_eval, "domain": "math"}]
    cfg = RossConfig(
        store=str(store_path), out_dir=str(sd / "ross"), upstream_model=str(upstream),
        base_model=None if args.no_base else args.model,
        continued_rl_model=cont_path, variants=["positive_sft", "ross_nomask", "ross"],
        window={"steps": (0, args.steps - 1), "task": "arith", "limit": args.limit,
                "reverify": "numeric" if args.rl_lenient and not args.lenient else None},
        train={"epochs": args.epochs, "lr": args.sft_lr, "batch_size": 8, "seed": seed},
        evaluate={"benchmarks": benches, "k": args.k_eval, "ks": sorted({1, args.k_eval}) if args.k_eval else [],
                  "verifier": {"name": "numeric", "params": {"lenient_fallback": True} if args.lenient else {}},
                  "max_tokens": args.eval_max_tokens, "temperature": 0.7, "seed": seed,
                  "batch_size": args.eval_batch},
        analyze={"ter_window": 1, "compatibility_prompts": 0, "complementarity_prompts": 0},
    )
    res = run_ross(cfg, log=lambda m: print(f"[seed {seed}] {m}", flush=True))
    print(res.table, flush=True)
    return {"seed": seed, "rl_seconds": round(t_rl, 1), "rl_cpu_seconds": round(c_rl, 1), "timings": res.timings,
            "run_dir": str(res.run_dir), "table": res.table,
            **{k: res.results.get(k) for k in ("select", "audit", "build", "evaluate", "analyze")}}


def eval_rows(run_dir: Path, rows: list[str]) -> None:
    """Evaluate only ``rows`` of a ROSS run folder (its ``config.json``) into ``eval.<row>.json``:
    a second process can evaluate rows in parallel with the main run, or finish an interrupted one."""
    from gfcr.ross.config import RossConfig
    from gfcr.ross.evaluation import evaluate_models
    from gfcr.ross.pipeline import heldout_benchmarks, load_model, load_tokenizer, model_paths, open_store

    cfg = RossConfig.model_validate_json((run_dir / "config.json").read_text())
    paths, _ = model_paths(cfg, run_dir)
    tok, benches = load_tokenizer(cfg), heldout_benchmarks(cfg, open_store(cfg))
    for row in rows:
        res = evaluate_models({row: paths[row]}, tok, benches, cfg.evaluate, load=load_model, log=print)
        (run_dir / f"eval.{row}.json").write_text(json.dumps(res))


def combine(run_dir: Path) -> str:
    """The comparison table with paired tests from every evaluation a run folder holds
    (``eval.json``, ``eval.partial.json``, ``eval.<row>.json``), rows in the table's order."""
    from gfcr.ross.config import RossConfig
    from gfcr.ross.evaluation import all_comparisons, comparison_table, default_pairs
    from gfcr.ross.pipeline import model_paths

    cfg = RossConfig.model_validate_json((run_dir / "config.json").read_text())
    order, aliases = model_paths(cfg, run_dir)
    found: dict = {}
    for f in sorted(run_dir.glob("eval.*.json")) + [run_dir / "eval.json"]:
        if f.exists():
            d = json.loads(f.read_text())
            found.update(d.get("results", d))
    results = {m: found[m] for m in order if m in found}
    pairs = default_pairs(list(results))
    ev = {"results": results, "aliases": aliases, "pairs": pairs, "paired": all_comparisons(results, pairs)}
    (run_dir / "eval.combined.json").write_text(json.dumps(ev, indent=2))
    missing = [m for m in order if m not in results]
    return comparison_table(ev) + (f"\n\nnot evaluated (yet): {', '.join(missing)}" if missing else "")


def summarize(per_seed: list[dict]) -> str:
    """Per seed: the evaluation table with its paired tests; across seeds: the mean headline."""
    parts = []
    for s in per_seed:
        parts += [f"### seed {s['seed']}", "", s["table"], ""]
    return "\n".join(parts)


def micro(n: int = 300) -> dict:
    """Audit + align throughput with the real tokenizer (no model), and the byte-offset decoder
    against the generic growing-prefix decoder, side by side on the same ids."""
    from transformers import AutoTokenizer

    import gfcr.ross.align as al
    from gfcr.models import resolve_model
    from gfcr.records import Message, Rollout
    from gfcr.ross.audit import judge_rollout, make_audit
    from gfcr.ross.judges import ArithSteps

    tok = AutoTokenizer.from_pretrained(resolve_model(None))
    rng = np.random.default_rng(0)
    rs = []
    for i in range(n):
        a, b = (int(x) for x in rng.integers(10, 99, 2))
        wrong = a + b + 1
        text = (f"To add {a} and {b}, add the tens and ones. {a} + {b} = {wrong}.\nWait, that is off by one.\n"
                f"{a} + {b} = {a + b}. Café ☕ check.\nAnswer: {a + b}\nSo the final answer is {a + b}.")
        ctx = tok.apply_chat_template([{"role": "user", "content": f"What is {a} + {b}?"}], add_generation_prompt=True,
                                      tokenize=False)
        ci = tok(ctx, add_special_tokens=False)["input_ids"]
        gi = tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        rs.append(Rollout(run_id="b", prompt_id=f"p{i}", token_ids=ci + gi, token_role=[0] * len(ci) + [1] * len(gi),
                          logprobs=[0.0] * (len(ci) + len(gi)), messages=[Message("user", "q"), Message("assistant", text)],
                          verified=True, verifier={"evidence": {"extracted": str(a + b)}}))
    judge = ArithSteps()
    t0 = time.perf_counter()
    ters = []
    for r in rs:
        d, e, raws, c, m = judge_rollout(r, None, judge)
        ters.append(make_audit(r, d, e, tok, judge, raws, c, m).ter)
    t_audit = time.perf_counter() - t0
    gens = [np.asarray(r.token_ids)[np.asarray(r.token_role) == 1] for r in rs[:100]]
    t0 = time.perf_counter()
    fast = [al.decode_with_offsets(tok, g) for g in gens]
    t_fast = time.perf_counter() - t0
    t0 = time.perf_counter()
    slow = [al._decode_generic(tok, g.tolist()) for g in gens]
    t_slow = time.perf_counter() - t0
    same_text = all(f.text == s.text for f, s in zip(fast, slow, strict=True))
    out = {"rollouts": n, "audit_align_per_s": round(n / t_audit, 1), "mean_ter": round(float(np.mean(ters)), 4),
           "byte_offsets_vs_prefix_decode_speedup": round(t_slow / t_fast, 1), "same_text": same_text}
    print(json.dumps(out, indent=2))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--steps", type=int, default=6, help="upstream RL steps")
    ap.add_argument("--extra-steps", type=int, default=1, help="continued-RL steps (0: no continued-RL row)")
    ap.add_argument("--train-levels", type=int, nargs="+", default=[1, 2], help="gfcr.tasks.arith levels of the RL prompts")
    ap.add_argument("--model", default="default", help="policy model (default: SmolLM2-135M-Instruct)")
    ap.add_argument("--eval-level", type=int, default=2, help="arith level of the held-out prompts")
    ap.add_argument("--n-train", type=int, default=64, help="train prompts per level")
    ap.add_argument("--prompts-per-step", type=int, default=8)
    ap.add_argument("--k-rl", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=80, help="RL generation length")
    ap.add_argument("--rl-lr", type=float, default=2e-6)
    ap.add_argument("--rl-lenient", action="store_true", help="RL reward falls back to the last number")
    ap.add_argument("--lenient", action="store_true", help="the ROSS window trusts the stored (lenient, never "
                    "truncated) verdicts and the held-out evaluation falls back to the last number when the 'Answer:' "
                    "line is absent (recorded in the evidence); truncated samples stay wrong")
    ap.add_argument("--from-rl", default=None, help="a finished seed folder (seedN/ with rl/*/store and "
                    "upstream_model/) to reuse instead of running RL again")
    ap.add_argument("--limit", type=int, default=None, help="at most this many historical rollouts")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--sft-lr", type=float, default=1e-5)
    ap.add_argument("--n-eval", type=int, default=300, help="distinct held-out prompts (>= 300 for the README)")
    ap.add_argument("--k-eval", type=int, default=0, help="sampled completions per prompt (0: greedy only)")
    ap.add_argument("--eval-max-tokens", type=int, default=80)
    ap.add_argument("--eval-batch", type=int, default=100, help="prompts per generation batch in the evaluation")
    ap.add_argument("--system", default=None, help="system message of every train and held-out prompt")
    ap.add_argument("--no-base", action="store_true", help="leave out the base row (saves one evaluation)")
    ap.add_argument("--out", default="bench/out/ross")
    ap.add_argument("--micro", action="store_true", help="only the audit/align throughput micro-benchmark")
    ap.add_argument("--eval-rows", nargs="+", default=None, help="with --run-dir: evaluate only these rows")
    ap.add_argument("--combine", action="store_true", help="with --run-dir: print the table of what is evaluated")
    ap.add_argument("--run-dir", default=None, help="a ROSS run folder (seedN/ross/ross-…)")
    args = ap.parse_args(argv)
    if args.micro:
        micro()
        return 0
    if args.run_dir and args.eval_rows:
        eval_rows(Path(args.run_dir), args.eval_rows)
        return 0
    if args.run_dir and args.combine:
        print(combine(Path(args.run_dir)))
        return 0
    out = Path(args.out) / time.strftime("%Y%m%d-%H%M%S")
    out.mkdir(parents=True)
    per_seed = []
    env = {"load_avg_start": os.getloadavg(), "cpus": os.cpu_count(), "omp_threads": os.environ.get("OMP_NUM_THREADS")}
    t0 = time.perf_counter()
    for s in args.seeds:
        per_seed.append(run_seed(s, args, out))
        env["load_avg_now"] = os.getloadavg()
        env["wall_s"] = round(time.perf_counter() - t0, 1)
        env["cpu_s"] = round(time.process_time(), 1)
        (out / "summary.json").write_text(json.dumps({"args": vars(args), "machine": env, "seeds": per_seed},
                                                     indent=2, default=str))
        (out / "summary.md").write_text(summarize(per_seed))
        print(summarize(per_seed), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
