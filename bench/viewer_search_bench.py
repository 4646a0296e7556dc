"""Viewer search and sort benchmark (issue 45, part 2): ``GET /api/rollouts`` with ``q=`` (words in any
turn), with ``sort=reward``, and the plain first page, on a store of ``--n`` rows whose turns hold
realistic text (a ~60-word prompt and a ~90-word completion of arithmetic working).

    python bench/viewer_search_bench.py                 # 100k rows
    python bench/viewer_search_bench.py --n 1000000 --cache /tmp/vsearch

First, on a store without the text index, the search as a scan (``word_match`` over every row the
other filters keep); then ``RolloutStore.index_text`` (``gfcr store index``) builds the index, timed;
then the arms alternated in one run: a search for a rare word (~0.15% of rows), a search for a word in
(almost) every row (the worst case: every row is matched, then sorted), a sort, a plain page, and the
list's two histograms (``/api/histogram``, reward and generated tokens, over the rows of steps >= a
random step: at least half the store). Each sample is
fresh (another word, another offset), medians over ``--samples``; wall and process CPU seconds side by
side, the load average before and after. The app runs in process (FastAPI's test client), so the
numbers are the route's own work plus its JSON, without a socket. A cached store that already has the
index skips the first phase.

Goal (issue 45): search <= 100 ms at 1M rows.
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
    wall, cpu, st = timed(lambda: build(path, args.n, args.steps))
    print(f"store: {args.n} rows at {path} (built or opened in {wall:.1f} s wall, {cpu:.1f} s CPU)")
    from gfcr.store.textindex import text_index

    c = TestClient(create_app(st.path))
    c.get("/api/rollouts", params={"limit": 50})  # the per-step index, built once per store version
    rng = np.random.default_rng(1)

    def report(arms: dict) -> None:
        for name, xs in arms.items():
            print(f"{name:>28}: median {1000 * statistics.median(x[0] for x in xs):8.1f} ms wall, "
                  f"{1000 * statistics.median(x[1] for x in xs):8.1f} ms CPU over {len(xs)} fresh samples "
                  f"(rows matched: {sorted({x[2] for x in xs})[:3]}...; searched by {sorted({str(x[3]) for x in xs})})")

    def sample(name: str, params: dict, arms: dict, route: str = "/api/rollouts") -> None:
        w, cp, r = timed(lambda: c.get(route, params=params))
        assert r.status_code == 200, r.text
        d = r.json()
        arms[name].append((w, cp, d["total"] if "total" in d else d["n"], d.get("search", "-")))

    if text_index(st.dataset("rollouts")) is None:
        scan_arms: dict = {"search q=rareN (no index)": []}
        for _ in range(args.samples):
            sample("search q=rareN (no index)", {"q": f"rare{int(rng.integers(0, 7))}", "limit": 50}, scan_arms)
        print(f"load average {os.getloadavg()[0]:.2f}")
        report(scan_arms)
        wall, cpu, res = timed(st.index_text)
        print(f"text index {res['action']} over {res['rows_indexed']} rows in {wall:.1f} s wall, {cpu:.1f} s CPU "
              f"(load average {os.getloadavg()[0]:.2f})")
    else:
        print("the store has the text index already: the no-index arm is skipped (use a fresh --cache)")
    c.get("/api/rollouts", params={"q": "rare0", "limit": 50})  # the new version's per-step index and index open
    load0 = os.getloadavg()
    arms: dict = {"search q=rareN": [], "search common word (~all rows)": [], "sort=reward desc": [], "plain page": [],
                  "histogram reward (steps >= s)": [], "histogram gen (steps >= s)": []}
    for _ in range(args.samples):
        word = f"rare{int(rng.integers(0, 7))}"
        off = int(rng.integers(0, max(1, args.n - 50)))
        common = str(rng.choice(WORDS[:5]))
        for name, params in (("search q=rareN", {"q": word, "limit": 50}),
                             ("search common word (~all rows)", {"q": common, "limit": 50}),
                             ("sort=reward desc", {"sort": "reward", "order": "desc", "offset": off, "limit": 50}),
                             ("plain page", {"offset": off, "limit": 50})):
            sample(name, params, arms)
        s = int(rng.integers(0, args.steps // 2))  # another filter each time: the histograms are cached per filter
        for field in ("reward", "gen"):
            sample(f"histogram {field} (steps >= s)", {"field": field, "step_min": s}, arms, "/api/histogram")
    load1 = os.getloadavg()
    print(f"load average before {load0[0]:.2f} {load0[1]:.2f}, after {load1[0]:.2f} {load1[1]:.2f}; pyarrow {pa.__version__}")
    report(arms)
    if tmp is not None:
        tmp.cleanup()


if __name__ == "__main__":
    main()
