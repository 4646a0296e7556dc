"""Import benchmark: a verl ``rollout_data_dir`` dump into the store, against the floor an import
must pay (pyarrow's read of the files plus a Lance write of the same columns the import writes),
measured in the same run (issue 48 part 5).

    python bench/import_bench.py                      # 100k rows (10 files of 10k, ~1.5 KB a row), 5 rounds
    python bench/import_bench.py --rows 20000 --rounds 2 --no-rows-arm   # quicker
    python bench/import_bench.py --no-rows-arm --base-src ../base/src  # against another checkout's code

Arms, each run in a fresh subprocess (so peak memory is its own: ``ru_maxrss`` minus the RSS after
imports and, for the floor, after loading the tables it writes), in turns every round with the order
rotating, so machine load hits them alike:
- ``floor`` (the denominator): ``pyarrow.json.read_json`` of every file on pyarrow's pool (the
  machine's cores), then ``lance.write_dataset`` of the rollout and prompt tables the import writes
  (the rows of an untimed reference import, read back before the clock starts: the same columns,
  types and values, ``created_at`` aside) into a new dataset each: what a columnar import of
  these files into these tables costs at the least, with no mapping, no ids, no checks;
- ``columnar``: ``import_rollouts(store, "verl", ...)`` into a new store (Arrow in, one append per batch);
- ``pyarrow``: the read alone (the reference of issue 26's retired goal);
- ``pyarrow+lance``: the read, each file's table (the dump's own columns) appended to a Lance
  dataset (the floor of earlier rounds: fewer and smaller columns than the import writes);
- ``rows`` (unless ``--no-rows-arm``): the import with ``columnar=False`` (a Rollout object per line);
- ``reimport``: the columnar import of the same, unchanged dump into the store it already fills
  (every file skipped by size + mtime, unread);
- ``columnar@base`` (with ``--base-src PATH``): the ``columnar`` arm run with another checkout's
  ``src`` first on ``PYTHONPATH`` (e.g. a ``git worktree`` of the commit before), in the same turns.
Reported per arm: medians over rounds of wall and CPU seconds (the process and all its threads,
Lance's included), rows/s, MB/s, peak memory above baseline, ``os.getloadavg()`` before and after
each sample; then the import's ratio to the floor (floor time / import time) by wall and by CPU.
Every arm sets pyarrow's pool to ``--threads`` (default: the machine's cores) itself:
``OMP_NUM_THREADS``, which pyarrow also reads, would otherwise cap the floor's read.
Goal (issue 48 part 5): the import >= 0.6x the floor by wall, on one machine; throughput beyond one
machine is the distributed import's. Retired: issue 26's ">= 100k rows/s and >= 0.4x pyarrow's read".
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


GOAL = 0.6  # the import >= 0.6x the floor (floor time / import time), by wall (issue 48 part 5)


def arm(name: str, dump: str, store_path: str, threads: int, ref: str | None = None) -> dict:
    """One sample of one arm, in this (fresh) process, with pyarrow's thread pool of ``threads``;
    ``ref``: the store of an untimed import of ``dump``, whose tables the ``floor`` arm writes."""
    import pyarrow as pa
    import pyarrow.json as pj

    pa.set_cpu_count(threads)  # the reference read uses the machine's cores (OMP_NUM_THREADS would cap it)

    from gfcr.formats import import_rollouts
    from gfcr.store import RolloutStore

    files = sorted(Path(dump).glob("*.jsonl"))
    store = RolloutStore.open(store_path, create=True) if name in ("columnar", "rows", "reimport") else None
    written: dict[str, list[str]] = {}
    if name == "floor":  # the tables the import writes, loaded before the clock starts
        import lance

        done = RolloutStore.open(ref)
        tables = {k: done.dataset(k).to_table() for k in ("rollouts", "prompts")}
        Path(store_path).mkdir(parents=True, exist_ok=True)
    base = _rss_now()
    t0, c0 = time.perf_counter(), time.process_time()
    if name in ("pyarrow", "pyarrow+lance", "floor"):
        import lance

        n = 0
        for f in files:
            t = pj.read_json(f)
            n += t.num_rows
            if name == "pyarrow+lance":
                lance.write_dataset(t, store_path + ".lance", mode="append")
            del t
        if name == "floor":
            for k, tk in tables.items():
                written[k] = lance.write_dataset(tk, f"{store_path}/{k}.lance", mode="create").schema.names
    else:
        res = import_rollouts(store, "verl", [dump], run_id="bench", columnar=name != "rows")
        n = res.written + res.skipped
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    import gfcr

    out = {"arm": name, "rows": n, "wall_s": wall, "cpu_s": cpu, "peak_mb": (peak - base) / 2**20,
           "src": str(Path(gfcr.__file__).parents[1]), "arrow_threads": pa.cpu_count()}
    if name == "floor":
        out |= {"written_rows": tables["rollouts"].num_rows, "written_columns": written}
    return out


def _rss_now() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--files", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--no-rows-arm", action="store_true", help="skip the slow row-path arm")
    ap.add_argument("--no-extra-arms", action="store_true",
                    help="only the floor and the import (and columnar@base): no pyarrow, pyarrow+lance, reimport")
    ap.add_argument("--base-src", type=Path, default=None,
                    help="another checkout's src folder: adds the arm columnar@base, the columnar import with that code")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                    help="pyarrow's thread pool in every arm (default: the machine's cores)")
    ap.add_argument("--arm", help=argparse.SUPPRESS)
    ap.add_argument("--dump", help=argparse.SUPPRESS)
    ap.add_argument("--store", help=argparse.SUPPRESS)
    ap.add_argument("--ref", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.arm:
        print(json.dumps(arm(a.arm, a.dump, a.store, a.threads, a.ref)))
        return
    tmp = Path(tempfile.mkdtemp(prefix="gfcr-import-bench-"))
    try:
        dump = tmp / "dump"
        size = write_dump(dump, a.rows, a.files)
        ref = tmp / "ref"
        _run("columnar", dump, ref, a.threads)  # untimed: the tables the floor arm writes
        arms = ["floor", "columnar"] + ([] if a.no_extra_arms else ["pyarrow", "pyarrow+lance", "reimport"]) + \
            ([] if a.no_rows_arm else ["rows"]) + (["columnar@base"] if a.base_src else [])
        samples: dict[str, list[dict]] = {k: [] for k in arms}
        for r in range(a.rounds):
            order = arms[r % len(arms):] + arms[:r % len(arms)]
            if "reimport" in arms:  # untimed: the store the reimport arm finds filled
                _run("columnar", dump, tmp / f"re-{r}", a.threads)
            for name in order:
                st = tmp / (f"re-{r}" if name == "reimport" else f"{name}-{r}")
                load0 = os.getloadavg()[0]
                s = _run(name, dump, st, a.threads, a.base_src, ref)
                s["load"] = [round(load0, 2), round(os.getloadavg()[0], 2)]
                samples[name].append(s)
                print(json.dumps(s), flush=True)
            for x in tmp.glob(f"*-{r}*"):
                shutil.rmtree(x, ignore_errors=True)
        print(summary(samples, a.rows, size, a.files, a.threads, a.base_src))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def summary(samples: dict[str, list[dict]], rows: int, size: int, files: int, threads: int,
            base_src: Path | None = None) -> str:
    """The report: one row per arm (medians), then the import against the floor: the ratio of the
    medians and the median of the per-round ratios (each round's two samples ran minutes apart at
    most, so the paired ratio is the steadier figure on a loaded machine), by wall and by CPU."""
    mb = size / 2**20
    rounds = min(len(ss) for ss in samples.values())
    out = [f"\ndump: {rows} rows in {files} files, {mb:.1f} MB; rounds: {rounds}; pyarrow threads: "
           f"{threads} of {os.cpu_count()} cores; machine: {_machine()}; medians",
           "| arm | wall s | CPU s | rows/s | MB/s | peak MB | load |", "|---|---|---|---|---|---|---|"]
    med: dict[str, dict[str, float]] = {}
    for name, ss in samples.items():
        med[name] = {k: statistics.median(x[k] for x in ss) for k in ("wall_s", "cpu_s", "peak_mb")}
        loads = [v for x in ss for v in x["load"]]
        w = med[name]["wall_s"]
        out.append(f"| {name} | {w:.2f} | {med[name]['cpu_s']:.2f} | {rows / w:,.0f} | {mb / w:.1f} | "
                   f"{med[name]['peak_mb']:.0f} | {min(loads):.1f}-{max(loads):.1f} |")

    def ratio(num: str, den: str, k: str) -> tuple[float, float]:
        paired = statistics.median(x[k] / y[k] for x, y in zip(samples[num], samples[den], strict=False))
        return med[num][k] / med[den][k], paired

    (w, wp), (c, cp) = ratio("floor", "columnar", "wall_s"), ratio("floor", "columnar", "cpu_s")
    out.append(f"\nimport = {w:.2f}x the floor by wall (median of per-round ratios {wp:.2f}x), {c:.2f}x by CPU "
               f"(per round {cp:.2f}x); goal >= {GOAL}x by wall: {'met' if w >= GOAL else 'not met'}")
    if "pyarrow" in samples:
        out.append(f"import = {ratio('pyarrow', 'columnar', 'wall_s')[0]:.2f}x pyarrow's read alone, "
                   f"{ratio('pyarrow+lance', 'columnar', 'wall_s')[0]:.2f}x read + Lance write of the dump's columns "
                   "(by wall; the retired goal of issue 26 was >= 0.4x the read alone)")
    if base_src:
        bw, bwp = ratio("columnar@base", "columnar", "wall_s")
        bc, _ = ratio("columnar@base", "columnar", "cpu_s")
        out.append(f"import against {base_src}: {bw:.2f}x faster by wall (per round {bwp:.2f}x), {bc:.2f}x less CPU, "
                   f"peak memory {med['columnar']['peak_mb'] / med['columnar@base']['peak_mb']:.2f}x the base's; "
                   f"base = {ratio('floor', 'columnar@base', 'wall_s')[0]:.2f}x the floor by wall")
    return "\n".join(out)


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


def _run(name: str, dump: Path, store: Path, threads: int, base_src: Path | None = None,
         ref: Path | None = None) -> dict:
    env = dict(os.environ)
    if name.endswith("@base"):
        env["PYTHONPATH"] = os.pathsep.join([str(Path(base_src).resolve()), env.get("PYTHONPATH", "")])
    out = subprocess.run([sys.executable, __file__, "--arm", name.removesuffix("@base"), "--dump", str(dump),
                          "--store", str(store), "--threads", str(threads)]
                         + (["--ref", str(ref)] if ref else []), capture_output=True, text=True, env=env, check=True).stdout
    s = json.loads(out.strip().splitlines()[-1])
    return s | {"arm": name}


if __name__ == "__main__":
    main()
