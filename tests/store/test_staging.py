"""Staged writes (gfcr.store.staging): writers write data files without committing, one commit makes many
writers' batches visible. On local disk and on the loopback S3 server (the ``store_uri`` fixture)."""

import subprocess
import sys

import lance
import pytest

from gfcr.store import RolloutStore, StoreError
from gfcr.store.staging import BatchedWriter, Staged
from gfcr.testing import make_rollout

# a writer process: stages its batches (no commit) and prints each as JSON for the committer
STAGER = r"""
import sys
from gfcr.store import RolloutStore
from gfcr.testing import make_rollout
uri, tag, batches, size = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
store = RolloutStore.open(uri)
for b in range(batches):
    s = store.stage([make_rollout(i, step=b, run=tag, n_ctx=8, n_gen=16, seed=b, rollout_id=f"{tag}-{b}-{i}")
                     for i in range(size)], check_existing=False)
    print(s.to_json(), flush=True)
"""


def _batch(tag, n, step=0):
    return [make_rollout(i, step=step, run=tag, rollout_id=f"{tag}-{i}") for i in range(n)]


def _txn(store):
    ds = store.dataset("rollouts")
    return ds.read_transaction(ds.version).transaction_properties or {}


def test_writer_processes_stage_and_one_commit_makes_all_visible(store_uri):
    uri = str(store_uri)
    store = RolloutStore.open(uri, create=True, auto_compact=0)  # (a merge of the 9 new fragments adds a version)
    v0 = store.version
    procs = [subprocess.Popen([sys.executable, "-c", STAGER, uri, f"w{k}", "3", "5"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for k in range(3)]
    staged = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-2000:]
        staged += [Staged.from_json(line) for line in out.splitlines()]
    assert len(staged) == 9
    assert store.count() == 0 and store.version == v0  # staged, not visible
    store.append(_batch("plain", 4))  # a plain append lands between the stages and the commit
    assert store.commit_staged(staged) == 45
    ids = store.scan(columns=["rollout_id"]).column("rollout_id").to_pylist()
    assert len(ids) == len(set(ids)) == 49 == store.count()
    assert set(ids) == {f"w{k}-{b}-{i}" for k in range(3) for b in range(3) for i in range(5)} | {
        f"plain-{i}" for i in range(4)}
    assert store.version == v0 + 2  # the plain append, then one commit for the 9 staged batches
    props = _txn(store)
    assert props["gfcr.rows"] == "45" and props["gfcr.staged"] == "9"
    RolloutStore.open(uri)  # opens, its integrity checks pass (local: the commit was recorded)


def test_a_staged_batch_never_committed_is_invisible(store_uri):
    store = RolloutStore.open(store_uri, create=True)
    lost = store.stage(_batch("lost", 6))
    kept = store.stage(_batch("kept", 3))
    assert store.commit_staged([kept]) == 3
    again = RolloutStore.open(store_uri)
    assert again.count() == 3
    assert set(again.scan(columns=["rollout_id"]).column(0).to_pylist()) == {f"kept-{i}" for i in range(3)}
    assert len(lost.fragments) == 1 and lost.rows == 6
    # the full check reads every fragment of every version: the unreferenced files are not the store's
    from gfcr.store import TABLES
    from gfcr.store.integrity import check_store
    from gfcr.store.opening import check_remote

    rep = check_store(store.path, list(TABLES)) if store.local else check_remote(store.location, TABLES)
    assert rep.ok, rep.all_problems
    assert sum(t.rows for t in rep.tables if t.name == "rollouts") == 3


def test_commit_refuses_repeated_or_stored_ids_and_commits_nothing(store_uri):
    store = RolloutStore.open(store_uri, create=True)
    store.append(_batch("a", 2))
    v = store.version
    one, two = store.stage(_batch("b", 3)), store.stage(_batch("b", 3))
    with pytest.raises(StoreError, match="is in two staged batches"):
        store.commit_staged([one, two])
    assert store.version == v and store.count() == 2
    late = store.stage(_batch("c", 2))
    store.append(_batch("c", 1))  # another writer stored c-0 after it was staged
    v = store.version
    with pytest.raises(StoreError, match="already in the store .*'c-0'.*nothing was committed"):
        store.commit_staged([late])
    assert store.version == v and store.count() == 3
    with pytest.raises(StoreError, match="already in the store"):  # stage checks too, writing nothing
        store.stage(_batch("a", 1))
    with pytest.raises(StoreError, match="duplicate rollout_id"):
        store.stage(_batch("d", 2) + _batch("d", 1))


def test_a_commit_that_loses_to_a_plain_append_is_retried(store_uri, monkeypatch):
    store = RolloutStore.open(store_uri, create=True)
    other = RolloutStore.open(store_uri)
    staged = store.stage(_batch("s", 5))
    real = lance.LanceDataset.commit
    calls = []

    def racing(*a, **kw):  # the first try: another writer commits first and the commit is refused
        calls.append(1)
        if len(calls) == 1:
            other.append(_batch("p", 2))
            from lance.commit import CommitConflictError

            raise CommitConflictError("Retryable commit conflict for version 2: raced")
        return real(*a, **kw)

    monkeypatch.setattr(lance.LanceDataset, "commit", staticmethod(racing))
    assert store.commit_staged([staged]) == 5
    assert len(calls) == 2
    ids = store.scan(columns=["rollout_id"]).column(0).to_pylist()
    assert sorted(ids) == sorted([f"s-{i}" for i in range(5)] + ["p-0", "p-1"])


def test_batched_writer_commits_every_n_batches_and_flushes(tmp_path):
    store = RolloutStore.open(tmp_path / "st", create=True, auto_compact=0)
    v0 = store.version
    with BatchedWriter(store, max_batches=4, max_seconds=3600) as w:
        for b in range(10):
            w.write(_batch(f"b{b}", 3))
            assert store.count() == 3 * 4 * ((b + 1) // 4)  # visible only at each 4th batch
    assert (w.commits, w.committed, store.count()) == (3, 30, 30)
    assert store.version == v0 + 3
    with pytest.raises(RuntimeError, match="boom"), BatchedWriter(store, max_batches=100) as w2:
        w2.write(_batch("x", 2))
        raise RuntimeError("boom")
    assert store.count() == 30 and len(w2.pending) == 1  # after an error: nothing committed
    with pytest.raises(StoreError, match="max_batches"):
        BatchedWriter(store, max_batches=0)


def test_lances_cleanup_removes_a_batch_never_committed_only_when_asked(tmp_path):
    """docs/store.md's cleanup: Lance keeps unreferenced files younger than 7 days unless told."""
    from datetime import timedelta

    store = RolloutStore.open(tmp_path / "st", create=True)
    store.append(_batch("k", 3))
    lost = store.stage(_batch("l", 3))
    f = tmp_path / "st" / "rollouts.lance" / "data" / lost.fragments[0]["files"][0]["path"]
    assert f.exists()
    store.dataset("rollouts").cleanup_old_versions(older_than=timedelta(days=1))
    assert f.exists()  # a batch staged a moment ago is never deleted under its committer
    store.dataset("rollouts").cleanup_old_versions(older_than=timedelta(0), delete_unverified=True)
    assert not f.exists() and RolloutStore.open(tmp_path / "st").count() == 3


def test_two_racing_commits_of_overlapping_ids_leave_one_copy_of_each(store_uri, monkeypatch):
    """Two committers stage overlapping batches and both pass their id check before either commits
    (another process's commit lands while this one is committing): Lance's Append commits do not
    conflict, so both land; the later one then drops its copies of the ids the earlier one added."""
    store = RolloutStore.open(store_uri, create=True)
    other = RolloutStore.open(store_uri)
    store.append(_batch("old", 2))
    mine = store.stage(_batch("x", 6))                                     # x-0 … x-5
    theirs = other.stage(_batch("x", 3) + _batch("y", 2), check_existing=False)  # x-0 … x-2 and y-0, y-1
    real = lance.LanceDataset.commit
    raced = []

    def racing(*a, **kw):  # the first try of `store`'s commit: the other committer commits first
        if not raced:
            raced.append(None)
            raced[0] = other.commit_staged([theirs])
        return real(*a, **kw)

    monkeypatch.setattr(lance.LanceDataset, "commit", staticmethod(racing))
    assert store.commit_staged([mine]) == 3  # x-3 … x-5: its copies of x-0 … x-2 were dropped
    assert raced == [5]
    ids = RolloutStore.open(store_uri).scan(columns=["rollout_id"]).column(0).to_pylist()
    assert sorted(ids) == sorted([f"old-{i}" for i in range(2)] + [f"x-{i}" for i in range(6)] + ["y-0", "y-1"])
    ds = RolloutStore.open(store_uri).dataset("rollouts")
    t = ds.read_transaction(ds.version)  # the follow-up commit says what it dropped
    assert t.transaction_properties["gfcr.dropped_raced"] == "3"


# a committer process: stages and commits the same batches as the others (the same ids), one commit each
RACER = r"""
import json, sys
from gfcr.store import RolloutStore, StoreError
from gfcr.testing import make_rollout
uri, tag, batches, size = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
store, kept, refused = RolloutStore.open(uri), 0, 0
for b in range(batches):
    s = store.stage([make_rollout(i, step=b, n_ctx=8, n_gen=16, seed=b, rollout_id=f"r{b}-{i}") for i in range(size)],
                    check_existing=False)
    try:
        kept += store.commit_staged([s])
    except StoreError as e:
        assert "already in the store" in str(e), e
        refused += 1
print(json.dumps({"kept": kept, "refused": refused}))
"""


def test_processes_committing_the_same_staged_rows_at_once_store_each_once(store_uri):
    """3 processes stage and commit the same 6 batches of 4 rollouts, racing: every rollout is stored
    once, and the rows the processes say they kept add up to exactly the rows stored."""
    import json

    uri = str(store_uri)
    RolloutStore.open(uri, create=True)
    procs = [subprocess.Popen([sys.executable, "-c", RACER, uri, f"c{k}", "6", "4"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for k in range(3)]
    outs = [p.communicate(timeout=240) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], [e for _, e in outs]
    ids = RolloutStore.open(uri).scan(columns=["rollout_id"]).column(0).to_pylist()
    assert sorted(ids) == sorted(f"r{b}-{i}" for b in range(6) for i in range(4))
    assert sum(json.loads(o)["kept"] for o, _ in outs) == 24


def test_check_names_rows_a_racing_commit_left_doubled(store_uri, monkeypatch):
    """A committer that stops between its Append and the follow-up commit that drops its copies (here:
    the follow-up never runs) leaves rows stored twice: `gfcr store check` names them."""
    import gfcr.store.staging as staging
    from gfcr.store import TABLES
    from gfcr.store.integrity import check_store
    from gfcr.store.opening import check_remote

    store, other = RolloutStore.open(store_uri, create=True), RolloutStore.open(store_uri)
    mine, theirs = store.stage(_batch("x", 3)), other.stage(_batch("x", 2), check_existing=False)
    real, raced = lance.LanceDataset.commit, []

    def racing(*a, **kw):
        if not raced:
            raced.append(None)
            raced[0] = other.commit_staged([theirs])
        return real(*a, **kw)

    monkeypatch.setattr(lance.LanceDataset, "commit", staticmethod(racing))
    monkeypatch.setattr(staging, "drop_raced_copies", lambda latest, before, mine, *a: (mine, set()))
    store.commit_staged([mine])
    rep = check_store(store.path, list(TABLES)) if store.local else check_remote(store.location, TABLES)
    assert not rep.ok and any("2 rollout_id(s) stored more than once (e.g. 'x-0')" in p for p in rep.all_problems)
