"""Benchmark run (not a test): ``gfcr train`` with retrieval-guided seeds on vs off, paired per prompt.

    nice -n 10 .venv/bin/python bench/retrieve_train_bench.py [--steps 6] [--prompts-per-step 8] [--lr 5e-6]
        [--n-eval 300] [--k 0] [--seed 0] [--k-seeds 2] [--no-base]

Stages, each timed (wall and CPU seconds), with the machine load at start and end:

1. held-out set: ``--n-eval`` distinct two-digit sums of the arith task's *test* split (never trained on);
2. two training runs of ``configs/arith-smollm2.yaml`` (GRPO, K = 4, T = 0.7, 64 new tokens), the same
   seed, steps, prompts and learning rate; arm **on** adds ``retrieve: {k: --k-seeds}`` (the run's own
   store: what the run solved at earlier steps seeds its later prompts, gfcr.train.seeding; with
   ``--source off``, arm off's finished store, so seeds exist from step 0), arm **off** does not. The
   arms are run one after the other (off first);
3. greedy pass@1 (+ ``--k`` samples at T = 0.7 when > 0) of the base model (unless ``--no-base``) and of
   each arm's last checkpoint on the held-out set, *unseeded* (what the policy learnt);
4. paired comparisons (``gfcr.evaluate.compare_paired``: McNemar for greedy pass@1, paired bootstrap
   + sign-flip test for sampled pass@1): on − off, on − base, off − base;
5. from each arm's store: verified share of the training rollouts per step, all-wrong groups (no GRPO
   signal), and in arm on the share of rollouts that had seeds and the verified share with and without.

Results: ``bench/out/retrieve_train_bench.json`` and a printed table ("not significant" when p >= 0.05).
What it can show: whether training with in-context seeds changes the unseeded policy after a few
steps at this size; not: long runs, other tasks, or other embedders.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from opd_bench import cpu_seconds, evaluate_lenient  # bench/ is the script's folder on sys.path


def _train_stats(store_path: str) -> dict[str, Any]:
    """Per step: rollouts, verified share, all-wrong groups; seeded vs unseeded verified share."""
    from gfcr.store import RolloutStore

    rs = RolloutStore.open(store_path).rollouts()
    steps: dict[int, dict[str, Any]] = {}
    for s in sorted({int(r.step) for r in rs}):
        mine = [r for r in rs if int(r.step) == s]
        groups: dict[str, list[bool]] = {}
        for r in mine:
            groups.setdefault(r.group_id, []).append(bool(r.verified))
        steps[s] = {"rollouts": len(mine), "verified": round(sum(bool(r.verified) for r in mine) / len(mine), 4),
                    "all_wrong_groups": sum(not any(g) for g in groups.values()), "groups": len(groups)}
    seeded = [r for r in rs if r.meta.get("retrieved")]
    plain = [r for r in rs if not r.meta.get("retrieved")]

    def share(xs: list) -> float | None:
        return round(sum(bool(r.verified) for r in xs) / len(xs), 4) if xs else None

    return {"per_step": steps, "rollouts": len(rs), "seeded_rollouts": len(seeded),
            "verified_seeded": share(seeded), "verified_unseeded": share(plain), "verified_all": share(rs)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="configs/arith-smollm2.yaml")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--prompts-per-step", type=int, default=8)
    ap.add_argument("--lr", type=float, default=5e-6)
    ap.add_argument("--n-eval", type=int, default=300)
    ap.add_argument("--k", type=int, default=0, help="sampled completions per held-out prompt (0: greedy only)")
    ap.add_argument("--k-seeds", type=int, default=2, help="retrieve.k of arm on")
    ap.add_argument("--source", choices=["own", "off"], default="own", help=(
        "arm on retrieves from its own store (retrieve.store: null) or from arm off's finished store"))
    ap.add_argument("--no-base", action="store_true", help="skip the base model's evaluation")
    ap.add_argument("--output-dir", default="bench/out/retrieve_train")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    from gfcr.evaluate import compare_paired
    from gfcr.tasks.arith import make_arith
    from gfcr.train.config import load_config
    from gfcr.train.loop import train

    out: dict[str, Any] = {"args": vars(args), "load_start": os.getloadavg(), "stages": {}}
    timings = out["stages"]
    partial = Path("bench/out/retrieve_train_bench.partial.json")
    partial.parent.mkdir(parents=True, exist_ok=True)

    def stage(name: str, fn: Any) -> Any:
        t0, c0 = time.perf_counter(), cpu_seconds()
        res = fn()
        timings[name] = {"wall_s": round(time.perf_counter() - t0, 1), "cpu_s": round(cpu_seconds() - c0, 1),
                         "load": os.getloadavg()[0]}
        print(f"[{name}] {timings[name]}", file=sys.stderr, flush=True)
        if hasattr(res, "metrics"):  # an evaluation: kept at once, so a run cut short still leaves it
            out.setdefault("metrics", {})[name.removeprefix("eval_")] = {m: vars(v) for m, v in res.metrics.items()}
        partial.write_text(json.dumps(out, indent=2, default=str))
        return res

    prompts = make_arith(n=args.n_eval, level=2, split="test", seed=args.seed).prompts()
    out["n_eval"] = len(prompts)
    common = {"steps": args.steps, "output_dir": args.output_dir, "eval.before": False, "eval.after": False,
              "seed": args.seed, "optim.lr": args.lr, "generate.prompts_per_step": args.prompts_per_step,
              "checkpoint.every": args.steps, "tensorboard": False}
    arms = {"off": common, "on": common | {"retrieve": {"k": args.k_seeds}}}
    students: dict[str, str] = {}
    for name, over in arms.items():
        if name == "on" and args.source == "off":  # seeds from step 0 on: arm off's solved rollouts
            over = over | {"retrieve": {"k": args.k_seeds, "store": out["train_off"]["store"]}}
        res = stage(f"train_{name}", lambda o=over, n=name: train(load_config(args.config, o | {"run_name": f"rt-{n}"}),
                                                                progress=False))
        students[name] = str(sorted((Path(res.run_dir) / "checkpoints").glob("step_*"))[-1])
        out[f"train_{name}"] = {"run_dir": str(res.run_dir), "store": str(res.store_path)} | _train_stats(str(res.store_path))
        partial.write_text(json.dumps(out, indent=2, default=str))
        print(f"[train_{name}] {json.dumps(out[f'train_{name}'])}", file=sys.stderr, flush=True)
    evals: dict[str, Any] = {}
    if not args.no_base:
        evals["base"] = stage("eval_base", lambda: evaluate_lenient("default", prompts, args.k, args.seed, progress=False))
    for name, path in students.items():
        evals[name] = stage(f"eval_{name}", lambda p=path: evaluate_lenient(p, prompts, args.k, args.seed, progress=False))
    out["metrics"] = {name: {m: vars(v) for m, v in e.metrics.items()} for name, e in evals.items()}
    pairs = [("on", "off")] + ([("on", "base"), ("off", "base")] if "base" in evals else [])
    out["paired"] = {}
    for a, b in pairs:
        for metric in ("greedy_pass@1", "pass@1") if args.k else ("greedy_pass@1",):
            out["paired"][f"{a} - {b} {metric}"] = compare_paired(evals[a], evals[b], metric).to_dict()
    out["load_end"] = os.getloadavg()
    p = Path("bench/out/retrieve_train_bench.json")
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(out, indent=2, default=str))
    print(f"\nwritten {p}\n")
    for name, e in evals.items():
        print(name, {m: round(v.value, 4) if hasattr(v, "value") else v for m, v in e.metrics.items()})
    print("| comparison | metric | difference [95% CI] | p | verdict |\n|---|---|---|---|---|")
    for key, d in out["paired"].items():
        name, metric = key.rsplit(" ", 1)
        verdict = "significant" if d["significant"] else "not significant"
        print(f"| {name} | {metric} | {d['diff']:+.3f} [{d['ci_low']:+.3f}, {d['ci_high']:+.3f}] | {d['p_value']:.3g} | {verdict} |")


if __name__ == "__main__":
    main()
