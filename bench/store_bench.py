"""Store benchmark: the rollout store against a raw Lance write and a verl-style JSONL dump of the
same synthetic rollouts, arms alternated batch by batch in one run.

    python bench/store_bench.py                       # 100k rollouts x 512 tokens, + 1M narrow rows for reads
    python bench/store_bench.py --n 20000 --read-rows 0 --no-jsonl   # quicker
    python bench/store_bench.py --n 5000 --read-rows 1000000 --read-tokens 512 --no-narrow-compact --no-jsonl  # 1M wide rows

Measured (wall and CPU seconds of this process, Lance's threads included):
- append: ``store.append`` of Arrow batches (schema check + duplicate-id check + commit + automatic
  compaction) vs the same batches written with a raw ``lance.write_dataset`` vs the same content
  dumped as JSONL lines (the way verl's rollout_data_dir dumps, plus token ids and log-probs). The
  three arms take turns on every batch, the order rotating, so machine load hits them alike;
- a step-window query: ``store.scan(steps=...)`` vs reading the JSONL and keeping matching lines;
- 1,000 random rows, all columns: ``store.sample`` and ``store.get`` (1,000 random ids), each beside
  raw Lance takes of the same rows (the floor: what the store adds is the difference), arms in
  turns, a fresh random sample every repeat (medians over fresh samples, never the best of
  repeats), at ``--n`` rows and at ``--read-rows`` narrow rows (written in commits of 10,000), each
  as written and after ``store.compact()`` (which also builds the ``rollout_id`` index).
The machine load (``os.getloadavg``) is recorded around every measurement.
Goals: append >= 2x faster than JSONL and <= 1.5x the raw Lance write; window query >= 50x faster
than the JSONL scan; 1,000 random rows <= 50 ms (median) at 100k and at 1M rows.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
import uuid
from pathlib import Path

import lance
import numpy as np
import pyarrow as pa

from gfcr.records import COST_TYPE, MESSAGE_TYPE, ROLLOUT_SCHEMA, utcnow
from gfcr.store import RolloutStore
from gfcr.store.reads import READ_BLOCK_SIZE, READ_PARAMS


def synth_table(n: int, tokens: int, steps: int, start: int = 0, total: int | None = None, seed: int = 0) -> pa.Table:
    """``n`` synthetic rollouts (rows ``start .. start + n`` of ``total``) built column-wise."""
    total = total or n
    rng = np.random.default_rng(seed * 1_000_003 + start)
    idx = np.arange(start, start + n)
    n_ctx = tokens // 4
    role = np.tile(np.array([0] * n_ctx + [1] * (tokens - n_ctx), np.int8), n)
    lp = np.where(role == 1, -rng.exponential(1.0, n * tokens), 0.0).astype(np.float32)
    offs = pa.array(np.arange(0, n * tokens + 1, tokens, dtype=np.int32))
    step = (idx * steps // total).astype(np.int64)
    msgs = [[{"role": "user", "content": f"What is {i} + 1?", "tool_calls": None, "name": None},
             {"role": "assistant", "content": f"{i} + 1 = {i + 1}. Answer: {i + 1}", "tool_calls": None, "name": None}]
            for i in idx]
    cols = {
        "rollout_id": pa.array([uuid.UUID(int=int(x)).hex for x in rng.integers(0, 2**62, n)]),
        "run_id": pa.array(["bench"] * n), "step": pa.array(step), "policy_version": pa.array([f"v{s}" for s in step]),
        "prompt_id": pa.array([f"p{i // 8}" for i in idx]),
        "group_id": pa.array([f"p{i // 8}@bench:{s}" for i, s in zip(idx, step, strict=True)]),
        "sample_index": pa.array((idx % 8).astype(np.int64)), "parent_id": pa.nulls(n, pa.string()),
        "branch_pos": pa.nulls(n, pa.int64()), "task": pa.array(["arith"] * n),
        "messages": pa.array(msgs, pa.list_(MESSAGE_TYPE)),
        "token_ids": pa.ListArray.from_arrays(offs, pa.array(rng.integers(0, 49152, n * tokens, dtype=np.int32))),
        "token_role": pa.ListArray.from_arrays(offs, pa.array(role)),
        "logprobs": pa.ListArray.from_arrays(offs, pa.array(lp)), "finish_reason": pa.array(["stop"] * n),
        "reward": pa.array((idx % 2).astype(np.float64)), "verified": pa.array((idx % 2).astype(bool)),
        "verifier": pa.array(["{}"] * n), "signals": pa.array([[("entropy", 0.5)]] * n, pa.map_(pa.string(), pa.float64())),
        "sampling": pa.array(['{"temperature": 0.7}'] * n),
        "cost": pa.array([{"prompt_tokens": n_ctx, "gen_tokens": tokens - n_ctx, "latency_s": 0.0}] * n, COST_TYPE),
        "tokens_source": pa.array(["engine"] * n),
        "created_at": pa.array([utcnow()] * n, ROLLOUT_SCHEMA.field("created_at").type), "meta": pa.array(["{}"] * n),
    }
    return pa.Table.from_pydict(cols).cast(ROLLOUT_SCHEMA)


class Clock:
    """Wall and CPU seconds of one call, plus the 1-minute load average when it started."""

    def __init__(self) -> None:
        self.wall: list[float] = []
        self.cpu: list[float] = []
        self.load: list[float] = []

    def __call__(self, fn, *args):
        self.load.append(os.getloadavg()[0])
        t0, c0 = time.perf_counter(), time.process_time()
        out = fn(*args)
        self.wall.append(time.perf_counter() - t0)
        self.cpu.append(time.process_time() - c0)
        return out

    def summary(self, scale: float = 1.0) -> dict[str, float]:
        return {"n": len(self.wall), "wall_total": sum(self.wall) * scale, "cpu_total": sum(self.cpu) * scale,
                "wall_median": statistics.median(self.wall) * scale, "cpu_median": statistics.median(self.cpu) * scale,
                "load_median": statistics.median(self.load)}


def jsonl_lines(t: pa.Table) -> str:
    cols = {c: t.column(c).to_pylist() for c in ("messages", "reward", "step", "rollout_id", "token_ids", "token_role", "logprobs")}
    return "".join(json.dumps({
        "input": cols["messages"][i][0]["content"], "output": cols["messages"][i][1]["content"], "gts": None,
        "score": cols["reward"][i], "step": cols["step"][i], "request_id": cols["rollout_id"][i],
        "token_ids": cols["token_ids"][i], "token_role": cols["token_role"][i], "logprobs": cols["logprobs"][i],
    }) + "\n" for i in range(t.num_rows))


def bench_append(a, root: Path) -> tuple[dict, RolloutStore, Path]:
    store = RolloutStore.open(root / "store", create=True)
    raw_uri = str(root / "raw.lance")
    lance.write_dataset(pa.Table.from_batches([], schema=ROLLOUT_SCHEMA), raw_uri, mode="create")
    jpath = root / "dump.jsonl"
    jf = open(jpath, "w") if a.jsonl else None
    arms = {"store": Clock(), "raw": Clock(), "jsonl": Clock()}
    run = {
        "store": lambda t: store.append(t),
        "raw": lambda t: lance.write_dataset(t, raw_uri, mode="append"),
        "jsonl": lambda t: (jf.write(jsonl_lines(t)), jf.flush()),
    }
    names = ["store", "raw"] + (["jsonl"] if a.jsonl else [])
    for b, start in enumerate(range(0, a.n, a.batch)):
        t = synth_table(min(a.batch, a.n - start), a.tokens, a.steps, start=start, total=a.n)
        for k in range(len(names)):  # rotate the order every batch
            name = names[(b + k) % len(names)]
            arms[name](run[name], t)
    if jf:
        jf.close()
    out = {name: arms[name].summary() for name in names}
    ratios = [s / r for s, r in zip(arms["store"].wall, arms["raw"].wall, strict=True)]
    out["store/raw wall, total"] = out["store"]["wall_total"] / out["raw"]["wall_total"]
    out["store/raw cpu, total"] = out["store"]["cpu_total"] / out["raw"]["cpu_total"]
    out["store/raw wall, median of per-batch ratios"] = statistics.median(ratios)
    if a.jsonl:
        out["jsonl/store wall, total"] = out["jsonl"]["wall_total"] / out["store"]["wall_total"]
    out["store fragments"] = len(store.dataset("rollouts").get_fragments())
    out["store compactions"] = len(store.compactions)
    return out, store, jpath


#: what a trainer replaying rollouts reads (no messages, verifier, sampling, signals, cost or meta)
TRAIN_COLUMNS = ["rollout_id", "prompt_id", "group_id", "step", "policy_version", "reward", "token_ids", "token_role",
                 "logprobs"]


def bench_reads(store: RolloutStore, samples: int, total: int) -> dict:
    """1,000 random rows, all columns, through the store and through raw Lance with the same rows.

    Arms, in turns (the order rotating every repeat), each repeat on a fresh random sample:
    ``store.sample`` (opens the dataset, counts rows, draws offsets, takes), also with only the
    columns a trainer needs (``TRAIN_COLUMNS``); raw ``take`` of the same
    offsets on a dataset held open, with Lance's default read options and with the store's (the
    floor under ``store.sample``); ``store.get`` of 1,000 random ids (id look-up, then a take by row
    id); raw ``_take_rows`` of those rows' ids on a held-open dataset (the floor under ``get``).
    """
    uri = str(store.path / "rollouts.lance")
    raw = lance.dataset(uri)
    tuned = lance.dataset(uri, block_size=READ_BLOCK_SIZE, read_params=READ_PARAMS)
    idt = raw.to_table(columns=["rollout_id"], with_row_id=True)
    all_ids = np.asarray(idt.column("rollout_id").to_pylist(), dtype=object)
    all_rowids = idt.column("_rowid").to_numpy()
    n = min(1000, total)

    def offsets(seed: int) -> list[int]:  # as RolloutStore.sample draws them
        return np.sort(np.random.default_rng(seed).choice(total, size=n, replace=False)).tolist()

    arms = {
        "store.sample": lambda seed, pick: store.sample(1000, None, seed),
        "store.sample, training columns only": lambda seed, pick: store.sample(1000, None, seed, TRAIN_COLUMNS),
        "raw take, Lance defaults": lambda seed, pick: raw.take(offsets(seed)),
        "raw take, store's read options (floor)": lambda seed, pick: tuned.take(offsets(seed)),
        "store.get of 1,000 random ids": lambda seed, pick: store.get(all_ids[pick].tolist()),
        "raw _take_rows of those row ids (floor)": lambda seed, pick: tuned._take_rows(np.sort(all_rowids[pick]).tolist()),
    }
    clocks = {k: Clock() for k in arms}
    names = list(arms)
    for s in range(samples):
        seed = 10_000 + s
        pick = np.random.default_rng(20_000 + s).choice(total, size=n, replace=False)
        for k in range(len(names)):
            name = names[(s + k) % len(names)]
            t = clocks[name](arms[name], seed, pick)
            assert t.num_rows == n, (name, t.num_rows)
        if s == 0:  # same rows through the store and raw Lance
            assert store.sample(1000, None, seed).column("rollout_id").equals(tuned.take(offsets(seed), ["rollout_id"]).column(0))
    out = {k: c.summary(scale=1000.0) for k, c in clocks.items()}
    floor = out["raw take, store's read options (floor)"]
    out["store.sample minus floor, cpu ms (median)"] = out["store.sample"]["cpu_median"] - floor["cpu_median"]
    return out | {"unit": "ms", "fragments": len(store.dataset("rollouts").get_fragments()),
                  "rollout_id index": bool(store.dataset("rollouts").describe_indices())}


def bench_window(a, store: RolloutStore, jpath: Path) -> dict:
    lo = a.steps // 2
    hi = lo + 4
    sc, jc = Clock(), Clock()

    def jsonl_window() -> int:
        n = 0
        with open(jpath) as f:
            for line in f:
                n += lo <= json.loads(line)["step"] <= hi
        return n

    n_store = n_json = 0
    for r in range(3):  # alternate: store, jsonl, store, jsonl, ...
        n_store = sc(store.scan, None, (lo, hi)).num_rows
        if a.jsonl and r == 0:
            n_json = jc(jsonl_window)
    out = {"store": sc.summary()}
    if a.jsonl:
        assert n_json == n_store, (n_json, n_store)
        out["jsonl"] = jc.summary()
        out["speed-up (jsonl wall / store median wall)"] = out["jsonl"]["wall_median"] / out["store"]["wall_median"]
    return out


def build_narrow(root: Path, rows: int, tokens: int, batch: int) -> RolloutStore:
    store = RolloutStore.open(root / "narrow", create=True)
    for start in range(0, rows, batch):
        store.append(synth_table(min(batch, rows - start), tokens, 100, start=start, total=rows, seed=1))
    return store


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--batch", type=int, default=5000, help="rollouts per commit (one training step's worth)")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--samples", type=int, default=21, help="fresh 1,000-row samples per read measurement")
    ap.add_argument("--read-rows", type=int, default=1_000_000, help="rows of the narrow store for reads (0 = skip)")
    ap.add_argument("--read-tokens", type=int, default=16, help="tokens per row of the narrow store")
    ap.add_argument("--no-jsonl", dest="jsonl", action="store_false", help="skip the JSONL arm")
    ap.add_argument("--no-narrow-compact", dest="narrow_compact", action="store_false",
                    help="measure the --read-rows store only as written (compacting 1M wide rows takes long)")
    ap.add_argument("--dir", type=str, default=None)
    ap.add_argument("--out", type=str, default="bench/out/store.json")
    a = ap.parse_args()
    root = Path(a.dir) if a.dir else Path(tempfile.mkdtemp(prefix="gfcr-bench-"))
    root.mkdir(parents=True, exist_ok=True)
    res: dict = {"args": vars(a), "cpus": os.cpu_count(), "load_start": os.getloadavg()}
    try:
        print(f"append: {a.n} rollouts x {a.tokens} tokens in commits of {a.batch} ...", flush=True)
        res["append"], store, jpath = bench_append(a, root)
        print(json.dumps(res["append"], indent=1), flush=True)
        res["window"] = bench_window(a, store, jpath)
        print(json.dumps(res["window"], indent=1), flush=True)
        res["sample_1k"] = {f"{a.n} rows x {a.tokens} tokens": bench_reads(store, a.samples, a.n)}
        t0 = time.perf_counter()
        store.compact()
        res["compact_all_s"] = time.perf_counter() - t0
        res["sample_1k"][f"{a.n} rows x {a.tokens} tokens, after compact()"] = bench_reads(store, a.samples, a.n)
        if a.jsonl:
            jc = Clock()

            def jsonl_sample() -> int:
                lines = jpath.read_text().splitlines()
                idx = np.random.default_rng(1).choice(len(lines), size=min(1000, len(lines)), replace=False)
                return len([json.loads(lines[i]) for i in idx])

            jc(jsonl_sample)
            res["sample_1k"]["jsonl (one sample)"] = jc.summary(scale=1000.0) | {"unit": "ms"}
        print(json.dumps(res["sample_1k"], indent=1), flush=True)
        res["size_mb"] = {"store": sum(p.stat().st_size for p in (root / "store").rglob("*") if p.is_file()) / 1e6}
        if a.jsonl:
            res["size_mb"]["jsonl"] = jpath.stat().st_size / 1e6
        shutil.rmtree(root / "raw.lance", ignore_errors=True)
        if a.read_rows:
            print(f"reads: building {a.read_rows} rows x {a.read_tokens} tokens ...", flush=True)
            t0 = time.perf_counter()
            narrow = build_narrow(root, a.read_rows, a.read_tokens, 10_000)
            res["narrow_build_s"] = time.perf_counter() - t0
            res["sample_1k"][f"{a.read_rows} rows x {a.read_tokens} tokens"] = bench_reads(narrow, a.samples, a.read_rows)
            if a.narrow_compact:
                t0 = time.perf_counter()
                narrow.compact()
                res["narrow_compact_s"] = time.perf_counter() - t0
                res["sample_1k"][f"{a.read_rows} rows x {a.read_tokens} tokens, after compact()"] = bench_reads(
                    narrow, a.samples, a.read_rows)
            print(json.dumps(res["sample_1k"], indent=1), flush=True)
        res["load_end"] = os.getloadavg()
    finally:
        if not a.dir:
            shutil.rmtree(root, ignore_errors=True)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(res, indent=1))
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
