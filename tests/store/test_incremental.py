"""Incremental import: re-runs import only what is new, two racing imports store each rollout
once, and ``--follow`` keeps up with a dump folder that a writer process extends."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from gfcr.formats import follow, import_rollouts
from gfcr.store import RolloutStore

SRC = str(Path(__file__).resolve().parents[2] / "src")


def _env():
    return {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", ""), "OMP_NUM_THREADS": "1"}


def _verl_line(step: int, i: int) -> str:
    return json.dumps({"input": f"q{i % 5}", "output": f"answer {step}-{i}", "gts": "1", "score": float(i % 2),
                       "step": step, "acc": i % 2 == 1}) + "\n"


@pytest.mark.parametrize(("hold_bytes", "commits"), [(256 << 20, 1), (1, 2)])
def test_rerun_imports_only_new_content_one_commit_per_batch(store, tmp_path, hold_bytes, commits):
    """The columnar path batches consecutive files up to ``hold_bytes`` into one commit; with a
    tiny budget, each file with new rows is its own commit."""
    d = tmp_path / "dump"
    d.mkdir()
    (d / "1.jsonl").write_text("".join(_verl_line(1, i) for i in range(6)))
    first = import_rollouts(store, "verl", [str(d)], run_id="r")
    v1 = store.version
    assert (first.written, first.skipped) == (6, 0)
    with open(d / "1.jsonl", "a") as f:  # the trainer appended to a file and wrote a new one
        f.write("".join(_verl_line(1, i) for i in range(6, 9)))
    (d / "2.jsonl").write_text("".join(_verl_line(2, i) for i in range(4)))
    second = import_rollouts(store, "verl", [str(d)], run_id="r", hold_bytes=hold_bytes)
    assert (second.written, second.skipped) == (7, 6) and store.count() == 13
    assert store.version == v1 + commits
    third = import_rollouts(store, "verl", [str(d)], run_id="r", hold_bytes=hold_bytes)
    assert (third.written, third.skipped) == (0, 13) and store.version == v1 + commits
    # ids come from content and source position: the same text on another line is another rollout
    assert len(set(store.scan(columns=["rollout_id"]).column(0).to_pylist())) == 13


def test_two_imports_racing_store_each_rollout_once(tmp_path):
    d = tmp_path / "dump"
    d.mkdir()
    for step in range(1, 7):
        (d / f"{step}.jsonl").write_text("".join(_verl_line(step, i) for i in range(40)))
    st = tmp_path / "st"
    RolloutStore.open(st, create=True)
    cmd = [sys.executable, "-m", "gfcr.cli", "store", "import", str(st), str(d), "--from", "verl", "--run", "r"]
    procs = [subprocess.Popen(cmd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    store = RolloutStore.open(st)
    ids = store.scan(columns=["rollout_id"]).column(0).to_pylist()
    assert len(ids) == len(set(ids)) == 240
    written = [int(re.search(r"imported (\d+) new rollouts", o).group(1)) for o, _ in outs]
    assert sum(written) == 240  # between them, each rollout written exactly once


WRITER = textwrap.dedent('''
    import json, sys, time
    from pathlib import Path
    d = Path(sys.argv[1])
    def line(step, i):
        return json.dumps({"input": f"q{i}", "output": f"a{step}-{i}", "score": 1.0, "step": step}) + "\\n"
    for step in (1, 2, 3):
        with open(d / f"{step}.jsonl", "a") as f:
            for i in range(5):
                text = line(step, i)
                f.write(text[:10]); f.flush(); time.sleep(0.15)   # a line caught half-written
                f.write(text[10:]); f.flush(); time.sleep(0.05)
    (d / "done").write_text("1")
''')


def test_follow_cli_keeps_up_with_a_writer_and_stops_on_ctrl_c(tmp_path):
    d = tmp_path / "dump"
    d.mkdir()
    st = tmp_path / "st"
    follower = subprocess.Popen(
        [sys.executable, "-m", "gfcr.cli", "store", "import", str(st), str(d), "--from", "verl", "--run", "live",
         "--follow", "--interval", "0.3"], env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(d)])
    assert writer.wait(timeout=120) == 0
    deadline = time.time() + 120
    n = 0
    while time.time() < deadline:
        n = RolloutStore.open(st).count() if (st / "gfcr-store.json").exists() else 0
        if n >= 15:
            break
        time.sleep(0.5)
    follower.send_signal(signal.SIGINT)
    out, err = follower.communicate(timeout=60)
    assert follower.returncode == 0, err
    store = RolloutStore.open(st)
    rs = store.rollouts(run="live")
    assert n == 15 and len(rs) == 15 and len({r.rollout_id for r in rs}) == 15
    assert sorted({r.step for r in rs}) == [1, 2, 3]
    assert "following" in err and "+" in err and "Traceback" not in err  # progress on stderr
    assert "imported 15 new rollouts" in out


def test_follow_defers_a_file_still_being_written(store, tmp_path):
    d = tmp_path / "dump"
    d.mkdir()
    good = _verl_line(1, 0)
    (d / "1.jsonl").write_text(good + good[:12])  # a line without its newline yet
    polls = []
    res = follow(store, "verl", [str(d)], interval=0.05, max_polls=2, run_id="f", progress=polls.append)
    assert res.written == 1 and store.count() == 1 and len(polls) == 1
    with open(d / "1.jsonl", "a") as f:
        f.write(good[12:])
    res = follow(store, "verl", [str(d)], interval=0.05, max_polls=1, run_id="f")
    assert res.written == 1 and store.count() == 2


def test_export_import_round_trip_keeps_prompts(store, tmp_path):
    from gfcr.formats.export import export, prompts_path
    from gfcr.testing import make_prompt, make_rollout

    store.upsert_prompts([make_prompt("p0", answer="7", tests={"cases": [1, 2]}, category="arith", difficulty=0.5),
                          make_prompt("p1", answer="9")])
    store.append([make_rollout(i, prompt=f"p{i % 2}", finish_reason=None if i == 2 else "stop") for i in range(4)])
    for fmt in ("jsonl", "parquet"):
        out = tmp_path / f"x.{fmt}"
        assert export(store, fmt, out) == 4 and prompts_path(out).exists()
        other = RolloutStore.open(tmp_path / f"other-{fmt}", create=True)
        res = import_rollouts(other, fmt, [str(out)])
        assert res.written == 4
        ps = {p.prompt_id: p for p in other.prompts()}
        assert ps["p0"].answer == "7" and ps["p0"].tests == {"cases": [1, 2]} and ps["p0"].difficulty == 0.5
        assert ps["p1"].answer == "9" and ps["p0"].category == "arith"
        got = {r.rollout_id: r for r in other.rollouts()}
        for r in store.rollouts():
            g = got[r.rollout_id]
            assert g.finish_reason == r.finish_reason and g.token_ids.tobytes() == r.token_ids.tobytes()
    with pytest.raises(Exception, match="never overwrites"):
        export(store, "jsonl", tmp_path / "x.jsonl")
