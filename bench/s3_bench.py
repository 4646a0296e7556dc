"""The store on local disk and on a loopback S3 server, beside raw Lance on the same backend.

    python bench/s3_bench.py                     # append 64x256 (15 rounds), 5,000x512 (4), sample(1000) (8)
    python bench/s3_bench.py --small-rounds 30 --out s3.json
    python bench/s3_bench.py --no-appends --rows-read 1000000 --read-tokens 16 --read-batch 10000 --read-rounds 4

The S3 server is moto's (``ThreadedMotoServer``, the S3 HTTP API) in a child process on 127.0.0.1,
logging every request; requests are counted from its log between marks. It is one Python process on
this machine's cores: request counts carry over to real S3, absolute times do not (real S3 has
~10-30 ms first-byte latency per request and serves them in parallel).

Arms, per operation, alternated every round (the order rotates so machine load hits all alike):

- ``gfcr-local`` / ``lance-local``: ``RolloutStore.append`` / ``lance.write_dataset(mode="append")``
  of the same table (the synthetic rollouts of ``bench/store_bench.py``) into a local store / dataset;
- ``gfcr-s3`` / ``lance-s3``: the same on the S3 server;
- for reads, on a table of ``--rows-read`` rows: ``RolloutStore.sample(1000)`` beside Lance's own
  ``take`` of 1,000 sorted random offsets and a full scan of one column (``reward``), cold (a new
  process: Lance's session caches empty) and warm; ``sample`` without the whole-file block
  (``gfcr.store.reads.whole_file_block``: ``REMOTE_BLOCK_SIZE`` only) and with other read block sizes
  (``--block-sizes``: reads closer than this are merged into one request). ``--rows-read 1000000
  --read-tokens 16 --read-batch 10000 --no-appends``: the 1M-row table as the store writes it from
  10,000-row commits (100 fragments).

Per arm: median wall and CPU seconds of the client (the server's CPU is in its own process), and on
S3 the median requests per operation; the 1-minute load average at each sample.
"""

from __future__ import annotations

import argparse
import json
import os
import re
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
from gfcr.store import reads as store_reads  # noqa: E402

BUCKET = "gfcr-bench"
#: one logged request (werkzeug colours some status lines: escape codes after the opening quote)
_REQUEST = re.compile(r'"(?:\x1b\[[0-9;]*m)*(?:GET|PUT|HEAD|POST|DELETE) ')
SERVER = r"""
import logging, sys, time, boto3
from moto.server import ThreadedMotoServer
logging.basicConfig(filename=sys.argv[2], level=logging.INFO, format="%(message)s")
srv = ThreadedMotoServer(ip_address="127.0.0.1", port=int(sys.argv[1]), verbose=False); srv.start()
boto3.client("s3", endpoint_url=f"http://127.0.0.1:{sys.argv[1]}", region_name="us-east-1", aws_access_key_id="x",
             aws_secret_access_key="x").create_bucket(Bucket=sys.argv[3])
print("ready", flush=True)
time.sleep(1e6)
"""


class Server:
    """moto's S3 server in a child process; :meth:`requests` counts the requests it has logged."""

    def __init__(self, log: Path):
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.log = log
        self.proc = subprocess.Popen([sys.executable, "-c", SERVER, str(self.port), str(log), BUCKET],
                                     stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout.readline().strip() == "ready"
        os.environ.update(AWS_ENDPOINT_URL=f"http://127.0.0.1:{self.port}", AWS_ACCESS_KEY_ID="x",
                          AWS_SECRET_ACCESS_KEY="x", AWS_REGION="us-east-1", AWS_ALLOW_HTTP="true")

    def requests(self) -> int:
        with open(self.log) as f:
            return sum(1 for line in f if _REQUEST.search(line))

    def stop(self) -> None:
        self.proc.kill()


def timed(fn, server: Server | None) -> tuple[float, float, int | None]:
    r0 = server.requests() if server else None
    t0, c0 = time.perf_counter(), time.process_time()
    fn()
    w, c = time.perf_counter() - t0, time.process_time() - c0
    if server:
        time.sleep(0.05)  # the server logs after it answers
    return w, c, (server.requests() - r0) if server else None


def run_rounds(arms: dict, rounds: int, load: list[float]) -> dict[str, dict[str, float]]:
    """``arms``: name -> (callable taking the round, server or None). Alternated, order rotating."""
    res: dict[str, list[tuple[float, float, int | None]]] = {k: [] for k in arms}
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
    ap.add_argument("--block-sizes", default="65536,4194304", help="other read block sizes tried for sample on S3")
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
            rng = np.random.default_rng(0)
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

            for where, st in stores.items():
                s = srv if where == "s3" else None
                uri = st.dataset("rollouts").uri
                arms[f"gfcr sample(1000) {where}, cold"] = (cold(lambda r, st=st: st.sample(1000, seed=r)), s)
                arms[f"gfcr sample(1000) {where}, warm"] = (lambda r, st=st: st.sample(1000, seed=r), s)
                arms[f"lance take(1000) {where}, cold"] = (lambda r, uri=uri: lance.dataset(uri).take(
                    np.sort(rng.choice(a.rows_read, 1000, replace=False)).tolist()), s)
                arms[f"lance scan(reward) {where}, cold"] = (
                    lambda r, uri=uri: lance.dataset(uri).to_table(columns=["reward"]), s)
            def whole_off(fn):  # sample with REMOTE_BLOCK_SIZE only (no whole-file block)
                def go(r):
                    keep = store_reads.WHOLE_FILE_PER_ROW
                    store_reads.WHOLE_FILE_PER_ROW = 0
                    try:
                        return fn(r)
                    finally:
                        store_reads.WHOLE_FILE_PER_ROW = keep
                return go

            arms["gfcr sample(1000) s3, cold, 1 MiB block only"] = (
                cold(whole_off(lambda r, st=stores["s3"]: st.sample(1000, seed=r))), srv)
            for bs in [int(x) for x in a.block_sizes.split(",") if x]:
                arms[f"gfcr sample(1000) s3, cold, block {bs >> 10} KiB"] = (
                    cold(whole_off(with_block(lambda r, st=stores["s3"]: st.sample(1000, seed=r), bs))), srv)
            out[f"reads, {a.rows_read} rows"] = run_rounds(arms, a.read_rounds, load)
        finally:
            srv.stop()
    out["load_median"], out["load_max"] = statistics.median(load), max(load)
    print(json.dumps(out, indent=2))
    if a.out:
        a.out.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
