"""Import benchmark: a verl ``rollout_data_dir`` dump into the store, the columnar path against
pyarrow's own JSON reader on the same files (the floor), the row path, and a re-import.

    python bench/import_bench.py                      # 100k rows (10 files of 10k, ~1.7 KB a row), 3 rounds
    python bench/import_bench.py --rows 20000 --rounds 2 --no-rows-arm   # quicker
    python bench/import_bench.py --no-rows-arm --base-src ../base/src  # against another checkout's code

Arms, each run in a fresh subprocess (so peak memory is its own: ``ru_maxrss`` minus the RSS after
imports), in turns every round with the order rotating, so machine load hits them alike:
- ``pyarrow``: ``pyarrow.json.read_json`` of every file (no mapping, no store): the issue's reference;
- ``pyarrow+lance``: the same read, each file's table (the dump's own columns) appended to a Lance
  dataset: the floor a columnar import cannot beat (read the file with pyarrow, write Lance);
- ``columnar``: ``import_rollouts(store, "verl", ...)`` into a new store (Arrow in, one append per file);
- ``rows``: the same with ``columnar=False`` (a Rollout object per line, the earlier path);
- ``reimport``: the columnar import of the same, unchanged dump into the store it already fills
  (every file skipped by size + mtime, unread);
- ``columnar@base`` (with ``--base-src PATH``): the ``columnar`` arm run with another checkout's
  ``src`` first on ``PYTHONPATH`` (e.g. a ``git worktree`` of the commit before), in the same turns: before/after in one run.
Reported per arm: medians over rounds of wall and CPU seconds (this process and its threads), rows/s,
MB/s, peak memory above baseline; the ratios of columnar to pyarrow and to pyarrow+lance; ``os.getloadavg()`` before and after
each sample. Every arm runs with pyarrow's thread pool at ``--threads`` (default: the machine's
cores), set in the arm itself: ``OMP_NUM_THREADS``, which pyarrow also reads, would otherwise cap
the reference read (until 2026-12-04 the bench set it to 1). Goal (issue 26): >= 100k rows/s and >= 0.4x pyarrow's JSON read.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def write_dump(d: Path, rows: int, files: int) -> int:
    """A verl-style dump: ``{step}.jsonl`` files with the keys ``_write_generations`` writes."""
    d.mkdir(parents=True, exist_ok=True)
    per = rows // files
    filler = "Let me think step by step about the quantities given in the problem. " * 14
    for s in range(files):
        with open(d / f"{s + 1}.jsonl", "w") as fh:
            for i in range(per):
                q = i % (per // 8 or 1)
                a = (q * 7) % 100
                ok = i % 3 == 0
                fh.write(json.dumps({
                    "input": f"<|im_start|>user\nProblem {s}-{q}: what is {q} * 7 mod 100? " + filler[:300] + "<|im_end|>",
                    "output": filler + f"So the answer is \\boxed{{{a if ok else a + 1}}}.",
                    "gts": str(a), "score": 1.0 if ok else -1.0, "step": s + 1, "acc": ok,
                    "pred": str(a if ok else a + 1), "request_id": f"req-{s}-{i}"}) + "\n")
    return sum(f.stat().st_size for f in d.glob("*.jsonl"))


def arm(name: str, dump: str, store_path: str, threads: int) -> dict:
    """One sample of one arm, in this (fresh) process, with pyarrow's thread pool of ``threads``."""
    import pyarrow as pa
    import pyarrow.json as pj

    pa.set_cpu_count(threads)  # the reference read uses the machine's cores (OMP_NUM_THREADS would cap it)

    from gfcr.store import RolloutStore
    from gfcr.store.importers import import_rollouts

    base = _rss_now()
    files = sorted(Path(dump).glob("*.jsonl"))
    store = RolloutStore.open(store_path, create=True) if not name.startswith("pyarrow") else None
    t0, c0 = time.perf_counter(), time.process_time()
    if name in ("pyarrow", "pyarrow+lance"):
        import lance

        n = 0
        for f in files:
            t = pj.read_json(f)
            n += t.num_rows
            if name == "pyarrow+lance":
                lance.write_dataset(t, store_path + ".lance", mode="append")
    else:
        res = import_rollouts(store, "verl", [dump], run_id="bench", columnar=name != "rows")
        n = res.written + res.skipped
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    import gfcr

    return {"arm": name, "rows": n, "wall_s": wall, "cpu_s": cpu, "peak_mb": (peak - base) / 2**20,
            "src": str(Path(gfcr.__file__).parents[1]), "arrow_threads": pa.cpu_count()}


def _rss_now() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--files", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-rows-arm", action="store_true", help="skip the slow row-path arm")
    ap.add_argument("--base-src", type=Path, default=None,
                    help="another checkout's src folder: adds the arm columnar@base, the columnar import with that code")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                    help="pyarrow's thread pool in every arm (default: the machine's cores)")
    ap.add_argument("--arm", help=argparse.SUPPRESS)
    ap.add_argument("--dump", help=argparse.SUPPRESS)
    ap.add_argument("--store", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.arm:
        print(json.dumps(arm(a.arm, a.dump, a.store, a.threads)))
        return
    tmp = Path(tempfile.mkdtemp(prefix="gfcr-import-bench-"))
    try:
        dump = tmp / "dump"
        size = write_dump(dump, a.rows, a.files)
        arms = ["pyarrow", "pyarrow+lance", "columnar", "reimport"] + ([] if a.no_rows_arm else ["rows"]) + \
            (["columnar@base"] if a.base_src else [])
        samples: dict[str, list[dict]] = {k: [] for k in arms}
        for r in range(a.rounds):
            order = arms[r % len(arms):] + arms[:r % len(arms)]
            _run("columnar", dump, tmp / f"re-{r}", a.threads)  # untimed: the store the reimport arm finds filled
            for name in order:
                st = tmp / (f"re-{r}" if name == "reimport" else f"{name}-{r}")
                load0 = os.getloadavg()[0]
                s = _run(name, dump, st, a.threads, a.base_src)
                s["load"] = [round(load0, 2), round(os.getloadavg()[0], 2)]
                samples[name].append(s)
                print(json.dumps(s), flush=True)
            for x in tmp.glob(f"*-{r}*"):
                shutil.rmtree(x, ignore_errors=True)
        mb = size / 2**20
        print(f"\ndump: {a.rows} rows in {a.files} files, {mb:.1f} MB; rounds: {a.rounds}; pyarrow threads: "
              f"{a.threads} of {os.cpu_count()} cores; machine: {_machine()}; medians")
        print("| arm | wall s | CPU s | rows/s | MB/s | peak MB | load |")
        print("|---|---|---|---|---|---|---|")
        med = {}
        for name, ss in samples.items():
            w = statistics.median(x["wall_s"] for x in ss)
            c = statistics.median(x["cpu_s"] for x in ss)
            p = statistics.median(x["peak_mb"] for x in ss)
            loads = [v for x in ss for v in x["load"]]
            med[name] = w
            print(f"| {name} | {w:.2f} | {c:.2f} | {a.rows / w:,.0f} | {mb / w:.1f} | {p:.0f} | "
                  f"{min(loads):.1f}-{max(loads):.1f} |")
        ratio = med["pyarrow"] / med["columnar"]
        floor = med["pyarrow+lance"] / med["columnar"]
        cpu = {k: statistics.median(x["cpu_s"] for x in ss) for k, ss in samples.items()}
        print(f"columnar / (pyarrow read + Lance write): {floor:.2f}x by wall, "
              f"{cpu['pyarrow+lance'] / cpu['columnar']:.2f}x by CPU; columnar / pyarrow read by CPU: "
              f"{cpu['pyarrow'] / cpu['columnar']:.2f}x")
        if a.base_src:
            pk = {k: statistics.median(x["peak_mb"] for x in ss) for k, ss in samples.items()}
            print(f"columnar against {a.base_src}: {med['columnar@base'] / med['columnar']:.2f}x faster by wall, "
                  f"{cpu['columnar@base'] / cpu['columnar']:.2f}x less CPU, "
                  f"peak memory {pk['columnar'] / pk['columnar@base']:.2f}x the base's")
        print(f"\ncolumnar = {a.rows / med['columnar']:,.0f} rows/s = {ratio:.2f}x pyarrow's JSON read "
              f"(goal >= 100,000 rows/s and >= 0.4x): {'met' if a.rows / med['columnar'] >= 1e5 and ratio >= 0.4 else 'not met'}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _machine() -> str:
    """The CPU model and the instruction sets the parse and the hashes lean on (figures move with
    them: pyarrow's parse of the dump took 0.31 s on one machine, 0.81 s on another)."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "unknown"
    model = next((ln.split(":", 1)[1].strip() for ln in info.splitlines() if ln.startswith("model name")), "unknown")
    flags = next((ln.split(":", 1)[1].split() for ln in info.splitlines() if ln.startswith("flags")), [])
    return f"{model} ({', '.join(f for f in ('avx2', 'avx512f', 'sha_ni') if f in flags) or 'no avx2'})"


def _run(name: str, dump: Path, store: Path, threads: int, base_src: Path | None = None) -> dict:
    env = dict(os.environ)
    if name.endswith("@base"):
        env["PYTHONPATH"] = os.pathsep.join([str(Path(base_src).resolve()), env.get("PYTHONPATH", "")])
    out = subprocess.run([sys.executable, __file__, "--arm", name.removesuffix("@base"), "--dump", str(dump),
                          "--store", str(store), "--threads", str(threads)], capture_output=True, text=True, env=env, check=True).stdout
    s = json.loads(out.strip().splitlines()[-1])
    return s | {"arm": name}


if __name__ == "__main__":
    main()
