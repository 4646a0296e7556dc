"""bench/import_bench.py: its floor (the goal's denominator, issue 48 part 5) reads on the machine's
cores and writes the columns the import writes; the report states the import against it.

The floor arm reads every file with pyarrow and writes the rollout and prompt tables an import of
the dump wrote (read back before its clock starts); issue 26's denominator was the read alone.
Earlier rounds ran every arm with ``OMP_NUM_THREADS=1``, which pyarrow reads as its thread count, so the reference read used one core
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


def _run(*args: str) -> str:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "src")}
    return subprocess.run([sys.executable, str(ROOT / "bench" / "import_bench.py"), "--rows", "40", "--files", "2",
                           "--rounds", "1", "--no-rows-arm", *args], capture_output=True, text=True, env=env,
                          check=True, timeout=300).stdout


def _samples(*args: str) -> list[dict]:
    return [json.loads(line) for line in _run(*args).splitlines() if line.startswith("{")]


def test_every_arm_gets_the_machines_cores_despite_omp_num_threads():
    s = _samples()
    assert {x["arm"] for x in s} == {"floor", "pyarrow", "pyarrow+lance", "columnar", "reimport"}
    assert {x["arrow_threads"] for x in s} == {os.cpu_count()}
    assert all(x["rows"] == 40 for x in s)


def test_threads_option_sets_the_pool():
    assert {x["arrow_threads"] for x in _samples("--threads", "1")} == {1}


def test_floor_writes_the_columns_the_import_writes_and_the_report_states_the_ratio():
    from gfcr.records.schema import PROMPT_SCHEMA, ROLLOUT_SCHEMA

    out = _run("--no-extra-arms")
    (floor,) = [json.loads(ln) for ln in out.splitlines() if ln.startswith('{"arm": "floor"')]
    assert floor["written_rows"] == 40
    assert floor["written_columns"] == {"rollouts": ROLLOUT_SCHEMA.names, "prompts": PROMPT_SCHEMA.names}
    assert {ln.split("|")[1].strip() for ln in out.splitlines() if ln.startswith("| ")} - {"arm"} == {"floor", "columnar"}
    (line,) = [ln for ln in out.splitlines() if ln.startswith("import = ") and "the floor by wall" in ln]
    assert line.endswith(("goal >= 0.6x by wall: met", "goal >= 0.6x by wall: not met"))
