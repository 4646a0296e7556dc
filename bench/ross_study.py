"""Study (not a test): ROSS in the paper's shape, long and resumable.

    # built from a `gfcr train` run folder (default: the GRESO study's uniform arm, read only)
    nice -n 10 .venv-vllm/bin/python bench/ross_study.py --state ~/.cache/gfcr/studies/ross --until 17:55
    # the same command again continues where it stopped; --report only prints the report so far
    .venv-vllm/bin/python bench/ross_study.py --state ~/.cache/gfcr/studies/ross --report

Stages, each skipped when its output exists (``STATE`` = ``--state``):

1. ``upstream``: the run's store is copied to ``STATE/upstream/store`` (the run folder is only read)
   and its verified, distinct rollouts counted (``gfcr.ross.audit.select_rollouts``, dedup on);
   with fewer than ``--min-verified`` (1000) the study refuses in one line saying how many there
   are. Otherwise the run's latest checkpoint is snapshotted to ``STATE/upstream/model``.
2. ``continued``: the run folder is copied to ``STATE/continued`` and trained ``--extra-steps``
   more steps through the loop's own resume (``prepare_run`` + ``TrainingRun``): the "continued
   RL" row, the same extra compute spent on RL. It needs the run's own engine (the GRESO arm's is
   vllm: run the study in ``.venv-vllm``).
3. ``ross``: ``STATE/ross.yaml`` (store = the copy, window = every stored step, upstream, base,
   continued RL, variants positive_sft, ross_nomask, ross, ross_from_base; held-out benchmarks
   ``--n-2d`` (300) distinct two-digit sums and the ``--n-1d`` (14) one-digit test prompts, greedy
   and ``--k`` (4) samples; ``evaluate.engine`` vllm when importable) and the pipeline's stages in
   ``STATE/ross``: select + audit + build, then masked SFT one variant at a time (resumable inside a
   variant: ``train.checkpoint_every``), then evaluation one model row at a time
   (``STATE/ross/rows/<row>.json`` and its generations), then the paired tests (per benchmark and
   on the domain average, Holm over the table: ``gfcr.ross.evaluation.all_comparisons``).
4. ``claims``: per model, the share of its held-out generations (greedy, one per prompt; and all
   sampled ones) containing at least one false arithmetic claim (``gfcr.ross.claims.find_claims``:
   a stated result of an expression, recomputed), and each model against ROSS paired per prompt
   (exact McNemar on the greedy generations), Holm over the models (``STATE/claims.json``).
5. ``report``: ``STATE/report.md``, everything with the load recorded.

``--until HH:MM`` (UTC, its next occurrence; greso_study's semantics): no unit of work (an RL step,
one variant's SFT, one model row's evaluation) starts when its estimate would end after it. Before
each run the study prints its estimate of the remaining CPU time per stage: measured rates where a
unit has run (``STATE/timings.jsonl``), else the priors of ``PRIOR_S``. The arguments are kept in
``STATE/study.json``; a re-run with other study arguments is refused.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from greso_study import append_jsonl, check_same_study, read_jsonl, sign_test, study_args, until_ts  # noqa: E402

RESUMABLE = ("until", "report")
ROWS = ("ross", "upstream", "base", "continued_rl", "positive_sft", "ross_nomask", "ross_from_base")
#: CPU seconds per unit before any is measured (2 cores, SmolLM2-135M): an RL step of the GRESO arm
#: (its study.jsonl: ~22 s with vLLM), one SFT row-epoch, one generated sample of the evaluation.
PRIOR_S = {"rl_step": 25.0, "sft_row_epoch": 0.6, "eval_sample": 0.25}


def write_json(path: Path, obj: Any) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, default=str))
    os.replace(tmp, path)


class Clock:
    """Times units of work into ``STATE/timings.jsonl`` and decides, against ``--until``, whether the
    next one may start (its estimate: the median of its kind so far, else ``prior`` seconds)."""

    def __init__(self, state: Path, until: str | None):
        self.path, self.deadline, self.until = state / "timings.jsonl", until_ts(until), until

    def rate(self, kind: str) -> tuple[float, bool]:
        """(seconds per unit, measured?) of ``kind``: the median of the measured rates, else the prior."""
        xs = [r["cpu_s"] / r["units"] for r in read_jsonl(self.path) if r["kind"] == kind and r["units"] > 0]
        return (float(np.median(xs)), True) if xs else (PRIOR_S[kind], False)

    def may_start(self, kind: str, units: float, what: str) -> bool:
        if self.deadline is None:
            return True
        est = self.rate(kind)[0] * units
        if time.time() + est > self.deadline:
            print(f"--until {self.until}: not starting {what} (estimate {est / 60:.0f} min)", flush=True)
            return False
        return True

    def record(self, kind: str, units: float, what: str, wall: float, cpu: float) -> None:
        append_jsonl(self.path, {"kind": kind, "units": units, "what": what, "wall_s": wall, "cpu_s": cpu,
                                 "load_1m": os.getloadavg()[0], "time": datetime.now(UTC).isoformat()})


class Stopped(Exception):
    """--until reached: the study stops cleanly before the next unit of work."""


def cpu_seconds() -> float:
    """CPU seconds of this process and of its children that have ended (an evaluation row's vLLM
    engine core is a child process, reaped when the row's engine shuts down)."""
    import resource

    ch = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + ch.ru_utime + ch.ru_stime


def timed(clock: Clock, kind: str, units: float, what: str, fn: Any) -> Any:
    if not clock.may_start(kind, units, what):
        raise Stopped(what)
    w0, c0 = time.perf_counter(), cpu_seconds()
    out = fn()
    clock.record(kind, units, what, time.perf_counter() - w0, cpu_seconds() - c0)
    return out


# ---------------------------------------------------------------------------------------------
# Stage 1: the upstream snapshot (the run folder is only read)
# ---------------------------------------------------------------------------------------------


def count_verified(store_path: Path, task: str | None = None) -> int:
    """Verified-successful rollouts, deduplicated per prompt and completion, as ROSS selects them."""
    from gfcr.ross.audit import select_rollouts
    from gfcr.store import RolloutStore

    return len(select_rollouts(RolloutStore.open(store_path), task=task, dedup=True))


def stage_upstream(args: argparse.Namespace, state: Path) -> dict[str, Any]:
    from gfcr.train.checkpoint import latest_checkpoint

    up = state / "upstream"
    done = up / "upstream.json"
    if done.exists():
        return json.loads(done.read_text())
    run = Path(args.run).expanduser()
    ck = latest_checkpoint(run) if (run / "config.yaml").exists() else None
    if ck is None:
        raise SystemExit(f"--run {run}: not a gfcr train run folder with a checkpoint")
    shutil.rmtree(up, ignore_errors=True)
    up.mkdir(parents=True)
    shutil.copytree(run / "store", up / "store")  # counted and audited on the copy: the run stays untouched
    n = count_verified(up / "store", args.task)
    if n < args.min_verified:
        shutil.rmtree(up)
        raise SystemExit(f"--run {run}: its store holds {n} verified distinct rollouts, fewer than --min-verified "
                         f"{args.min_verified}; train the upstream run longer (--run own: the same command with a "
                         f"larger --rl-steps continues it) or on more prompts")
    shutil.copytree(ck, up / "model", ignore=shutil.ignore_patterns("optimizer*", "loop_state.json"))
    out = {"run": str(run), "checkpoint": str(ck), "step": int(ck.name.split("_")[-1]), "verified_distinct": n,
           "time": datetime.now(UTC).isoformat()}
    write_json(done, out)
    print(f"upstream: {ck} ({n} verified distinct rollouts) -> {up / 'model'}", flush=True)
    return out


# ---------------------------------------------------------------------------------------------
# Stage 2: continued RL (the loop's own resume, on a copy of the run folder)
# ---------------------------------------------------------------------------------------------


def train_steps(cfg: Any, d: Path, resuming: bool, clock: Clock, label: str) -> Path:
    """Train ``cfg.steps`` steps in run folder ``d`` (the loop's own resume), each step a unit of the
    clock; on --until the last finished step is checkpointed (a crash resumes from the last checkpoint)."""
    from gfcr.train.checkpoint import latest_checkpoint, save_checkpoint
    from gfcr.train.loop import TrainingRun

    t = TrainingRun(cfg, d, resuming, progress=False)
    t.setup()
    t._end = cfg.steps
    last = t.start_step - 1
    try:
        for step in range(t.start_step, cfg.steps):
            row = timed(clock, "rl_step", 1, f"{label} step {step}", lambda s=step: t.step(s))
            with open(d / "metrics.jsonl", "a") as fh:
                fh.write(json.dumps(row, sort_keys=True, default=float) + "\n")
            last = step
            print(f"{label} step {step}/{cfg.steps - 1}: reward {row.get('reward_mean', float('nan')):.3f}", flush=True)
    except Stopped:
        ck = latest_checkpoint(d)
        if last >= t.start_step and (ck is None or ck.name != f"step_{last:06d}"):
            save_checkpoint(t, last)
        raise
    finally:
        t.close()
    return latest_checkpoint(d)


def overrides(pairs: list[str]) -> dict[str, Any]:
    out = {}
    for kv in pairs:
        k, _, v = kv.partition("=")
        try:
            out[k] = json.loads(v)
        except json.JSONDecodeError:
            out[k] = v
    return out


def stage_own_rl(args: argparse.Namespace, state: Path, clock: Clock) -> Path:
    """``--run own``: the study's own upstream RL run in ``STATE/rl`` (``--rl-config``, ``--rl-steps``,
    ``--rl-set``), resumable; its folder is then the upstream run."""
    from gfcr.train.checkpoint import latest_checkpoint
    from gfcr.train.config import load_config
    from gfcr.train.loop import prepare_run

    d = state / "rl"
    if (state / "rl.json").exists():
        return d
    over = {"steps": args.rl_steps, "output_dir": str(state), "run_name": "rl", "tensorboard": False,
            "eval.before": False, "eval.after": False, "checkpoint.every": 5, "checkpoint.keep_last": 1,
            "generate.engine": args.rl_engine}
    if args.rl_engine == "vllm":
        over["generate.engine.params"] = {"enforce_eager": True, "dtype": "float32", "max_model_len": 1024,
                                          "kv_cache_memory_bytes": args.kv_mib << 20}
    cfg = load_config(args.rl_config, over | overrides(args.rl_set))
    resume = d.exists() and latest_checkpoint(d) is not None
    if d.exists() and not resume:  # started, never checkpointed: start again
        shutil.rmtree(d)
    d, resuming = prepare_run(cfg, d if resume else None, None if resume else d)
    ck = train_steps(cfg, d, resuming, clock, "upstream RL")
    write_json(state / "rl.json", {"checkpoint": str(ck), "steps": cfg.steps, "time": datetime.now(UTC).isoformat()})
    return d


def extend_upstream(state: Path, args: argparse.Namespace) -> bool:
    """``--run own``: a re-run whose only new study argument is a larger ``--rl-steps`` lengthens the
    study's upstream RL run (the loop resumes from its last checkpoint; the default config's learning
    rate is constant, so the steps already trained are the same steps), as long as the upstream
    snapshot has not been taken: the count refused it, or the run has not reached it. The change is
    kept in ``STATE/study.json`` (``"extended"``). Anything else is left to :func:`check_same_study`
    (which refuses it). Returns whether the run was extended."""
    f = state / "study.json"
    if args.run != "own" or not f.exists() or (state / "upstream" / "upstream.json").exists():
        return False
    rec = json.loads(f.read_text())
    old, mine = rec["args"], study_args(args, RESUMABLE)
    changed = {k for k in set(old) | set(mine) if old.get(k) != mine.get(k)}
    if changed != {"rl_steps"} or not int(mine["rl_steps"]) > int(old["rl_steps"]):
        return False
    was = old["rl_steps"]
    rec.setdefault("extended", []).append({"rl_steps": [was, mine["rl_steps"]], "time": datetime.now(UTC).isoformat()})
    rec["args"]["rl_steps"] = mine["rl_steps"]
    (state / "rl.json").unlink(missing_ok=True)  # the run is not finished any more
    write_json(f, rec)
    print(f"upstream RL: extended from {was} to {mine['rl_steps']} steps", flush=True)
    return True


def stage_continued(args: argparse.Namespace, state: Path, clock: Clock, upstream: dict[str, Any]) -> dict[str, Any]:
    from gfcr.train.config import load_config
    from gfcr.train.loop import prepare_run

    done = state / "continued.json"
    if done.exists():
        return json.loads(done.read_text())
    d = state / "continued"
    if not d.exists():
        shutil.copytree(Path(upstream["run"]), d.with_name("continued.tmp"), dirs_exist_ok=True)
        os.replace(d.with_name("continued.tmp"), d)
    steps = upstream["step"] + 1 + args.extra_steps
    cfg = load_config(d / "config.yaml", {"steps": steps, "output_dir": str(state), "run_name": "continued",
                                          "eval.before": False, "eval.after": False, "tensorboard": False})
    d, resuming = prepare_run(cfg, d, None)
    ck = train_steps(cfg, d, resuming, clock, "continued RL")
    out = {"checkpoint": str(ck), "steps": steps, "extra_steps": args.extra_steps, "time": datetime.now(UTC).isoformat()}
    write_json(done, out)
    return out


# ---------------------------------------------------------------------------------------------
# Stage 3: ROSS (config, select/audit/build, SFT per variant, evaluation per row, paired tests)
# ---------------------------------------------------------------------------------------------


def vllm_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


def ross_config(args: argparse.Namespace, state: Path, upstream: dict[str, Any], continued: dict[str, Any] | None) -> Any:
    """``STATE/ross.yaml`` (written once) loaded with the study's ``--set`` overrides."""
    import yaml

    from gfcr.ross.config import load_config

    path = state / "ross.yaml"
    if not path.exists():
        engine = args.engine if args.engine != "auto" else ("vllm" if vllm_available() else "hf")
        ev: dict[str, Any] = {
            "benchmarks": [
                {"name": "arith-1d", "source": "arith", "params": {"level": 1}, "n_prompts": args.n_1d, "domain": "math"},
                {"name": "arith-2d", "source": "arith", "params": {"level": 2}, "n_prompts": args.n_2d, "domain": "math"}],
            "k": args.k, "ks": sorted({1, args.k}) if args.k else [], "temperature": 0.7, "max_tokens": args.max_tokens,
            # the RL reward's verifier (configs/arith-smollm2.yaml: lenient_fallback): strict, the models' "a + b = c"
            # with no 'Answer: N' line scored 0 of 14 one-digit sums for every row
            "verifier": {"name": "numeric", "params": {"lenient_fallback": True}}, "engine": engine,
            "save_generations": True}
        if engine == "vllm":
            ev["engine"] = {"name": "vllm", "params": {"enforce_eager": True, "dtype": "float32", "max_model_len": 1024,
                                                       "kv_cache_memory_bytes": args.kv_mib << 20}}
        cfg = {"store": str(state / "upstream" / "store"), "out_dir": str(state / "ross_runs"),
               "upstream_model": str(state / "upstream" / "model"), "base_model": args.base_model,
               "continued_rl_model": continued["checkpoint"] if continued else None,
               "variants": ["positive_sft", "ross_nomask", "ross", "ross_from_base"],
               "window": {"steps": [0, upstream["step"]], "task": args.task, "dedup": True},
               "judge": {"name": "arith-steps"}, "build": {"max_length": 512},
               "train": {"epochs": args.epochs, "lr": 1e-5, "batch_size": 8, "checkpoint_every": 50},
               "evaluate": ev, "stages": ["select", "audit", "build", "train", "evaluate"]}
        path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return load_config(path, overrides(args.set))


def stage_ross_data(cfg: Any, rd: Path, tok: Any) -> dict[str, Any]:
    """Select + audit + build, once (``STATE/ross/build.json``)."""
    from gfcr.ross import pipeline as P

    done = rd / "build.json"
    if done.exists():
        return json.loads(done.read_text())
    store = P.open_store(cfg)
    sel = P.stage_select(cfg, store)
    audit = P.stage_audit(cfg, store, sel, tok)
    build = P.stage_build(cfg, store, rd)
    out = {"select": {"rollouts": len(sel)}, "audit": audit, "build": build}
    write_json(done, out)
    return out


def stage_ross_train(cfg: Any, rd: Path, tok: Any, clock: Clock, build: dict[str, Any]) -> dict[str, Any]:
    from gfcr.ross import pipeline as P

    out = {}
    for v in cfg.variants:
        if (rd / "models" / v / "sft.json").exists() or P.same_as(rd, v):
            out.update(P.stage_train(cfg.model_copy(update={"variants": [v]}), rd, tok))
            continue
        n = build.get("build", {}).get("ross" if v == "ross_from_base" else v, {}).get("rows", 100)
        out.update(timed(clock, "sft_row_epoch", n * cfg.train.epochs, f"SFT of {v}",
                         lambda v=v: P.stage_train(cfg.model_copy(update={"variants": [v]}), rd, tok)))
    return out


def n_samples(cfg: Any, benches: list[tuple[Any, list[Any]]]) -> int:
    e = cfg.evaluate
    return sum(len(ps) for _, ps in benches) * (e.k + (1 if e.greedy else 0))


def stage_ross_evaluate(cfg: Any, rd: Path, tok: Any, clock: Clock) -> dict[str, Any]:
    """Each model row on every benchmark, one row per unit (``STATE/ross/rows/<row>.json`` and
    ``<row>.generations.jsonl``), then the paired tests (``STATE/ross/eval.json``)."""
    from gfcr.ross import pipeline as P
    from gfcr.ross.evaluation import all_comparisons, default_pairs, evaluate_models

    done = rd / "eval.json"
    if done.exists():
        return json.loads(done.read_text())
    rows, aliases = P.model_paths(cfg, rd)
    order = [r for r in ROWS if r in rows] + [r for r in rows if r not in ROWS]
    benches = P.heldout_benchmarks(cfg, P.open_store(cfg))
    (rd / "rows").mkdir(exist_ok=True)
    results = {}
    for row in order:
        f = rd / "rows" / f"{row}.json"
        if not f.exists():
            gens = rd / "rows" / f"{row}.generations.jsonl"
            gens.write_text("")

            def one(row: str = row, gens: Path = gens) -> dict[str, Any]:
                return evaluate_models({row: rows[row]}, tok, benches, cfg.evaluate, load=P.load_model, log=print,
                                       on_generation=lambda g: append_jsonl(gens, g))[row]

            write_json(f, timed(clock, "eval_sample", n_samples(cfg, benches), f"evaluation of {row}", one))
        results[row] = json.loads(f.read_text())
    results = {r: results[r] for r in rows}  # the table's order
    e = cfg.evaluate
    pairs = [tuple(p) for p in e.pairs] if e.pairs is not None else default_pairs(list(rows))
    pairs = [(aliases.get(a, a), aliases.get(b, b)) for a, b in pairs]
    out = {"results": results, "aliases": aliases, "pairs": pairs, "paired": all_comparisons(results, pairs, seed=e.seed)}
    write_json(done, out)
    return out


# ---------------------------------------------------------------------------------------------
# Stage 4: the false-claim measure
# ---------------------------------------------------------------------------------------------


def has_false_claim(text: str) -> bool:
    """At least one stated arithmetic result that recomputes to another value (gfcr.ross.claims)."""
    from gfcr.ross.claims import find_claims

    return any(not c.correct for c in find_claims(text))


def claims_of_rows(rows_dir: Path) -> dict[str, Any]:
    """``{row: {greedy: {prompt key: bool}, sampled: [n with a false claim, n]}}`` from each row's
    recorded generations; a prompt key is ``benchmark/prompt_id``."""
    out: dict[str, Any] = {}
    for f in sorted(rows_dir.glob("*.generations.jsonl")):
        row = f.name.removesuffix(".generations.jsonl")
        greedy, s_false, s_all = {}, 0, 0
        for g in read_jsonl(f):
            flags = [has_false_claim(t) for t in g["texts"]]
            if g["greedy"]:
                greedy[f"{g['benchmark']}/{g['prompt_id']}"] = flags[0]
            else:
                s_false, s_all = s_false + sum(flags), s_all + len(flags)
        out[row] = {"greedy": greedy, "sampled": [s_false, s_all]}
    return out


def claims_summary(by_row: dict[str, Any], ref: str = "ross") -> dict[str, Any]:
    """Per row the false-claim shares; each row against ``ref`` paired per prompt on the greedy
    generations (difference of shares, exact McNemar = sign test on the discordant prompts), Holm
    over the rows."""
    from gfcr.ross.evaluation import holm

    out: dict[str, Any] = {"rows": {}, "vs": ref, "tests": []}
    for row, c in by_row.items():
        g = list(c["greedy"].values())
        s_false, s_all = c["sampled"]
        out["rows"][row] = {"greedy_share": float(np.mean(g)) if g else math.nan, "greedy_n": len(g),
                            "sampled_share": s_false / s_all if s_all else math.nan, "sampled_n": s_all}
    if ref in by_row:
        for row, c in by_row.items():
            if row == ref:
                continue
            keys = sorted(set(c["greedy"]) & set(by_row[ref]["greedy"]))
            d = np.array([float(c["greedy"][k]) - float(by_row[ref]["greedy"][k]) for k in keys])
            lo, hi, p = sign_test(d)
            out["tests"].append({"a": row, "b": ref, "n": len(keys), "diff": float(d.mean()) if len(d) else math.nan,
                                 "a_fewer": lo, "a_more": hi, "p_value": p})
        for t, adj in zip(out["tests"], holm([t["p_value"] for t in out["tests"]]), strict=True):
            t["p_holm"] = adj
    return out


def stage_claims(state: Path) -> dict[str, Any]:
    done = state / "claims.json"
    if done.exists():
        return json.loads(done.read_text())
    out = claims_summary(claims_of_rows(state / "ross" / "rows"))
    write_json(done, out)
    return out


def claims_table(c: dict[str, Any]) -> str:
    lines = ["| model | greedy generations with a false claim | sampled generations with one | "
             f"Δ vs {c['vs']} (greedy, paired per prompt) | fewer/more | p (McNemar) | p (Holm) |",
             "|---|---|---|---|---|---|---|"]
    tests = {t["a"]: t for t in c["tests"]}
    for row, r in c["rows"].items():
        t = tests.get(row)
        cells = ["—"] * 4 if t is None else [f"{100 * t['diff']:+.1f} points", f"{t['a_fewer']}/{t['a_more']}",
                                             f"{t['p_value']:.2g}", f"{t['p_holm']:.2g}"]
        lines.append(f"| {row} | {100 * r['greedy_share']:.1f}% (n = {r['greedy_n']}) | "
                     f"{100 * r['sampled_share']:.1f}% (n = {r['sampled_n']}) | " + " | ".join(cells) + " |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Estimate and report
# ---------------------------------------------------------------------------------------------


def estimate(args: argparse.Namespace, state: Path, clock: Clock) -> list[tuple[str, float, bool]]:
    """``[(stage, CPU seconds left, measured rate?)]`` from what is on disk."""
    out = []
    rl, m = clock.rate("rl_step")
    if args.run == "own" and not (state / "rl.json").exists():
        from gfcr.train.checkpoint import latest_checkpoint

        ck = latest_checkpoint(state / "rl") if (state / "rl").exists() else None
        done = 0 if ck is None else int(ck.name.split("_")[-1]) + 1
        out.append(("upstream RL", max(0, args.rl_steps - done) * rl, m))
    if args.extra_steps > 0 and not (state / "continued.json").exists():
        up = read_json(state / "upstream" / "upstream.json")
        from gfcr.train.checkpoint import latest_checkpoint

        ck = latest_checkpoint(state / "continued") if (state / "continued").exists() else None
        left = args.extra_steps if up is None or ck is None else max(0, up["step"] + 1 + args.extra_steps
                                                                    - int(ck.name.split("_")[-1]) - 1)
        out.append(("continued RL", left * rl, m))
    rd = state / "ross"
    build = read_json(rd / "build.json") or {}
    sft, m = clock.rate("sft_row_epoch")
    n_rows = {v: (build.get("build", {}).get("ross" if v == "ross_from_base" else v, {}).get("rows")
                  or args.min_verified) for v in ("positive_sft", "ross_nomask", "ross", "ross_from_base")}
    aliased = {v for v in n_rows if (rd / "data" / v / "same_as").exists()}  # not trained: it is another's data
    left = sum(n for v, n in n_rows.items() if v not in aliased and not (rd / "models" / v / "sft.json").exists())
    out.append(("ROSS SFT (4 variants)", left * args.epochs * sft, m))
    ev, m = clock.rate("eval_sample")
    per_row = (args.n_1d + args.n_2d) * (args.k + 1)
    planned = [r for r in ROWS if r not in aliased and (r != "continued_rl" or args.extra_steps > 0)]
    rows_left = 0 if (rd / "eval.json").exists() else sum(1 for r in planned if not (rd / "rows" / f"{r}.json").exists())
    out.append((f"evaluation ({rows_left} rows x {per_row} samples)", rows_left * per_row * ev, m))
    return out


def read_json(path: Path) -> Any:
    return json.loads(path.read_text()) if path.exists() else None


def print_estimate(args: argparse.Namespace, state: Path, clock: Clock) -> None:
    rows = estimate(args, state, clock)
    for stage, s, measured in rows:
        print(f"estimate: {stage}: {s / 3600:.1f} CPU h left ({'measured rate' if measured else 'prior'})", flush=True)
    print(f"estimate: total {sum(s for _, s, _ in rows) / 3600:.1f} CPU h left", flush=True)


def report(args: argparse.Namespace, state: Path) -> str:
    from gfcr.ross.evaluation import comparison_table

    clock = Clock(state, None)
    up = read_json(state / "upstream" / "upstream.json")
    lines = ["# ROSS in the paper's shape (bench/ross_study.py)", ""]
    if up:
        lines.append(f"Upstream: {up['checkpoint']} ({up['verified_distinct']} verified distinct rollouts).")
    cont = read_json(state / "continued.json")
    if cont:
        lines.append(f"Continued RL: {cont['extra_steps']} more steps -> {cont['checkpoint']}.")
    build = read_json(state / "ross" / "build.json")
    if build:
        lines.append(f"ROSS: {build['select']['rollouts']} rollouts selected; datasets "
                     + ", ".join(f"{v} {b.get('rows', '?')} rows" for v, b in build["build"].items()) + ".")
    ev = read_json(state / "ross" / "eval.json")
    if ev:
        lines += ["", "## Held-out evaluation (paired per prompt, Holm over the table)", "", comparison_table(ev)]
    c = read_json(state / "claims.json")
    if c:
        lines += ["", "## Held-out generations with a false arithmetic claim (gfcr.ross.claims)", "", claims_table(c)]
    t = read_jsonl(state / "timings.jsonl")
    if t:
        loads = [r["load_1m"] for r in t]
        lines += ["", "## Cost and load", "", "| unit | n | wall s | CPU s |", "|---|---|---|---|"]
        for kind in sorted({r["kind"] for r in t}):
            rs = [r for r in t if r["kind"] == kind]
            lines.append(f"| {kind} | {len(rs)} | {sum(r['wall_s'] for r in rs):.0f} | {sum(r['cpu_s'] for r in rs):.0f} |")
        lines.append(f"\nload (1 min) at the end of each unit: min/median/max {min(loads):.1f}/"
                     f"{float(np.median(loads)):.1f}/{max(loads):.1f}")
    left = estimate(args, state, clock)
    if any(s > 0 for _, s, _ in left):
        lines += ["", "Left: " + "; ".join(f"{k} {s / 3600:.1f} CPU h" for k, s, _ in left if s > 0)]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------
# Driver
# ---------------------------------------------------------------------------------------------


def run_study(args: argparse.Namespace) -> str:
    from gfcr.ross import pipeline as P

    state = Path(args.state).expanduser()
    extend_upstream(state, args)
    check_same_study(state, args, RESUMABLE)
    clock = Clock(state, args.until)
    print_estimate(args, state, clock)
    try:
        if args.run == "own":
            args.run = str(stage_own_rl(args, state, clock))
        up = stage_upstream(args, state)
        cont = stage_continued(args, state, clock, up) if args.extra_steps > 0 else None
        cfg = ross_config(args, state, up, cont)
        rd = state / "ross"
        rd.mkdir(exist_ok=True)
        tok = P.load_tokenizer(cfg)
        build = stage_ross_data(cfg, rd, tok)
        stage_ross_train(cfg, rd, tok, clock, build)
        stage_ross_evaluate(cfg, rd, tok, clock)
        stage_claims(state)
    except Stopped as e:
        print(f"stopped before {e}; the same command resumes", flush=True)
    text = report(args, state)
    (state / "report.md").write_text(text)
    print(text)
    return text


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--state", default="~/.cache/gfcr/studies/ross", help="the study's folder (outside the repo)")
    ap.add_argument("--run", default="~/.cache/gfcr/studies/greso/arms/uniform",
                    help="the upstream `gfcr train` run folder (only read: its store and latest checkpoint are copied), "
                         "or 'own': the study's own upstream RL run in STATE/rl")
    ap.add_argument("--rl-config", default="configs/arith-smollm2.yaml", help="--run own: the upstream RL config")
    ap.add_argument("--rl-steps", type=int, default=150, help="--run own: upstream RL steps")
    ap.add_argument("--rl-engine", default="vllm", help="--run own: generate.engine of the upstream RL (vllm or hf)")
    ap.add_argument("--rl-set", action="append", default=[], help="--run own: dotted overrides of the RL config")
    ap.add_argument("--min-verified", type=int, default=1000, help="verified distinct rollouts the run's store must hold")
    ap.add_argument("--task", default="arith", help="window.task of the ROSS selection")
    ap.add_argument("--extra-steps", type=int, default=50, help="continued RL steps (0: no continued-RL row)")
    ap.add_argument("--base-model", default="default", help="the RL starting point (base row, ROSS from base)")
    ap.add_argument("--n-2d", type=int, default=300, help="distinct held-out two-digit sums")
    ap.add_argument("--n-1d", type=int, default=14, help="held-out one-digit sums (the test split holds 14)")
    ap.add_argument("--k", type=int, default=4, help="samples per prompt (plus greedy)")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--engine", default="auto", help="evaluate.engine: auto (vllm when importable), hf or vllm")
    ap.add_argument("--kv-mib", type=int, default=384, help="vLLM KV cache, MiB")
    ap.add_argument("--set", action="append", default=[], help="extra dotted overrides of the ROSS config (key=value)")
    ap.add_argument("--until", default=None, help="HH:MM UTC (its next occurrence): start no unit that would end after it")
    ap.add_argument("--report", action="store_true", help="only print the report of the state so far")
    return ap


def main(argv: list[str] | None = None) -> str:
    args = parser().parse_args(argv)
    if args.report:
        text = report(args, Path(args.state).expanduser())
        print(text)
        return text
    return run_study(args)


if __name__ == "__main__":
    main()
