"""bench/import_bench.py: its reference read gets the machine's cores.

The bench's pyarrow arm is the goal's denominator (issue 26). Earlier rounds ran every arm with
``OMP_NUM_THREADS=1``, which pyarrow reads as its thread count, so the reference read used one core
of two and every "x pyarrow" ratio was measured against half of pyarrow's speed. Run here on a tiny
dump under that same environment: each arm must report the machine's cores (or the count passed).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _samples(*args: str) -> list[dict]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "src")}
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "import_bench.py"), "--rows", "40", "--files", "2",
                          "--rounds", "1", "--no-rows-arm", *args], capture_output=True, text=True, env=env,
                         check=True, timeout=300).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def test_every_arm_gets_the_machines_cores_despite_omp_num_threads():
    s = _samples()
    assert {x["arm"] for x in s} == {"pyarrow", "pyarrow+lance", "columnar", "reimport"}
    assert {x["arrow_threads"] for x in s} == {os.cpu_count()}
    assert all(x["rows"] == 40 for x in s)


def test_threads_option_sets_the_pool():
    assert {x["arrow_threads"] for x in _samples("--threads", "1")} == {1}
