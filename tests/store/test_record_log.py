"""The commit record log (issue 44): an append's record is one line appended to ``gfcr-store.log``
instead of a rewrite of ``gfcr-store.json``; readers apply the log's records to the manifest.

What must hold: every recorded version and digest reads back through the log (so a deleted newest
version manifest is still refused); a line a stopped writer left half-written is not a record and is
cut off by the next writer; a whole line that is not a record is damage, named; a log left from before
a rewrite of ``gfcr-store.json`` (a stop between its two renames) is ignored; the log is folded into
``gfcr-store.json`` once it holds ``LOG_MAX`` records."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import lance
import pytest

from gfcr.store import RolloutStore, integrity
from gfcr.store.core import TABLES
from gfcr.store.errors import StoreDamaged
from gfcr.store.integrity import LOG, MANIFEST, check_store, version_files
from gfcr.testing import make_rollout


def _store(p: Path, batches: int, auto_compact: int = 0) -> RolloutStore:
    s = RolloutStore.open(p, create=True, auto_compact=auto_compact)
    for b in range(batches):
        s.append([make_rollout(100 * b + i, step=b) for i in range(4)])
    return s


def _lines(p: Path) -> list[bytes]:
    return (p / LOG).read_bytes().splitlines(keepends=True)


def test_an_append_records_one_log_line_and_leaves_the_manifest_file_alone(tmp_path):
    p = tmp_path / "st"
    s = _store(p, 1)
    snap, n = (p / MANIFEST).read_bytes(), len(_lines(p))
    s.append([make_rollout(900 + i, step=9) for i in range(4)])
    assert (p / MANIFEST).read_bytes() == snap
    lines = _lines(p)
    assert len(lines) == n + 1 and lines[-1].endswith(b"\n")
    rec = json.loads(lines[-1])
    ds = lance.dataset(str(p / "rollouts.lance"))
    new = ds.get_fragments()[-1].metadata.files[0].path
    assert (rec["table"], rec["version"], rec["rows"]) == ("rollouts", ds.version, 8)
    assert list(rec["files"]) == [f"rollouts.lance/data/{new}"]
    m = RolloutStore.open(p).manifest
    assert m["committed"]["rollouts"] == {"version": ds.version, "rows": 8}
    assert integrity.read_manifest(p)["files"][f"rollouts.lance/data/{new}"] == rec["files"][f"rollouts.lance/data/{new}"]
    assert check_store(p, list(TABLES)).ok


def test_a_deleted_newest_version_manifest_recorded_only_in_the_log_is_refused(tmp_path):
    p = tmp_path / "st"
    _store(p, 3)
    assert json.loads((p / MANIFEST).read_text())["committed"]["rollouts"]["version"] < lance.dataset(
        str(p / "rollouts.lance")).version  # the newest version is recorded in the log only
    vf = version_files(p / "rollouts.lance")
    vf[max(vf)].unlink()
    with pytest.raises(StoreDamaged, match="roll the table back"):
        RolloutStore.open(p)


def test_a_half_written_last_line_is_not_a_record_and_the_next_writer_cuts_it_off(tmp_path):
    p = tmp_path / "st"
    s = _store(p, 2)
    before = integrity.read_manifest(p)
    with open(p / LOG, "ab") as fh:
        fh.write(b'{"table": "rollouts", "version": 99, "ro')  # a writer stopped mid-line
    assert integrity.read_manifest(p) == before
    assert RolloutStore.open(p).count() == 8
    s.append([make_rollout(900 + i, step=9) for i in range(4)])
    lines = _lines(p)
    assert all(x.endswith(b"\n") for x in lines) and all(isinstance(json.loads(x), dict) for x in lines)
    assert integrity.read_manifest(p)["committed"]["rollouts"]["version"] == s.version
    assert check_store(p, list(TABLES)).ok


def test_a_whole_line_that_is_not_a_record_is_damage_named_and_accept_repairs_it(tmp_path):
    p = tmp_path / "st"
    _store(p, 2)
    lines = _lines(p)
    lines[1] = b'{"table": "rollouts", "versio\n'
    (p / LOG).write_bytes(b"".join(lines))
    with pytest.raises(StoreDamaged, match=rf"{LOG} is damaged \(a line between bytes"):
        RolloutStore.open(p)
    rep = check_store(p, list(TABLES))
    assert not rep.ok and any(LOG in x for x in rep.all_problems)
    integrity.accept(p, list(TABLES), integrity.new_manifest(list(TABLES)))
    assert RolloutStore.open(p).count() == 8 and check_store(p, list(TABLES)).ok


def test_a_log_cut_at_any_length_loses_only_its_last_records(tmp_path):
    """A cut inside a record line reads as if that record was never written ("Lance is ahead", as
    after a writer killed between its commit and its record); a cut inside the header is damage."""
    base = tmp_path / "base"
    _store(base, 4)
    size, head = (base / LOG).stat().st_size, len(_lines(base)[0])
    full = integrity.read_manifest(base)["committed"]["rollouts"]["version"]
    for frac in (0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99):
        p = tmp_path / f"cut-{frac}"
        shutil.copytree(base, p)
        os.truncate(p / LOG, int(size * frac))
        if int(size * frac) < head:
            with pytest.raises(StoreDamaged, match=LOG):
                RolloutStore.open(p)
            continue
        s = RolloutStore.open(p)
        assert s.count() == 16 and s.manifest["committed"]["rollouts"]["version"] <= full
        assert check_store(p, list(TABLES)).ok
        s.append([make_rollout(900 + i, step=9) for i in range(4)])
        assert check_store(p, list(TABLES)).ok


def test_a_log_of_an_earlier_manifest_is_ignored(tmp_path):
    """A stop between gfcr-store.json's rename and the new log's leaves the old log: its records are
    already in the new gfcr-store.json, and they are not applied again."""
    p = tmp_path / "st"
    s = _store(p, 2)
    old_log = (p / LOG).read_bytes()
    integrity.write_manifest(p, integrity.read_manifest(p))
    (p / LOG).write_bytes(old_log + json.dumps({"table": "rollouts", "version": 999, "rows": 1, "files": {}}).encode()
                          + b"\n")
    assert integrity.read_manifest(p)["committed"]["rollouts"]["version"] == s.version
    s.append([make_rollout(900 + i, step=9) for i in range(4)])
    assert integrity.read_manifest(p)["committed"]["rollouts"]["version"] == s.version
    assert check_store(p, list(TABLES)).ok


def test_the_log_is_folded_into_the_manifest_file_after_log_max_records(tmp_path, monkeypatch):
    monkeypatch.setattr(integrity, "LOG_MAX", 3)
    p = tmp_path / "st"
    s = _store(p, 3)
    snap = (p / MANIFEST).read_bytes()
    assert len(_lines(p)) == 4  # the header and three records
    s.append([make_rollout(900 + i, step=9) for i in range(4)])
    assert (p / MANIFEST).read_bytes() != snap and len(_lines(p)) == 1
    m = json.loads((p / MANIFEST).read_text())
    ds = lance.dataset(str(p / "rollouts.lance"))
    full: dict = {}
    integrity.record_digests(p, "rollouts", ds, full)
    assert m["committed"]["rollouts"]["version"] == ds.version
    assert {k: v for k, v in m["files"].items() if k.startswith("rollouts.lance/")} == full
    assert integrity.read_manifest(p) == m


def test_two_store_objects_in_one_process_keep_every_record(tmp_path):
    """Each writer reads the log's lines the other appended since its last record (no record lost,
    none applied twice), and the cached write head of one notices the other's commit."""
    p = tmp_path / "st"
    a = _store(p, 1)
    b = RolloutStore.open(p, auto_compact=0)
    for k in range(6):
        (a if k % 2 else b).append([make_rollout(1000 * (k + 1) + i, step=k) for i in range(4)])
    m = integrity.read_manifest(p)
    ds = lance.dataset(str(p / "rollouts.lance"))
    assert m["committed"]["rollouts"] == {"version": ds.version, "rows": 28} and ds.count_rows() == 28
    data = {f"rollouts.lance/data/{f.metadata.files[0].path}" for f in ds.get_fragments()}
    assert data <= set(m["files"])
    assert check_store(p, list(TABLES)).ok


def test_a_log_cut_shorter_than_a_writer_last_saw_is_read_whole_again(tmp_path):
    """A writer reads only the log's bytes past its last record; when the log changed under them (cut
    or rewritten by hand), it reads the log whole again instead of reading from the middle of a line."""
    p = tmp_path / "st"
    s = _store(p, 4)
    lines = _lines(p)
    rec = json.loads(lines[2])
    rec["pad"] = "x" * sum(len(x) for x in lines[2:])  # the writer's last read ends inside this line now
    (p / LOG).write_bytes(b"".join(lines[:2]) + json.dumps(rec).encode() + b"\n")
    for b in range(6):
        s.append([make_rollout(900 + 10 * b + i, step=9 + b) for i in range(4)])
    assert all(isinstance(json.loads(x), dict) for x in _lines(p))
    assert integrity.read_manifest(p)["committed"]["rollouts"]["version"] == s.version
    assert check_store(p, list(TABLES)).ok
