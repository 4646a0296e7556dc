"""``gfcr simulate CONFIG`` before and after a change: arms alternated in one run, wall and CPU seconds.

The "before" arm is a git revision's ``src/`` (extracted to a temporary folder with ``git archive``),
the "after" arm this checkout's ``src/``; each sample is a fresh process running the whole config
(``--no-plot``) into a new folder. Reports per arm the median wall and CPU (user + sys of the child)
seconds and the load average around each sample (the machine may be shared).

    .venv/bin/python bench/sim_speed_bench.py --before main --config configs/simulate-10k.yaml --samples 2
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def extract(rev: str, into: Path) -> Path:
    """``src/`` of git revision ``rev`` under ``into``; returns that ``src``."""
    tar = into / "src.tar"
    with open(tar, "wb") as fh:
        subprocess.run(["git", "-C", str(ROOT), "archive", rev, "src"], stdout=fh, check=True)
    with tarfile.open(tar) as t:
        t.extractall(into, filter="data")
    return into / "src"


def sample(src: Path, config: Path, out: Path) -> dict[str, float]:
    """One fresh ``python -m gfcr simulate`` with ``src`` first on the path: wall, CPU seconds, load."""
    env = dict(os.environ, PYTHONPATH=str(src))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    load0, t0 = os.getloadavg()[0], time.perf_counter()
    subprocess.run([sys.executable, "-m", "gfcr", "simulate", str(config), "--out", str(out), "--no-plot"],
                   env=env, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall_s": wall, "cpu_s": cpu, "load_start": load0, "load_end": os.getloadavg()[0]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", default="main", help="git revision of the 'before' arm")
    ap.add_argument("--config", default=str(ROOT / "configs" / "simulate-10k.yaml"))
    ap.add_argument("--samples", type=int, default=2, help="samples per arm (alternated)")
    ap.add_argument("--after", default=str(ROOT / "src"), help="the 'after' arm's src folder (default: this checkout)")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        arms = {"before": extract(a.before, Path(tmp)), "after": Path(a.after)}
        res: dict[str, list[dict[str, float]]] = {k: [] for k in arms}
        for i in range(a.samples):
            for name, src in (arms.items() if i % 2 == 0 else reversed(list(arms.items()))):
                res[name].append(sample(src, Path(a.config), Path(tmp) / f"{name}{i}"))
                print(name, json.dumps(res[name][-1]), flush=True)

    def med(xs: list[float]) -> float:
        xs = sorted(xs)
        return (xs[(len(xs) - 1) // 2] + xs[len(xs) // 2]) / 2

    summary = {k: {m: med([s[m] for s in v]) for m in ("wall_s", "cpu_s")} for k, v in res.items()}
    print(json.dumps({"config": a.config, "before": a.before, "samples": a.samples, "cpus": os.cpu_count(),
                      "median": summary, "runs": res}, indent=1))


if __name__ == "__main__":
    main()
