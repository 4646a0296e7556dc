"""Benchmark run (not a test): ``gfcr train`` with retrieval-guided seeds on vs off, paired per prompt.

    nice -n 10 .venv/bin/python bench/retrieve_train_bench.py [--steps 6] [--prompts-per-step 8] [--lr 5e-6]
        [--n-eval 300] [--k 0] [--seeds 0,1,2] [--eval-seed 0] [--k-seeds 2] [--no-base]

Stages, each timed (wall and CPU seconds), with the machine load at start and end:

1. held-out set: ``--n-eval`` distinct two-digit sums of the arith task's *test* split (never trained on),
   drawn with ``--eval-seed``, the same for every training seed;
2. per training seed of ``--seeds``, two training runs of ``configs/arith-smollm2.yaml`` (GRPO, K = 4,
   T = 0.7, 64 new tokens), the same seed, steps, prompts and learning rate; arm **on** adds ``retrieve: {k: --k-seeds}`` (the run's own
   store: what the run solved at earlier steps seeds its later prompts, gfcr.train.seeding; with
   ``--source off``, arm off's finished store, so seeds exist from step 0), arm **off** does not. The
   arms are run one after the other (off first);
3. greedy pass@1 (+ ``--k`` samples at T = 0.7 when > 0) of the base model (unless ``--no-base``) and of
   each arm's last checkpoint on the held-out set, *unseeded* (what the policy learnt);
4. paired comparisons per seed (``gfcr.evaluate.compare_paired``: McNemar for greedy pass@1, paired
   bootstrap + sign-flip test for sampled pass@1): on − off, on − base, off − base; with several seeds
   also pooled per prompt (a prompt's score: the share of seeds whose greedy answer verified; the exact
   sign test on the per-prompt differences, so prompts stay the independent units);
5. from each arm's store: verified share of the training rollouts per step, all-wrong groups (no GRPO
   signal), and in arm on the share of rollouts that had seeds and the verified share with and without.

Results: ``bench/out/retrieve_train_bench.json`` (per seed under ``"seeds"``) and a printed table ("not significant" when p >= 0.05).
``--truncation RESULT_JSON`` re-evaluates a finished run's base and checkpoints and counts the held-out
answers cut at the 64-token budget (``bench/out/retrieve_train_truncation.json``).
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

import numpy as np
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
    ap.add_argument("--seeds", default="0", help="training seeds, comma-separated (each trains both arms)")
    ap.add_argument("--eval-seed", type=int, default=0, help="draws the held-out set (one set for all seeds)")
    ap.add_argument("--truncation", metavar="RESULT_JSON", help=(
        "instead of training: re-evaluate the base and the checkpoints a finished run recorded (greedy, "
        "the same held-out set) and count the answers cut at the 64-token budget"))
    args = ap.parse_args()
    if args.truncation:
        return truncation(Path(args.truncation))

    from gfcr.evaluate import compare_paired
    from gfcr.evaluate.paired import per_prompt_values
    from gfcr.tasks.arith import make_arith
    from gfcr.train.checkpoint import latest_checkpoint
    from gfcr.train.config import load_config
    from gfcr.train.loop import train

    out: dict[str, Any] = {"args": vars(args), "load_start": os.getloadavg(), "seeds": {}}
    partial = Path("bench/out/retrieve_train_bench.partial.json")
    partial.parent.mkdir(parents=True, exist_ok=True)

    def stage(rec: dict[str, Any], name: str, fn: Any) -> Any:
        t0, c0 = time.perf_counter(), cpu_seconds()
        res = fn()
        rec.setdefault("stages", {})[name] = t = {"wall_s": round(time.perf_counter() - t0, 1),
                                                   "cpu_s": round(cpu_seconds() - c0, 1), "load": os.getloadavg()[0]}
        print(f"[{name}] {t}", file=sys.stderr, flush=True)
        if hasattr(res, "metrics"):  # an evaluation: kept at once, so a run cut short still leaves it
            rec.setdefault("metrics", {})[name.removeprefix("eval_")] = {m: vars(v) for m, v in res.metrics.items()}
            rec.setdefault("greedy", {})[name.removeprefix("eval_")] = per_prompt_values(res, "greedy_pass@1")
            rec.setdefault("info", {})[name.removeprefix("eval_")] = dict(res.info)  # e.g. truncated answers
        partial.write_text(json.dumps(out, indent=2, default=str))
        return res

    prompts = make_arith(n=args.n_eval, level=2, split="test", seed=args.eval_seed).prompts()
    out["n_eval"] = len(prompts)
    base = None if args.no_base else stage(out, "eval_base", lambda: evaluate_lenient(
        "default", prompts, args.k, args.eval_seed, progress=False))
    for seed in [int(x) for x in args.seeds.split(",")]:
        rec = out["seeds"][str(seed)] = {}
        common = {"steps": args.steps, "output_dir": args.output_dir, "eval.before": False, "eval.after": False,
                  "seed": seed, "optim.lr": args.lr, "generate.prompts_per_step": args.prompts_per_step,
                  "checkpoint.every": args.steps, "tensorboard": False}
        arms = {"off": common, "on": common | {"retrieve": {"k": args.k_seeds}}}
        students: dict[str, str] = {}
        for name, over in arms.items():
            if name == "on" and args.source == "off":  # seeds from step 0 on: arm off's solved rollouts
                over = over | {"retrieve": {"k": args.k_seeds, "store": rec["train_off"]["store"]}}
            res = stage(rec, f"train_{name}", lambda o=over, n=f"rt-{name}-s{seed}": train(
                load_config(args.config, o | {"run_name": n}), progress=False))
            students[name] = str(latest_checkpoint(res.run_dir))
            rec[f"train_{name}"] = {"run_dir": str(res.run_dir), "store": str(res.store_path)} | _train_stats(
                str(res.store_path))
            partial.write_text(json.dumps(out, indent=2, default=str))
            print(f"[seed {seed} train_{name}] {json.dumps(rec[f'train_{name}'])}", file=sys.stderr, flush=True)
        evals = {"base": base} if base is not None else {}
        for name, path in students.items():
            evals[name] = stage(rec, f"eval_{name}", lambda p=path: evaluate_lenient(
                p, prompts, args.k, args.eval_seed, progress=False))
        pairs = [("on", "off")] + ([("on", "base"), ("off", "base")] if "base" in evals else [])
        rec["paired"] = {f"{a} - {b} {metric}": compare_paired(evals[a], evals[b], metric).to_dict()
                         for a, b in pairs for metric in (("greedy_pass@1", "pass@1") if args.k else ("greedy_pass@1",))}
    out["pooled"] = pooled_greedy(out)
    out["load_end"] = os.getloadavg()
    p = Path("bench/out/retrieve_train_bench.json")
    p.write_text(json.dumps(out, indent=2, default=str))
    print(f"\nwritten {p}\n")
    print("| seed | comparison | metric | difference [95% CI] | A / B higher | p | verdict |\n|---|---|---|---|---|---|---|")
    for seed, rec in out["seeds"].items():
        for key, d in rec["paired"].items():
            name, metric = key.rsplit(" ", 1)
            verdict = "significant" if d["significant"] else "not significant"
            print(f"| {seed} | {name} | {metric} | {d['diff']:+.3f} [{d['ci_low']:+.3f}, {d['ci_high']:+.3f}] | "
                  f"{d['a_better']} / {d['b_better']} | {d['p_value']:.3g} | {verdict} |")
    for key, d in out["pooled"].items():
        verdict = "significant" if d["p"] < 0.05 else "not significant"
        print(f"| pooled ({len(out['seeds'])} seeds) | {key} | greedy_pass@1 | {d['diff']:+.3f} (means {d['a']:.3f} vs "
              f"{d['b']:.3f}) | {d['a_better']} / {d['b_better']} | {d['p']:.3g} | {verdict} |")


def truncation(result: Path) -> None:
    """Held-out greedy answers cut at the budget (``finish_reason`` length: never verified) for the base
    and every arm of a finished run's result file; writes ``bench/out/retrieve_train_truncation.json``."""
    from gfcr.tasks.arith import make_arith
    from gfcr.train.checkpoint import latest_checkpoint

    done = json.loads(result.read_text())
    prompts = make_arith(n=done["n_eval"], level=2, split="test", seed=done["args"]["eval_seed"]).prompts()
    models = {"base": "default"} | {
        f"{arm} s{seed}": str(latest_checkpoint(Path(rec[f"train_{arm}"]["run_dir"])))
        for seed, rec in done["seeds"].items() for arm in ("off", "on")}
    out: dict[str, Any] = {"result": str(result), "n": len(prompts), "load_start": os.getloadavg(), "models": {}}
    for name, path in models.items():
        t0, c0 = time.perf_counter(), cpu_seconds()
        res = evaluate_lenient(path, prompts, 0, done["args"]["eval_seed"], progress=False)
        out["models"][name] = {"truncated": res.info["truncated"], "greedy_pass@1": res.metrics["greedy_pass@1"].value,
                               "wall_s": round(time.perf_counter() - t0, 1), "cpu_s": round(cpu_seconds() - c0, 1)}
        print(f"{name}: {out['models'][name]}", file=sys.stderr, flush=True)
    out["load_end"] = os.getloadavg()
    p = Path("bench/out/retrieve_train_truncation.json")
    p.write_text(json.dumps(out, indent=2))
    print(f"written {p}")


def pooled_greedy(out: dict[str, Any]) -> dict[str, Any]:
    """On − off (and each − base) pooled over the seeds per prompt: a prompt's score is the share of
    the seeds whose greedy answer verified (base: its one evaluation); exact sign test on the
    per-prompt differences."""
    from greso_study import sign_test

    seeds = list(out["seeds"].values())
    score = {arm: {pid: float(np.mean([s["greedy"][arm][pid] for s in seeds])) for pid in seeds[0]["greedy"][arm]}
             for arm in ("on", "off")}
    if "greedy" in out:
        score["base"] = out["greedy"]["base"]
    res = {}
    for a, b in [("on", "off"), ("on", "base"), ("off", "base")]:
        if a in score and b in score:
            ids = sorted(score[a])
            d = np.array([score[a][i] - score[b][i] for i in ids])
            lo, hi, p = sign_test(d)
            res[f"{a} - {b}"] = {"n": len(ids), "a": float(np.mean([score[a][i] for i in ids])),
                                 "b": float(np.mean([score[b][i] for i in ids])), "diff": float(d.mean()),
                                 "a_better": hi, "b_better": lo, "p": p}
    return res


if __name__ == "__main__":
    main()
