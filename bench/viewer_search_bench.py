"""Viewer search and sort benchmark (issue 45, part 2): ``GET /api/rollouts`` with ``q=`` (text in any
turn), with ``sort=reward``, and the plain first page, on a store of ``--n`` rows whose turns hold
realistic text (a ~60-word prompt and a ~90-word completion of arithmetic working).

    python bench/viewer_search_bench.py                 # 100k rows
    python bench/viewer_search_bench.py --n 1000000 --cache /tmp/vsearch

The three arms are alternated in one run; each sample is fresh (a search for another word, a sort at
another offset, a plain page at another offset), medians over ``--samples``; wall and process CPU
seconds side by side, the load average before and after. The app runs in process (FastAPI's test
client), so the numbers are the route's own work plus its JSON, without a socket.

Goal (issue 45): search <= 100 ms at 1M rows. The search here has no index (a substring test over
the flattened turn texts of every row the other filters keep), so it is expected to miss the goal at
1M rows; this measures by how much.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from gfcr.records import Message, Rollout
from gfcr.store import RolloutStore

WORDS = ("carry", "digit", "total", "check", "answer", "first", "second", "column", "borrow", "place", "value",
         "ones", "tens", "hundreds", "result", "again", "verify", "count", "plus", "minus")


def make_rows(lo: int, hi: int, steps: int, rng: np.random.Generator) -> list[Rollout]:
    out = []
    for i in range(lo, hi):
        a, b = int(rng.integers(10, 999)), int(rng.integers(10, 999))
        words = " ".join(rng.choice(WORDS, 40))
        prompt = f"Compute {a} + {b}. Work it out step by step, then finish with a final line 'Answer: N'. {words}"
        tag = f" rare{i % 7}" if i % 97 == 0 else ""  # ~1% of rows hold one of 7 rare words
        completion = (f"We add {a} and {b}. " + " ".join(rng.choice(WORDS, 70)) + tag +
                      f". So {a} + {b} = {a + b}.\nAnswer: {a + b}")
        role = np.r_[np.zeros(8, np.uint8), np.ones(8, np.uint8)]
        out.append(Rollout(run_id="bench", prompt_id=f"p{i // 8}", group_id=f"g{i // 8}", step=min(i * steps // hi, steps - 1),
                           sample_index=i % 8, token_ids=np.arange(16, dtype=np.int32), token_role=role,
                           logprobs=np.zeros(16, np.float32), reward=float(rng.random()), verified=bool(rng.random() < 0.5),
                           messages=[Message("user", prompt), Message("assistant", completion)], rollout_id=f"r{i:08d}"))
    return out


def build(path: Path, n: int, steps: int, chunk: int = 50_000) -> RolloutStore:
    if (path / "gfcr-store.json").exists():
        st = RolloutStore.open(path)
        if st.count() == n:
            return st
        raise SystemExit(f"{path} holds {st.count()} rows, not {n}; remove it or pick another --cache")
    st = RolloutStore.open(path, create=True)
    rng = np.random.default_rng(0)
    for lo in range(0, n, chunk):
        st.append(make_rows(lo, min(lo + chunk, n), steps, rng))
    st.compact()
    return st


def timed(fn):  # noqa: ANN001, ANN201
    c0, t0 = time.process_time(), time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, time.process_time() - c0, out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--samples", type=int, default=7)
    ap.add_argument("--cache", type=Path, default=None, help="build the store here once and reuse it")
    args = ap.parse_args()
    from fastapi.testclient import TestClient

    from gfcr.diagnose.viewer import create_app

    tmp = None
    if args.cache is None:
        tmp = tempfile.TemporaryDirectory()
        path = Path(tmp.name) / "st"
    else:
        path = args.cache / f"n{args.n}"
    load0 = os.getloadavg()
    wall, cpu, st = timed(lambda: build(path, args.n, args.steps))
    print(f"store: {args.n} rows at {path} (built or opened in {wall:.1f} s wall, {cpu:.1f} s CPU)")
    c = TestClient(create_app(st.path))
    c.get("/api/rollouts", params={"limit": 50})  # the per-step index, built once per store version
    rng = np.random.default_rng(1)
    arms = {"search q=rareN": [], "sort=reward desc": [], "plain page": []}
    for _ in range(args.samples):
        word = f"rare{int(rng.integers(0, 7))}"
        off = int(rng.integers(0, max(1, args.n - 50)))
        for name, params in (("search q=rareN", {"q": word, "limit": 50}),
                             ("sort=reward desc", {"sort": "reward", "order": "desc", "offset": off, "limit": 50}),
                             ("plain page", {"offset": off, "limit": 50})):
            w, cp, r = timed(lambda params=params: c.get("/api/rollouts", params=params))
            assert r.status_code == 200, r.text
            arms[name].append((w, cp, r.json()["total"]))
    load1 = os.getloadavg()
    print(f"load average before {load0[0]:.2f} {load0[1]:.2f}, after {load1[0]:.2f} {load1[1]:.2f}; pyarrow {pa.__version__}")
    for name, xs in arms.items():
        print(f"{name:>18}: median {1000 * statistics.median(x[0] for x in xs):8.1f} ms wall, "
              f"{1000 * statistics.median(x[1] for x in xs):8.1f} ms CPU over {len(xs)} fresh samples "
              f"(rows matched: {sorted({x[2] for x in xs})[:3]}...)")
    if tmp is not None:
        tmp.cleanup()


if __name__ == "__main__":
    main()
