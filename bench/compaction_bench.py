"""Commit rate over a long run of small commits: automatic compaction vs none vs the earlier path.

    python bench/compaction_bench.py [--commits 1200] [--rows 10] [--window 200] [--out bench/out/compaction.json]

Three stores receive the same 10-row batches, one commit each per step, the order rotating every
step (so machine load hits the arms alike):

- ``auto``: this version (duplicate-id check through the in-process index, size-tiered automatic
  compaction after every write);
- ``no-compaction``: the same check, ``auto_compact=0``;
- ``scan (before)``: the earlier append path, re-created here: the duplicate-id check reads the id
  column of every fragment (filtered by the new ids), then a plain Lance append; no compaction.

For every window of ``--window`` commits the report gives each arm's commits per wall second,
CPU milliseconds per commit (this process, Lance's threads included), and the median load; at the
end, each store's fragment count and row count (all arms must hold every row).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import lance

sys.path.insert(0, str(Path(__file__).parent))
from store_bench import synth_table  # noqa: E402

from gfcr.store import RolloutStore  # noqa: E402


def scan_append(store: RolloutStore, table) -> None:
    """The append path before the id index: filter the id column by the new ids, then append."""
    ids = table.column("rollout_id").to_pylist()
    ds = store.dataset("rollouts")
    flt = "rollout_id IN (" + ", ".join("'" + i + "'" for i in ids) + ")"
    if ds.to_table(columns=["rollout_id"], filter=flt).num_rows:
        raise RuntimeError("duplicate")
    lance.write_dataset(table, store._uri("rollouts"), mode="append")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--commits", type=int, default=1200)
    ap.add_argument("--rows", type=int, default=10)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--window", type=int, default=200)
    ap.add_argument("--out", default="bench/out/compaction.json")
    a = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="gfcr-compaction-"))
    stores = {
        "auto": RolloutStore.open(root / "auto", create=True),
        "no-compaction": RolloutStore.open(root / "none", create=True, auto_compact=0),
        "scan (before)": RolloutStore.open(root / "scan", create=True, auto_compact=0),
    }
    run = {"auto": lambda t: stores["auto"].append(t), "no-compaction": lambda t: stores["no-compaction"].append(t),
           "scan (before)": lambda t: scan_append(stores["scan (before)"], t)}
    names = list(stores)
    wall = {n: [] for n in names}
    cpu = {n: [] for n in names}
    loads: list[float] = []
    windows = []
    res: dict = {"args": vars(a), "cpus": os.cpu_count(), "load_start": os.getloadavg()}
    try:
        for i in range(a.commits):
            t = synth_table(a.rows, a.tokens, 100, start=i * a.rows, total=a.commits * a.rows)
            loads.append(os.getloadavg()[0])
            for k in range(len(names)):
                n = names[(i + k) % len(names)]
                t0, c0 = time.perf_counter(), time.process_time()
                run[n](t)
                wall[n].append(time.perf_counter() - t0)
                cpu[n].append(time.process_time() - c0)
            if (i + 1) % a.window == 0:
                w = slice(i + 1 - a.window, i + 1)
                row = {"commits": f"{i + 2 - a.window}-{i + 1}", "load": statistics.median(loads[w])}
                for n in names:
                    row[n] = {"commits_per_s": a.window / sum(wall[n][w]), "cpu_ms_per_commit": 1000 * statistics.mean(cpu[n][w])}
                windows.append(row)
                print(json.dumps(row), flush=True)
        res["windows"] = windows
        res["end"] = {n: {"fragments": len(s.dataset("rollouts").get_fragments()), "rows": s.count(),
                          "compactions": len(s.compactions)} for n, s in stores.items()}
        assert all(v["rows"] == a.commits * a.rows for v in res["end"].values()), res["end"]
        res["load_end"] = os.getloadavg()
        print(json.dumps(res["end"]))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
