"""Many writers into one store on the loopback S3 server: one commit per batch vs staged batches
committed together (gfcr.store.staging).

    python bench/writers_bench.py                          # 4 writers x 12 batches of 64x256, 3 rounds
    python bench/writers_bench.py --writers 8 --batches 25 --rounds 2 --out writers.json

The S3 server is moto's (``bench/s3_bench.py``'s ``Server``: one Python process on this machine's
cores, on 127.0.0.1): request counts and the shape of the race carry over to real S3, absolute
times do not. Arms, alternated every round (order rotating), each into a new store (new prefix):

- ``per-batch``: ``--writers`` processes each ``RolloutStore.append`` their ``--batches`` batches of
  ``--rows`` x ``--tokens`` (``bench/store_bench.py``'s synthetic rollouts), one commit per batch, all
  racing for the next version;
- ``staged``: the same processes ``RolloutStore.stage`` the same batches (data files, no commit) and
  send each :class:`~gfcr.store.staging.Staged` as one JSON line to a committer (this process), which
  commits whatever has arrived in one ``commit_staged`` as soon as its previous commit is done (a
  group commit: one committer, no race).

Both arms open the stores with ``auto_compact=0`` and append with ``check_existing=False`` (ids are
fresh uuids, as the live recorders write them), so the commit path alone is compared. The clock
starts when every writer has opened the store and built its tables (they then wait for "go") and
stops when the last batch is visible. Per arm, medians over rounds: wall s, commits, commits/s,
rows/s, the slowest single append (per-batch) or commit (staged), and CPU s of the writers and of
this process (the committer) beside the wall; the 1-minute load average at each sample.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import selectors
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from s3_bench import BUCKET, Server  # noqa: E402

from gfcr.store import RolloutStore  # noqa: E402
from gfcr.store.staging import Staged  # noqa: E402

WRITER = r"""
import json, resource, sys, time
sys.path.insert(0, sys.argv[7])
from store_bench import synth_table
from gfcr.store import RolloutStore
uri, mode, k, batches, rows, tokens = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
store = RolloutStore.open(uri, auto_compact=0)
tables = [synth_table(rows, tokens, batches, start=b * rows, total=batches * rows, seed=1000 * k + 1) for b in range(batches)]
print("ready", flush=True)
sys.stdin.readline()
ru = resource.getrusage(resource.RUSAGE_SELF)
cpu0, worst = ru.ru_utime + ru.ru_stime, 0.0
for t in tables:
    t0 = time.perf_counter()
    if mode == "per-batch":
        store.append(t, check_existing=False)
    else:
        print(store.stage(t, check_existing=False).to_json(), flush=True)
    worst = max(worst, time.perf_counter() - t0)
ru = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"done": True, "cpu": ru.ru_utime + ru.ru_stime - cpu0, "worst": worst}), flush=True)
"""


def one(mode: str, writers: int, batches: int, rows: int, tokens: int) -> dict:
    """One sample of one arm into a new store; see the module."""
    uri = f"s3://{BUCKET}/w-{mode}-{uuid.uuid4().hex[:8]}"
    store = RolloutStore.open(uri, create=True, auto_compact=0)
    v0 = store.version
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, uri, mode, str(k), str(batches), str(rows), str(tokens),
                               str(HERE)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
             for k in range(writers)]
    for p in procs:
        assert p.stdout.readline().strip() == "ready"
    load = os.getloadavg()[0]
    c0 = time.process_time()
    t0 = time.perf_counter()
    for p in procs:
        p.stdin.write("go\n")
        p.stdin.flush()
    sel = selectors.DefaultSelector()
    for p in procs:
        sel.register(p.stdout, selectors.EVENT_READ, p)
    stats, commits, worst = [], 0, 0.0
    open_ = len(procs)
    while open_:
        pending: list[Staged] = []
        for key, _ in sel.select():  # everything that has arrived (at least one line)
            line = key.fileobj.readline()
            if not line:
                sel.unregister(key.fileobj)
                open_ -= 1
            elif line.startswith("{\"done\""):
                stats.append(json.loads(line))
            else:
                pending.append(Staged.from_json(line))
        if pending:
            c = time.perf_counter()
            store.commit_staged(pending, check_existing=False)
            worst = max(worst, time.perf_counter() - c)
            commits += 1
    wall = time.perf_counter() - t0
    committer_cpu = time.process_time() - c0
    for p in procs:
        assert p.wait() == 0
    n = writers * batches * rows
    assert store.count() == n, (store.count(), n)
    if mode == "per-batch":
        commits, worst = store.version - v0, max(s["worst"] for s in stats)
    return {"wall_s": wall, "commits": commits, "commits_per_s": commits / wall, "rows_per_s": n / wall,
            "slowest_commit_s": worst, "writers_cpu_s": sum(s["cpu"] for s in stats), "committer_cpu_s": committer_cpu,
            "load": load}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--writers", type=int, default=4)
    ap.add_argument("--batches", type=int, default=12, help="batches per writer")
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    arms = ["per-batch", "staged"]
    samples: dict[str, list[dict]] = {m: [] for m in arms}
    with tempfile.TemporaryDirectory() as td:
        srv = Server(Path(td) / "requests.log")
        try:
            for r in range(a.rounds):
                for k in range(len(arms)):
                    m = arms[(r + k) % len(arms)]
                    samples[m].append(one(m, a.writers, a.batches, a.rows, a.tokens))
                    print(m, json.dumps({k: round(v, 3) for k, v in samples[m][-1].items()}), file=sys.stderr)
        finally:
            srv.stop()
    out: dict = {"writers": a.writers, "batches_per_writer": a.batches, "rows": a.rows, "tokens": a.tokens,
                 "rounds": a.rounds, "cpus": os.cpu_count(), "rusage_children_s": round(
                     resource.getrusage(resource.RUSAGE_CHILDREN).ru_utime, 1)}
    for m, xs in samples.items():
        out[m] = {k: round(statistics.median(x[k] for x in xs), 3) for k in xs[0]}
        out[m]["load_max"] = round(max(x["load"] for x in xs), 2)
    out["staged / per-batch rows/s"] = round(out["staged"]["rows_per_s"] / out["per-batch"]["rows_per_s"], 2)
    print(json.dumps(out, indent=2))
    if a.out:
        a.out.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
