"""The numpy summaries of a large batch (sample buckets in gfcr.store.buckets, metrics in
gfcr.store.smallstats) equal DuckDB's queries over the same rows."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from diag_helpers import assert_metrics_match, close, duckdb_partials, group, random_batch

from gfcr.diagnose.metrics import MetricsConfig
from gfcr.records import rollouts_to_table
from gfcr.store import aggregates, buckets, smallstats
from gfcr.store.stepstats import metrics_of, rollout_features


def _batch(seed: int, n: int, steps: int, infinite: bool = True) -> pa.Table:
    """:func:`random_batch` rows spread over ``steps`` steps, with rewards that tie a lot, are
    missing, signed zeros or (``infinite``) infinite, and tasks sometimes missing."""
    rng = np.random.default_rng(seed)
    t = rollouts_to_table(random_batch(rng, n))
    pool = np.array([0.0, -0.0, 1.0, 1.0, 1.0, -1.0, 0.5] + ([np.inf, -np.inf] if infinite else []), np.float64)
    r = pool[rng.integers(len(pool), size=n)]
    missing = rng.random(n) < 0.05
    t = t.set_column(t.schema.get_field_index("reward"), "reward", pa.array(r, pa.float64(), mask=missing))
    t = t.set_column(t.schema.get_field_index("step"), "step", pa.array(rng.integers(steps, size=n), pa.int64()))
    tasks = [None if x == "zeta" else x for x in t.column("task").to_pylist()]
    return t.set_column(t.schema.get_field_index("task"), "task", pa.array(tasks, pa.string()))


def test_worked_example_ties_broken_by_id():
    rs = group("r", 0, "g", [1.0, 1.0, 0.0])
    for r, rid in zip(rs, ["b", "a", "c"], strict=True):
        r.rollout_id = rid
    t = rollouts_to_table(rs)
    keys, inv = smallstats.step_keys(t)
    got = buckets.tops(t, keys, inv)[("r", 0)]
    assert [x["id"] for x in got["best"]] == ["a", "b", "c"]
    assert [x["id"] for x in got["worst"]] == ["c", "b", "a"]
    assert got == aggregates._tops(t)[("r", 0)]


@pytest.mark.parametrize(("seed", "n", "steps"), [(0, 3000, 4), (1, 5000, 1), (2, 2600, 300), (3, 4000, 40),
                                                  (4, 150, 70), (5, 2500, 2500)])
def test_buckets_equal_duckdb(seed, n, steps):
    t = _batch(seed, n, steps)
    keys, inv = smallstats.step_keys(t)
    want = aggregates._tops(t)
    assert buckets.tops(t, keys, inv) == want
    if n <= smallstats.MAX_ROWS:
        assert smallstats.tops(t) == want


@pytest.mark.parametrize("seed", range(3))
def test_large_batch_metrics_equal_duckdb(seed):
    t = _batch(seed, 4000 + 500 * seed, 3 + seed, infinite=False)
    cfg = MetricsConfig()
    feats, events = rollout_features(t, cfg)
    want = metrics_of(feats, events.slice(0, 0), None, cfg)
    got = smallstats.step_metrics(feats, cfg)
    assert got is not None and got.schema == want.schema and got.num_rows == want.num_rows
    assert_metrics_match(got, want, nan_ok=True)
    # the whole aggregate row: buckets, counts and health exactly, metrics to the last bits
    ours, duck = aggregates.partials(t), duckdb_partials(t)
    assert ours.schema == duck.schema
    metric = list(want.column_names[2:])
    assert ours.drop_columns(metric).to_pylist() == duck.drop_columns(metric).to_pylist()
    # infinite rewards: the metrics come from DuckDB (its NaN rules), the buckets still from numpy
    inf = _batch(seed, 3000, 3)
    assert smallstats.step_metrics(rollout_features(inf, cfg)[0], cfg) is None
    ours, duck = aggregates.partials(inf), duckdb_partials(inf)
    assert ours.drop_columns(metric).to_pylist() == duck.drop_columns(metric).to_pylist()
    # (close, not equal: DuckDB's threads add in their own order)
    for g, w in zip(ours.select(metric).to_pylist(), duck.select(metric).to_pylist(), strict=True):
        assert all(close(g[k], w[k]) or (g[k] != g[k] and w[k] != w[k]) for k in metric), (g, w)


def test_what_buckets_do_not_decide_goes_to_duckdb(monkeypatch):
    t = _batch(7, 3000, 3)
    keys, inv = smallstats.step_keys(t)
    nan = t.set_column(t.schema.get_field_index("reward"), "reward", pa.array([float("nan")] * t.num_rows))
    assert buckets.tops(nan, keys, inv) is None
    odd = t.set_column(t.schema.get_field_index("sampling"), "sampling", pa.array(['{"model": 3}'] * t.num_rows))
    assert buckets.tops(odd, keys, inv) is None
    assert aggregates.partials(odd).column("models").to_pylist()[0] == [{"m": "3", "n": int((inv == 0).sum())}]
    # a batch of more steps than NUMPY_STEPS never reaches the per-step loops
    many = _batch(8, 3000, aggregates.NUMPY_STEPS * 4)
    assert len(smallstats.step_keys(many)[0]) > aggregates.NUMPY_STEPS

    def boom(*a, **k):
        raise AssertionError("per-step numpy path used for a batch of many steps")

    monkeypatch.setattr(buckets, "tops", boom)
    monkeypatch.setattr(smallstats, "step_metrics", boom)
    assert aggregates.partials(many).num_rows == len(smallstats.step_keys(many)[0])
