"""bench/stages.py: the long benches' resumable stage loop."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "bench"))
from stages import run_stages  # noqa: E402


def test_a_finished_stage_is_read_back_and_the_rest_run_in_order(tmp_path, capsys):
    (tmp_path / "a.json").write_text(json.dumps({"n": 1}))  # finished by an earlier start
    ran = []

    def b():
        ran.append("b")
        return {"n": results["a"]["n"] + 1, "per_prompt": [0, 1]}  # reads the earlier stage's result

    results = {}
    out = run_stages(["a", "b"], lambda s: tmp_path / f"{s}.json",
                     {"a": lambda: ran.append("a"), "b": b}, results,
                     brief=lambda r: {k: v for k, v in r.items() if k != "per_prompt"})
    assert ran == ["b"] and out is results
    assert results == {"a": {"n": 1}, "b": {"n": 2, "per_prompt": [0, 1]}}
    assert json.loads((tmp_path / "b.json").read_text()) == results["b"]
    printed = capsys.readouterr().out
    assert '"n": 2' in printed and "per_prompt" not in printed

    run_stages(["a", "b"], lambda s: tmp_path / f"{s}.json", {"a": lambda: 1 / 0, "b": lambda: 1 / 0}, {})
    assert ran == ["b"]  # nothing runs again on a third start


def test_an_unknown_stage_stops_before_anything_runs(tmp_path):
    ran = []
    with pytest.raises(SystemExit, match=r"unknown stage 'evl' \(a, eval\)"):
        run_stages(["a", "evl"], lambda s: tmp_path / f"{s}.json", {"a": lambda: ran.append(1), "eval": dict}, {})
    assert ran == [] and not list(tmp_path.iterdir())
