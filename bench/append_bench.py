"""Small-append benchmark: what the per-step aggregates cost on the append of one training step.

    python bench/append_bench.py                      # 64 rows x 256 tokens, 40 rounds, 20 steps before
    python bench/append_bench.py --rows 2048 --rounds 20

Three arms, each its own store filled with the same ``--before`` steps first, then a fresh batch
(a new step, ``--rows`` x ``--tokens``, the synthetic rollouts of ``bench/store_bench.py``) appended
to every store per round, the arms' order rotating every round so machine load hits them alike:

- ``small``: the aggregates kept as shipped (batches of <= ``aggregates.SMALL_ROWS`` rows summarised
  without DuckDB, :mod:`gfcr.store.smallstats`);
- ``duckdb``: the same with ``SMALL_ROWS = NUMPY_STEPS = 0`` (every batch through DuckDB's queries);
- ``off``: the aggregates hook replaced by a no-op (the floor: the append without its aggregates).

Per arm: median (and 90th percentile) wall and CPU seconds of ``store.append`` over the rounds
(fresh samples, never the best of repeats), the 1-minute load average at each sample. The stores
compact automatically as shipped (a compaction lands in some rounds of every arm alike). At the end
the two kept arms' aggregates are checked equal to a recompute from the rows (floats to 1e-12
relative: DuckDB's own sums round differently when the rows come in other batches).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from store_bench import synth_table  # noqa: E402

from gfcr.store import RolloutStore, aggregates  # noqa: E402

ARMS = ("small", "duckdb", "off")


def _append(store: RolloutStore, table, arm: str) -> tuple[float, float]:
    keep_rows, keep_steps, keep_hook = aggregates.SMALL_ROWS, aggregates.NUMPY_STEPS, aggregates.committed
    try:
        if arm == "duckdb":
            aggregates.SMALL_ROWS = aggregates.NUMPY_STEPS = 0
        if arm == "off":
            aggregates.committed = lambda *a, **k: None
        t0, c0 = time.perf_counter(), time.process_time()
        store.append(table)
        return time.perf_counter() - t0, time.process_time() - c0
    finally:
        aggregates.SMALL_ROWS, aggregates.NUMPY_STEPS, aggregates.committed = keep_rows, keep_steps, keep_hook


def _q(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=64, help="rows per append (one training step)")
    ap.add_argument("--tokens", type=int, default=256, help="tokens per row")
    ap.add_argument("--before", type=int, default=20, help="steps appended to every store before measuring")
    ap.add_argument("--rounds", type=int, default=40, help="measured appends per arm")
    ap.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    a = ap.parse_args()
    total = (a.before + a.rounds) * a.rows
    steps = a.before + a.rounds
    with tempfile.TemporaryDirectory() as d:
        stores = {arm: RolloutStore.open(Path(d) / arm, create=True) for arm in ARMS}
        for b in range(a.before):
            t = synth_table(a.rows, a.tokens, steps, start=b * a.rows, total=total)
            for arm in ARMS:
                stores[arm].append(t)
        wall = {arm: [] for arm in ARMS}
        cpu = {arm: [] for arm in ARMS}
        load: list[float] = []
        for r in range(a.rounds):
            b = a.before + r
            t = synth_table(a.rows, a.tokens, steps, start=b * a.rows, total=total)
            load.append(os.getloadavg()[0])
            for k in range(len(ARMS)):
                arm = ARMS[(r + k) % len(ARMS)]
                w, c = _append(stores[arm], t, arm)
                wall[arm].append(w)
                cpu[arm].append(c)
        for arm in ("small", "duckdb"):
            s = stores[arm]
            assert aggregates.state(s)[0] == "fresh", (arm, aggregates.state(s))
            kept, fresh = aggregates.load(s), aggregates.compute(s.dataset("rollouts"))
            for x, y in zip(kept.to_pylist(), fresh.to_pylist(), strict=True):
                bad = {c: (x[c], y[c]) for c in x if x[c] != y[c] and not (
                    isinstance(x[c], float) and math.isclose(x[c], y[c], rel_tol=1e-12))}
                assert not bad, (arm, bad)
    out = {"rows": a.rows, "tokens": a.tokens, "before": a.before, "rounds": a.rounds,
           "load_median": statistics.median(load), "load_max": max(load)}
    for arm in ARMS:
        out[arm] = {"wall_ms_median": 1e3 * statistics.median(wall[arm]), "wall_ms_p90": 1e3 * _q(wall[arm], 0.9),
                    "cpu_ms_median": 1e3 * statistics.median(cpu[arm]), "cpu_ms_p90": 1e3 * _q(cpu[arm], 0.9)}
    for arm in ("small", "duckdb"):
        out[f"{arm} - off, wall ms (median)"] = out[arm]["wall_ms_median"] - out["off"]["wall_ms_median"]
    print(json.dumps(out, indent=2))
    if a.out:
        a.out.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
