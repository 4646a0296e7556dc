"""ROSS on the CPU miniature: SmolLM2-135M-Instruct, procedural arithmetic, several seeds.

Per seed: (1) upstream RL with ``gfcr.train`` for ``--steps`` steps, every rollout kept in the
run's store; (2) continued RL: the same run resumed for ``--extra-steps`` more steps (the
"continued RL" row; its rollouts are outside the ROSS window); (3) ROSS over the upstream
window with the ``arith-steps`` judge: positive-rollout SFT, ROSS w/o mask, ROSS (and ROSS from
base with ``--from-base``), each masked SFT from the upstream checkpoint; (4) every model on
the same held-out arith prompts (pass@k with bootstrap CIs), plus the analyses.

Prints one table per seed and the mean over seeds (with the per-seed spread), and writes
``bench/out/ross/summary.json``. This is a benchmark, not a test: on 2 shared cores one seed
with the defaults takes tens of minutes.

    .venv/bin/python bench/ross_bench.py --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import json
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
    tcfg = load_train_config(None, {
        "seed": seed, "steps": args.steps, "output_dir": str(sd / "rl"), "run_name": "upstream",
        "tasks": [{"name": "arith", "n_train": args.n_train, "n_eval": 0, "params": {"digits": args.digits}}],
        "generate": {"k": args.k_rl, "prompts_per_step": args.prompts_per_step, "max_tokens": args.max_tokens},
        "optim": {"lr": args.rl_lr, "micro_batch": 8}, "checkpoint": {"every": args.steps, "keep_last": 1},
        "tensorboard": False,
    })
    t0 = time.perf_counter()
    up = train(tcfg, progress=False)
    t_rl = time.perf_counter() - t0
    upstream = sd / "upstream_model"
    shutil.copytree(up.checkpoint, upstream, ignore=shutil.ignore_patterns("optimizer.pt"))
    cont_path = None
    if args.extra_steps:
        cont = train(tcfg.model_copy(update={"steps": args.steps + args.extra_steps}), resume=up.run_dir, progress=False)
        cont_path = str(cont.checkpoint)
    cfg = RossConfig(
        store=str(up.store_path), out_dir=str(sd / "ross"), upstream_model=str(upstream), base_model="default",
        continued_rl_model=cont_path,
        variants=["positive_sft", "ross_nomask", "ross"] + (["ross_from_base"] if args.from_base else []),
        window={"steps": (0, args.steps - 1), "task": "arith", "limit": args.limit},
        train={"epochs": args.epochs, "lr": args.sft_lr, "batch_size": 8, "seed": seed},
        evaluate={"source": "arith", "arith_digits": args.digits, "n_prompts": args.n_eval, "k": args.k_eval,
                  "ks": sorted({1, args.k_eval}), "max_tokens": args.max_tokens, "seed": seed},
        analyze={"ter_window": max(1, args.steps // 4), "compatibility_prompts": args.compat,
                 "complementarity_prompts": args.compl, "complementarity_k": args.compl_k,
                 "max_tokens": args.max_tokens},
    )
    res = run_ross(cfg, log=lambda m: print(f"[seed {seed}] {m}", flush=True))
    print(res.table, flush=True)
    return {"seed": seed, "rl_seconds": round(t_rl, 1), "timings": res.timings, "run_dir": str(res.run_dir),
            **{k: res.results.get(k) for k in ("select", "audit", "build", "evaluate", "analyze")}}


def summarize(per_seed: list[dict]) -> str:
    models = list(per_seed[0]["evaluate"])
    metrics = list(per_seed[0]["evaluate"][models[0]])
    lines = [f"Mean over {len(per_seed)} seed(s) (min–max over seeds), held-out arith, %", "",
             "| model | " + " | ".join(metrics) + " |", "|---|" + "---|" * len(metrics)]
    for m in models:
        cells = []
        for k in metrics:
            v = np.array([100 * s["evaluate"][m][k]["value"] for s in per_seed])
            cells.append(f"{v.mean():.1f} ({v.min():.1f}–{v.max():.1f})")
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    ters = [w["ter"] for s in per_seed for w in (s.get("analyze") or {}).get("ter_by_window", [])]
    if ters:
        lines += ["", f"mean TER over windows and seeds: {100 * np.mean(ters):.1f}%"]
    return "\n".join(lines)


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
    orig = al._is_byte_level
    al._is_byte_level = lambda _t: False
    try:
        t0 = time.perf_counter()
        slow = [al.decode_with_offsets(tok, g) for g in gens]
        t_slow = time.perf_counter() - t0
    finally:
        al._is_byte_level = orig
    same_text = all(f.text == s.text for f, s in zip(fast, slow, strict=True))
    out = {"rollouts": n, "audit_align_per_s": round(n / t_audit, 1), "mean_ter": round(float(np.mean(ters)), 4),
           "byte_offsets_vs_prefix_decode_speedup": round(t_slow / t_fast, 1), "same_text": same_text}
    print(json.dumps(out, indent=2))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--steps", type=int, default=12, help="upstream RL steps")
    ap.add_argument("--extra-steps", type=int, default=3, help="continued-RL steps (0: no continued-RL row)")
    ap.add_argument("--digits", type=int, default=1)
    ap.add_argument("--n-train", type=int, default=64)
    ap.add_argument("--prompts-per-step", type=int, default=8)
    ap.add_argument("--k-rl", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--rl-lr", type=float, default=2e-6)
    ap.add_argument("--limit", type=int, default=None, help="at most this many historical rollouts")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--sft-lr", type=float, default=1e-5)
    ap.add_argument("--n-eval", type=int, default=32)
    ap.add_argument("--k-eval", type=int, default=4)
    ap.add_argument("--compat", type=int, default=8)
    ap.add_argument("--compl", type=int, default=0)
    ap.add_argument("--compl-k", type=int, default=32)
    ap.add_argument("--from-base", action="store_true")
    ap.add_argument("--out", default="bench/out/ross")
    ap.add_argument("--micro", action="store_true", help="only the audit/align throughput micro-benchmark")
    args = ap.parse_args(argv)
    if args.micro:
        micro()
        return 0
    out = Path(args.out) / time.strftime("%Y%m%d-%H%M%S")
    out.mkdir(parents=True)
    per_seed = []
    for s in args.seeds:
        per_seed.append(run_seed(s, args, out))
        (out / "summary.json").write_text(json.dumps({"args": vars(args), "seeds": per_seed}, indent=2, default=str))
        print(summarize(per_seed), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
