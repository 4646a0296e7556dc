"""Diagnose benchmark: per-step metrics from the store (columnar, gfcr.diagnose.metrics) against a
naive baseline that loads every rollout as an object and loops in Python, side by side on the
same synthetic store; then the HTML report end to end.

    python bench/diagnose_bench.py              # 20k rollouts x 256 tokens, 40 steps, groups of 8
    python bench/diagnose_bench.py --n 5000     # quicker

Goal: step_metrics >= 3x faster than the object-loop baseline, and the two agree on the numbers
they both compute (mean reward, zero-variance share, waste share, mean length, truncation rate).

Scale (``--scale 100000,1000000,10000000``): stores of that many rows (16 tokens each, 500
steps, groups of 8; built as Arrow tables in 1M-row appends) timing, per size:

* the viewer's list page (``GET /api/rollouts``, 50 rows, the app in process): the first request
  after the store changed (it builds the per-step index), then pages at random offsets (median of
  fresh samples, each a new offset), alternated with the full-scan baseline (every row's list
  columns read and sorted, what the viewer did before);
* the per-step metrics alone (``step_metrics``: derived from the rows on read, issue 44) with the
  process's cache emptied first ("cold": what ``gfcr report`` pays, a fresh process) alternated
  with the cached read (the same store version again);
* ``gfcr report``'s work: metrics once, findings, health checks, the HTML (``build_report``),
  cold, alternated with the same report with the metrics cached;
* the viewer's summary page (``GET /api/summary``).

``--cache DIR`` builds each store once (1M-row appends, then ``compact()``) and reuses it on later
runs.

Goals (issue 27): list page <= 200 ms and report <= 5 s at 10M rows. Wall and CPU seconds, the
machine's load average before and after.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

from gfcr.diagnose.metrics import step_metrics
from gfcr.diagnose.report import build_report
from gfcr.records import Message, Rollout
from gfcr.store import RolloutStore


def make_rollouts(n: int, steps: int, k: int, tokens: int, seed: int = 0) -> list[Rollout]:
    rng = np.random.default_rng(seed)
    out = []
    per_step = n // steps
    for i in range(n):
        step = min(i // per_step, steps - 1)
        g = i // k
        p_correct = rng.choice([0.0, 0.5, 1.0]) if i % k == 0 else None
        if p_correct is not None:
            cur = p_correct
        gen = int(rng.integers(tokens // 4, tokens // 2))
        role = np.r_[np.zeros(tokens - gen, np.uint8), np.ones(gen, np.uint8)]
        ok = bool(rng.random() < cur)
        out.append(Rollout(
            run_id="bench", prompt_id=f"p{g}", group_id=f"g{g}", step=step, sample_index=i % k,
            token_ids=rng.integers(0, 50000, tokens, dtype=np.int32), token_role=role,
            logprobs=np.where(role == 1, -rng.random(tokens), 0).astype(np.float32),
            messages=[Message("user", "q"), Message("assistant", "a")], reward=float(ok), verified=ok,
            finish_reason="length" if gen > 0.45 * tokens else "stop", signals={"advantage": 0.0}))
    return out


def baseline(store: RolloutStore) -> dict[int, dict[str, float]]:
    """The object loop a user would write without gfcr.diagnose."""
    rs = store.rollouts()
    by_step: dict[int, list[Rollout]] = defaultdict(list)
    for r in rs:
        by_step[r.step].append(r)
    out = {}
    for step, rows in sorted(by_step.items()):
        groups: dict[str, list[Rollout]] = defaultdict(list)
        for r in rows:
            groups[r.group_id].append(r)
        gen = [int((r.token_role == 1).sum()) for r in rows]
        zero = [g for g in groups.values() if len(g) > 1 and len({r.reward for r in g}) == 1]
        wasted = sum(int((r.token_role == 1).sum()) for g in zero for r in g)
        multi = sum(1 for g in groups.values() if len(g) > 1)
        out[step] = {"reward_mean": statistics.fmean(r.reward for r in rows), "zero_var_share": len(zero) / multi,
                     "waste_share": wasted / sum(gen), "len_mean": statistics.fmean(gen),
                     "trunc_rate": sum(r.finish_reason == "length" for r in rows) / len(rows)}
    return out


def scale_store(path: Path, n: int, tokens: int = 16, steps: int = 500, k: int = 8, chunk: int = 1_000_000,
                budget_s: float | None = None):
    """A store of ``n`` rows over ``steps`` training steps built from a 10,000-row template (made by
    the project's own record writer) with fresh ids, groups and steps per copy: 1M-row appends.
    An existing store at ``path`` is continued from its row count; ``budget_s``: stop appending
    once that many seconds have passed (a later call continues)."""
    t0 = time.perf_counter()
    per_step = max(k, n // steps)
    import pyarrow as pa

    from gfcr.records import rollouts_to_table

    base = rollouts_to_table(make_rollouts(10_000, 1, k, tokens, seed=1))
    store = RolloutStore.open(path, create=True)
    done = store.count()
    while done < n and (budget_s is None or time.perf_counter() - t0 < budget_s):
        m = min(chunk, n - done)
        reps = -(-m // base.num_rows)
        t = pa.concat_tables([base] * reps).slice(0, m)
        pos = np.arange(done, done + m)
        t = t.set_column(t.schema.get_field_index("rollout_id"), "rollout_id", pa.array([f"r{i:09d}" for i in pos]))
        t = t.set_column(t.schema.get_field_index("group_id"), "group_id", pa.array([f"g{i // k}" for i in pos]))
        t = t.set_column(t.schema.get_field_index("prompt_id"), "prompt_id", pa.array([f"p{i // k % 5000}" for i in pos]))
        t = t.set_column(t.schema.get_field_index("step"), "step", pa.array(pos // per_step, pa.int64()))
        store.append(t, check_existing=False)
        done += m
    return store


def _timed(fn):  # noqa: ANN001, ANN202
    w, c = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - w, time.process_time() - c


def full_scan_page(store: RolloutStore, offset: int, limit: int = 50):  # noqa: ANN201
    """The baseline list page: every row's list columns read and sorted, then sliced."""
    import pyarrow.compute as pc

    from gfcr.diagnose.paging import SORT_KEYS
    from gfcr.diagnose.viewer import LIST_COLUMNS

    t = store.scan(columns=LIST_COLUMNS)
    return t.take(pc.sort_indices(t, sort_keys=SORT_KEYS)).slice(offset, limit)


def cached_store(n: int, cache: Path | None, budget_s: float | None = None
                 ) -> tuple[RolloutStore, float | None, tempfile.TemporaryDirectory | None]:
    """The scale store of ``n`` rows: built once under ``cache`` (kept between runs; its id index
    built by ``compact()``, as ``gfcr store compact`` does), or in a temporary directory."""
    tmp = None
    if cache is None:
        tmp = tempfile.TemporaryDirectory()
        path = Path(tmp.name) / "s"
    else:
        path = cache / f"diagnose-scale-{n}"
        if path.exists() and RolloutStore.open(path).count() == n and (path / ".built").exists():
            return RolloutStore.open(path), None, None
    t = time.perf_counter()
    store = scale_store(path, n, budget_s=budget_s)
    if store.count() < n:
        raise SystemExit(f"{path}: {store.count():,} of {n:,} rows built within --build-budget-s; run again to continue")
    store.compact()
    if cache is not None:
        (path / ".built").touch()
    return store, time.perf_counter() - t, tmp


def scale(sizes: list[int], samples: int, baseline_max: int, report_max: int, cache: Path | None,
          report_samples: int, budget_s: float | None = None, build_only: bool = False) -> None:
    """Long because: one benchmark per size, its arms alternated, then the table."""
    import os

    from fastapi.testclient import TestClient

    from gfcr.diagnose.metrics import clear_cache
    from gfcr.diagnose.viewer import create_app

    rng = np.random.default_rng(0)
    print(f"load before: {os.getloadavg()}")
    rows = []
    for n in sizes:
        store, w_build, tmp = cached_store(n, cache, budget_s)
        if build_only:
            print(f"{n:,} rows built at {store.path} ({w_build} s)")
            continue
        client = TestClient(create_app(store.path))
        (r, w_first, c_first) = _timed(lambda c=client: c.get("/api/rollouts", params={"limit": 50}))
        assert r.status_code == 200 and r.json()["total"] == n
        pages, cpus, base, base_cpu = [], [], [], []
        for _ in range(samples):  # arms alternated; a fresh offset each sample
            off = int(rng.integers(0, n - 50))
            r, w, c = _timed(lambda off=off, cl=client: cl.get("/api/rollouts", params={"offset": off, "limit": 50}))
            assert r.status_code == 200 and len(r.json()["items"]) == 50
            pages.append(w), cpus.append(c)
            if n <= baseline_max:
                b, w, c = _timed(lambda off=off, st=store: full_scan_page(st, off))
                assert b.column("rollout_id").to_pylist() == [i["rollout_id"] for i in r.json()["items"]]
                base.append(w), base_cpu.append(c)
        _, w_sum, c_sum = _timed(lambda c=client: c.get("/api/summary"))
        t: dict[str, list[float]] = defaultdict(list)
        kib = 0.0
        for i in range(report_samples if n <= report_max else 0):  # cold vs cached, alternated
            for arm in ("cold", "cached") if i % 2 == 0 else ("cached", "cold"):
                if arm == "cold":
                    clear_cache()
                else:
                    step_metrics(store)  # (cached: a no-op when it already is)
                _, w, c = _timed(lambda st=store: step_metrics(st))
                t[f"metrics_{arm}"].append(w), t[f"metrics_{arm}_cpu"].append(c)
                if arm == "cold":
                    clear_cache()
                html, w, c = _timed(lambda st=store: build_report(st))
                t[f"report_{arm}"].append(w), t[f"report_{arm}_cpu"].append(c)
                kib = len(html) / 1024
        med = statistics.median
        row = {"n": n, "build_s": w_build, "first_page_s": w_first, "first_page_cpu_s": c_first,
               "page_ms": 1000 * med(pages), "page_cpu_ms": 1000 * med(cpus),
               "full_scan_ms": 1000 * med(base) if base else None,
               "full_scan_cpu_ms": 1000 * med(base_cpu) if base else None,
               "summary_ms": 1000 * w_sum, "summary_cpu_ms": 1000 * c_sum,
               **{f"{k}_s": med(v) for k, v in t.items()}, "report_kib": kib, "load": os.getloadavg()}
        rows.append(row)
        print({k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items()}, flush=True)
        if tmp is not None:
            tmp.cleanup()
    print(f"load after: {os.getloadavg()}")
    print("| rows | list page (median, wall / CPU) | full-scan page | first page (builds the index) | summary | "
          "step metrics cold / cached (wall / CPU) | report cold / metrics cached (wall / CPU) |")
    print("|---|---|---|---|---|---|---|")

    def pair(r: dict, what: str) -> str:
        if f"{what}_cold_s" not in r:
            return "not run"
        return " · ".join(f"{r[f'{what}_{a}_s']:.3f} / {r[f'{what}_{a}_cpu_s']:.3f} s" for a in ("cold", "cached"))

    for r in rows:
        fs = f"{r['full_scan_ms']:.0f} / {r['full_scan_cpu_ms']:.0f} ms" if r["full_scan_ms"] is not None else "not run"
        print(f"| {r['n']:,} | {r['page_ms']:.0f} / {r['page_cpu_ms']:.0f} ms | {fs} | {r['first_page_s']:.2f} s | "
              f"{r['summary_ms']:.0f} ms | {pair(r, 'metrics')} | {pair(r, 'report')} |")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scale", type=str, default=None, help="comma-separated store sizes for the scale run")
    ap.add_argument("--samples", type=int, default=7, help="scale run: list pages timed per size")
    ap.add_argument("--baseline-max", type=int, default=1_000_000, help="scale run: largest size given the full-scan arm")
    ap.add_argument("--report-max", type=int, default=10_000_000, help="scale run: largest size whose report is timed")
    ap.add_argument("--build-budget-s", type=float, default=None, help="scale run: stop building after this long")
    ap.add_argument("--build-only", action="store_true", help="scale run: build (or continue) the cached stores only")
    ap.add_argument("--report-samples", type=int, default=3, help="scale run: reports timed per size")
    ap.add_argument("--cache", type=Path, default=None,
                    help="scale run: keep the built stores here and reuse them (e.g. ~/.cache/gfcr/bench)")
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=256)
    a = ap.parse_args()
    if a.scale:
        scale([int(x) for x in a.scale.split(",")], a.samples, a.baseline_max, a.report_max,
              a.cache.expanduser() if a.cache else None, a.report_samples, a.build_budget_s, a.build_only)
        return
    with tempfile.TemporaryDirectory() as d:
        store = RolloutStore.open(Path(d) / "store", create=True)
        rs = make_rollouts(a.n, a.steps, a.k, a.tokens)
        for i in range(0, len(rs), 5000):
            store.append(rs[i:i + 5000])
        del rs
        step_metrics(store)  # warm-up: one-off imports (duckdb) and the OS page cache, for both sides
        t_fast = t_base = float("inf")
        for _ in range(3):  # best of 3, alternating, to damp noise from other work on the machine
            t = time.perf_counter()
            m = step_metrics(store)
            t_fast = min(t_fast, time.perf_counter() - t)
            t = time.perf_counter()
            base = baseline(store)
            t_base = min(t_base, time.perf_counter() - t)
        for row in m.to_pylist():
            b = base[row["step"]]
            for key, v in b.items():
                # the store's rows carry advantage 0 for every rollout, so every group is zero-advantage
                want = 1.0 if key == "waste_share" else v
                assert abs(row[key] - want) < 1e-9, (row["step"], key, row[key], want)
        t = time.perf_counter()
        page = build_report(store)
        t_rep = time.perf_counter() - t
    print(f"rollouts={a.n} tokens={a.tokens} steps={a.steps}")
    print(f"step_metrics: {t_fast:.2f} s   object-loop baseline: {t_base:.2f} s   speed-up x{t_base / t_fast:.1f} "
          f"(goal >= 3x; best of 3)")
    print(f"build_report: {t_rep:.2f} s, {len(page) / 1024:.0f} KiB")


if __name__ == "__main__":
    main()
