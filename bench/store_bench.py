"""Store benchmark: the rollout store against a verl-style JSONL dump and a raw Lance write,
side by side in the same run, on the same synthetic rollouts.

    python bench/store_bench.py                 # 100k rollouts x 512 tokens (needs ~6 GB RAM, minutes)
    python bench/store_bench.py --n 10000       # quicker

Measured:
- append: store.append of Arrow batches (schema check + duplicate-id check + commit) vs the same
  batches written to JSONL (the way verl's rollout_data_dir dumps, plus token ids and logprobs so
  the content is the same) vs a raw ``lance.write_dataset`` of the same Arrow batches;
- also the full path from Rollout objects (records → Arrow → append);
- a step-window query: store.scan(steps=...) vs reading the JSONL and keeping matching lines;
- 1k random rows: store.sample vs the JSONL (which must be read whole).
Goals (issue 2): append >= 2x faster than JSONL and within 1.5x of raw Lance; window query >= 50x
faster than the JSONL scan; random 1k sample <= 50 ms.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

import lance
import numpy as np
import pyarrow as pa

from gfcr.records import ROLLOUT_SCHEMA, Message, Rollout, rollouts_to_table
from gfcr.store import RolloutStore


def synth(n: int, tokens: int, steps: int, seed: int = 0) -> list[Rollout]:
    rng = np.random.default_rng(seed)
    n_ctx = tokens // 4
    role = np.array([0] * n_ctx + [1] * (tokens - n_ctx), np.int8)
    out = []
    for i in range(n):
        lp = np.where(role == 1, -rng.exponential(1.0, tokens), 0.0).astype(np.float32)
        out.append(Rollout(
            run_id="bench", step=i * steps // n, prompt_id=f"p{i // 8}", sample_index=i % 8, task="arith",
            token_ids=rng.integers(0, 49152, tokens, dtype=np.int32), token_role=role, logprobs=lp,
            messages=[Message("user", f"What is {i} + 1?"), Message("assistant", f"{i} + 1 = {i + 1}. Answer: {i + 1}")],
            reward=float(i % 2), verified=bool(i % 2), policy_version=f"v{i * steps // n}",
            signals={"entropy": 0.5}, sampling={"temperature": 0.7},
        ))
    return out


def jsonl_line(t: pa.Table, i: int, cols: dict[str, list]) -> str:
    return json.dumps({
        "input": cols["messages"][i][0]["content"], "output": cols["messages"][i][1]["content"],
        "gts": None, "score": cols["reward"][i], "step": cols["step"][i], "request_id": cols["rollout_id"][i],
        "token_ids": cols["token_ids"][i], "token_role": cols["token_role"][i], "logprobs": cols["logprobs"][i],
    })


def timed(fn, repeat: int = 1) -> tuple[float, object]:
    best, res = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        res = fn()
        best = min(best, time.perf_counter() - t0)
    return best, res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--batch", type=int, default=5000, help="rollouts per commit (one training step's worth)")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--dir", type=str, default=None)
    a = ap.parse_args()
    root = Path(a.dir) if a.dir else Path(tempfile.mkdtemp(prefix="gfcr-bench-"))
    root.mkdir(parents=True, exist_ok=True)
    print(f"synthesising {a.n} rollouts x {a.tokens} tokens ...", flush=True)
    rs = synth(a.n, a.tokens, a.steps)
    batches_r = [rs[i : i + a.batch] for i in range(0, a.n, a.batch)]

    t_conv, tables = timed(lambda: [rollouts_to_table(b) for b in batches_r])
    res: dict[str, float] = {"records->arrow (s)": t_conv}

    # 1. gfcr store append (Arrow batches)
    store = RolloutStore.open(root / "store", create=True)
    res["store append (s)"], _ = timed(lambda: [store.append(t) for t in tables])
    # 2. raw Lance write of the same batches
    raw_uri = str(root / "raw.lance")
    lance.write_dataset(pa.Table.from_batches([], schema=ROLLOUT_SCHEMA), raw_uri, mode="create")
    res["raw lance append (s)"], _ = timed(lambda: [lance.write_dataset(t, raw_uri, mode="append") for t in tables])
    # 3. JSONL dump of the same content
    jpath = root / "dump.jsonl"

    def write_jsonl() -> None:
        with open(jpath, "w") as f:
            for t in tables:
                cols = {c: t.column(c).to_pylist() for c in
                        ("messages", "reward", "step", "rollout_id", "token_ids", "token_role", "logprobs")}
                for i in range(t.num_rows):
                    f.write(jsonl_line(t, i, cols) + "\n")

    res["jsonl dump (s)"], _ = timed(write_jsonl)
    # 4. the full path from Rollout objects into a second store
    store2 = RolloutStore.open(root / "store2", create=True)
    res["store append from records (s)"], _ = timed(lambda: [store2.append(b) for b in batches_r])

    # window query: 5 steps in the middle
    lo = a.steps // 2
    hi = lo + 4
    res["store window query (s)"], wq = timed(lambda: store.scan(steps=(lo, hi)), repeat=3)

    def jsonl_window() -> int:
        n = 0
        with open(jpath) as f:
            for line in f:
                if lo <= json.loads(line)["step"] <= hi:
                    n += 1
        return n

    res["jsonl window scan (s)"], jn = timed(jsonl_window)
    assert jn == wq.num_rows, (jn, wq.num_rows)
    res["store sample 1k (s)"], smp = timed(lambda: store.sample(1000, seed=1), repeat=5)
    assert smp.num_rows == min(1000, a.n)

    def jsonl_sample() -> int:
        lines = jpath.read_text().splitlines()
        idx = np.random.default_rng(1).choice(len(lines), size=min(1000, len(lines)), replace=False)
        return len([json.loads(lines[i]) for i in idx])

    res["jsonl sample 1k (s)"], _ = timed(jsonl_sample)
    sizes = {
        "store size (MB)": sum(p.stat().st_size for p in (root / "store").rglob("*") if p.is_file()) / 1e6,
        "jsonl size (MB)": jpath.stat().st_size / 1e6,
    }

    print(f"\n{a.n} rollouts x {a.tokens} tokens, {len(tables)} commits of {a.batch}\n")
    for k, v in {**res, **sizes}.items():
        print(f"  {k:34s} {v:10.3f}")
    ratios = {
        "append speed-up vs JSONL (goal >= 2)": res["jsonl dump (s)"] / res["store append (s)"],
        "append time / raw Lance (goal <= 1.5)": res["store append (s)"] / res["raw lance append (s)"],
        "append from records speed-up vs JSONL": res["jsonl dump (s)"] / res["store append from records (s)"],
        "window query speed-up (goal >= 50)": res["jsonl window scan (s)"] / res["store window query (s)"],
        "sample 1k speed-up vs JSONL": res["jsonl sample 1k (s)"] / res["store sample 1k (s)"],
    }
    print()
    for k, v in ratios.items():
        print(f"  {k:42s} {v:8.2f}x")
    print(f"  {'sample 1k latency (goal <= 50 ms)':42s} {res['store sample 1k (s)'] * 1000:8.1f} ms")
    if not a.dir:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
