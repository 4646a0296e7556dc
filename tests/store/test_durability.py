"""Durability of what a store has committed: ``--follow`` keeps the rows it committed when a later
line is malformed (issue 30, item 2)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from gfcr.store import RolloutStore

SRC = str(Path(__file__).resolve().parents[2] / "src")


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", ""), "OMP_NUM_THREADS": "1"}


def gfcr(*args: object, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gfcr.cli", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=_env())


def _verl_lines(step: int, n: int) -> str:
    return "".join(json.dumps({"input": f"q{i % 5}", "output": f"answer {step}-{i}", "score": float(i % 2),
                               "step": step}) + "\n" for i in range(n))


def _old(p: Path) -> None:
    """Make ``p`` look finished (older than --follow's settle time)."""
    os.utime(p, (p.stat().st_atime - 3600, p.stat().st_mtime - 3600))


def test_follow_keeps_committed_rows_when_a_later_line_is_malformed(tmp_path):
    d = tmp_path / "dump"
    d.mkdir()
    (d / "1.jsonl").write_text(_verl_lines(1, 30))
    (d / "2.jsonl").write_text(_verl_lines(2, 20))
    (d / "3.jsonl").write_text(_verl_lines(3, 4) + '{"input": "q", "output": \n' + _verl_lines(3, 2))
    for f in d.iterdir():
        _old(f)
    st = tmp_path / "new-store"
    p = gfcr("store", "import", st, d, "--from", "verl", "--run", "live", "--follow", "--interval", "0.1")
    assert p.returncode == 2, p.stderr + p.stdout
    err_lines = [ln for ln in p.stderr.splitlines() if ln.startswith("error:")]
    assert len(err_lines) == 1 and "Traceback" not in p.stderr, p.stderr
    line = err_lines[0]
    assert "3.jsonl" in line and "line 5" in line  # which file and line it stopped at
    assert "50 rollouts" in line and "resume" in line  # what is kept, and how to go on
    # every committed row is still there
    store = RolloutStore.open(st)
    assert store.count() == 50
    assert sorted(set(store.scan(columns=["step"]).column(0).to_pylist())) == [1, 2]
    # resuming after the fix imports the rest once
    (d / "3.jsonl").write_text(_verl_lines(3, 6))
    _old(d / "3.jsonl")
    again = gfcr("store", "import", st, d, "--from", "verl", "--run", "live")
    assert again.returncode == 0, again.stderr
    assert "imported 6 new rollouts (50 already stored)" in again.stdout
    assert RolloutStore.open(st).count() == 56


def test_follow_whose_first_file_is_malformed_leaves_no_new_store(tmp_path):
    d = tmp_path / "dump"
    d.mkdir()
    (d / "1.jsonl").write_text('{"input": "q", "output": \n')
    _old(d / "1.jsonl")
    st = tmp_path / "new-store"
    p = gfcr("store", "import", st, d, "--from", "verl", "--follow", "--interval", "0.1")
    assert p.returncode == 2 and "1.jsonl" in p.stderr and "line 1" in p.stderr, p.stderr
    assert not st.exists()
