"""The store on local disk and on a loopback S3 server, beside raw Lance on the same backend.

    python bench/s3_bench.py                     # append 64x256 (15 rounds), 5,000x512 (4), reads (8)
    python bench/s3_bench.py --small-rounds 30 --out s3.json
    python bench/s3_bench.py --no-appends --rows-read 1000000 --read-tokens 16 --read-batch 10000 --read-rounds 4
    python bench/s3_bench.py --no-appends --rows-read 100000 --read-tokens 512 --read-rounds 4

The S3 server is moto's (:class:`gfcr.testing.S3Server`, the S3 HTTP API) in a child process on
127.0.0.1, logging every request with the bytes it answered; requests and bytes are counted from its
log between marks. It is one Python process on this machine's cores: request and byte counts carry
over to real S3, absolute times do not (real S3 has tens of ms first-byte latency per request and
serves requests in parallel).

Arms, per operation, alternated every round (the order rotates so machine load hits all alike):

- ``gfcr-local`` / ``lance-local``: ``RolloutStore.append`` / ``lance.write_dataset(mode="append")``
  of the same table (the synthetic rollouts of ``bench/store_bench.py``) into a local store / dataset;
- ``gfcr-s3`` / ``lance-s3``: the same on the S3 server;
- for reads, on a table of ``--rows-read`` rows × ``--read-tokens`` tokens in ``--read-batch``-row
  commits: ``RolloutStore.sample(1000)`` and ``get`` of 1,000 ids beside Lance's own ``take`` of 1,000
  sorted random offsets and a full scan of one column (``reward``), cold (a new process: Lance's session
  caches empty) and warm; on S3 also ``sample`` with every file read by ranges (``request_bytes=1``:
  what the store did for large rows before the per-file plan of ``gfcr.store.readcache``; other read
  blocks with ``--block-sizes``), ``sample(where="step >= 9")`` (the last tenth of the steps), and a
  read cache's sequence: a fresh process and an empty cache, samples 1-5 (new seeds) and a get.

Per arm: median wall and CPU seconds of the client (the server's CPU is in its own process), and on
S3 the median requests and MB answered per operation; the 1-minute load average at each sample.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import lance  # noqa: E402
import numpy as np  # noqa: E402
from store_bench import synth_table  # noqa: E402

from gfcr.store import RolloutStore  # noqa: E402
from gfcr.store import core as store_core  # noqa: E402
from gfcr.store.readcache import ReadCache  # noqa: E402

BUCKET = "gfcr-bench"
SERVER = r"""
import sys, time
from gfcr.testing import S3Server
S3Server(int(sys.argv[1]), sys.argv[3], log_file=sys.argv[2])
print("ready", flush=True)
time.sleep(1e6)
"""


class Server:
    """moto's S3 server in a child process (:class:`gfcr.testing.S3Server`: one log line per request,
    ``METHOD path response-bytes``); :meth:`requests` counts the requests and bytes it has logged."""

    def __init__(self, log: Path):
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.log = log
        log.touch()
        self.proc = subprocess.Popen([sys.executable, "-c", SERVER, str(self.port), str(log), BUCKET],
                                     stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
        assert self.proc.stdout.readline().strip() == "ready"
        os.environ.update(AWS_ENDPOINT_URL=f"http://127.0.0.1:{self.port}", AWS_ACCESS_KEY_ID="x",
                          AWS_SECRET_ACCESS_KEY="x", AWS_REGION="us-east-1", AWS_ALLOW_HTTP="true")

    def requests(self) -> tuple[int, int]:
        """(requests, response bytes) logged so far."""
        n = b = 0
        with open(self.log) as f:
            for line in f:
                n, b = n + 1, b + int(line.split()[-1])
        return n, b

    def stop(self) -> None:
        self.proc.kill()


def timed(fn, server: Server | None) -> tuple[float, float, int | None, int | None]:
    """Wall and CPU seconds of ``fn()``, and on S3 the requests and bytes the server answered meanwhile."""
    r0, b0 = server.requests() if server else (0, 0)
    t0, c0 = time.perf_counter(), time.process_time()
    fn()
    w, c = time.perf_counter() - t0, time.process_time() - c0
    if not server:
        return w, c, None, None
    time.sleep(0.05)  # the server logs after it answers
    r1, b1 = server.requests()
    return w, c, r1 - r0, b1 - b0


def run_rounds(arms: dict, rounds: int, load: list[float]) -> dict[str, dict[str, float]]:
    """``arms``: name -> (callable taking the round, server or None). Alternated, order rotating."""
    res: dict[str, list[tuple[float, float, int | None, int | None]]] = {k: [] for k in arms}
    names = list(arms)
    for r in range(rounds):
        load.append(os.getloadavg()[0])
        for k in range(len(names)):
            name = names[(r + k) % len(names)]
            fn, srv = arms[name]
            res[name].append(timed(lambda fn=fn, r=r: fn(r), srv))
    out = {}
    for k, xs in res.items():
        out[k] = {"wall_ms": round(1e3 * statistics.median(x[0] for x in xs), 1),
                  "cpu_ms": round(1e3 * statistics.median(x[1] for x in xs), 1)}
        if xs[0][2] is not None:
            out[k]["requests"] = statistics.median(x[2] for x in xs)
            out[k]["MB"] = round(statistics.median(x[3] for x in xs) / 1e6, 1)
    return out


def append_arms(rows: int, tokens: int, rounds: int, d: Path, srv: Server) -> dict:
    """gfcr vs raw Lance appends of ``rows`` x ``tokens``, local and S3 (each into its own new table)."""
    total = rows * (rounds + 2)
    tables = [synth_table(rows, tokens, rounds + 2, start=b * rows, total=total, seed=rows) for b in range(rounds + 1)]
    s3 = f"s3://{BUCKET}/a{rows}-{uuid.uuid4().hex[:6]}"
    stores = {"gfcr-local": RolloutStore.open(d / f"a{rows}", create=True), "gfcr-s3": RolloutStore.open(s3, create=True)}
    raws = {"lance-local": str(d / f"raw{rows}.lance"), "lance-s3": f"{s3}-raw/rollouts.lance"}
    for st in stores.values():
        st.append(tables[0])  # (the first append of a process reads the store's ids once)
    for u in raws.values():
        lance.write_dataset(tables[0], u, schema=tables[0].schema)
    arms = {name: ((lambda r, st=st: st.append(tables[r + 1])), srv if "s3" in name else None)
            for name, st in stores.items()}
    arms |= {name: ((lambda r, u=u: lance.write_dataset(tables[r + 1], u, mode="append")), srv if "s3" in name else None)
             for name, u in raws.items()}
    return arms


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small-rounds", type=int, default=15)
    ap.add_argument("--large-rounds", type=int, default=4)
    ap.add_argument("--read-rounds", type=int, default=8)
    ap.add_argument("--rows-read", type=int, default=20_000, help="rows of the table sample(1000) reads")
    ap.add_argument("--read-tokens", type=int, default=256, help="tokens per row of the read table")
    ap.add_argument("--read-batch", type=int, default=5000, help="rows per commit (fragment) of the read table")
    ap.add_argument("--no-appends", dest="appends", action="store_false", help="skip the append arms")
    ap.add_argument("--block-sizes", default="", help="other read block sizes tried for sample by ranges on S3 (e.g. 65536)")
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    load: list[float] = []
    out: dict = {"cpus": os.cpu_count(), "lance": lance.__version__}
    with tempfile.TemporaryDirectory() as td:
        d = Path(td)
        srv = Server(d / "requests.log")
        try:
            if a.appends:
                out["append 64x256"] = run_rounds(append_arms(64, 256, a.small_rounds, d, srv), a.small_rounds, load)
                out["append 5000x512"] = run_rounds(append_arms(5000, 512, a.large_rounds, d, srv), a.large_rounds, load)
            # reads: one table of --rows-read rows in --read-batch-row commits, local and S3
            s3 = f"s3://{BUCKET}/read-{uuid.uuid4().hex[:6]}"
            stores = {"local": RolloutStore.open(d / "read", create=True), "s3": RolloutStore.open(s3, create=True)}
            for b in range(0, a.rows_read, a.read_batch):
                t = synth_table(min(a.read_batch, a.rows_read - b), a.read_tokens, 10, start=b, total=a.rows_read)
                for st in stores.values():
                    st.append(t)
            ds = stores["s3"].dataset("rollouts")
            sizes = [f.metadata.files[0].file_size_bytes for f in ds.get_fragments()]
            out["read table"] = {"rows": a.rows_read, "tokens": a.read_tokens, "files": len(sizes),
                                 "MB": round(sum(sizes) / 1e6, 1)}
            rng = np.random.default_rng(0)
            ids = stores["local"].scan(columns=["rollout_id"]).column("rollout_id").to_numpy(zero_copy_only=False)
            arms = {}

            def cold(fn):  # a reader process's first read: Lance's session (its caches) starts empty
                def go(r):
                    store_core._SESSION.clear()
                    return fn(r)
                return go

            def with_block(fn, bs):
                def go(r):
                    keep = store_core.REMOTE_BLOCK_SIZE
                    store_core.REMOTE_BLOCK_SIZE = bs
                    try:
                        return fn(r)
                    finally:
                        store_core.REMOTE_BLOCK_SIZE = keep
                return go

            def pick(r):
                return ids[np.random.default_rng(100 + r).choice(len(ids), 1000, replace=False)].tolist()

            for where, st in stores.items():
                s = srv if where == "s3" else None
                uri = st.dataset("rollouts").uri
                arms[f"gfcr sample(1000) {where}, cold"] = (cold(lambda r, st=st: st.sample(1000, seed=r)), s)
                arms[f"gfcr sample(1000) {where}, warm"] = (lambda r, st=st: st.sample(1000, seed=r), s)
                arms[f"gfcr get(1000 ids) {where}, cold"] = (cold(lambda r, st=st: st.get(pick(r))), s)
                arms[f"lance take(1000) {where}, cold"] = (lambda r, uri=uri: lance.dataset(uri).take(
                    np.sort(rng.choice(a.rows_read, 1000, replace=False)).tolist()), s)
                arms[f"lance scan(reward) {where}, cold"] = (
                    lambda r, uri=uri: lance.dataset(uri).to_table(columns=["reward"]), s)
            ranges = RolloutStore.open(s3, request_bytes=1)  # every file by its rows' ranges (1 MiB block)
            arms["gfcr sample(1000) s3, cold, ranges only"] = (cold(lambda r: ranges.sample(1000, seed=r)), srv)
            for bs in [int(x) for x in a.block_sizes.split(",") if x]:
                arms[f"gfcr sample(1000) s3, cold, ranges only, block {bs >> 10} KiB"] = (
                    cold(with_block(lambda r: ranges.sample(1000, seed=r), bs)), srv)
            recent = "step >= 9"  # the last tenth of the steps
            arms["gfcr sample(1000, where=step >= 9) s3, cold"] = (
                cold(lambda r: stores["s3"].sample(1000, where=recent, seed=r)), srv)
            arms["gfcr sample(1000, where=step >= 9) s3, cold, ranges only"] = (
                cold(lambda r: ranges.sample(1000, where=recent, seed=r)), srv)
            seq: dict[str, list] = {}

            def cache_sequence(r):  # a fresh process and an empty read cache: samples 1..3, then get
                store_core._SESSION.clear()
                c = ReadCache(d / f"cache-{r}", 1 << 40)
                st = RolloutStore.open(s3, read_cache=c)
                calls = [(f"sample {j + 1}", lambda j=j: st.sample(1000, seed=1000 * r + j)) for j in range(5)]
                for name, fn in calls + [("get(1000 ids)", lambda: st.get(pick(r)))]:
                    seq.setdefault(name, []).append(timed(fn, srv))
                seq.setdefault("cache MB", []).append(sum(f.stat().st_size for f in c.root.rglob("*") if f.is_file()))
                shutil.rmtree(c.root)

            arms["gfcr s3, read cache (empty at start): samples 1-5 and a get"] = (cache_sequence, None)
            out[f"reads, {a.rows_read} rows"] = run_rounds(arms, a.read_rounds, load)
            mb = seq.pop("cache MB")
            out["read cache sequence"] = {k: {"wall_ms": round(1e3 * statistics.median(x[0] for x in xs), 1),
                                              "cpu_ms": round(1e3 * statistics.median(x[1] for x in xs), 1),
                                              "requests": statistics.median(x[2] for x in xs),
                                              "MB": round(statistics.median(x[3] for x in xs) / 1e6, 1)}
                                          for k, xs in seq.items()}
            out["read cache sequence"]["cache MB after"] = round(statistics.median(mb) / 1e6, 1)
        finally:
            srv.stop()
    out["load_median"], out["load_max"] = statistics.median(load), max(load)
    print(json.dumps(out, indent=2))
    if a.out:
        a.out.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
