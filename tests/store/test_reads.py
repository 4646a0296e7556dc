"""Random-row reads (RolloutStore.get / sample) stay exact across appends, automatic compaction,
updates (which delete the old rows), deletions, compact() with its rollout_id index, and checkouts.

The oracle is a full scan of the table (a different read path: no row ids, no index)."""

import lance
import numpy as np
import pytest

from gfcr.store import RolloutStore
from gfcr.testing import make_rollout


def _batch(b, size):
    return [make_rollout(i, step=b, run="r", n_ctx=3, n_gen=2 + (i + b) % 7, seed=b, reward=float(b),
                         rollout_id=f"b{b}-{i}") for i in range(size)]


def _by_id(store):
    return {r["rollout_id"]: r for r in store.scan().to_pylist()}


def _check_reads(store, rng, n=12):
    """get() of a shuffled subset (with a repeat) and sample() both return exactly the scanned rows."""
    rows = _by_id(store)
    ids = list(rows)
    pick = [ids[k] for k in rng.choice(len(ids), size=min(n, len(ids)), replace=False)]
    pick.append(pick[0])  # a repeated id comes back twice, in place
    assert store.get(pick).to_pylist() == [rows[i] for i in pick]
    got = store.get(pick, columns=["reward", "token_ids"]).to_pylist()
    assert got == [{"reward": rows[i]["reward"], "token_ids": rows[i]["token_ids"]} for i in pick]
    s = store.sample(n, seed=int(rng.integers(1 << 30))).to_pylist()
    assert len(s) == min(n, len(ids)) and len({r["rollout_id"] for r in s}) == len(s)
    assert all(r == rows[r["rollout_id"]] for r in s)
    every = store.sample(len(ids) + 5).to_pylist()
    assert sorted(r["rollout_id"] for r in every) == sorted(ids)
    return rows


@pytest.fixture
def store(store_uri):
    """A new store, local and on the loopback S3 server (the contract tests run on both)."""
    return RolloutStore.open(store_uri, create=True)


def test_reads_exact_through_appends_compaction_updates_deletes(store_uri):
    rng = np.random.default_rng(0)
    store = RolloutStore.open(store_uri, create=True, auto_compact=3)
    for b in range(9):  # small commits: automatic compaction rewrites some of them
        store.append(_batch(b, 2 + b % 4))
    assert store.compactions, "the store should have merged fragments by now"
    _check_reads(store, rng)

    v_before = store.version
    r = store.rollouts(where="rollout_id = 'b3-1'")[0]
    r.reward = -7.0
    store.update([r])  # the old row is deleted, the new one appended
    rows = _check_reads(store, rng)
    assert rows["b3-1"]["reward"] == -7.0 and store.get(["b3-1"]).column("reward").to_pylist() == [-7.0]
    assert store.checkout(v_before).get(["b3-1"]).column("reward").to_pylist() == [3.0]

    res = store.compact()
    assert res["rollouts"]["index"] == "rollout_id (BTREE)"
    ds = store.dataset("rollouts")
    assert [(d.field_names, "BTree" in d.type_url) for d in ds.describe_indices()] == [(["rollout_id"], True)]
    plan = ds.scanner(columns=["rollout_id"], filter="rollout_id IN ('b1-0', 'b2-1')", with_row_id=True).explain_plan()
    assert "ScalarIndexQuery" in plan  # get()'s look-up goes through the index
    _check_reads(store, rng)

    for b in range(9, 14):  # rows the index has not seen; automatic compaction merges some of them
        store.append(_batch(b, 2))
    r = store.rollouts(where="rollout_id = 'b0-0'")[0]
    r.reward = 42.0
    store.update([r])  # an indexed row replaced after the index was built
    rows = _check_reads(store, rng)
    assert rows["b0-0"]["reward"] == 42.0 and "b13-1" in rows
    assert store.get(["b13-1", "b0-0"]).column("reward").to_pylist() == [13.0, 42.0]

    store.dataset("rollouts").delete("step = 5")  # deletion vectors
    rows = _check_reads(store, rng)
    assert not any(k.startswith("b5-") for k in rows)
    with pytest.raises(KeyError, match="not in the store"):
        store.get(["b1-0", "b5-0"])


def test_get_edge_cases(store):
    store.append(_batch(0, 5))
    assert store.get([]).num_rows == 0
    assert store.get([], columns=["reward"]).column_names == ["reward"]
    assert store.get(["b0-4", "b0-2"], columns=["step", "rollout_id"]).column_names == ["step", "rollout_id"]
    with pytest.raises(KeyError, match="1 rollout id"):
        store.get(["b0-1", "nope"])
    store.compact()
    assert store.get(["b0-4", "b0-0"]).column("rollout_id").to_pylist() == ["b0-4", "b0-0"]


@pytest.mark.parametrize("n_keys", [3, 2500])
def test_rows_in_is_the_in_list_filter_for_short_and_long_key_lists(tmp_path, n_keys, monkeypatch):
    """Long key lists are matched with Arrow's is_in after the read (an SQL IN list of thousands of
    ids is slow to parse): the same rows, order, columns and ``where`` as the IN-list filter."""
    import pyarrow as pa

    from gfcr.store import reads

    t = pa.table({"prompt_id": [f"p{i}" for i in range(3000)], "task": ["a", "b", "c"] * 1000,
                  "control": [str(i) for i in range(3000)]})
    ds = lance.write_dataset(t, str(tmp_path / "p.lance"))
    rng = np.random.default_rng(n_keys)
    keys = [f"p{i}" for i in rng.choice(3200, size=n_keys, replace=False)]  # some not stored
    for columns, where in ((None, None), (["control"], "task = 'b'"), (["task", "prompt_id"], None)):
        got = reads.rows_in(ds, "prompt_id", keys, columns, where)
        monkeypatch.setattr(reads, "IN_LIST_MAX", 10**9)  # the IN-list path as the oracle
        want = reads.rows_in(ds, "prompt_id", keys, columns, where)
        monkeypatch.undo()
        assert got.column_names == want.column_names and got.to_pylist() == want.to_pylist()
        assert want.num_rows > 0
    assert reads.rows_in(ds, "prompt_id", None, ["task"]).num_rows == 3000
