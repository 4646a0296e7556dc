"""Digest benchmark: what the digest of each new data file costs a commit (issues 30, 44).

    python bench/digest_bench.py                      # 10-row and 2,048-row appends, 30 rounds each
    python bench/digest_bench.py --sizes 10,4096 --rounds 20

Every commit hashes the data files it wrote (``gfcr.store.integrity.digest_entry``: each file
once, at its own commit) and the deletion files of its fragments. Three arms, each its own store,
per batch size:

- ``digest``: as shipped (XXH3-128, ``integrity.DIGEST``);
- ``sha256``: the same with ``integrity.DIGEST`` set to SHA-256 (what stores recorded before issue 44);
- ``off``: the digest function replaced by a constant (everything else of the commit's record
  unchanged): the floor without hashing.

Each round appends the same fresh batch (a new step, the synthetic rollouts of
``bench/store_bench.py``) to both stores, the arms' order alternating every round so machine load
hits them alike. Automatic compaction is off (``auto_compact=0``) so every round writes exactly one
new data file of the batch's size. Per arm and size: the medians (fresh samples, never the best of
repeats) of wall and CPU seconds of ``store.append``, the size of the new data file, and the
1-minute load average at each sample.
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

sys.path.insert(0, str(Path(__file__).resolve().parent))

from store_bench import synth_table  # noqa: E402

from gfcr.store import RolloutStore, integrity  # noqa: E402

ARMS = ("digest", "sha256", "off")


def _append(store: RolloutStore, table, arm: str) -> tuple[float, float]:
    alg, real = integrity.DIGEST, integrity.DIGESTS[integrity.DIGEST]
    try:
        if arm == "sha256":
            integrity.DIGEST = "sha256"
        if arm == "off":
            integrity.DIGESTS[alg] = lambda f, *a: "0" * 32
        t0, c0 = time.perf_counter(), time.process_time()
        store.append(table)
        return time.perf_counter() - t0, time.process_time() - c0
    finally:
        integrity.DIGEST, integrity.DIGESTS[alg] = alg, real


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="10,2048", help="rows per append, comma-separated")
    ap.add_argument("--tokens", type=int, default=256, help="tokens per row")
    ap.add_argument("--rounds", type=int, default=30, help="measured appends per arm and size")
    ap.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    a = ap.parse_args()
    out: dict = {"tokens": a.tokens, "rounds": a.rounds, "sizes": {}}
    loads: list[float] = []
    with tempfile.TemporaryDirectory() as d:
        for rows in (int(x) for x in a.sizes.split(",")):
            stores = {arm: RolloutStore.open(Path(d) / f"{arm}-{rows}", create=True, auto_compact=0) for arm in ARMS}
            wall: dict[str, list[float]] = {arm: [] for arm in ARMS}
            cpu: dict[str, list[float]] = {arm: [] for arm in ARMS}
            sizes: list[int] = []
            for r in range(a.rounds):
                t = synth_table(rows, a.tokens, a.rounds, start=r * rows, total=a.rounds * rows)
                loads.append(os.getloadavg()[0])
                for k in range(len(ARMS)):
                    arm = ARMS[(r + k) % len(ARMS)]
                    data = Path(stores[arm].path) / "rollouts.lance" / "data"
                    had = set(data.glob("*.lance"))
                    w, c = _append(stores[arm], t, arm)
                    wall[arm].append(w)
                    cpu[arm].append(c)
                    if arm == "digest":
                        new = set(data.glob("*.lance")) - had
                        sizes.append(sum(f.stat().st_size for f in new))
            # the shipped arm's digests are the files' real ones
            files = integrity.read_manifest(Path(stores["digest"].path))["files"]
            for k, v in list(files.items())[:3]:
                assert v[integrity.DIGEST] == integrity.DIGESTS[integrity.DIGEST](Path(stores["digest"].path) / k), k
            res = {"file_bytes_median": statistics.median(sizes)}
            for arm in ARMS:
                res[arm] = {"wall_ms_median": 1e3 * statistics.median(wall[arm]),
                            "cpu_ms_median": 1e3 * statistics.median(cpu[arm])}
            for arm in ARMS[:2]:
                res[f"{arm} - off, wall ms"] = res[arm]["wall_ms_median"] - res["off"]["wall_ms_median"]
                res[f"{arm} - off, cpu ms"] = res[arm]["cpu_ms_median"] - res["off"]["cpu_ms_median"]
            out["sizes"][rows] = res
    out["load_median"], out["load_max"] = statistics.median(loads), max(loads)
    print(json.dumps(out, indent=2))
    if a.out:
        a.out.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
