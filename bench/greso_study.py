"""Study (not a test): prompt selectors on the real model, long and resumable: uniform vs GRESO (vs VADE).

    # the study of docs/control.md ("GRESO on the real model, long"): vLLM engine, state outside the repo
    nice -n 10 .venv-vllm/bin/python bench/greso_study.py --state ~/.cache/gfcr/studies/greso \\
        --arms uniform,greso,vade --steps 200 --until 17:55
    # the same command again continues where it stopped; --report only prints the tables so far
    .venv-vllm/bin/python bench/greso_study.py --state ~/.cache/gfcr/studies/greso --report

Every arm trains ``--config`` (default ``configs/arith-smollm2.yaml``, with ``generate.engine: vllm``)
from the same seed; they differ only in ``control.selector``. The arms run **alternated step by step
in one process** (arm A step s, arm B step s, ...), so machine load falls on all alike. The training
pool is cut to ``--n-train`` prompts per task (default 8 one-digit + 24 two-digit sums = 32 prompts, a
pass every 8 steps at 4 prompts per step), so prompts recur: GRESO and VADE can only act on prompts
they have seen.

Recorded per arm and step (``STATE/arms/<arm>/study.jsonl``): the zero-variance share of the step's
groups, the tokens generated in zero-variance groups, generated tokens, live rows (non-zero
advantage), wall and CPU seconds, the 1-minute load. Every ``--eval-every`` steps (and before step 0)
each arm's current policy decodes ``--n-eval`` held-out prompts greedily (default 14 one-digit + 210
two-digit = 224 distinct test-split prompts, never in the training pool), per-prompt verdicts in
``STATE/arms/<arm>/evals.jsonl``, so pass@1 is paired by prompt across arms.

Resume: each arm is a ``gfcr train`` run folder (``STATE/arms/<arm>``) checkpointed every
``--ckpt-every`` steps and when the study stops (``--until HH:MM`` UTC, ``--max-rounds``, SIGTERM or
SIGINT: the step in progress finishes, then every arm is checkpointed). Re-running the same command
resumes each arm from its last checkpoint through the loop's own resume (a step whose rollouts the
store already holds is replayed from the store, so a killed study resumes exactly as well); study rows
of steps after the checkpoint are dropped and recomputed. The arguments are kept in
``STATE/study.json``; a re-run with other study arguments is refused.

The summary (``--report``, and at every stop): per arm the sums; vs the first arm, the zero-variance
share difference paired by step (mean, 95% bootstrap CI over steps, two-sided sign test), the
tokens-per-effective-sample ratio (bootstrap over steps), and at each evaluation point the greedy
pass@1 difference paired by prompt (bootstrap CI over prompts, exact sign test on the discordant
prompts).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np

SELECTOR_OF = {"uniform": "uniform", "greso": "greso", "vade": "vade"}
#: study arguments that may differ on a resume (they decide when to stop, not what is computed)
RESUMABLE = ("until", "max_rounds", "report", "steps")
STUDY_FILE = "study.json"


# ---------------------------------------------------------------------------------------------
# Statistics (pure functions)
# ---------------------------------------------------------------------------------------------


def bootstrap_mean(diff: np.ndarray, n_boot: int = 4000, seed: int = 0) -> tuple[float, float, float]:
    """Mean of paired differences and its 95% percentile-bootstrap CI (resampling the pairs).

    >>> bootstrap_mean(np.array([1.0, 1.0, 1.0]))
    (1.0, 1.0, 1.0)
    """
    diff = np.asarray(diff, dtype=np.float64)
    if diff.size == 0:
        return (math.nan, math.nan, math.nan)
    rng = np.random.default_rng(seed)
    boots = diff[rng.integers(0, diff.size, (n_boot, diff.size))].mean(axis=1)
    return float(diff.mean()), float(np.percentile(boots, 2.5)), float(np.percentile(boots, 97.5))


def sign_test(diff: np.ndarray) -> tuple[int, int, float]:
    """Two-sided exact sign test on paired differences: (n below 0, n above 0, p). Ties are dropped.

    >>> sign_test(np.array([-1.0, -1.0, -1.0, -1.0, -1.0, 0.0]))
    (5, 0, 0.0625)
    """
    d = np.asarray(diff, dtype=np.float64)
    lo, hi = int((d < 0).sum()), int((d > 0).sum())
    n = lo + hi
    if n == 0:
        return lo, hi, 1.0
    tail = sum(math.comb(n, i) for i in range(min(lo, hi) + 1)) / 2.0**n
    return lo, hi, float(min(1.0, 2.0 * tail))


def ratio_ci(num: np.ndarray, den: np.ndarray, base_num: np.ndarray, base_den: np.ndarray,
             n_boot: int = 4000, seed: int = 0) -> tuple[float, float, float]:
    """``(sum num / sum den) / (sum base_num / sum base_den)`` and its 95% bootstrap CI, resampling steps
    (paired: one index picks the same step of both arms). For tokens per effective sample:
    num = generated tokens, den = live rows.

    >>> ratio_ci(np.array([10., 10.]), np.array([2., 2.]), np.array([10., 10.]), np.array([1., 1.]))
    (0.5, 0.5, 0.5)
    """
    arrs = [np.asarray(a, dtype=np.float64) for a in (num, den, base_num, base_den)]

    def r(idx: Any) -> float:
        n, d, bn, bd = (a[idx].sum(axis=-1) for a in arrs)
        with np.errstate(divide="ignore", invalid="ignore"):
            return (n / d) / (bn / bd)

    n = arrs[0].size
    if n == 0:
        return (math.nan, math.nan, math.nan)
    est = float(r(np.arange(n)))
    rng = np.random.default_rng(seed)
    boots = np.asarray(r(rng.integers(0, n, (n_boot, n))), dtype=np.float64)
    boots = boots[np.isfinite(boots)]
    if boots.size == 0:
        return (est, math.nan, math.nan)
    return est, float(np.percentile(boots, 2.5)), float(np.percentile(boots, 97.5))


# ---------------------------------------------------------------------------------------------
# State on disk
# ---------------------------------------------------------------------------------------------


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    """Rewrite ``path`` with ``rows`` (through a temp file renamed into place)."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))
    os.replace(tmp, path)


def append_jsonl(path: Path, row: dict[str, Any]) -> None:
    with open(path, "a") as fh:
        fh.write(json.dumps(row, sort_keys=True) + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def study_args(args: argparse.Namespace, resumable: tuple[str, ...] = RESUMABLE) -> dict[str, Any]:
    """The arguments that define a study: all but ``--state`` and the ``resumable`` ones (those that
    only say how far this call goes). Shared with ``bench/ross_study.py``."""
    return {k: v for k, v in sorted(vars(args).items()) if k not in resumable and k != "state"}


def check_same_study(state: Path, args: argparse.Namespace, resumable: tuple[str, ...] = RESUMABLE) -> None:
    """Write ``STATE/study.json`` on the first run; refuse a re-run whose study arguments differ."""
    f = state / STUDY_FILE
    mine = study_args(args, resumable)
    if f.exists():
        old = json.loads(f.read_text())["args"]
        changed = sorted(k for k in set(old) | set(mine) if old.get(k) != mine.get(k))
        if changed:
            raise SystemExit(f"{state}: this study was started with other arguments ({', '.join(changed)}: "
                             f"{[old.get(k) for k in changed]}); resume it with the same ones or use another --state")
    else:
        state.mkdir(parents=True, exist_ok=True)
        f.write_text(json.dumps({"args": mine, "started": datetime.now(UTC).isoformat()}, indent=2))


# ---------------------------------------------------------------------------------------------
# The study
# ---------------------------------------------------------------------------------------------


def arm_config(args: argparse.Namespace, arm: str, run_dir: Path) -> Any:
    from gfcr.train.config import load_config

    over = {"steps": args.steps, "output_dir": str(run_dir.parent), "run_name": arm, "tensorboard": False,
            "eval.before": False, "eval.after": False, "eval.k": 0, "eval.greedy": True,
            "checkpoint.every": args.ckpt_every, "checkpoint.keep_last": 1,
            "control.selector": SELECTOR_OF[arm], "generate.engine": args.engine}
    if args.engine == "vllm":
        over["generate.engine.params"] = {"enforce_eager": True, "dtype": "float32", "max_model_len": 1024,
                                          "kv_cache_memory_bytes": args.kv_mib << 20}
    for kv in args.set:
        k, _, v = kv.partition("=")
        try:
            over[k] = json.loads(v)
        except json.JSONDecodeError:
            over[k] = v
    cfg = load_config(args.config, over)
    for flag, value, attr in (("--n-eval", args.n_eval, "n_eval"), ("--n-train", args.n_train, "n_train")):
        counts = [int(x) for x in value.split(",")]
        if len(counts) != len(cfg.tasks):
            raise SystemExit(f"{flag}: give one count per task ({len(cfg.tasks)} tasks), got {value!r}")
        for t, n in zip(cfg.tasks, counts, strict=True):
            setattr(t, attr, n)
    return cfg


class Stop:
    """Set by SIGTERM/SIGINT: the study stops after the step in progress, checkpointing every arm."""

    def __init__(self) -> None:
        self.asked = False
        for s in (signal.SIGTERM, signal.SIGINT):
            signal.signal(s, self._ask)

    def _ask(self, signum: int, frame: Any) -> None:
        self.asked = True
        print(f"signal {signum}: stopping after the step in progress", flush=True)


def open_arms(args: argparse.Namespace, state: Path) -> dict[str, Any]:
    """Each arm's ``TrainingRun``, new or resumed from its last checkpoint; study rows past it dropped."""
    from gfcr.train.checkpoint import latest_checkpoint
    from gfcr.train.loop import TrainingRun, prepare_run

    runs = {}
    for arm in args.arms.split(","):
        d = state / "arms" / arm
        cfg = arm_config(args, arm, d)
        resume = d.exists() and latest_checkpoint(d) is not None
        if d.exists() and not resume:  # started but never checkpointed: start the arm again
            import shutil

            shutil.rmtree(d)
        d, resuming = prepare_run(cfg, d if resume else None, None if resume else d)
        t = TrainingRun(cfg, d, resuming, progress=False)
        t.setup()
        t._end = cfg.steps
        rows = [r for r in read_jsonl(d / "study.jsonl") if r["step"] < t.start_step]
        write_jsonl(d / "study.jsonl", rows)
        evals = [r for r in read_jsonl(d / "evals.jsonl") if r["after_steps"] <= t.start_step]
        write_jsonl(d / "evals.jsonl", evals)
        runs[arm] = t
    return runs


def evaluate_arm(t: Any, after_steps: int) -> dict[str, Any]:
    from gfcr.train.loop import evaluate_policy

    w0, c0 = time.perf_counter(), time.process_time()
    ev = evaluate_policy(t)
    per = {p["prompt_id"]: bool(p["greedy_correct"]) for p in ev.per_prompt}
    return {"after_steps": after_steps, "greedy_pass@1": float(np.mean(list(per.values()))), "per_prompt": per,
            "wall_s": time.perf_counter() - w0, "cpu_s": time.process_time() - c0, "load_1m": os.getloadavg()[0],
            "time": datetime.now(UTC).isoformat()}


def until_ts(until: str | None, now: datetime | None = None) -> float | None:
    """``HH:MM`` UTC as a Unix time: its next occurrence after ``now`` (so ``00:25`` at 22:25 is tomorrow's,
    2 h ahead); None for no limit."""
    if not until:
        return None
    h, m = (int(x) for x in until.split(":"))
    now = now or datetime.now(UTC)
    at = now.replace(hour=h, minute=m, second=0, microsecond=0)
    if at <= now:
        at += timedelta(days=1)
    return at.timestamp()


def run_study(args: argparse.Namespace) -> dict[str, Any]:
    """Run (or resume) the study until ``--steps``, ``--until``, ``--max-rounds`` or a signal; returns the summary."""
    from gfcr.train.checkpoint import latest_checkpoint, save_checkpoint

    state = Path(args.state).expanduser()
    check_same_study(state, args)
    stop = Stop()
    runs = open_arms(args, state)
    deadline = until_ts(args.until)
    start = min(t.start_step for t in runs.values())
    print(f"study {state}: arms {list(runs)}, resuming at steps {[t.start_step for t in runs.values()]}", flush=True)
    done_rounds, last_step, round_wall, eval_wall = 0, {a: t.start_step - 1 for a, t in runs.items()}, [], []
    clean = False
    try:
        for step in range(start, args.steps):
            if stop.asked or (args.max_rounds is not None and done_rounds >= args.max_rounds):
                break
            est = round_estimate(round_wall, eval_wall, step % args.eval_every == 0)
            if deadline is not None and time.time() + est > deadline:
                print(f"--until {args.until}: stopping before step {step}", flush=True)
                break
            r0, ev_s = time.perf_counter(), 0.0
            for arm, t in runs.items():
                if step < t.start_step:
                    continue
                d = t.run_dir
                if step % args.eval_every == 0 and not any(e["after_steps"] == step for e in read_jsonl(d / "evals.jsonl")):
                    ev = evaluate_arm(t, step)
                    ev_s += ev["wall_s"]
                    append_jsonl(d / "evals.jsonl", ev)
                    print(f"eval after {step} steps {arm}: greedy pass@1 {ev['greedy_pass@1']:.3f} ({ev['wall_s']:.0f}s)",
                          flush=True)
                w0, c0 = time.perf_counter(), time.process_time()
                row = t.step(step)
                append_jsonl(d / "study.jsonl", step_record(step, row, time.perf_counter() - w0, time.process_time() - c0))
                last_step[arm] = step
                print(f"step {step} {arm}: {time.perf_counter() - w0:.1f}s zero-var {row['zero_var_share'] or 0.0:.2f} "
                      f"tokens {int(row['gen_tokens'])} live {int(row.get('n_live', 0))}", flush=True)
            round_wall.append(time.perf_counter() - r0 - ev_s)  # the steps alone
            if ev_s:
                eval_wall.append(ev_s)
            done_rounds += 1
        else:  # all steps done: the final evaluation
            for t in runs.values():
                d = t.run_dir
                if not any(e["after_steps"] == args.steps for e in read_jsonl(d / "evals.jsonl")):
                    append_jsonl(d / "evals.jsonl", evaluate_arm(t, args.steps))
        clean = True
    finally:
        for arm, t in runs.items():  # a clean stop: every arm checkpointed at its last finished step
            ck = latest_checkpoint(t.run_dir)
            if clean and last_step[arm] >= 0 and (ck is None or ck.name != f"step_{last_step[arm]:06d}"):
                save_checkpoint(t, last_step[arm])
            t.close()
    summary = summarize(state, list(runs))
    (state / "summary.json").write_text(json.dumps(summary, indent=2))
    print(markdown(summary))
    return summary


def round_estimate(step_walls: list[float], eval_walls: list[float], evaluates: bool) -> float:
    """Seconds the next round (one step of every arm) should take: the median of the rounds' step time
    so far, plus the median evaluation time when the round starts with an evaluation (0 before any
    measurement: the first round always runs).

    >>> round_estimate([300.0, 400.0, 350.0], [900.0], True)
    1250.0
    >>> round_estimate([300.0], [], True)
    300.0
    """
    est = float(np.median(step_walls)) if step_walls else 0.0
    return est + (float(np.median(eval_walls)) if evaluates and eval_walls else 0.0)


def step_record(step: int, row: dict[str, Any], wall: float, cpu: float) -> dict[str, Any]:
    n_groups, zv = int(row["n_groups"]), float(row["zero_var_share"] or 0.0)  # the report's names (issue 44)
    return {"step": step, "n_prompts": int(row["n_prompts"]), "n_groups": n_groups, "zero_var_share": zv,
            "zero_var_groups": round(zv * n_groups), "wasted_tokens": int(row["wasted_tokens"]),
            "gen_tokens": int(row["gen_tokens"]),
            "n_live": int(row.get("n_live", 0)), "n_seqs": int(row.get("n_seqs", 0)),
            "reward_mean": float(row.get("reward_mean") or 0.0), "wall_s": wall, "cpu_s": cpu,
            "load_1m": os.getloadavg()[0], "time": datetime.now(UTC).isoformat(),
            "stage_s": {k.removeprefix("seconds/"): float(v) for k, v in row.items()
                        if k.startswith("seconds/") and k != "seconds/step"}}


# ---------------------------------------------------------------------------------------------
# Summary
# ---------------------------------------------------------------------------------------------


def summarize(state: Path, arms: list[str]) -> dict[str, Any]:
    """Sums per arm, and each arm against the first: paired by step (the steps every arm finished) and,
    at each evaluation point every arm reached, paired by held-out prompt."""
    rows = {a: {r["step"]: r for r in read_jsonl(state / "arms" / a / "study.jsonl")} for a in arms}
    evals = {a: {e["after_steps"]: e for e in read_jsonl(state / "arms" / a / "evals.jsonl")} for a in arms}
    steps = sorted(set.intersection(*(set(r) for r in rows.values()))) if rows else []
    base = arms[0]
    out: dict[str, Any] = {"arms": {}, "steps": len(steps), "baseline": base}
    loads = [rows[a][s]["load_1m"] for a in arms for s in steps]
    out["load_1m"] = [min(loads), float(np.median(loads)), max(loads)] if loads else None

    def col(a: str, k: str) -> np.ndarray:
        return np.array([rows[a][s][k] for s in steps], dtype=np.float64)

    points = sorted(set.intersection(*(set(e) for e in evals.values()))) if evals else []
    for a in arms:
        gen, live = col(a, "gen_tokens"), col(a, "n_live")
        arm = {"gen_tokens": int(gen.sum()), "live_rows": int(live.sum()),
               "zero_var_groups": int(col(a, "zero_var_groups").sum()), "groups": int(col(a, "n_groups").sum()),
               "zero_var_token_share": float(col(a, "wasted_tokens").sum() / max(gen.sum(), 1)),
               "tokens_per_effective_sample": float(gen.sum() / live.sum()) if live.sum() else None,
               "wall_s": float(col(a, "wall_s").sum()), "cpu_s": float(col(a, "cpu_s").sum()),
               "eval_wall_s": float(sum(e["wall_s"] for e in evals[a].values())),
               "greedy_pass@1": {str(p): evals[a][p]["greedy_pass@1"] for p in points},
               "step_wall_s_median": float(np.median(col(a, "wall_s"))) if steps else None,
               "step_cpu_s_median": float(np.median(col(a, "cpu_s"))) if steps else None,
               "stage_s_median": {k: float(np.median([rows[a][s]["stage_s"][k] for s in steps if k in rows[a][s].get("stage_s", {})]))
                                  for k in sorted({k for s in steps for k in rows[a][s].get("stage_s", {})})}}
        if a != base and steps:
            dz = col(a, "zero_var_share") - col(base, "zero_var_share")
            arm["zero_var_share_diff_by_step"] = bootstrap_mean(dz)
            arm["zero_var_share_sign_test"] = sign_test(dz)
            arm["tokens_per_effective_ratio"] = ratio_ci(gen, live, col(base, "gen_tokens"), col(base, "n_live"))
            arm["pass@1_diff_by_prompt"] = {}
            for p in points:
                pa, pb = evals[a][p]["per_prompt"], evals[base][p]["per_prompt"]
                ids = sorted(set(pa) & set(pb))
                d = np.array([float(pa[i]) - float(pb[i]) for i in ids])
                arm["pass@1_diff_by_prompt"][str(p)] = {"n_prompts": len(ids), "diff": bootstrap_mean(d),
                                                         "sign_test": sign_test(d)}
        out["arms"][a] = arm
    return out


def _ci(t: Any, pct: bool = False) -> str:
    if not t or t[0] is None or not np.isfinite(t[0]):
        return "—"
    f = 100.0 if pct else 1.0
    fmt = "{:+.1f}" if pct else "{:.3f}"
    return f"{fmt.format(t[0] * f)} [{fmt.format(t[1] * f)}, {fmt.format(t[2] * f)}]"


def markdown(s: dict[str, Any]) -> str:
    """The summary as two Markdown tables: waste per arm (paired by step) and held-out pass@1 (paired by prompt)."""
    ld = s.get("load_1m")
    lines = [f"{s['steps']} steps every arm finished; load (1 min) min/median/max "
             + (f"{ld[0]:.1f}/{ld[1]:.1f}/{ld[2]:.1f}" if ld else "—"), "",
             "| arm | gen tokens | zero-var groups | their token share | tokens / effective sample | "
             "Δ zero-var share, points, by step [95% CI] | sign test (lower/higher, p) | "
             "tokens/effective ratio vs baseline [95% CI] | wall s | CPU s |", "|---|---|---|---|---|---|---|---|---|---|"]
    for name, a in s["arms"].items():
        st = a.get("zero_var_share_sign_test")
        tpe = a["tokens_per_effective_sample"]
        lines.append(f"| {name} | {a['gen_tokens']} | {a['zero_var_groups']}/{a['groups']} | {a['zero_var_token_share']:.1%} | "
                     f"{'—' if tpe is None else f'{tpe:.1f}'} | {_ci(a.get('zero_var_share_diff_by_step'), pct=True)} | "
                     f"{'—' if st is None else f'{st[0]}/{st[1]}, p = {st[2]:.2g}'} | "
                     f"{_ci(a.get('tokens_per_effective_ratio'))} | {a['wall_s']:.0f} | {a['cpu_s']:.0f} |")
    for name, a in s["arms"].items():
        if a.get("step_wall_s_median") is not None:
            stages = ", ".join(f"{k} {v:.1f}" for k, v in a.get("stage_s_median", {}).items() if v >= 0.5)
            lines.append(f"\n{name}: median step {a['step_wall_s_median']:.0f} s wall, {a['step_cpu_s_median']:.0f} s CPU"
                         + (f" (stages, median s: {stages})" if stages else ""))
    base = s["baseline"]
    pts = list(s["arms"][base]["greedy_pass@1"]) if s["arms"] else []
    if pts:
        lines += ["", "| after steps | " + " | ".join(f"{a} greedy pass@1" for a in s["arms"])
                  + " | " + " | ".join(f"Δ {a} [95% CI], sign test" for a in s["arms"] if a != base) + " |",
                  "|" + "---|" * (1 + 2 * len(s["arms"]) - 1)]
        for p in pts:
            cells = [f"{s['arms'][a]['greedy_pass@1'][p]:.3f}" for a in s["arms"]]
            for a in s["arms"]:
                if a == base:
                    continue
                d = s["arms"][a]["pass@1_diff_by_prompt"][p]
                st = d["sign_test"]
                cells.append(f"{_ci(d['diff'])}, {st[0]}/{st[1]} p = {st[2]:.2g} (n = {d['n_prompts']})")
            lines.append(f"| {p} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--state", required=True, help="the study's folder (outside the repo: it outlives a session)")
    ap.add_argument("--config", default="configs/arith-smollm2.yaml")
    ap.add_argument("--arms", default="uniform,greso,vade", help=f"comma-separated, the first is the baseline; known: "
                    f"{', '.join(SELECTOR_OF)}")
    ap.add_argument("--engine", default="vllm", help="generate.engine of every arm (vllm, or hf for a quick check)")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--n-train", default="8,24", help="training prompts per task (a small pool: prompts recur)")
    ap.add_argument("--n-eval", default="14,210", help="held-out prompts per task (the one-digit test split holds 14)")
    ap.add_argument("--eval-every", type=int, default=25)
    ap.add_argument("--ckpt-every", type=int, default=5)
    ap.add_argument("--kv-mib", type=int, default=384, help="vLLM KV cache per arm, MiB")
    ap.add_argument("--set", action="append", default=[], help="extra dotted overrides for every arm (key=value)")
    ap.add_argument("--until", default=None, help="HH:MM UTC (its next occurrence): start no step that would end after it, then stop cleanly")
    ap.add_argument("--max-rounds", type=int, default=None, help="stop cleanly after this many steps of every arm")
    ap.add_argument("--report", action="store_true", help="only print the summary of the state so far")
    return ap


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parser().parse_args(argv)
    unknown = [a for a in args.arms.split(",") if a not in SELECTOR_OF]
    if unknown:
        raise SystemExit(f"--arms: unknown arm {unknown[0]!r}; known: {', '.join(SELECTOR_OF)}")
    if args.report:
        s = summarize(Path(args.state).expanduser(), args.arms.split(","))
        print(markdown(s))
        return s
    return run_study(args)


if __name__ == "__main__":
    main()
