"""What it would cost to make a racing commit of stored ids fail before it is visible (issue 44).

Lance 14.0.3 detects a racing insert of one key only inside ``merge_insert`` on a table whose key is
declared (``lance-schema:unenforced-primary-key``); docs/store.md, "Staged writes", says why that does
not carry over to today's commits. This measures, per commit of ``--batches`` batches of ``--rows``
rows (``bench/store_bench.py``'s synthetic rollouts, ``--tokens`` tokens) into a store of ``--stored``
rows, arms alternated every round (order rotating), medians of wall and CPU ms, load recorded:

- ``commit_staged``: today's checked commit of staged batches (one Append of the staged files);
- ``mi_staged``: the staged files read back and committed by ``merge_insert`` insert-if-absent (the
  only commit Lance checks for racing keys: the rows are written a second time);
- ``append``: today's checked ``RolloutStore.append`` (one Append);
- ``mi_append``: the same rows by ``merge_insert`` insert-if-absent;
- ``claim_ids``: only the ids, ``merge_insert`` into a claims table of ``--stored`` ids (the extra
  commit a claims table would add before the data's Append).

    python bench/race_guard_bench.py                 # local store
    python bench/race_guard_bench.py --s3            # the loopback S3 server (bench/s3_bench.py)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import lance
import pyarrow as pa
from lance.file import LanceFileReader

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from store_bench import synth_table  # noqa: E402

from gfcr.store import RolloutStore  # noqa: E402
from gfcr.store.keys import PRIMARY_KEY  # noqa: E402


def run(root: str, stored: int, batches: int, rows: int, tokens: int, rounds: int) -> dict[str, list[tuple[float, float]]]:
    st = RolloutStore.open(f"{root}/store", auto_compact=0, create=True)
    for b in range(0, stored, 10000):
        st.append(synth_table(min(10000, stored - b), tokens, 10, start=b, total=stored, seed=1), check_existing=False)
    uri, opts = st._uri("rollouts"), st._opts
    ds = lance.dataset(uri, storage_options=opts)
    if not (ds.schema.field("rollout_id").metadata or {}).get(PRIMARY_KEY.encode()):
        ds.replace_field_metadata("rollout_id", {PRIMARY_KEY: "true"})  # a local store declares no key
    key = pa.schema([pa.field("rollout_id", pa.string(), nullable=False).with_metadata({PRIMARY_KEY: "true"})])
    claims = f"{root}/claims.lance"
    lance.write_dataset(pa.table([st.scan(columns=["rollout_id"]).column(0)], schema=key), claims, storage_options=opts)
    seed = [100]

    def fresh() -> list[pa.Table]:
        seed[0] += 1
        return [synth_table(rows, tokens, 10, start=i * rows, total=batches * rows, seed=seed[0]) for i in range(batches)]

    def mi(target: str, table: pa.Table) -> int:
        d = lance.dataset(target, storage_options=opts)
        return int(d.merge_insert("rollout_id").when_not_matched_insert_all().conflict_retries(0).execute(table)["num_inserted_rows"])

    def arm(name: str) -> tuple[float, float]:
        tabs = fresh()
        ss = [st.stage(t, check_existing=False) for t in tabs] if name.endswith("staged") else None
        t0, c0 = time.perf_counter(), time.process_time()
        if name == "commit_staged":
            n = st.commit_staged(ss)
        elif name == "mi_staged":
            back = [LanceFileReader(f"{uri}/data/{df.path}", storage_options=opts).read_all().to_table()
                    for s in ss for m in s.fragment_metadata() for df in m.data_files()]
            n = mi(uri, pa.concat_tables(back).cast(ds.schema))
        elif name == "append":
            n = st.append(pa.concat_tables(tabs))
        elif name == "mi_append":
            n = mi(uri, pa.concat_tables(tabs).cast(ds.schema))
        else:
            n = mi(claims, pa.table([pa.concat_tables(tabs).column("rollout_id")], schema=key))
        assert n == batches * rows, (name, n)
        return time.perf_counter() - t0, time.process_time() - c0

    names = ["commit_staged", "mi_staged", "append", "mi_append", "claim_ids"]
    arm("commit_staged")  # the id index read once, as in a long-lived writer
    arm("append")
    out: dict[str, list[tuple[float, float]]] = {k: [] for k in names}
    for r in range(rounds):
        for k in names[r % len(names):] + names[: r % len(names)]:
            out[k].append(arm(k))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--s3", action="store_true")
    ap.add_argument("--stored", type=int, default=20000)
    ap.add_argument("--batches", type=int, default=16)
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    loads = [open("/proc/loadavg").read().split()[0]]
    with tempfile.TemporaryDirectory() as tmp:
        server = None
        if a.s3:
            from s3_bench import BUCKET, Server

            server = Server(Path(tmp) / "s3.log")
            root = f"s3://{BUCKET}/race-{uuid.uuid4().hex[:8]}"
        else:
            root = tmp
        try:
            res = run(root, a.stored, a.batches, a.rows, a.tokens, a.rounds)
        finally:
            if server:
                server.stop()
    loads.append(open("/proc/loadavg").read().split()[0])
    where = "S3 (loopback)" if a.s3 else "local"
    print(f"{where}: {a.stored} rows stored, commits of {a.batches}x{a.rows} rows x {a.tokens} tokens; "
          f"medians of {a.rounds}; load {loads[0]} -> {loads[1]}")
    for k, v in res.items():
        print(f"  {k:14s} wall {statistics.median(x[0] for x in v) * 1000:7.1f} ms   cpu {statistics.median(x[1] for x in v) * 1000:7.1f} ms")


if __name__ == "__main__":
    main()
