"""Per-step aggregates kept with the store (:mod:`gfcr.store.aggregates`): after every kind of
write they equal a from-scratch recompute over the rows, a failed write leaves them as they were or
stale (never wrong), and a store without them is rebuilt."""

from __future__ import annotations

import math
from pathlib import Path

import lance
import numpy as np
import pyarrow as pa
import pytest
from diag_helpers import (
    PATHOLOGIES,
    assert_metrics_match,
    audit,
    duckdb_partials,
    group,
    random_batch,
    rollout,
    simulate_run,
)
from typer.testing import CliRunner

from gfcr.cli import app
from gfcr.diagnose.health import run_health_checks
from gfcr.diagnose.metrics import MetricsConfig, step_metrics
from gfcr.records import Message
from gfcr.store import RolloutStore, aggprep, aggregates, smallstats


def _same(a, b, rel: float = 1e-9) -> bool:
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, float) or isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or a == pytest.approx(b, rel=rel, abs=1e-12)
    return a == b


def assert_fresh_and_exact(store: RolloutStore, run: str | None = None) -> None:
    """The aggregates are fresh, and what they give equals a scan of the rows."""
    assert aggregates.state(store)[0] == "fresh", aggregates.state(store)
    got = step_metrics(store, run=run).to_pylist()
    want = step_metrics(store, run=run, use_aggregates=False).to_pylist()
    assert [(r["run_id"], r["step"]) for r in got] == [(r["run_id"], r["step"]) for r in want]
    for g, w in zip(got, want, strict=True):
        bad = {k: (g[k], w[k]) for k in w if not _same(g[k], w[k])}
        assert not bad, (w["run_id"], w["step"], bad)
    hg = run_health_checks(store, run=run, decode=False)
    hw = run_health_checks(store, run=run, decode=False, use_aggregates=False)
    assert hg.counts == hw.counts and hg.checked == hw.checked and hg.skipped == hw.skipped
    key = lambda i: (i.check, i.rollout_id, i.message)  # noqa: E731
    assert sorted(map(key, hg.issues)) == sorted(map(key, hw.issues))
    # and the file itself equals a recompute from the rows
    kept = aggregates.load(store)
    fresh = aggregates.compute(store.dataset("rollouts"))
    assert kept.select(["run_id", "step", "n_rows", "n_pass"]).to_pylist() == \
        fresh.select(["run_id", "step", "n_rows", "n_pass"]).to_pylist()


def _runaway(run: str, step: int, i: int):
    r = rollout(run, step, f"loop{i}", 0.0, gen_len=80, verified=False, finish="length", sample_index=i)
    r.token_ids = np.r_[np.arange(4), np.tile(np.arange(16), 5)].astype(np.int32)
    return r


def _batches() -> list[list]:
    """Appends of a varied store: pathologies, replay copies and annotations, a step split over two
    appends and appended out of order, a step nobody passed (hack judged on the run's median),
    continuous rewards, health faults (runaway, empty turn)."""
    b1 = [r for kind in PATHOLOGIES for r in simulate_run(kind) if r.step < 3]
    b2 = [r for kind in PATHOLOGIES for r in simulate_run(kind) if r.step >= 3]
    b3 = group("mix", 2, "a", [1.0, 0.4, 0.7], [False, False, False])  # nobody passed at step 2
    b3 += group("mix", 2, "b", [0.8, 0.3], [False, False]) + [_runaway("mix", 2, 0)]
    b4 = group("mix", 0, "a", [1.0, 0.6, 0.0, 0.95], [True, False, False, True])
    b4 += [rollout("mix", 0, "y", 1.0, verified=True, meta={"replayed_at_step": [2, 5], "replay_importance_weight": [2.0, 0.5]})]
    b5 = group("mix", 2, "c", [0.85, 0.1], [False, False])  # more rows at step 2: recomputed from the store
    empty = rollout("mix", 1, "e", 0.0, verified=False)
    empty.messages = [Message("user", "q"), Message("assistant", "")]
    b5 += [empty, _runaway("mix", 1, 1)]
    return [b1, b2, b3, b4, b5]


def test_aggregates_equal_a_recompute_after_every_append(tmp_path):
    store = RolloutStore.open(tmp_path / "s", create=True, auto_compact=2)  # compacts as it goes
    assert aggregates.state(store)[0] == "fresh"  # a new store starts with its (empty) aggregates
    assert step_metrics(store).num_rows == 0
    for b in _batches():
        store.append(b)
        assert_fresh_and_exact(store)
    assert store.compactions, "the appends were meant to trigger automatic compaction"
    assert_fresh_and_exact(store, run="mix")
    m = {r["step"]: r for r in step_metrics(store, run="mix").to_pylist()}
    assert m[5]["n_rollouts"] == 0 and m[5]["n_replayed"] == 1  # a step holding only a replay event
    # nobody passed at step 2: its 1.0 failure is judged against the run's passing median (1.0)
    assert m[2]["n_verdicts"] == 8 and m[2]["hack_rate"] == pytest.approx(1 / 8)


def test_aggregates_computed_while_a_batch_is_written_equal_the_serial_ones(tmp_path, monkeypatch):
    """A large batch's aggregate rows are computed in a worker thread during its Lance write
    (:func:`aggprep.prepare`): the file ends as the serial computation leaves it."""
    batches = _batches()
    serial = RolloutStore.open(tmp_path / "a", create=True)
    for b in batches:
        serial.append(b)
    used, orig = [], aggprep.prepare

    def spy(*a):
        f = orig(*a)
        used.append(f is not None)
        return f

    monkeypatch.setattr(aggprep, "PREPARE_MIN_ROWS", 0)  # every batch counts as large
    monkeypatch.setattr(aggprep, "prepare", spy)
    par = RolloutStore.open(tmp_path / "b", create=True)
    for b in batches:
        par.append(b)
        assert_fresh_and_exact(par)
    # b1 to b4 bring only new steps (the worker computes them); b5 adds to a stored step (read back)
    assert used == [True, True, True, True, False]
    assert aggregates.load(par).to_pylist() == aggregates.load(serial).to_pylist()


def test_update_audits_compact_and_checkout(tmp_path):
    store = RolloutStore.open(tmp_path / "s", create=True)
    rs = group("r", 0, "a", [1.0, 0.0], [True, False]) + group("r", 1, "a", [1.0, 1.0], [True, True])
    store.append(rs)
    v = store.version
    rs[0].meta = {"replayed_at_step": 1, "replay_importance_weight": 0.8}  # what the train loop writes
    rs[1].reward = 0.5
    store.update([rs[0], rs[1]])
    assert_fresh_and_exact(store)
    store.upsert_audits([audit(rs[0], [(0, 2, "other")], ter=0.5)])
    assert_fresh_and_exact(store)
    assert step_metrics(store).to_pylist()[0]["n_audited"] == 1
    store.compact()
    assert_fresh_and_exact(store)
    old = store.checkout(v)  # an earlier version: computed from its rows, in memory
    got = step_metrics(old).to_pylist()
    assert [r["reward_mean"] for r in got] == [0.5, 1.0]


def test_after_an_import(tmp_path):
    from gfcr.store.importers import import_rollouts

    fix = Path(__file__).resolve().parents[1] / "contracts" / "fixtures"
    store = RolloutStore.open(tmp_path / "s", create=True)
    import_rollouts(store, "verl", [str(fix / "verl")], run_id="verl")
    import_rollouts(store, "slime", [str(fix / "slime")], run_id="slime", reward_key="score")
    assert_fresh_and_exact(store)


def test_a_failed_append_leaves_both_as_they_were(tmp_path, monkeypatch):
    store = RolloutStore.open(tmp_path / "s", create=True)
    store.append(simulate_run("healthy"))
    before = (store.version, aggregates.read_tag(store.path), aggregates.load(store).to_pylist())

    def full_disk(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(lance, "write_dataset", full_disk)
    with pytest.raises(OSError):
        store.append(simulate_run("truncation"))
    monkeypatch.undo()
    assert (store.version, aggregates.read_tag(store.path), aggregates.load(store).to_pylist()) == before
    assert_fresh_and_exact(store)


def test_a_commit_whose_aggregates_were_not_written_is_stale_and_rebuilt(tmp_path, monkeypatch):
    store = RolloutStore.open(tmp_path / "s", create=True)
    store.append(simulate_run("healthy"))

    def fail(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(aggregates, "write", fail)
    with pytest.warns(RuntimeWarning, match="aggregates were not updated"):
        store.append(simulate_run("truncation"))  # the rows commit; the aggregates cannot follow
    monkeypatch.undo()
    state, detail = aggregates.state(store)
    assert state == "stale" and "rebuilt" in detail
    r = CliRunner().invoke(app, ["store", "check", str(store.path)])
    assert r.exit_code == 0 and "aggregates: stale" in r.output, r.output
    m = step_metrics(store)  # never the old numbers: rebuilt from the rows (and written back)
    assert "truncation" in set(m.column("run_id").to_pylist())
    assert_fresh_and_exact(store)


def test_another_writers_commit_in_between_makes_them_stale_not_wrong(tmp_path):
    store = RolloutStore.open(tmp_path / "s", create=True)
    store.append(simulate_run("healthy"))
    # a writer that does not keep the aggregates (an older gfcr) appends behind this one's back
    from gfcr.records import rollouts_to_table

    lance.write_dataset(rollouts_to_table(simulate_run("zero_reward")), str(store.path / "rollouts.lance"), mode="append")
    store.append(simulate_run("truncation"))  # this commit follows the other one: not applied incrementally
    assert aggregates.state(store)[0] == "stale"
    assert set(step_metrics(store).column("run_id").to_pylist()) == {"healthy", "zero_reward", "truncation"}
    assert_fresh_and_exact(store)


def test_a_store_from_before_the_aggregates_is_rebuilt(tmp_path):
    store = RolloutStore.open(tmp_path / "s", create=True)
    store.append(simulate_run("healthy"))
    (store.path / aggregates.FILE).unlink()  # the layout of a store written before this file existed
    assert aggregates.state(store)[0] == "missing"
    r = CliRunner().invoke(app, ["store", "check", str(store.path)])
    assert r.exit_code == 0 and "aggregates: missing" in r.output, r.output
    step_metrics(store)  # the first read rebuilds and writes it
    assert_fresh_and_exact(store)
    store.append(simulate_run("truncation"))  # and from then on it is kept on append
    assert_fresh_and_exact(store)


def test_a_damaged_aggregates_file_is_rebuilt(tmp_path):
    store = RolloutStore.open(tmp_path / "s", create=True)
    store.append(simulate_run("healthy"))
    (store.path / aggregates.FILE).write_bytes(b"not parquet")
    assert aggregates.state(store)[0] == "missing"
    step_metrics(store)
    assert_fresh_and_exact(store)


def test_other_metrics_configs_scan_the_rows(tmp_path):
    store = RolloutStore.open(tmp_path / "s", create=True)
    store.append(simulate_run("healthy"))
    assert aggregates.config_ok(MetricsConfig(pass_reward=0.5)) and not aggregates.config_ok(MetricsConfig(eps=0.1))
    a = step_metrics(store, config=MetricsConfig(tail_quantile=0.5)).to_pylist()
    b = step_metrics(store, config=MetricsConfig(tail_quantile=0.5), use_aggregates=False).to_pylist()
    assert a == b


def test_median_of_value_counts_hand_worked():
    assert aggregates._median([{"r": 0.5, "n": 1}, {"r": 1.0, "n": 3}]) == 1.0
    assert aggregates._median([{"r": 0.5, "n": 2}, {"r": 1.0, "n": 2}]) == 0.75
    assert aggregates._median([{"r": 0.2, "n": 1}]) == 0.2
    assert aggregates._median([]) is None



def test_the_stores_ngram_count_is_the_early_exits():
    from gfcr.control.groups import tail_ngram_count as control_count
    from gfcr.store.checks import tail_ngram_count

    rng = np.random.default_rng(0)
    for _ in range(200):
        t = rng.integers(0, 3, int(rng.integers(0, 40)))
        n = int(rng.integers(1, 6))
        assert tail_ngram_count(t, n) == control_count(t, n)


def test_report_buckets_and_viewer_summary_from_the_aggregates(tmp_path):
    from fastapi.testclient import TestClient

    from gfcr.diagnose import report
    from gfcr.diagnose.viewer import create_app

    store = RolloutStore.open(tmp_path / "s", create=True)
    for b in _batches():
        store.append(b)
    store.upsert_audits([audit(r, [(0, 2, "other")], ter=0.1 * (i + 1)) for i, r in enumerate(_batches()[2][:3])])
    for run in (None, "mix", "healthy"):
        for n in (1, 3, 10):
            assert report._buckets(store, run, n) == report._pick(store, run, n), (run, n)
    assert report.store_runs(store) == sorted(set(store.scan(columns=["run_id"]).column("run_id").to_pylist()))
    got = TestClient(create_app(store.path)).get("/api/summary").json()
    runs = store.sql("SELECT run_id, min(step) AS step_min, max(step) AS step_max, count(*) AS rollouts "
                     "FROM rollouts GROUP BY run_id ORDER BY run_id").to_pylist()
    assert got["runs"] == runs
    assert got["tasks"] == store.sql("SELECT DISTINCT task FROM rollouts ORDER BY task").column("task").to_pylist()


def test_the_stores_model_from_the_aggregates(tmp_path):
    from gfcr.diagnose.viewer import store_model

    store = RolloutStore.open(tmp_path / "s", create=True)
    rs = group("r", 0, "a", [1.0, 0.0, 1.0], [True, False, True])
    for r, m in zip(rs, ["m-b", "m-a", "m-b"], strict=True):
        r.sampling = {"model": m, "temperature": 1.0}
    store.append(rs)
    more = group("r", 1, "a", [1.0, 0.0], [True, False])
    for r in more:
        r.sampling = {"model": "m-a"}
    store.append(more)
    assert store_model(store) == "m-a"  # 3 rows of m-a (over two steps) against 2 of m-b
    assert (store.path / aggregates.FILE).exists() and aggregates.state(store)[0] == "fresh"


# --- the small-batch path (gfcr.store.smallstats) equals the DuckDB path ---------------------------
@pytest.mark.parametrize("seed", range(13))
def test_the_small_path_equals_duckdb_on_random_batches(seed):
    from gfcr.records import rollouts_to_table
    from gfcr.store import smallstats
    from gfcr.store.stepstats import metrics_of, rollout_features

    rng = np.random.default_rng(seed)
    table = rollouts_to_table(random_batch(rng, 2048 if seed == 12 else int(rng.integers(1, 300))))
    tasks = table.column("task").to_pylist()  # a columnar import may leave a task missing
    table = table.set_column(table.schema.get_field_index("task"), "task",
                             pa.array([None if t == "zeta" else t for t in tasks], pa.string()))
    cfg = MetricsConfig()
    feats, events = rollout_features(table, cfg)
    want = metrics_of(feats, events.slice(0, 0), None, cfg)
    got = smallstats.step_metrics(feats, cfg)
    assert got is not None and got.schema == want.schema
    assert_metrics_match(got, want)
    assert got.num_rows == want.num_rows
    assert smallstats.tops(table) == aggregates._tops(table)
    small = aggregates.partials(table)
    duck = duckdb_partials(table)
    assert small.schema == duck.schema
    assert small.drop_columns(list(want.column_names[2:])).to_pylist() == duck.drop_columns(
        list(want.column_names[2:])).to_pylist()


def test_duckdb_quantile_definition_hand_worked():
    from gfcr.store import smallstats

    # RN = (3 - 1) * 0.95 = 1.9: 2 * (1 - 0.9) + 10 * 0.9; numpy's "linear" rounds this one differently
    assert smallstats.quantile_cont(np.array([1.0, 2.0, 10.0]), 0.95) == pytest.approx(9.2, rel=1e-15)
    # RN = 7 * 0.9 = 6.3, d = 0.2999999999999998: fma(19, 1 - d, 25 * d) = 20.799999999999997 (DuckDB's),
    # where the plain expression gives 20.8
    assert smallstats.quantile_cont(np.array([0, 0, 0, 0, 0, 0, 19.0, 25.0]), 0.9) == 20.799999999999997
    assert smallstats.quantile_cont(np.array([1.0, 3.0]), 0.5) == 2.0
    assert smallstats.quantile_cont(np.array([4.0]), 0.9) == 4.0 and smallstats.quantile_cont(np.array([]), 0.5) is None
    assert smallstats.TOP == aggregates.TOP


def test_what_the_small_path_does_not_decide_goes_to_duckdb():
    from gfcr.records import rollouts_to_table
    from gfcr.store import smallstats

    rs = group("r", 0, "a", [1.0, 0.0], [True, False])
    rs[0].sampling = {"model": 3}  # json_extract_string gives '3': DuckDB's text, not ours
    table = rollouts_to_table(rs)
    assert smallstats.tops(table) is None
    assert aggregates._tops(table)[("r", 0)]["models"] == [{"m": "3", "n": 1}]
    assert aggregates.partials(table).column("models").to_pylist() == [[{"m": "3", "n": 1}]]


def test_fused_multiply_add_rounds_once():
    from fractions import Fraction

    from gfcr.store.smallstats import _fma

    rng = np.random.default_rng(0)
    for a, b, c in rng.normal(size=(500, 3)) * 10.0 ** rng.integers(-3, 4, size=(500, 3)):
        assert _fma(float(a), float(b), float(c)) == float(Fraction(a) * Fraction(b) + Fraction(c))
    assert _fma(0.1, 10.0, -1.0) == 5.551115123125783e-17  # 0.1 * 10 - 1 rounded twice is 0.0


def test_step_keys_equal_pythons_sorted_tuples():
    rng = np.random.default_rng(3)
    names = ["b", "a", "ä", "Z", "a b", "", "日本", "a\x00"]
    runs = [names[i] for i in rng.integers(0, len(names), 3000)]
    steps = rng.integers(-5, 40, 3000).tolist()
    t = pa.table({"run_id": pa.chunked_array([runs[:1000], runs[1000:]]), "step": pa.chunked_array([steps[:1700], steps[1700:]])})
    uniq, inv = smallstats.step_keys(t)
    keys = list(zip(runs, steps, strict=True))
    assert uniq == sorted(set(keys)) and [uniq[i] for i in inv] == keys
    # steps too far apart for one int64 key per (run, step): the 2-D unique, same answer
    wide = pa.table({"run_id": ["b", "a", "b", "a"], "step": [2**62, -(2**62), 5, 2**62]})
    uniq, inv = smallstats.step_keys(wide)
    assert uniq == [("a", -(2**62)), ("a", 2**62), ("b", 5), ("b", 2**62)] and inv.tolist() == [3, 0, 2, 1]


def test_aggregates_prepared_before_the_append_are_used_only_for_that_table(tmp_path, monkeypatch):
    """``prepare_append(t)`` starts the aggregates of ``t`` early (the columnar import upserts its
    prompts meanwhile); ``append(t, ready=...)`` uses them, and ignores those of another table."""
    monkeypatch.setattr(aggprep, "PREPARE_MIN_ROWS", 0)
    from gfcr.records import rollouts_to_table

    b1, b2 = (rollouts_to_table(b) for b in _batches()[:2])
    serial = RolloutStore.open(tmp_path / "a", create=True)
    serial.append(b1)
    serial.append(b2)
    calls, orig = [], aggregates.partials
    monkeypatch.setattr(aggprep, "partials", lambda t: calls.append(t.num_rows) or orig(t))
    early = RolloutStore.open(tmp_path / "b", create=True)
    ready = early.prepare_append(b1)
    assert ready[0] is b1 and ready[1] is not None
    early.append(b1, ready=ready)
    assert calls == [b1.num_rows]  # computed once, before the append, and used
    early.append(b2, ready=ready)  # b1's: not b2's aggregates
    assert calls == [b1.num_rows, b2.num_rows]
    assert_fresh_and_exact(early)
    assert aggregates.load(early).to_pylist() == aggregates.load(serial).to_pylist()

