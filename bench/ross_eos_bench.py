"""The ROSS end-of-sequence rule on the ROSS benchmark's data: ``after-answer`` against ``neighbours``.

The data is ``bench/ross_bench.py``'s upstream window, made the same way: SmolLM2-135M-Instruct
(``--model``), the bench's RL config (arith levels 1 and 2, K=4, 80 new tokens, the RL reward
falling back to the last number as with ``ross_bench.py --rl-lenient --lenient``, because strict
reading verifies none of this model's samples) run for ``--steps`` steps of ``--prompts-per-step``
prompts (a smaller window than the bench's 6 × 8, sized for the shared CPUs: step 0's samples are
the base model's, the window ROSS reads first). Or ``--store`` reuses any run store.

Per selected rollout (``gfcr.ross.audit.select_rollouts``: verified, deduplicated) each judge
(``arith-steps``, the bench's; ``keep-all``, positive SFT's) decides **once**; the decision is then
aligned into a token mask under each rule (:func:`gfcr.ross.audit.make_audit`), so every row is a
pair on the same rollout and the same decision. Reported per judge: the kept/discarded outcome under
each rule and how many differ, the share of kept masks that change and by how many tokens (only the
closing eos may), the share with the eos supervised under each rule (exact McNemar on the pairs),
and the mean TER. The verifier's verdict is read before the judge and the rule, so it cannot change;
the bench checks that the selected set is the same for both rules.

NOT measured: the effect on the SFT'd model (its stopping and pass@1); that needs two SFT runs and
evaluations (``ross_bench.py``'s cost, about an hour per seed here).

    OMP_NUM_THREADS=1 nice -n 5 .venv/bin/python bench/ross_eos_bench.py
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np


def window_store(args: argparse.Namespace, out: Path) -> Path:
    """The upstream RL window (``ross_bench.py``'s config, fewer steps and more prompts per step)."""
    from gfcr.train.config import load_config
    from gfcr.train.loop import train

    cfg = load_config(None, {
        "seed": args.seed, "steps": args.steps, "output_dir": str(out / "rl"), "run_name": "upstream",
        "model": args.model,
        "tasks": [{"name": "arith", "n_train": args.n_train, "n_eval": 0, "params": {"level": lv}} for lv in (1, 2)],
        "generate": {"k": 4, "prompts_per_step": args.prompts_per_step, "max_tokens": 80},
        "verify": {"verifier": "numeric", "params": {"lenient_fallback": True}},
        "optim": {"lr": 2e-6, "micro_batch": 8}, "checkpoint": {"every": args.steps, "keep_last": 1},
        "eval": {"before": False, "after": False}, "tensorboard": False,
    })
    return train(cfg, progress=False).store_path


def compare(store_path: Path, model: str) -> dict:
    """Both rules on every selected rollout of the store, paired (see the module doc)."""
    from transformers import AutoTokenizer

    from gfcr.evaluate import mcnemar
    from gfcr.models import resolve_model
    from gfcr.ross.audit import _eos_supervised, judge_rollout, make_audit, select_rollouts
    from gfcr.ross.judges import ArithSteps, KeepAll
    from gfcr.store import RolloutStore

    store = RolloutStore.open(store_path)
    tok = AutoTokenizer.from_pretrained(resolve_model(None if model == "default" else model))
    all_rs = store.rollouts()
    rs = select_rollouts(store, dedup=True)
    prompts = {p.prompt_id: p for p in store.prompts(ids=sorted({r.prompt_id for r in rs}))}
    out = {"rollouts_in_store": len(all_rs), "selected": len(rs),
           "stopped_share_of_store": float(np.mean([r.finish_reason == "stop" for r in all_rs])) if all_rs else None}
    for judge in (ArithSteps(), KeepAll()):
        rows = []
        for r in rs:
            dec, err, raws, cost, meta = judge_rollout(r, prompts.get(r.prompt_id), judge)
            a = {rule: make_audit(r, dec, err, tok, judge, raws, cost, meta, rule) for rule in ("after-answer", "neighbours")}
            kept = {k: v.status == "kept" for k, v in a.items()}
            eos = {k: (_eos_supervised(r, v.mask, tok) if kept[k] else None) for k, v in a.items()}
            diff = int((a["after-answer"].mask != a["neighbours"].mask).sum())
            rows.append({"kept": kept, "eos": eos, "diff_tokens": diff, "ter": {k: v.ter for k, v in a.items()},
                         "excluded_chars": sum(s.end - s.start for s in dec.excluded) if dec is not None and dec.status == "kept" else 0})
        both = [x for x in rows if x["kept"]["after-answer"] and x["kept"]["neighbours"]]
        with_eos = [x for x in both if x["eos"]["after-answer"] is not None]
        aa = np.array([bool(x["eos"]["after-answer"]) for x in with_eos])
        nb = np.array([bool(x["eos"]["neighbours"]) for x in with_eos])
        b, c = int((aa & ~nb).sum()), int((~aa & nb).sum())
        out[judge.name] = {
            "audited": len(rows),
            "kept": {k: sum(x["kept"][k] for x in rows) for k in ("after-answer", "neighbours")},
            "kept_outcome_differs": sum(x["kept"]["after-answer"] != x["kept"]["neighbours"] for x in rows),
            "kept_with_excluded_text": sum(x["excluded_chars"] > 0 for x in both),
            "masks_changed": sum(x["diff_tokens"] > 0 for x in both),
            "masks_changed_share": float(np.mean([x["diff_tokens"] > 0 for x in both])) if both else None,
            "max_tokens_changed_per_mask": max((x["diff_tokens"] for x in both), default=0),
            "ending_in_eos": len(with_eos),
            "eos_supervised": {"after-answer": int(aa.sum()), "neighbours": int(nb.sum())},
            "eos_supervised_share": {"after-answer": float(aa.mean()) if len(aa) else None,
                                     "neighbours": float(nb.mean()) if len(nb) else None},
            "discordant": {"after_only": b, "neighbours_only": c},
            "mcnemar_p": mcnemar(aa, nb).p_value if len(aa) else None,
            "mean_ter": {k: float(np.mean([x["ter"][k] for x in both])) if both else None
                         for k in ("after-answer", "neighbours")},
        }
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--store", default=None, help="an existing run store (skips the RL window)")
    ap.add_argument("--model", default="default")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=1)
    ap.add_argument("--prompts-per-step", type=int, default=32)
    ap.add_argument("--n-train", type=int, default=64)
    ap.add_argument("--out", default="bench/out/ross_eos")
    args = ap.parse_args(argv)
    out = Path(args.out) / time.strftime("%Y%m%d-%H%M%S")
    out.mkdir(parents=True)
    env = {"load_avg_start": os.getloadavg(), "cpus": os.cpu_count(), "omp_threads": os.environ.get("OMP_NUM_THREADS")}
    t0, c0 = time.perf_counter(), time.process_time()
    store = Path(args.store) if args.store else window_store(args, out)
    env["window_wall_s"], env["window_cpu_s"] = round(time.perf_counter() - t0, 1), round(time.process_time() - c0, 1)
    res = compare(store, args.model)
    env["load_avg_end"] = os.getloadavg()
    env["wall_s"], env["cpu_s"] = round(time.perf_counter() - t0, 1), round(time.process_time() - c0, 1)
    summary = {"args": vars(args), "machine": env, "result": res}
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
