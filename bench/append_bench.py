"""Append benchmark: ``RolloutStore.append`` against a raw Lance append of the same tables.

    python bench/append_bench.py                                  # 64 rows x 256 tokens (one training step)
    python bench/append_bench.py --rows 5000 --tokens 512 --before 4 --rounds 16   # a 5,000-row commit

Three arms, each its own dataset filled with the same ``--before`` batches first, then per round one
fresh batch (a new step, ``--rows`` x ``--tokens``, the synthetic rollouts of
``bench/store_bench.py``) appended to every arm, the arms' order rotating every round so machine load
hits them alike:

- ``store``: ``RolloutStore.append`` as shipped: the duplicate-id check (in-process id index), one
  Lance commit, the integrity record (``_record``: the new file's digest and one line appended to
  ``gfcr-store.log``), automatic compaction;
- ``store, no _record``: the same with ``RolloutStore._record`` replaced by a no-op on that store
  object (bench only: what the integrity record costs);
- ``raw``: ``lance.write_dataset(table, uri, mode="append")`` on a dataset created empty with the
  rollouts schema (the floor).

Per arm: median and 90th percentile of wall and CPU seconds over the rounds (fresh samples, never
the best of repeats); the ratios to ``raw`` of the medians and the medians of the per-round ratios
(wall and CPU: each round's arms ran within milliseconds of each other, so a ratio sees one load);
the 1-minute load average at every round. The store compacts automatically as shipped (in some
rounds; the 90th percentile shows them), raw Lance does not.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import lance
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent))

from store_bench import synth_table  # noqa: E402

from gfcr.records import ROLLOUT_SCHEMA  # noqa: E402
from gfcr.store import RolloutStore  # noqa: E402

ARMS = ("store", "store, no _record", "raw")


def _q(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def _writers(root: Path) -> dict:
    """One append function per arm, each on its own dataset."""
    store = RolloutStore.open(root / "store", create=True)
    bare = RolloutStore.open(root / "bare", create=True)
    bare._record = lambda *a, **k: None  # bench only: the integrity record left out
    raw_uri = str(root / "raw.lance")
    lance.write_dataset(pa.Table.from_batches([], schema=ROLLOUT_SCHEMA), raw_uri, mode="create")
    return {"store": store.append, "store, no _record": bare.append,
            "raw": lambda t: lance.write_dataset(t, raw_uri, mode="append")}


def run(rows: int, tokens: int, before: int, rounds: int) -> dict:
    """Long because: fill, the alternated rounds, then the summary."""
    steps = before + rounds
    total = steps * rows
    wall: dict[str, list[float]] = {a: [] for a in ARMS}
    cpu: dict[str, list[float]] = {a: [] for a in ARMS}
    load: list[float] = []
    with tempfile.TemporaryDirectory() as d:
        write = _writers(Path(d))
        for b in range(before):
            t = synth_table(rows, tokens, steps, start=b * rows, total=total)
            for arm in ARMS:
                write[arm](t)
        for r in range(rounds):
            t = synth_table(rows, tokens, steps, start=(before + r) * rows, total=total)
            load.append(os.getloadavg()[0])
            for k in range(len(ARMS)):
                arm = ARMS[(r + k) % len(ARMS)]
                t0, c0 = time.perf_counter(), time.process_time()
                write[arm](t)
                wall[arm].append(time.perf_counter() - t0)
                cpu[arm].append(time.process_time() - c0)
        counts = {a: lance.dataset(str(Path(d) / p)).count_rows()
                  for a, p in zip(ARMS, ("store/rollouts.lance", "bare/rollouts.lance", "raw.lance"), strict=True)}
        assert set(counts.values()) == {total}, counts
    med = statistics.median
    out: dict = {"rows": rows, "tokens": tokens, "before": before, "rounds": rounds, "cpus": os.cpu_count(),
                 "load_1m": {"min": min(load), "median": med(load), "max": max(load)}}
    for arm in ARMS:
        out[arm] = {"wall_ms_median": 1e3 * med(wall[arm]), "wall_ms_p90": 1e3 * _q(wall[arm], 0.9),
                    "cpu_ms_median": 1e3 * med(cpu[arm]), "cpu_ms_p90": 1e3 * _q(cpu[arm], 0.9)}
    for arm in ARMS[:2]:
        out[f"{arm} / raw"] = {
            "wall (medians)": med(wall[arm]) / med(wall["raw"]),
            "cpu (medians)": med(cpu[arm]) / med(cpu["raw"]),
            "wall (median of per-round ratios)": med([a / b for a, b in zip(wall[arm], wall["raw"], strict=True)]),
            "cpu (median of per-round ratios)": med([a / b for a, b in zip(cpu[arm], cpu["raw"], strict=True)]),
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=64, help="rows per append")
    ap.add_argument("--tokens", type=int, default=256, help="tokens per row")
    ap.add_argument("--before", type=int, default=20, help="batches appended to every arm before measuring")
    ap.add_argument("--rounds", type=int, default=40, help="measured appends per arm")
    ap.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    a = ap.parse_args()
    out = run(a.rows, a.tokens, a.before, a.rounds)
    print(json.dumps(out, indent=2))
    if a.out:
        a.out.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
