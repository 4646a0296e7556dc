"""ROSS's compatibility and complementarity measured on real ``gfcr train`` runs (issue 47).

The paper's two questions about an upstream run's history (the seed text, "compatibility and
complementarity"): are the stored successes close to what the final checkpoint would write (mean
token NLL under it: history 0.120, its own correct answers 0.120, an external teacher's 0.520), and
does the history hold behaviour the final checkpoint does not yet reproduce reliably (of the 100
hardest training prompts, the 98 history solved at least once, sampled 32 times by the final model:
pass@1 37.7%, pass@8 89.8%, pass@32 99.0%; 74 of 98 solved in at most half the samples)?

For each run folder given (``gfcr train``'s: ``store/``, ``checkpoints/step_*``, ``config.yaml``), this
runs :func:`gfcr.ross.pipeline.stage_analyze` with the run's last checkpoint as the upstream model,
the run's store and run id as the history, and the run's own sampling temperature and new-token budget:

- complementarity: the ``--n`` hardest prompts the run solved at least once (lowest historical solve
  rate first), each sampled ``--k`` times by the last checkpoint: pass@1/8/32 and how many it solves in
  at most half of its samples; ``--with-start`` also samples the run's starting model on them;
- compatibility: on ``--compat`` historically solved prompts, the mean token NLL under the last
  checkpoint of (1) the stored success (exact tokens), (2) the checkpoint's own first correct sample of
  4, (3) the starting model's first correct sample of 4.

Writes ``--out`` (JSON: per run the analysis, wall and CPU seconds, the machine's load) and prints a
table. Run (after ``bench/retrieve_train_bench.py``, whose arm-off runs are plain GRPO runs):
``python bench/complementarity_bench.py bench/out/retrieve_train/rt-off-s*``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any


def cpu_seconds() -> float:
    r, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime + c.ru_utime + c.ru_stime


def run_facts(run_dir: Path) -> dict[str, Any]:
    """The run's id, last checkpoint, starting model, sampling temperature and new-token budget."""
    import yaml

    from gfcr.store import RolloutStore
    from gfcr.train.checkpoint import latest_checkpoint

    cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
    last = latest_checkpoint(run_dir)
    if last is None:
        raise SystemExit(f"{run_dir}: no checkpoints/step_* that finished (is it a finished gfcr train run?)")

    runs = sorted(set(RolloutStore.open(run_dir / "store").scan(columns=["run_id"]).column("run_id").to_pylist()))
    if len(runs) != 1:
        raise SystemExit(f"{run_dir}/store holds {len(runs)} runs; expected the one run of this folder")
    g = cfg.get("generate", {})
    return {"run_id": runs[0], "last": str(last), "start": cfg["model"], "temperature": g.get("temperature", 1.0),
            "max_tokens": g.get("max_tokens", 96)}


def analyze(run_dir: Path, args: argparse.Namespace) -> dict[str, Any]:
    from gfcr.ross import pipeline as P
    from gfcr.ross.config import load_config
    from gfcr.store import RolloutStore

    f = run_facts(run_dir)
    out_dir = Path(args.work) / run_dir.name
    out_dir.mkdir(parents=True, exist_ok=True)
    cfg = load_config(None, {
        "store": str(run_dir / "store"), "out_dir": str(out_dir), "upstream_model": f["last"], "base_model": f["start"],
        "window": {"run": f["run_id"]}, "judge": {"name": "arith-steps"},
        "evaluate": {"temperature": f["temperature"], "max_tokens": f["max_tokens"],
                     "verifier": {"name": "numeric", "params": {"lenient_fallback": True}}},
        "analyze": {"complementarity_prompts": args.n, "complementarity_k": args.k, "compatibility_prompts": args.compat,
                    "max_tokens": f["max_tokens"]}})
    store = RolloutStore.open(cfg.store)
    tok = P.load_tokenizer(cfg, store)
    t0, c0, l0 = time.time(), cpu_seconds(), os.getloadavg()[0]
    res = P.stage_analyze(cfg, store, out_dir, tok)
    rec: dict[str, Any] = {"run_dir": str(run_dir), **f, "wall_s": round(time.time() - t0, 1),
                           "cpu_s": round(cpu_seconds() - c0, 1), "load": [l0, os.getloadavg()[0]],
                           "complementarity": res.get("complementarity"), "compatibility": res.get("compatibility")}
    if args.with_start and res.get("complementarity"):
        t1, c1 = time.time(), cpu_seconds()
        rec["start_complementarity"] = P.complementarity_of(cfg, store, P.load_model(f["start"]), tok, "start")
        rec["start_wall_s"], rec["start_cpu_s"] = round(time.time() - t1, 1), round(cpu_seconds() - c1, 1)
    return rec


def row(name: str, c: dict[str, Any]) -> str:
    m = c["metrics"]
    cells = [f"{100 * m[k]['value']:.1f}%" if k in m else "—" for k in ("pass@1", "pass@8", "pass@32")]
    return (f"| {name} | {c['n_prompts']} | " + " | ".join(cells)
            + f" | {c['at_most_half']} | {c['solved_any']} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", help="gfcr train run folders")
    ap.add_argument("--n", type=int, default=100, help="hardest historically solved prompts (the paper: 100)")
    ap.add_argument("--k", type=int, default=32, help="samples per prompt (the paper: 32)")
    ap.add_argument("--compat", type=int, default=32, help="prompts of the compatibility NLL (0: skip)")
    ap.add_argument("--with-start", action="store_true", help="also sample the run's starting model")
    ap.add_argument("--work", default="bench/out/complementarity", help="analysis folders")
    ap.add_argument("--out", default="bench/out/complementarity_bench.json")
    args = ap.parse_args()
    out = {"args": vars(args), "load_start": os.getloadavg(), "runs": {}}
    for r in args.runs:
        rec = analyze(Path(r), args)
        out["runs"][Path(r).name] = rec
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(out, indent=2, default=str))
        print(f"[{Path(r).name}] {rec['wall_s']} s wall, {rec['cpu_s']} CPU-s", file=sys.stderr, flush=True)
    out["load_end"] = os.getloadavg()
    Path(args.out).write_text(json.dumps(out, indent=2, default=str))
    print("| run (model) | prompts | pass@1 | pass@8 | pass@32 | solved in ≤ half | solved at all |")
    print("|---|---|---|---|---|---|---|")
    for name, rec in out["runs"].items():
        if rec.get("complementarity"):
            print(row(f"{name} (last)", rec["complementarity"]))
        if rec.get("start_complementarity"):
            print(row(f"{name} (start)", rec["start_complementarity"]))
    for name, rec in out["runs"].items():
        c = rec.get("compatibility") or {}
        print(name, "compatibility:", json.dumps({k: v for k, v in c.items() if k != "per_prompt"})[:600])


if __name__ == "__main__":
    main()
