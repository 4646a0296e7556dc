"""Every performance row in one run: each row's own benchmark, in sequence, then one Markdown table.

    python bench/perf_all.py                      # default sizes (~18 min on an idle 2-core machine)
    python bench/perf_all.py --quick              # tiny sizes, a smoke test of the whole chain (minutes)
    python bench/perf_all.py --only align,tree    # some rows (names: --list)
    python bench/perf_all.py --no-run             # rebuild the table from the outputs already there

Each benchmark runs as its own subprocess with ``OMP_NUM_THREADS=1`` (one torch thread; Lance keeps
its own I/O threads) and writes its JSON under ``--out-dir`` (default ``bench/out/perf_all/``; its
stdout and stderr go beside it as ``NAME.log`` / ``NAME.err``). Around each subprocess this script
records the 1-minute load average (``os.getloadavg``) before, after, and every 10 s while it runs,
and the subprocess's wall and CPU seconds (``getrusage`` of the children). It measures nothing
itself: every number in the table is read from a benchmark's own JSON (medians over fresh samples,
arms alternated, CPU seconds beside wall), so a row means what its benchmark's docstring says.

The table (``bench/out/perf_all.md``, also printed) has one line per row: what, goal, measured,
verdict (met / partly / not met, judged on every quantity the goal names; rows without a goal say
so), the load during the benchmark, its wall and CPU time, and the exact command. The RL-step row
runs ``gfcr train configs/arith-smollm2.yaml`` for a few steps without evaluation and reads the
per-step ``seconds/*`` keys and ``zero_var_share`` of its ``metrics.jsonl``; its run folder is
deleted afterwards (only the metrics are kept).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOAD_EVERY_S = 10.0
THREAD_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


# --- the benchmarks ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Job:
    """One benchmark subprocess. ``full`` / ``quick``: its arguments at default / tiny sizes; ``script``
    None means ``python -m gfcr``. ``out_flag``: the option that names its JSON file (None: the
    JSON is the last object on its stdout, or ``collect`` builds it)."""

    name: str
    script: str | None
    full: tuple[str, ...]
    quick: tuple[str, ...]
    out_flag: str | None = "--out"
    collect: Callable[[Path], dict] | None = None  # (out_dir) -> the JSON, after the run
    run_dir: bool = False  # takes ``--run-dir <out_dir>/<name>-run`` (emptied before the run)


def _run_dir(out_dir: Path, name: str = "train") -> Path:
    return out_dir / f"{name}-run"


def _collect_train(out_dir: Path) -> dict:
    """The run's per-step metrics rows; the run folder (store, checkpoint) is then deleted."""
    run = _run_dir(out_dir)
    rows = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines() if ln.strip()]
    shutil.rmtree(run, ignore_errors=True)
    return {"steps": rows}


TRAIN_ARGS = ("train", "configs/arith-smollm2.yaml", "--no-progress", "--set", "eval.before=false",
              "--set", "eval.after=false")

JOBS: dict[str, Job] = {j.name: j for j in (
    Job("store", "bench/store_bench.py", ("--no-jsonl",),
        ("--no-jsonl", "--n", "5000", "--batch", "1000", "--read-rows", "20000", "--samples", "5")),
    Job("compaction", "bench/compaction_bench.py", ("--commits", "1000", "--window", "200"),
        ("--commits", "60", "--window", "20")),
    Job("align", "bench/align_bench.py", ("--rounds", "7", "--rollouts", "40"), ("--rounds", "3", "--rollouts", "4"),
        out_flag=None),
    Job("gen_tree", "bench/gen_bench.py", ("--part", "tree", "--reps", "3", "--prompts", "1", "--max-tokens", "32"),
        ("--part", "tree", "--reps", "1", "--prompts", "1", "--max-tokens", "16")),
    Job("gen_throughput", "bench/gen_bench.py", ("--part", "throughput", "--reps", "3", "--max-tokens", "32"),
        ("--part", "throughput", "--reps", "1", "--max-tokens", "16")),
    Job("train", None, TRAIN_ARGS + ("--set", "steps=3"),
        TRAIN_ARGS + ("--set", "steps=1", "--set", "generate.max_tokens=16"), out_flag=None, collect=_collect_train, run_dir=True),
    Job("serve", "bench/serve_bench.py",
        ("--part", "onoff", "--clients", "16", "--max-tokens", "32", "--rounds", "3", "--threads", "1"),
        ("--part", "onoff", "--clients", "4", "--max-tokens", "8", "--rounds", "1", "--threads", "1")),
    Job("sft_padding", "bench/ross_pack_bench.py",  # the packed arms' padding comes from the plans (not timed)
        ("--n", "48", "--batch-size", "8", "--layers", "8", "--threads", "1", "--arms", "padded-1,padded-5"),
        ("--n", "16", "--batch-size", "8", "--layers", "1", "--threads", "1", "--arms", "padded-1,padded-5")),
)}


def job_argv(job: Job, quick: bool, out_dir: Path) -> list[str]:
    """The benchmark's argv after the interpreter, its output path included."""
    head = [job.script] if job.script else ["-m", "gfcr"]
    args = list(job.quick if quick else job.full)
    if job.out_flag:
        args += [job.out_flag, _rel(out_dir / f"{job.name}.json")]
    if job.run_dir:
        args += ["--run-dir", _rel(_run_dir(out_dir, job.name))]
    return head + args


def _rel(p: Path) -> str:
    p = p.resolve()
    return str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else str(p)


def shown_command(argv: list[str]) -> str:
    """The command as a person types it from the repository root."""
    return "OMP_NUM_THREADS=1 " + shlex.join(["python", *argv])


def last_json_object(text: str) -> dict:
    """The last JSON object printed on its own lines (a benchmark that prints its result)."""
    starts = [0] + [m.start() + 1 for m in re.finditer(r"\n\{", text)]
    for s in reversed(starts):
        try:
            obj = json.loads(text[s:].strip())
        except ValueError:
            continue
        if isinstance(obj, dict):
            return obj
    raise ValueError("no JSON object at the end of the benchmark's output")


def run_job(job: Job, quick: bool, out_dir: Path) -> dict:
    """Run one benchmark; returns its record (command, rc, wall/CPU seconds, load before/during/after)."""
    argv = job_argv(job, quick, out_dir)
    if job.run_dir:
        shutil.rmtree(_run_dir(out_dir, job.name), ignore_errors=True)
    (out_dir / f"{job.name}.json").unlink(missing_ok=True)
    samples: list[float] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(LOAD_EVERY_S):
            samples.append(round(os.getloadavg()[0], 2))

    env = os.environ | THREAD_ENV
    before = os.getloadavg()[0]
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    th = threading.Thread(target=sample, daemon=True)
    th.start()
    with open(out_dir / f"{job.name}.log", "w") as out, open(out_dir / f"{job.name}.err", "w") as err:
        rc = subprocess.run([sys.executable, *argv], stdout=out, stderr=err, env=env, cwd=ROOT).returncode
    stop.set()
    th.join()
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    rec = {"job": job.name, "mode": "quick" if quick else "full", "command": shown_command(argv), "rc": rc,
           "wall_s": round(time.perf_counter() - t0, 1),
           "cpu_s": round(ru1.ru_utime + ru1.ru_stime - ru0.ru_utime - ru0.ru_stime, 1),
           "load": {"before": round(before, 2), "after": round(os.getloadavg()[0], 2), "during": samples},
           "finished": datetime.now(UTC).isoformat(timespec="seconds")}
    if rc == 0 and not job.out_flag:
        try:
            res = job.collect(out_dir) if job.collect else last_json_object((out_dir / f"{job.name}.log").read_text())
            (out_dir / f"{job.name}.json").write_text(json.dumps(res, indent=1))
        except (OSError, ValueError) as e:
            rec["error"] = f"could not read its result: {e}"
    return rec


# --- reading each row's numbers ---------------------------------------------------------------


@dataclass(frozen=True)
class Measured:
    """What a row shows: the text, the goal's checks (label, met?), and a note on a missed goal."""

    text: str
    checks: tuple[tuple[str, bool], ...] = ()
    note: str = ""


def judge(checks: tuple[tuple[str, bool], ...] | list[tuple[str, bool]]) -> str:
    """'met' when every check holds, 'not met' when none does, 'partly' otherwise; no checks: no goal."""
    if not checks:
        return "— (no goal)"
    good = [label for label, ok in checks if ok]
    bad = [label for label, ok in checks if not ok]
    if not bad:
        return "met"
    if not good:
        return "**not met**"
    return f"partly: met {', '.join(good)}; **not met** {', '.join(bad)}"


def fmt_x(x: float) -> str:
    return f"{x:.2f}×"


def fmt_n(n: int) -> str:
    """100000 -> '100k', 1000000 -> '1M'."""
    if n >= 1_000_000 and n % 1_000_000 == 0:
        return f"{n // 1_000_000}M"
    if n >= 1000 and n % 1000 == 0:
        return f"{n // 1000}k"
    return str(n)


def fmt_load(load: dict) -> str:
    """'before → after (during: median m, max M, n samples)' of the 1-minute load average."""
    s = f"{load['before']:.1f} → {load['after']:.1f}"
    if load.get("during"):
        d = load["during"]
        s += f" (during: median {statistics.median(d):.1f}, max {max(d):.1f})"
    return s


def count(n: int, word: str) -> str:
    """'1 rep', '3 reps'."""
    return f"{n} {word}{'' if n == 1 else 's'}"


def fmt_time(s: float) -> str:
    return f"{s / 60:.1f} min" if s >= 120 else f"{s:.0f} s"


def m_store_append(j: dict) -> Measured:
    a = j["append"]
    wall = a["store/raw wall, median of per-batch ratios"]
    cpu = a["store"]["cpu_median"] / a["raw"]["cpu_median"]
    n, tokens = j["args"]["n"], j["args"]["tokens"]
    text = (f"{fmt_n(n)} rows × {tokens} tokens: store/raw {fmt_x(wall)} wall (median of per-commit ratios), {fmt_x(cpu)} CPU (ratio of medians); "
            f"per commit of {j['args']['batch']:,}: store {a['store']['wall_median']:.2f} s wall, "
            f"{a['store']['cpu_median']:.2f} s CPU; raw {a['raw']['wall_median']:.2f} / {a['raw']['cpu_median']:.2f} s "
            f"({a['store']['n']} commits, {a['store fragments']} fragments after {a['store compactions']} compactions)")
    return Measured(text, ((f"wall {fmt_x(wall)}", wall <= 1.5), (f"CPU {fmt_x(cpu)}", cpu <= 1.5)))


FLOOR = "raw take, store's read options (floor)"
_TABLE_KEY = re.compile(r"(\d+) rows x (\d+) tokens(, after compact\(\))?$")


TRAIN_COLS = "store.sample, training columns only"


def m_store_reads(j: dict) -> Measured:
    parts, checks, extra, cols = [], [], [], []
    for key, r in j["sample_1k"].items():
        m = _TABLE_KEY.match(key)
        if not m:
            continue
        label = f"{fmt_n(int(m[1]))}×{m[2]} {'compacted' if m[3] else 'as written'}"
        s = r["store.sample"]
        parts.append(f"{label}: {s['wall_median']:.0f} / {s['cpu_median']:.0f}")
        extra.append(f"{r[FLOOR]['cpu_median']:.0f}")
        if TRAIN_COLS in r:
            cols.append(f"{r[TRAIN_COLS]['wall_median']:.0f} / {r[TRAIN_COLS]['cpu_median']:.0f}")
        checks.append((f"{label} {s['wall_median']:.0f} ms wall", s["wall_median"] <= 50))
    n = j["args"]["samples"]
    text = (f"`store.sample(1000)`, all columns, ms wall / CPU (median of {n} fresh samples): " + "; ".join(parts)
            + f". Raw Lance take of the same rows (the floor), CPU ms: {', '.join(extra)}"
            + (f". A trainer's columns only (`sample(..., columns=...)`), same tables: {'; '.join(cols)}" if cols else ""))
    worst = max((r["store.sample minus floor, cpu ms (median)"] for k, r in j["sample_1k"].items() if _TABLE_KEY.match(k)),
                default=0.0)
    note = (f"the store adds at most {worst:.0f} ms CPU over Lance's own take; the rest is Lance's per-row take "
            "(profile: docs/store.md, Random-row reads)")
    return Measured(text, tuple(checks), note)


def m_commits(j: dict) -> Measured:
    w0, w1 = j["windows"][0], j["windows"][-1]
    arms = [k for k in w0 if isinstance(w0[k], dict)]
    parts = [f"{a}: {w0[a]['cpu_ms_per_commit']:.1f} → {w1[a]['cpu_ms_per_commit']:.1f} CPU ms/commit "
             f"({w0[a]['commits_per_s']:.1f} → {w1[a]['commits_per_s']:.1f} commits/s wall, "
             f"{j['end'][a]['fragments']} fragments)" for a in arms]
    return Measured(f"commits {w0['commits']} → {w1['commits']}, " + "; ".join(parts))


def m_align(j: dict) -> Measured:
    v, lp = j["vectorised"], j["loop"]
    cpu = v["median_tokens_per_cpu_s"]
    text = (f"{cpu / 1e6:.2f}M tokens per CPU-s, {v['median_tokens_per_wall_s'] / 1e6:.2f}M per wall-s "
            f"(median of {count(j['rounds'], 'round')} × {j['rollouts_per_round']} rollouts of ~{j['rollout_tokens_mean']:.0f} "
            f"tokens; the per-token loop it replaced: {lp['median_tokens_per_cpu_s'] / 1e6:.2f}M per CPU-s; "
            f"masks identical: {j['identical_masks']})")
    return Measured(text, ((f"{cpu / 1e6:.2f}M per CPU-s", cpu >= 1e6),), "docs/ross.md, Alignment")


def m_tree(j: dict) -> Measured:
    t = j["tree_vs_group"]
    g, tr, rr = t["group"], t["tree (growing batch)"], t["tree (round by round)"]
    text = (f"tree (one growing batch) {fmt_x(tr['wall_over_group'])} the group's wall, {fmt_x(tr['cpu_over_group'])} its CPU "
            f"({tr['wall_s']:.1f} vs {g['wall_s']:.1f} s wall, {tr['cpu_s']:.1f} vs {g['cpu_s']:.1f} s CPU); "
            f"{tr['token_saving_per_leaf']:.1%} fewer sampled tokens per leaf; round by round: "
            f"{fmt_x(rr['wall_over_group'])} wall, {fmt_x(rr['cpu_over_group'])} CPU "
            f"(medians of {count(j['reps'], 'rep')}, {j['max_tokens']} new tokens)")
    checks = ((f"wall {fmt_x(tr['wall_over_group'])} group", tr["wall_over_group"] < 1.0),
              (f"{tr['token_saving_per_leaf']:.0%} fewer tokens", tr["token_saving_per_leaf"] >= 0.30))
    return Measured(text, checks, "docs/generate.md, Benchmark")


def m_batch(j: dict) -> Measured:
    t = j["throughput"]
    cpu, wall = t["batch32_over_batch1_cpu"], t["batch32_over_batch1_wall"]
    per = " / ".join(f"{t[b]['tok_per_cpu_s']:.1f}" for b in ("1", "8", "32"))
    perw = " / ".join(f"{t[b]['tok_per_s']:.1f}" for b in ("1", "8", "32"))
    text = (f"batch 32 / batch 1: {fmt_x(cpu)} per CPU-s, {fmt_x(wall)} wall; tokens per CPU-s at batch 1 / 8 / 32: "
            f"{per}; per wall-s: {perw} (medians of {count(j['reps'], 'rep')}, {j['max_tokens']} new tokens, "
            f"{j['threads']} thread)")
    return Measured(text, ((f"per CPU-s {fmt_x(cpu)}", cpu >= 5.0), (f"wall {fmt_x(wall)}", wall >= 5.0)),
                    "profile per decode step: docs/generate.md, Benchmark")


def m_rl_step(j: dict) -> Measured:
    steps = j["steps"]
    tot = {}
    for row in steps:
        for k, v in row.items():
            if k.startswith("seconds/"):
                tot[k[8:]] = tot.get(k[8:], 0.0) + v
    step = tot.pop("step")
    gen, upd = tot.pop("generate", 0.0), tot.pop("update", 0.0)
    other = [kv for kv in sorted(tot.items(), key=lambda kv: -kv[1])[:3] if kv[1] >= 0.005 * step]
    groups = sum(r["n_groups"] for r in steps)  # groups of two or more (the report's n_groups)
    zero = sum(round((r["zero_var_share"] or 0.0) * r["n_groups"]) for r in steps)
    gen_tokens = sum(r["gen_tokens"] for r in steps)
    text = (f"{count(len(steps), 'step')}, {step:.1f} s: generation {gen / step:.0%}, update {upd / step:.0%}, "
            f"other {(step - gen - upd) / step:.0%} (" + ", ".join(f"{k} {v / step:.0%}" for k, v in other)
            + f"); {zero} of {groups} groups had zero reward variance; {gen_tokens} generated tokens")
    if all("wasted_tokens" in r for r in steps):
        text += f", {sum(r['wasted_tokens'] for r in steps) / max(gen_tokens, 1):.0%} of them on zero-advantage groups"
    return Measured(text)


def m_serve(j: dict) -> Measured:
    on, off = j["runs"]["on"], j["runs"]["off"]
    calls = ", ".join(str(x["engine_calls"]) for x in on)
    cpu_on = statistics.median(x["cpu_seconds"] for x in on)
    cpu_off = statistics.median(x["cpu_seconds"] for x in off)
    text = (f"batching on/off {fmt_x(j['ratio_tokens_per_s'])} tokens per wall-s ({j['on_tokens_per_s']} vs "
            f"{j['off_tokens_per_s']}), CPU s per burst {cpu_on:.1f} vs {cpu_off:.1f} ({fmt_x(cpu_off / cpu_on)}); "
            f"engine calls per {j['clients']}-client burst: {calls}; greedy answers identical {j['greedy_same_tokens']} "
            f"(medians of {count(j['rounds'], 'round')}, {j['max_tokens']} tokens each)")
    return Measured(text)


def m_padding(j: dict) -> Measured:
    arms, planned = j["arms"], j["planned_pad_fraction"]
    pad = {a: arms[a]["pad_fraction"] if a in arms else planned[a] for a in planned}
    planned_only = [a for a in planned if a not in arms]
    text = (f"padding, ≤ {j['max_pad_fraction']:.0%} micro-batches: padded {pad['padded-5']:.1%}, "
            f"packed {pad['packed-5']:.1%} (one tensor per step: {pad['padded-1']:.1%} / {pad['packed-1']:.1%}"
            + (f"; {', '.join(planned_only)} from the plans, not timed" if planned_only else "") + "); "
            f"{j['n']} rows at batch {j['batch_size']}, lengths {j['lengths']['min']}–{j['lengths']['max']}")
    if "padded-5" in arms and "padded-1" in arms:
        a5, a1 = arms["padded-5"], arms["padded-1"]
        text += (f"; real tokens per CPU-s {a5['tokens_per_cpu_s']:.0f} vs {a1['tokens_per_cpu_s']:.0f} one tensor "
                 f"({fmt_x(a5['tokens_per_cpu_s'] / a1['tokens_per_cpu_s'])}; wall {a5['wall_s']:.1f} vs {a1['wall_s']:.1f} s, "
                 f"{count(j['layers'], 'layer')} of the model)")
    checks = ((f"padded {pad['padded-5']:.1%}", pad["padded-5"] <= 0.05), (f"packed {pad['packed-5']:.1%}", pad["packed-5"] <= 0.05))
    return Measured(text, checks, "docs/ross.md, Bounded padding")


@dataclass(frozen=True)
class Row:
    key: str  # --only name
    number: str
    what: str
    goal: str
    job: str
    measure: Callable[[dict], Measured]


ROWS: tuple[Row, ...] = (
    Row("store-append", "1", "store append vs a raw Lance write of the same batches", "≤ 1.5×",
        "store", m_store_append),
    Row("store-reads", "2", "1,000 random rows, all columns, as written and compacted (by default 100k × 512 and 1M × 16 rows)",
        "≤ 50 ms median", "store", m_store_reads),
    Row("store-commits", "1b", "small commits (10 rows × 128 tokens): cost per commit over a long run, "
        "automatic compaction vs none vs the earlier id scan", "—", "compaction", m_commits),
    Row("align", "3", "ROSS span → token alignment (~1,050-token rollouts)", "≥ 1M tokens per CPU-s", "align", m_align),
    Row("tree", "4", "tree (EPTree 6×2×1×2) vs group (k = 30) at equal leaves", "faster in wall than the group; ≥ 30% fewer tokens",
        "gen_tree", m_tree),
    Row("batch", "5", "batch 32 vs batch 1 generation (hf, SmolLM2-135M)", "≥ 5×", "gen_throughput", m_batch),
    Row("rl-step", "6", "RL step split (`configs/arith-smollm2.yaml`, no evaluation)", "—", "train", m_rl_step),
    Row("serve", "7", "`gfcr serve` dynamic batching, concurrent clients (16 by default)", "—", "serve", m_serve),
    Row("sft-padding", "8", "masked SFT padding (arithmetic lengths + a long tail, 8 rows per step)", "≤ 5%",
        "sft_padding", m_padding),
)


def row_line(row: Row, rec: dict | None, res: dict | None) -> str:
    """One Markdown table line: the row, its benchmark's numbers and verdict, the load and the command."""
    if rec is None:
        measured, verdict = "not run", "—"
    elif rec.get("rc") or rec.get("error") or res is None:
        why = rec.get("error") or f"exit status {rec.get('rc')}"
        measured, verdict = f"benchmark failed ({why}; see {rec['job']}.err)", "not measured"
    else:
        try:
            m = row.measure(res)
            verdict = judge(m.checks)
            if m.note and m.checks and verdict != "met":
                verdict += f"; see {m.note}" if m.note.startswith("docs/") else f"; {m.note}"
            measured = m.text
        except (KeyError, TypeError, ValueError, ZeroDivisionError, IndexError) as e:
            measured, verdict = f"could not read the benchmark's JSON ({type(e).__name__}: {e})", "not measured"
    load = fmt_load(rec["load"]) if rec else "—"
    run = f"{fmt_time(rec['wall_s'])} wall, {fmt_time(rec['cpu_s'])} CPU" if rec else "—"
    cmd = f"`{rec['command']}`" if rec else "—"
    cells = [row.number, row.what, row.goal, measured, verdict, load, run, cmd]
    return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"


def build_table(rows: list[Row], records: dict[str, dict], results: dict[str, dict], header: str = "") -> str:
    """The Markdown table of ``rows`` from the runs' records and the benchmarks' JSON (both by job name)."""
    lines = [header] if header else []
    lines += ["| # | what | goal | measured (medians; CPU beside wall) | verdict | load avg (1 min) | benchmark run | command |",
              "|---|---|---|---|---|---|---|---|"]
    lines += [row_line(r, records.get(r.job), results.get(r.job)) for r in rows]
    return "\n".join(lines) + "\n"


# --- the command ------------------------------------------------------------------------------


def pick_rows(only: str | None) -> list[Row]:
    if not only:
        return list(ROWS)
    keys = [k.strip() for k in only.split(",") if k.strip()]
    unknown = [k for k in keys if k not in {r.key for r in ROWS}]
    if unknown:
        raise SystemExit(f"--only: unknown row {', '.join(unknown)} (rows: {', '.join(r.key for r in ROWS)})")
    return [r for r in ROWS if r.key in keys]


def _git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="tiny sizes: checks the chain end to end, not the goals")
    ap.add_argument("--only", default=None, help="comma-separated rows (see --list)")
    ap.add_argument("--list", action="store_true", help="print the rows and their benchmarks, then exit")
    ap.add_argument("--no-run", action="store_true", help="only rebuild the table from --out-dir")
    ap.add_argument("--out-dir", default="bench/out/perf_all")
    ap.add_argument("--table", default="bench/out/perf_all.md")
    a = ap.parse_args(argv)
    if a.list:
        for r in ROWS:
            print(f"{r.key:14s} row {r.number:3s} {r.job:15s} {r.what}")
        return 0
    rows = pick_rows(a.only)
    out_dir = Path(a.out_dir) if Path(a.out_dir).is_absolute() else ROOT / a.out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    runs_path = out_dir / "runs.json"
    records: dict[str, dict] = json.loads(runs_path.read_text()) if runs_path.exists() else {}
    jobs = list(dict.fromkeys(r.job for r in rows))
    started = datetime.now(UTC).isoformat(timespec="seconds")
    if not a.no_run:
        for i, name in enumerate(jobs, 1):
            job = JOBS[name]
            print(f"[{i}/{len(jobs)}] {name}: {shown_command(job_argv(job, a.quick, out_dir))}", flush=True)
            records[name] = run_job(job, a.quick, out_dir)
            rec = records[name]
            print(f"    rc {rec['rc']}, {rec['wall_s']} s wall, {rec['cpu_s']} s CPU, load {fmt_load(rec['load'])}"
                  + (f"; {rec['error']}" if rec.get("error") else ""), flush=True)
            runs_path.write_text(json.dumps(records, indent=1))
    results = {}
    for name in jobs:
        p = out_dir / f"{name}.json"
        if p.exists() and name in records:
            results[name] = json.loads(p.read_text())
    modes = sorted({records[n]["mode"] for n in jobs if n in records})
    total = sum(records[n]["wall_s"] for n in jobs if n in records)
    when = f"table rebuilt {started}" if a.no_run else f"started {started}"
    header = (f"perf_all, {when}, commit {_git_commit()}, {os.cpu_count()} CPUs, sizes: {'/'.join(modes) or '—'}, "
              f"one torch thread per benchmark (`OMP_NUM_THREADS=1`), benchmarks in sequence, "
              f"{fmt_time(total)} of benchmarks\n")
    table = build_table(rows, records, results, header)
    table_path = Path(a.table) if Path(a.table).is_absolute() else ROOT / a.table
    table_path.parent.mkdir(parents=True, exist_ok=True)
    table_path.write_text(table)
    print(table)
    print(f"wrote {_rel(table_path)}; the benchmarks' JSON and logs are in {_rel(out_dir)}/")
    return 0 if all(records.get(n, {}).get("rc") == 0 and not records[n].get("error") for n in jobs) else 1


if __name__ == "__main__":
    sys.exit(main())
