"""Stored rollouts pushed to an experiment tracker: trackio for real (its local SQLite database under a
temporary ``TRACKIO_DIR``), read back through trackio's own storage, from the store, the CLI and a live
step writer."""

from __future__ import annotations

import subprocess
import sys

import pytest

from gfcr.integrations.trackers import COLUMNS, TrackerHook, make_tracker, push_store
from gfcr.integrations.writer import StepBatch, StepWriter
from gfcr.records import Message
from gfcr.testing import make_rollout

trackio = pytest.importorskip("trackio")


@pytest.fixture
def trackio_dir(tmp_path, monkeypatch):
    d = tmp_path / "trackio"
    monkeypatch.setenv("TRACKIO_DIR", str(d))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(trackio, "TRACKIO_DIR", d, raising=False)
    import trackio.sqlite_storage as ss
    import trackio.utils as tu

    monkeypatch.setattr(tu, "TRACKIO_DIR", d, raising=False)
    monkeypatch.setattr(ss, "TRACKIO_DIR", d, raising=False)
    return d


def _logs(project: str, run: str) -> list[dict]:
    from trackio.sqlite_storage import SQLiteStorage

    return SQLiteStorage.get_logs(project, run)


def _two_steps(store, run="run-a"):
    rows = []
    for step in (0, 1):
        for i in range(4):
            rows.append(make_rollout(10 * step + i, run=run, step=step, prompt=f"p{i}", reward=float(i % 2),
                                     verified=bool(i % 2) if i < 3 else None,
                                     messages=[Message("user", f"what is {i}+{step}?"),
                                               Message("assistant", f"it is {i + step}")]))
    store.append(rows)
    return rows


def test_push_store_logs_the_stores_step_numbers_and_real_rollouts(store, trackio_dir):
    rows = _two_steps(store)
    tracker = make_tracker("trackio", "proj", "run-a")
    n = push_store(store, tracker, samples=3, seed=1)
    tracker.finish()
    assert n == {"steps": 2, "rollouts": 6}
    logs = _logs("proj", "run-a")
    scalars = {e["step"]: e for e in logs if "gfcr/reward_mean" in e}
    stats = {r["step"]: r for r in store.stats()}
    assert sorted(scalars) == [0, 1]
    for step, e in scalars.items():
        assert e["gfcr/n_rollouts"] == stats[step]["n_rollouts"] == 4
        assert e["gfcr/reward_mean"] == pytest.approx(stats[step]["reward_mean"])
        assert e["gfcr/len_mean"] == pytest.approx(6.0) and "gfcr/n_groups" in e  # the report's whole step row
        assert e["gfcr/verified_rate"] == pytest.approx(1 / 3)  # 1 of the 3 rollouts with a verdict
    tables = {e["step"]: e["gfcr/rollouts"]["_value"] for e in logs if "gfcr/rollouts" in e
              and isinstance(e["gfcr/rollouts"], dict)}
    assert sorted(tables) == [0, 1]
    by_id = {r.rollout_id: r for r in rows}
    for step, table in tables.items():
        assert len(table) == 3 and set(table[0]) == set(COLUMNS)
        for t in table:
            r = by_id[t["rollout_id"]]
            assert t["step"] == step == r.step
            assert t["prompt"] == r.messages[0].content and t["completion"] == r.completion
            assert t["reward"] == r.reward and t["verified"] == r.verified


def test_push_refuses_an_ambiguous_or_unknown_run(store, trackio_dir):
    _two_steps(store, "run-a")
    _two_steps(store, "run-b")

    class Nothing:
        def log(self, *a, **k):
            raise AssertionError("nothing may be logged")

        log_table = log

    with pytest.raises(ValueError, match="holds 2 runs"):
        push_store(store, Nothing())
    with pytest.raises(ValueError, match="no run 'run-c'"):
        push_store(store, Nothing(), run="run-c")
    with pytest.raises(ValueError, match="unknown tracker 'tensorboard'"):
        make_tracker("tensorboard", "p")


def test_cli_push_to_trackio(store, trackio_dir, tmp_path):
    _two_steps(store)
    env = {"TRACKIO_DIR": str(trackio_dir), "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-m", "gfcr", "store", "push", str(store.path), "--to", "trackio",
                          "--project", "cli", "--steps", "1:1", "--samples", "2"],
                         capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "pushed 1 step(s) and 2 sampled rollout(s) to trackio" in out.stdout
    logs = _logs("cli", "run-a")
    assert {e["step"] for e in logs if "gfcr/reward_mean" in e} == {1}
    bad = subprocess.run([sys.executable, "-m", "gfcr", "store", "push", str(store.path), "--steps", "x"],
                         capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0 and "--steps must be A:B" in bad.stderr


def test_live_writer_pushes_each_committed_step(store, trackio_dir):
    tracker = make_tracker("trackio", "live", "run-a")
    w = StepWriter(store, tracker=TrackerHook(tracker, samples=2, seed=0))
    for s in range(3):
        w.submit(s, lambda s=s: StepBatch(s, [make_rollout(i, step=s, reward=float(i == 0)) for i in range(4)]))
    w.close()
    tracker.finish()
    logs = _logs("live", "run-a")
    scalars = {e["step"]: e for e in logs if "gfcr/n_rollouts" in e}
    assert sorted(scalars) == [0, 1, 2]
    assert all(e["gfcr/reward_mean"] == pytest.approx(0.25) and e["gfcr/n_rollouts"] == 4 for e in scalars.values())
    stored = {r["step"]: r["reward_mean"] for r in store.stats()}
    assert stored == {0: pytest.approx(0.25), 1: pytest.approx(0.25), 2: pytest.approx(0.25)}


def test_a_failing_tracker_never_costs_a_stored_step(store):
    calls = []

    def broken(step, rollouts):
        calls.append(step)
        raise ConnectionError("tracker down")

    w = StepWriter(store, tracker=broken)
    with pytest.warns(RuntimeWarning, match="pushing step 0 to the tracker failed"):
        for s in range(3):
            w.submit(s, lambda s=s: StepBatch(s, [make_rollout(i, step=s) for i in range(2)]))
        w.close()
    assert calls == [0]  # turned off after the first failure
    assert store.count() == 6
