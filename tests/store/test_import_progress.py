"""An import reports its progress per file: ``read`` as each file is parsed and checked, ``write``
as its rows are committed, on the columnar path, the row path and a mix of both; ``gfcr store
import`` draws it as a bar on a terminal's stderr and leaves stdout as it was."""

from __future__ import annotations

import io
import json
from pathlib import Path

from rich.console import Console

from gfcr.cli.common import import_progress
from gfcr.formats import import_rollouts
from gfcr.store import RolloutStore


def _dump(d: Path, files: int = 3, blank_in: int | None = None) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    for s in range(1, files + 1):
        rows = [json.dumps({"input": f"q{i % 4}", "output": f"a{s}-{i}", "gts": str(i % 4), "score": float(i % 2),
                            "step": s, "acc": bool(i % 2)}) for i in range(20)]
        (d / f"{s}.jsonl").write_text("\n".join(rows) + ("\n\n" if s == blank_in else "\n"))
    return d


def _run(store, d, **kw):
    calls: list[tuple[str, int, int]] = []
    res = import_rollouts(store, "verl", [str(d)], run_id="v", progress=lambda *a: calls.append(a), **kw)
    return res, calls


def test_columnar_import_reports_each_file_read_then_the_batch_written(tmp_path):
    store = RolloutStore.open(tmp_path / "s", create=True)
    res, calls = _run(store, _dump(tmp_path / "d"))
    assert set(res.how.values()) == {"columnar"} and res.written == 60
    assert calls == [("read", 1, 3), ("read", 2, 3), ("read", 3, 3), ("write", 3, 3)]  # one commit for the three
    again, calls = _run(store, tmp_path / "d")  # every file unchanged: each counted at its turn
    assert again.written == 0
    assert calls == [("read", 1, 3), ("read", 2, 3), ("read", 3, 3), ("write", 1, 3), ("write", 2, 3), ("write", 3, 3)]


def test_row_path_reports_each_file_read_and_written(tmp_path):
    store = RolloutStore.open(tmp_path / "s", create=True)
    res, calls = _run(store, _dump(tmp_path / "d"), columnar=False)
    assert res.written == 60
    assert calls == [("read", 1, 3), ("read", 2, 3), ("read", 3, 3), ("write", 1, 3), ("write", 2, 3), ("write", 3, 3)]


def test_a_file_sent_to_the_row_path_is_counted_in_its_place(tmp_path):
    store = RolloutStore.open(tmp_path / "s", create=True)
    res, calls = _run(store, _dump(tmp_path / "d", blank_in=2))  # file 2 has a blank line: the row path
    assert res.how[str(tmp_path / "d" / "2.jsonl")].startswith("rows:") and res.written == 60
    assert [c for c in calls if c[0] == "read"] == [("read", 1, 3), ("read", 2, 3), ("read", 3, 3)]
    assert [c for c in calls if c[0] == "write"] == [("write", 1, 3), ("write", 2, 3), ("write", 3, 3)]


def test_no_callback_no_calls_and_the_same_rows(tmp_path):
    a = RolloutStore.open(tmp_path / "a", create=True)
    b = RolloutStore.open(tmp_path / "b", create=True)
    d = _dump(tmp_path / "d")
    _run(a, d)
    import_rollouts(b, "verl", [str(d)], run_id="v")
    ids = lambda s: sorted(s.scan(columns=["rollout_id"]).column(0).to_pylist())  # noqa: E731
    assert ids(a) == ids(b) and len(ids(a)) == 60


def test_the_bar_draws_reading_then_writing_on_a_terminal():
    buf = io.StringIO()
    con = Console(file=buf, force_terminal=True, color_system=None, width=80)
    with import_progress(True, console=con) as progress:
        counts = lambda: {t.description: (t.completed, t.total) for t in progress.bar.tasks}  # noqa: E731
        progress("read", 1, 3)
        assert counts() == {"reading": (1, 3)}
        progress("read", 3, 3)  # the last file read: "writing 0/3" shows while the commit runs
        assert counts() == {"reading": (3, 3), "writing": (0, 3)}
        progress("write", 3, 3)
        assert counts() == {"reading": (3, 3), "writing": (3, 3)}
        progress.bar.refresh()
    out = buf.getvalue()
    assert "reading" in out and "writing" in out and "3/3 files" in out
    with import_progress(False) as none:
        assert none is None
