"""An import split into shares whose writes are staged, committed once (gfcr.formats.staged; the shares
run here in-process, one after another; on Ray: tests/scale/test_ray.py). Local disk and loopback S3."""

import json
import shutil
from pathlib import Path

import pytest

from gfcr.formats import ImportFormatError, dump_files, import_rollouts
from gfcr.formats.staged import commit_import, last_per_id, stage_import
from gfcr.records import PROMPT_SCHEMA
from gfcr.scale.importing import split_files
from gfcr.store import RolloutStore, StoreError

VERL = Path(__file__).parents[1] / "contracts" / "fixtures" / "verl"
PRIME_RL = Path(__file__).parents[1] / "contracts" / "fixtures" / "prime_rl"


def rows(store):
    """Every stored rollout, all columns but the write time, in id order."""
    cols = [c for c in store.dataset("rollouts").schema.names if c != "created_at"]
    return store.scan(columns=cols).sort_by("rollout_id").to_pylist()


def _shares(store, fmt, root, k=2):
    files = dump_files(fmt, [str(root)])
    return [stage_import(store, fmt, [str(f) for f in share], [str(root)]) for share in split_files(files, k)]


def test_two_shares_committed_once_store_what_a_serial_import_stores(store_uri, tmp_path):
    serial = RolloutStore.open(tmp_path / "serial", create=True)
    import_rollouts(serial, "verl", [str(VERL)])
    store = RolloutStore.open(store_uri, create=True)
    v0 = store.version
    parts = _shares(store, "verl", VERL)
    assert len(parts) == 2 and all(p.written for p in parts)
    assert store.count() == 0 and store.version == v0  # staged only
    out = commit_import(store, parts)
    assert out["written"] == serial.count() == store.count() == 8
    assert store.version == v0 + 1  # one rollouts commit
    assert rows(store) == rows(serial)
    assert store.sql("SELECT * EXCLUDE (updated_at) FROM prompts ORDER BY prompt_id").to_pylist() == \
        serial.sql("SELECT * EXCLUDE (updated_at) FROM prompts ORDER BY prompt_id").to_pylist()
    # a re-run skips what is stored (each file unchanged: skipped unread) and commits nothing
    again = commit_import(store, _shares(store, "verl", VERL))
    assert (again["written"], again["skipped"], store.count(), store.version) == (0, 8, 8, v0 + 1)
    assert any("2 file(s) unchanged" in n for n in again["notes"])


def test_a_failing_share_commits_nothing(tmp_path):
    dump = tmp_path / "dump"
    shutil.copytree(VERL, dump)
    (dump / "2.jsonl").write_text((VERL / "2.jsonl").read_text() + "{not json\n")
    store = RolloutStore.open(tmp_path / "st", create=True)
    files = dump_files("verl", [str(dump)])
    good = stage_import(store, "verl", [str(files[0])], [str(dump)])  # one worker stages its rows …
    assert good.written == 4
    with pytest.raises(ImportFormatError, match="2.jsonl"):  # … the other fails: no commit is made
        stage_import(store, "verl", [str(files[1])], [str(dump)])
    assert store.count() == 0 and RolloutStore.open(tmp_path / "st").count() == 0


def test_rows_two_shares_read_or_another_writer_stored_are_refused(tmp_path):
    store = RolloutStore.open(tmp_path / "st", create=True)
    a = stage_import(store, "jsonl", [str(p) for p in _jsonl(tmp_path, "a", 3)], [str(tmp_path)])
    b = stage_import(store, "jsonl", [str(p) for p in _jsonl(tmp_path, "b", 3)], [str(tmp_path)])
    with pytest.raises(StoreError, match="read by two workers.*nothing was committed"):
        commit_import(store, [a, b])  # the same 3 rollouts in two files
    assert store.count() == 0 and store.count("prompts") == 0
    import_rollouts(store, "jsonl", [str(tmp_path / "a.jsonl")])  # another writer stores them first
    with pytest.raises(StoreError, match="stored by another writer.*nothing was committed"):
        commit_import(store, [b])
    assert store.count() == 3


def _jsonl(tmp_path, name, n):
    from gfcr.formats.export import rollout_to_json
    from gfcr.records import rollouts_to_table
    from gfcr.testing import make_rollout

    p = tmp_path / f"{name}.jsonl"
    t = rollouts_to_table([make_rollout(i, rollout_id=f"r{i}") for i in range(n)])
    p.write_text("".join(json.dumps(rollout_to_json(r), default=str) + "\n" for r in t.to_pylist()))
    return [p]


def test_prime_rl_copies_across_shares_and_replacements_are_refused(tmp_path):
    """prime-rl keeps one rollout in all/ and effective/: two shares read it twice (refused, nothing
    committed); a re-import that would replace the stored advantage-less copy is refused in one line."""
    store = RolloutStore.open(tmp_path / "st", create=True)
    files = dump_files("prime-rl", [str(PRIME_RL)])
    parts = [stage_import(store, "prime-rl", [str(f)], [str(PRIME_RL)]) for f in files]
    with pytest.raises(StoreError, match="read by two workers.*gfcr store import"):
        commit_import(store, parts)
    assert store.count() == 0
    import_rollouts(store, "prime-rl", [str(f) for f in files if "/all/" in str(f)], scope_roots=[str(PRIME_RL)])
    before = store.version
    with pytest.raises(StoreError, match="replace stored rollouts.*gfcr store import"):
        stage_import(store, "prime-rl", [str(f) for f in files if "/effective/" in str(f)], [str(PRIME_RL)])
    assert store.version == before


def test_split_files_contiguous_shares_of_about_equal_bytes(tmp_path):
    fs = []
    for i, size in enumerate([10, 10, 10, 10, 40]):
        f = tmp_path / f"{i}.jsonl"
        f.write_bytes(b"x" * size)
        fs.append(f)
    shares = split_files(fs, 2)
    assert [len(s) for s in shares] == [4, 1] and sum(shares, []) == fs
    assert split_files(fs[:4], 2) == [fs[:2], fs[2:4]]
    assert [len(s) for s in split_files(fs[:3], 5)] == [1, 1, 1]
    assert split_files(fs[:1], 3) == [fs[:1]]


def test_last_per_id_keeps_the_last_copy():
    import pyarrow as pa

    t = pa.Table.from_pylist([{"prompt_id": p} for p in "aba"])
    assert last_per_id(t).column("prompt_id").to_pylist() == ["b", "a"]
    assert "prompt_id" in PROMPT_SCHEMA.names


@pytest.mark.parametrize("store_uri", ["s3", "az"], indirect=True)  # (on local disk the import lock serialises them)
def test_two_racing_staged_imports_of_one_dump_store_each_rollout_once(store_uri, monkeypatch):
    """Two staged imports of one dump check the store before either commits (no lock on object storage):
    the one that commits second drops its copies, says so, and each rollout is stored once."""
    import lance

    store, other = RolloutStore.open(store_uri, create=True), RolloutStore.open(store_uri)
    mine, theirs = _shares(store, "verl", VERL), _shares(other, "verl", VERL)
    real = lance.LanceDataset.commit
    first: list = []

    def racing(*a, **kw):  # as this import commits its rollouts, the other one commits first
        if not first:
            first.append(None)
            first[0] = commit_import(other, theirs)
        return real(*a, **kw)

    monkeypatch.setattr(lance.LanceDataset, "commit", staticmethod(racing))
    out = commit_import(store, mine)
    assert first[0]["written"] == 8 and (out["written"], out["skipped"]) == (0, 8)
    assert any("8 rollout(s) were committed by a racing import first" in n for n in out["notes"])
    ids = RolloutStore.open(store_uri).scan(columns=["rollout_id"]).column(0).to_pylist()
    assert len(ids) == 8 == len(set(ids))
