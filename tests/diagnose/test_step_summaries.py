"""Per-step summaries are derived by their readers (:func:`gfcr.diagnose.metrics.step_metrics`,
one implementation in :mod:`gfcr.store.stepstats`): the write path computes and writes none of
it, the in-process cache never answers for another version, and one step's own summary (what the
training loop reports) equals the report's row for that step."""

from __future__ import annotations

import shutil

import lance
import numpy as np
import pytest
from diag_helpers import PATHOLOGIES, audit, close, group, random_batch, rollout, simulate_run
from typer.testing import CliRunner

from gfcr.cli import app
from gfcr.diagnose import metrics as M
from gfcr.diagnose.health import run_health_checks
from gfcr.diagnose.metrics import MetricsConfig, step_metrics
from gfcr.records import Message, rollouts_to_table
from gfcr.store import RolloutStore, stepstats
from gfcr.store.stepstats import STEP_COLUMNS, summarize


@pytest.fixture(autouse=True)
def _fresh_cache():
    M.clear_cache()
    yield
    M.clear_cache()


def _uncached(store, run=None, cfg=None):
    return step_metrics(store, run=run, config=cfg, cache=False).to_pylist()


def _batches() -> list[list]:
    """Appends of a varied store: pathologies, replay copies and annotations, a step split over two
    appends and appended out of order, a step nobody passed, health faults."""
    b1 = [r for kind in PATHOLOGIES for r in simulate_run(kind) if r.step < 3]
    b2 = [r for kind in PATHOLOGIES for r in simulate_run(kind) if r.step >= 3]
    b3 = group("mix", 2, "a", [1.0, 0.4, 0.7], [False, False, False])  # nobody passed at step 2
    b3 += group("mix", 2, "b", [0.8, 0.3], [False, False])
    b4 = group("mix", 0, "a", [1.0, 0.6, 0.0, 0.95], [True, False, False, True])
    b4 += [rollout("mix", 0, "y", 1.0, verified=True, meta={"replayed_at_step": [2, 5], "replay_importance_weight": [2.0, 0.5]})]
    b5 = group("mix", 2, "c", [0.85, 0.1], [False, False])  # more rows at a stored step
    empty = rollout("mix", 1, "e", 0.0, verified=False)
    empty.messages = [Message("user", "q"), Message("assistant", "")]
    return [b1, b2, b3, b4, b5 + [empty]]


def test_the_write_path_computes_no_summary(tmp_path, monkeypatch):
    """append / update / compact never call the summary and leave no sidecar next to the tables."""
    def boom(*a, **k):
        raise AssertionError("a per-step summary was computed on the write path")

    monkeypatch.setattr(stepstats, "metrics_of", boom)
    monkeypatch.setattr(stepstats, "rollout_features", boom)
    store = RolloutStore.open(tmp_path / "s", create=True, auto_compact=2)
    for b in _batches():
        store.append(b)
    rs = group("u", 0, "a", [1.0, 0.0], [True, False])
    store.append(rs)
    rs[0].reward = 0.5
    store.update(rs[:1])
    store.compact()
    assert store.compactions
    left = {p.name for p in store.path.iterdir()}
    assert not {n for n in left if "aggregates" in n}, left


def test_cached_metrics_follow_every_write(tmp_path):
    store = RolloutStore.open(tmp_path / "s", create=True, auto_compact=2)
    assert step_metrics(store).num_rows == 0
    for b in _batches():
        store.append(b)
        assert step_metrics(store).to_pylist() == _uncached(store)  # never the previous version's
    m = {r["step"]: r for r in step_metrics(store, run="mix").to_pylist()}
    assert m[5]["n_rollouts"] == 0 and m[5]["n_replayed"] == 1  # a step holding only a replay event
    # nobody passed at step 2: its 1.0 failure is judged against the run's passing median (1.0)
    assert m[2]["hack_rate"] == pytest.approx(1 / 7)
    v = store.version
    rs = group("r", 0, "a", [1.0, 0.0], [True, False])
    store.append(rs)
    before = step_metrics(store, run="r").to_pylist()
    rs[1].reward = 0.5
    store.update([rs[1]])
    after = step_metrics(store, run="r").to_pylist()
    assert before[0]["reward_mean"] == 0.5 and after[0]["reward_mean"] == 0.75 and after == _uncached(store, "r")
    store.upsert_audits([audit(rs[0], [(0, 2, "other")], ter=0.5)])  # an audit is a new version of audits only
    assert step_metrics(store, run="r").to_pylist()[0]["n_audited"] == 1
    store.compact()
    assert step_metrics(store).to_pylist() == _uncached(store)
    old = store.checkout(v)  # an earlier version: its own numbers, cached under its own key
    assert "r" not in set(step_metrics(old).column("run_id").to_pylist())
    assert "r" in set(step_metrics(store).column("run_id").to_pylist())


def test_the_cache_returns_the_same_table_until_a_commit(tmp_path, monkeypatch):
    store = RolloutStore.open(tmp_path / "s", create=True)
    store.append(simulate_run("healthy"))
    first = step_metrics(store)
    calls = []
    real = M.metrics_of
    monkeypatch.setattr(M, "metrics_of", lambda *a: calls.append(1) or real(*a))
    assert step_metrics(store) is first and not calls  # unchanged store: no scan
    assert step_metrics(RolloutStore.open(store.path)) is first  # another handle on the same version
    assert step_metrics(store, config=MetricsConfig(tail_quantile=0.5)) is not first and calls == [1]
    # another writer (an older gfcr, raw Lance) commits behind this handle's back: a new key
    lance.write_dataset(rollouts_to_table(simulate_run("zero_reward")), str(store.path / "rollouts.lance"), mode="append")
    assert set(step_metrics(store).column("run_id").to_pylist()) == {"healthy", "zero_reward"}


def test_a_store_made_again_at_the_same_path_is_not_answered_from_the_cache(tmp_path):
    path = tmp_path / "s"
    store = RolloutStore.open(path, create=True)
    store.append(simulate_run("healthy"))
    assert set(step_metrics(store).column("run_id").to_pylist()) == {"healthy"}
    shutil.rmtree(path)
    again = RolloutStore.open(path, create=True)
    again.append(simulate_run("truncation"))  # the same version numbers as before, other rows
    assert again.version == store.version
    assert set(step_metrics(again).column("run_id").to_pylist()) == {"truncation"}


def test_a_commit_during_the_read_is_not_cached_under_the_old_key(tmp_path, monkeypatch):
    store = RolloutStore.open(tmp_path / "s", create=True)
    store.append(simulate_run("healthy"))
    real = M.metrics_of

    def racing(*a):
        out = real(*a)
        monkeypatch.setattr(M, "metrics_of", real)
        store.append(simulate_run("truncation"))  # lands after the rows were read
        return out

    monkeypatch.setattr(M, "metrics_of", racing)
    got = step_metrics(store)
    assert set(got.column("run_id").to_pylist()) == {"healthy"}  # what it read
    assert set(step_metrics(store).column("run_id").to_pylist()) == {"healthy", "truncation"}


def test_health_report_runs_and_viewer_summary_read_the_rows(tmp_path):
    from fastapi.testclient import TestClient

    from gfcr.diagnose import report
    from gfcr.diagnose.viewer import create_app
    from gfcr.store.provenance import recorded_model as store_model

    store = RolloutStore.open(tmp_path / "s", create=True)
    for b in _batches():
        store.append(b)
    h = run_health_checks(store, decode=False)
    assert h.counts["empty_turn"] >= 1
    assert report.store_runs(store) == sorted(set(store.scan(columns=["run_id"]).column("run_id").to_pylist()))
    got = TestClient(create_app(store.path)).get("/api/summary").json()
    runs = store.sql("SELECT run_id, min(step) AS step_min, max(step) AS step_max, count(*) AS rollouts "
                     "FROM rollouts GROUP BY run_id ORDER BY run_id").to_pylist()
    assert got["runs"] == runs
    assert got["tasks"] == store.sql("SELECT DISTINCT task FROM rollouts ORDER BY task").column("task").to_pylist()
    rs = group("m", 0, "a", [1.0, 0.0, 1.0], [True, False, True])
    for r, m in zip(rs, ["m-b", "m-a", "m-a"], strict=True):
        r.sampling = {"model": m}
    store.append(rs)
    assert store_model(store) == "m-a"


def test_store_check_names_an_old_aggregates_file(tmp_path):
    store = RolloutStore.open(tmp_path / "s", create=True)
    store.append(simulate_run("healthy"))
    r = CliRunner().invoke(app, ["store", "check", str(store.path)])
    assert r.exit_code == 0 and "aggregates" not in r.output, r.output
    (store.path / "aggregates.parquet").write_bytes(b"left by gfcr 0.x")  # the layout of an older store
    r = CliRunner().invoke(app, ["store", "check", str(store.path)])
    assert r.exit_code == 0 and "no longer read or written" in r.output, r.output
    assert step_metrics(store).num_rows > 0


@pytest.mark.parametrize("seed", range(4))
def test_one_steps_own_summary_equals_its_row_in_the_report(tmp_path, seed):
    """What the training loop reports for a step (:func:`summarize` of that step's rows) equals the
    report's row for it on :data:`STEP_COLUMNS`, on random rows (replayed copies, missing rewards
    and verdicts, latencies, trained flags)."""
    rng = np.random.default_rng(seed)
    rows = random_batch(rng, 120)
    store = RolloutStore.open(tmp_path / "s", create=True)
    store.append(rows)
    report = {(r["run_id"], r["step"]): r for r in step_metrics(store).to_pylist()}
    table = rollouts_to_table(rows)
    for key in report:
        mask = [(r.run_id, r.step) == key for r in rows]
        own = summarize(table.filter(mask))
        want = report[key]
        bad = {c: (own[c], want[c]) for c in STEP_COLUMNS
               if not close(own[c], float(want[c]) if want[c] is not None and not isinstance(want[c], int | float) else want[c])}
        assert not bad, (key, bad)
    with pytest.raises(ValueError, match="one \\(run, step\\)"):
        summarize(table)


def test_signal_values_hand_worked_and_against_a_python_walk():
    import pyarrow as pa

    from gfcr.store.stepstats import _signals

    t = pa.array([[("a", 1.0), ("b", 2.0)], [], [("b", 3.0)], None], pa.map_(pa.string(), pa.float64()))
    b, c = _signals(pa.chunked_array([t]), ["b", "c"])
    assert b[0] == 2.0 and b[2] == 3.0 and np.isnan(b[1]) and np.isnan(b[3]) and np.isnan(c).all()
    rng = np.random.default_rng(0)
    rows = [[(str(k), float(rng.integers(5))) for k in rng.choice(["x", "y", "z"], int(rng.integers(0, 4)))]
            for _ in range(300)]
    col = pa.chunked_array([pa.array(rows[:100], pa.map_(pa.string(), pa.float64())),
                            pa.array(rows[100:], pa.map_(pa.string(), pa.float64()))]).slice(7, 250)
    got = _signals(col, ["x", "z"])
    for key, arr in zip(["x", "z"], got, strict=True):
        want = [dict(r).get(key, float("nan")) for r in rows[7:257]]  # (a repeated key: its last value)
        assert np.allclose(arr, want, equal_nan=True), key
