import numpy as np
import pytest

from gfcr.records import table_to_rollouts
from gfcr.store import RolloutStore, StoreError
from gfcr.testing import make_prompt, make_rollout


@pytest.fixture
def store(store_uri):
    """A new store, local and on the loopback S3 server (``store_uri``): the contract tests run on both."""
    return RolloutStore.open(store_uri, create=True)


def test_open_requires_existing_store(tmp_path):
    with pytest.raises(StoreError, match="gfcr store init"):
        RolloutStore.open(tmp_path / "nope")
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "file.txt").write_text("x")
    with pytest.raises(StoreError, match="not a gfcr store"):
        RolloutStore.open(tmp_path / "junk")


def test_append_and_read_back_bit_exact(store):
    rs = [make_rollout(i, step=i % 3, prompt=f"p{i % 2}") for i in range(10)]
    assert store.append(rs) == 10
    back = {r.rollout_id: r for r in store.rollouts()}
    for r in rs:
        b = back[r.rollout_id]
        assert b.token_ids.tobytes() == r.token_ids.tobytes()
        assert b.token_role.tobytes() == r.token_role.tobytes()
        assert b.logprobs.tobytes() == r.logprobs.tobytes()
        assert (b.messages, b.signals, b.verifier, b.sampling, b.meta, b.cost) == (
            r.messages, r.signals, r.verifier, r.sampling, r.meta, r.cost)
        assert b.created_at == r.created_at


def test_duplicates_rejected_and_nothing_written(store):
    rs = [make_rollout(i) for i in range(3)]
    store.append(rs[:2])
    with pytest.raises(StoreError, match="already in the store"):
        store.append(rs[1:])
    assert store.count() == 2
    with pytest.raises(StoreError, match="within the batch"):
        store.append([rs[2], rs[2]])
    assert store.count() == 2


def test_invalid_record_writes_nothing(store):
    bad = make_rollout(1)
    bad.logprobs = bad.logprobs[:-1]
    with pytest.raises(ValueError, match="logprobs"):
        store.append([make_rollout(0), bad])
    assert store.count() == 0


def test_scan_filters(store):
    store.append([make_rollout(i, run="a" if i < 6 else "b", step=i, prompt=f"p{i % 3}", verified=i % 2 == 0,
                               task="arith" if i % 4 else "gsm8k") for i in range(10)])
    assert store.scan(run="a").num_rows == 6
    assert sorted(store.scan(steps=(2, 4), columns=["step"]).column("step").to_pylist()) == [2, 3, 4]
    assert store.scan(verified=True).num_rows == 5
    assert store.scan(prompt_ids=["p0", "p1"]).num_rows == 7
    assert store.scan(task="gsm8k").num_rows == 3
    assert store.scan(where="reward > 0.5 AND step < 3").num_rows == 3
    assert store.scan(run="a", steps=(0, 3), verified=False).num_rows == 2
    assert store.scan(run="o'brien").num_rows == 0  # quoting is safe


def test_get_sample_sql(store):
    rs = [make_rollout(i, step=i) for i in range(20)]
    store.append(rs)
    ids = [rs[5].rollout_id, rs[1].rollout_id]
    assert store.get(ids).column("rollout_id").to_pylist() == ids
    assert store.get(ids, columns=["step"]).column("step").to_pylist() == [5, 1]
    with pytest.raises(KeyError):
        store.get(["missing"])
    s1 = store.sample(7, seed=3).column("rollout_id").to_pylist()
    assert len(set(s1)) == 7 and s1 == store.sample(7, seed=3).column("rollout_id").to_pylist()
    assert set(store.sample(50).column("rollout_id").to_pylist()) == {r.rollout_id for r in rs}
    steps = store.sample(4, where="step >= 15", seed=1).column("step").to_pylist()
    assert len(steps) == 4 and all(s >= 15 for s in steps)
    t = store.sql("SELECT step, len(token_ids) AS n FROM rollouts WHERE step < 3 ORDER BY step")
    assert t.to_pylist() == [{"step": 0, "n": 10}, {"step": 1, "n": 10}, {"step": 2, "n": 10}]
    with pytest.raises(StoreError, match="SQL error"):
        store.sql("SELECT nope FROM rollouts")


def test_stats(store):
    store.append([make_rollout(i, step=i // 2, reward=float(i), verified=i % 2 == 0) for i in range(4)])
    st = store.stats()
    assert st == [
        {"run_id": "run-a", "step": 0, "n_rollouts": 2, "gen_tokens": 12, "reward_mean": 0.5, "verified_rate": 0.5},
        {"run_id": "run-a", "step": 1, "n_rollouts": 2, "gen_tokens": 12, "reward_mean": 2.5, "verified_rate": 0.5},
    ]
    # the report's names and numbers for the same rows (one vocabulary)
    from gfcr.store.stepstats import FEATURE_COLUMNS, summarize

    for row in st:
        m = summarize(store.scan(steps=(row["step"], row["step"]), columns=FEATURE_COLUMNS))
        assert {k: m[k] for k in ("n_rollouts", "gen_tokens", "reward_mean", "verified_rate")} == \
            {k: row[k] for k in ("n_rollouts", "gen_tokens", "reward_mean", "verified_rate")}


def test_update_versions_checkout_compact(store):
    rs = [make_rollout(i) for i in range(4)]
    store.append(rs[:2])
    store.append(rs[2:])
    v = store.version
    r = store.rollouts(prompt_ids=["p0"])[0]
    r.reward, r.verified = -3.0, False
    store.update([r])
    assert store.get([r.rollout_id]).column("reward").to_pylist() == [-3.0]
    old = store.checkout(v)
    assert old.get([r.rollout_id]).column("reward").to_pylist() == [1.0]
    assert old.count() == 4 and store.checkout(2).count() == 2
    with pytest.raises(StoreError, match="read-only"):
        old.append([make_rollout(99)])
    with pytest.raises(StoreError, match="not in the store"):
        store.update([make_rollout(98)])
    n_before = store.count()
    res = store.compact()
    assert res["rollouts"]["fragments_after"] <= res["rollouts"]["fragments_before"]
    assert store.count() == n_before
    assert [x["version"] for x in store.versions()] == sorted(x["version"] for x in store.versions())


def test_prompts_control_state_and_kv(store):
    store.upsert_prompts([make_prompt(f"p{i}", answer=str(i)) for i in range(3)])
    store.set_control("greso", {"p1": {"streak": 2, "last": 5}})
    store.set_control("vade", {"p1": {"a": 2.0, "b": 1.0}})
    # re-registering the task keeps its Control state
    store.upsert_prompts([make_prompt("p1", answer="one")])
    assert store.get_control("greso") == {"p1": {"streak": 2, "last": 5}}
    assert store.get_control("vade") == {"p1": {"a": 2.0, "b": 1.0}}
    assert [p.answer for p in store.prompts(ids=["p1", "p0"])] == ["one", "0"]
    with pytest.raises(StoreError, match="upsert_prompts"):
        store.set_control("greso", {"unknown": {}})
    assert store.get_state("sec") is None
    store.put_state("sec", {"q": [0.1, 0.2]})
    store.put_state("sec", {"q": [0.3]})
    assert store.get_state("sec") == {"q": [0.3]}
    reopened = RolloutStore.open(store.path)
    assert reopened.get_control("greso") == {"p1": {"streak": 2, "last": 5}}


def test_audits_upsert_keyed(store):
    from gfcr.records import Audit

    a = Audit(rollout_id="r1", judge="keep-all", judge_version="1", status="kept", mask=[0, 1, 1])
    store.upsert_audits([a])
    a.status, a.reason = "discarded", "bad"
    store.upsert_audits([a, Audit(rollout_id="r1", judge="keep-all", judge_version="2", status="kept", mask=[1])])
    t = store.audits(judge="keep-all")
    assert t.num_rows == 2
    assert store.audits(judge_version="1").column("status").to_pylist() == ["discarded"]


def test_token_arrays_numpy_roundtrip_large(store):
    rs = [make_rollout(i, n_ctx=100, n_gen=412, seed=7) for i in range(50)]
    store.append(rs)
    back = table_to_rollouts(store.scan())
    got = {r.rollout_id: r for r in back}
    assert all(np.array_equal(got[r.rollout_id].logprobs, r.logprobs) for r in rs)


def test_store_import_needs_no_torch():
    import subprocess
    import sys

    code = ("import sys, gfcr.store, gfcr.formats, gfcr.records; "
            "bad = [m for m in ('torch', 'transformers') if m in sys.modules]; assert not bad, bad")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr


def test_a_store_from_before_a_field_became_nullable_takes_nulls(tmp_path):
    """A store whose rollouts table was created with ``finish_reason`` NOT NULL: the first null
    relaxes the field (one schema commit), then the rows land through the reopened table."""
    import lance
    import pyarrow as pa

    from gfcr.records import ROLLOUT_SCHEMA

    old = pa.schema([f.with_nullable(False) if f.name == "finish_reason" else f for f in ROLLOUT_SCHEMA])
    (tmp_path / "s").mkdir()  # the table as an older gfcr created it; init keeps a table it finds
    lance.write_dataset(pa.Table.from_batches([], schema=old), str(tmp_path / "s" / "rollouts.lance"), mode="create")
    store = RolloutStore.open(tmp_path / "s", create=True)
    assert not store.dataset("rollouts").schema.field("finish_reason").nullable
    rs = [make_rollout(i, finish_reason=None) for i in range(3)] + [make_rollout(3)]
    assert store.append(rs) == 4
    assert store.dataset("rollouts").schema.field("finish_reason").nullable
    assert sorted(store.scan(columns=["finish_reason"]).column(0).to_pylist(), key=str) == [None, None, None, "stop"]
