"""Data-file digests recorded at commit (issue 30, item 3: never a wrong answer with exit 0).

The cheap checks of every open see a data file that is missing, of another size or without its Lance
footer; a byte damaged *inside* a file, at its recorded size, can decode to other values without any
error. Each commit records a digest per new data file in the store's manifest (``"files"``: XXH3-128
since issue 44, SHA-256 before, each entry naming its algorithm), and ``gfcr store check`` verifies
them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import lance
import pytest
from typer.testing import CliRunner

from gfcr.cli import app
from gfcr.records import rollouts_to_table
from gfcr.store import RolloutStore, integrity
from gfcr.store.core import TABLES
from gfcr.store.errors import StoreDamaged
from gfcr.testing import make_rollout

FRAGMENTS, PER = 5, 20


@pytest.fixture(scope="module")
def base(tmp_path_factory, make_fragmented_store) -> Path:
    return make_fragmented_store(tmp_path_factory.mktemp("digests") / "st", FRAGMENTS, PER)


def _rows(p: Path, version: int | None = None):
    ds = lance.dataset(str(p / "rollouts.lance"), version=version)
    return ds.to_table().sort_by("rollout_id")


def _third_file(p: Path) -> Path:
    ds = lance.dataset(str(p / "rollouts.lance"))
    return p / "rollouts.lance" / "data" / ds.get_fragments()[2].metadata.files[0].path


def _flip(f: Path, offset: int) -> None:
    b = bytearray(f.read_bytes())
    b[offset] ^= 0x01
    f.write_bytes(bytes(b))


def test_each_commit_digests_its_new_data_files_once(tmp_path, monkeypatch):
    p = tmp_path / "st"
    s = RolloutStore.open(p, create=True, auto_compact=0)
    s.append([make_rollout(i, step=0) for i in range(4)])
    calls: list[Path] = []
    real = integrity.xxh3_file
    monkeypatch.setitem(integrity.DIGESTS, "xxh3_128", lambda f, *a: calls.append(f) or real(f, *a))
    s.append([make_rollout(10 + i, step=1) for i in range(4)])
    assert len(calls) == 1  # the new fragment's file only; the first one was hashed at its own commit
    files = integrity.read_manifest(p)["files"]
    data = sorted((p / "rollouts.lance" / "data").glob("*.lance"))
    rel = {f.relative_to(p).as_posix() for f in data}
    assert rel <= set(files)
    for f in data:
        k = f.relative_to(p).as_posix()
        assert files[k] == {"size": f.stat().st_size, "xxh3_128": real(f)}


def test_an_append_digests_only_its_new_fragment_without_walking_the_table(tmp_path, monkeypatch):
    """The record of a plain append (the manifest at the version it wrote on) hashes the new
    fragment's file and never walks every fragment of the table (the walk cost grew with the table:
    ~8 ms a 64-row append at 60 fragments); the digests are the same as a full walk gives."""
    p = tmp_path / "st"
    s = RolloutStore.open(p, create=True, auto_compact=0)
    for b in range(3):
        s.append([make_rollout(100 * b + i, step=b) for i in range(3)])
    walks: list[str] = []
    real = integrity.record_digests
    monkeypatch.setattr(integrity, "record_digests", lambda path, name, *a: walks.append(name) or real(path, name, *a))
    s.append([make_rollout(900 + i, step=9) for i in range(3)])
    assert walks == []
    files = integrity.read_manifest(p)["files"]
    full: dict = {}
    real(p, "rollouts", lance.dataset(str(p / "rollouts.lance")), full)
    assert {k: v for k, v in files.items() if k.startswith("rollouts.lance/")} == full
    assert RolloutStore.open(p).manifest["committed"]["rollouts"]["version"] == s.version


def test_files_a_crashed_writer_never_recorded_are_digested_by_the_next_append(tmp_path):
    """A commit whose record was never written (a writer killed between Lance's commit and the
    record) leaves the manifest behind Lance: the next append walks the table and digests those
    files too, instead of only its own."""
    p = tmp_path / "st"
    s = RolloutStore.open(p, create=True, auto_compact=0)
    s.append([make_rollout(i, step=0) for i in range(3)])
    lance.write_dataset(rollouts_to_table([make_rollout(50 + i, step=1) for i in range(3)]),
                        str(p / "rollouts.lance"), mode="append")  # committed, never recorded
    s.append([make_rollout(90 + i, step=2) for i in range(3)])
    files = integrity.read_manifest(p)["files"]
    data = {f.relative_to(p).as_posix() for f in (p / "rollouts.lance" / "data").glob("*.lance")}
    assert data <= set(files)
    assert integrity.check_store(p, list(TABLES)).ok


def test_a_manifest_changed_by_another_writer_is_read_again(tmp_path):
    """A writer keeps the manifest it last wrote in memory and parses the file again only when its
    bytes differ: another process's record in between is kept, not overwritten with the old copy."""
    p = tmp_path / "st"
    s = RolloutStore.open(p, create=True, auto_compact=0)
    s.append([make_rollout(i, step=0) for i in range(2)])
    m = integrity.read_manifest(p)
    m["note"] = "written by another writer"
    integrity.write_manifest(p, m)
    s.append([make_rollout(10 + i, step=1) for i in range(2)])
    after = integrity.read_manifest(p)
    assert after["note"] == "written by another writer"
    assert after["committed"]["rollouts"]["version"] == s.version


def test_a_flipped_byte_inside_a_fragment_is_found_by_check(base, tmp_path):
    """Every flip of a sample of offsets inside a data file is named by ``check_store``; without the
    digests some of these flips read back other values with no error at all (shown here)."""
    f0 = _third_file(base)
    size = f0.stat().st_size
    want = _rows(base)
    silent = 0
    offsets = sorted({int(size * k / 24) for k in range(1, 20)})
    for i, off in enumerate(offsets):
        p = tmp_path / f"c{i}"
        shutil.copytree(base, p)
        f = p / f0.relative_to(base)
        _flip(f, off)
        rep = integrity.check_store(p, list(TABLES))
        assert not rep.ok, f"flip at {off} of {size} not found"
        assert any(f.name in x for x in rep.all_problems)
        old = integrity._check_table(p, "rollouts", {}, digests={})  # the check as it was: no digests
        if old.rows_readable == FRAGMENTS * PER:
            try:
                got = _rows(p)
            except Exception:
                continue
            silent += not got.equals(want)
    assert silent >= 1, "expected at least one flip that reads back wrong without an error"


def test_salvage_skips_the_fragment_whose_digest_is_wrong(base, tmp_path):
    p = tmp_path / "st"
    shutil.copytree(base, p)
    f = _third_file(p)
    _flip(f, f.stat().st_size // 3)
    rep = integrity.check_store(p, list(TABLES))
    bad = [fr for t in rep.tables if t.name == "rollouts" for fr in t.fragments if not fr.readable]
    assert len(bad) == 1 and "XXH3-128" in bad[0].problem and "recorded at commit" in bad[0].problem
    copied = integrity.salvage(p, tmp_path / "new", list(TABLES), lambda q: RolloutStore.open(q, create=True).path)
    assert copied["rollouts"] == (FRAGMENTS - 1) * PER
    got = RolloutStore.open(tmp_path / "new").scan().to_pylist()
    assert {r["step"] for r in got} == set(range(FRAGMENTS)) - {2}
    assert integrity.check_store(tmp_path / "new", list(TABLES)).ok


def _as_old_store(p: Path, m: dict) -> None:
    """Write ``m`` as the whole manifest of a store from before the record log (no log, no epoch)."""
    m.pop("log", None)
    (p / "gfcr-store.json").write_text(json.dumps(m))
    (p / integrity.LOG).unlink()


def test_an_old_store_without_digests_opens_and_checks(base, tmp_path):
    p = tmp_path / "st"
    shutil.copytree(base, p)
    m = integrity.read_manifest(p)
    del m["files"]
    _as_old_store(p, m)
    assert RolloutStore.open(p).count() == FRAGMENTS * PER
    rep = integrity.check_store(p, list(TABLES))
    t = next(t for t in rep.tables if t.name == "rollouts")
    assert rep.ok and t.files_digested == 0 and t.files_not_digested == FRAGMENTS


def test_an_older_store_digested_with_sha256_is_still_verified(base, tmp_path):
    """A store whose files were digested with SHA-256 (before issue 44) checks ok, names a flipped byte
    by SHA-256, and its new commits add XXH3-128 entries beside the old ones."""
    p = tmp_path / "st"
    shutil.copytree(base, p)
    m = integrity.read_manifest(p)
    m["files"] = {k: {"size": v["size"], "sha256": integrity.sha256_file(p / k)} for k, v in m["files"].items()}
    _as_old_store(p, m)
    rep = integrity.check_store(p, list(TABLES))
    t = next(t for t in rep.tables if t.name == "rollouts")
    assert rep.ok and t.files_digested == FRAGMENTS and t.files_not_digested == 0
    s = RolloutStore.open(p, auto_compact=0)
    s.append([make_rollout(900 + i, step=9) for i in range(3)])
    kinds = sorted(next(iter(set(v) - {"size"})) for k, v in integrity.read_manifest(p)["files"].items()
                   if k.startswith("rollouts.lance/data/"))
    assert kinds == ["sha256"] * FRAGMENTS + ["xxh3_128"]
    assert integrity.check_store(p, list(TABLES)).ok
    f = _third_file(p)
    _flip(f, f.stat().st_size // 3)
    rep = integrity.check_store(p, list(TABLES))
    assert not rep.ok and any(f.name in x and "has SHA-256" in x for x in rep.all_problems)


def test_compaction_prunes_the_old_files_and_check_stays_ok(base, tmp_path):
    p = tmp_path / "st"
    shutil.copytree(base, p)
    s = RolloutStore.open(p)
    s.compact()
    files = integrity.read_manifest(p)["files"]
    ds = lance.dataset(str(p / "rollouts.lance"))
    current = {f"rollouts.lance/data/{df.path}" for fr in ds.get_fragments() for df in fr.metadata.files}
    assert {k for k in files if k.startswith("rollouts.lance/")} == current
    rep = integrity.check_store(p, list(TABLES))
    t = next(t for t in rep.tables if t.name == "rollouts")
    assert rep.ok and t.files_digested == len(current) and t.files_not_digested == 0


# --- deletion files (issue 30: Lance deletion files were not digested) ------------------------------
def _updated(tmp_path: Path) -> tuple[Path, Path]:
    """A store whose rollouts table has a deletion file: ``update`` rewrites rows through a merge,
    which marks the old copies deleted in their fragment."""
    p = tmp_path / "st"
    s = RolloutStore.open(p, create=True, auto_compact=0)
    rs = [make_rollout(i, step=0) for i in range(6)]
    s.append(rs)
    for r in rs[:2]:
        r.reward = 0.25
    s.update(rs[:2])
    ds = lance.dataset(str(p / "rollouts.lance"))
    dels = [integrity.deletion_file(p / "rollouts.lance", fr) for fr in ds.get_fragments()]
    dels = [d for d in dels if d is not None]
    assert len(dels) == 1 and dels[0].parent.name == "_deletions"
    return p, dels[0]


def test_a_deletion_file_is_digested_at_commit_and_checked(tmp_path):
    p, d = _updated(tmp_path)
    files = integrity.read_manifest(p)["files"]
    assert files[d.relative_to(p).as_posix()] == {"size": d.stat().st_size, "xxh3_128": integrity.xxh3_file(d)}
    rep = integrity.check_store(p, list(TABLES))
    assert rep.ok
    t = next(t for t in rep.tables if t.name == "rollouts")
    assert t.files_not_digested == 0 and t.files_digested == 3  # two data files and the deletion file
    _flip(d, d.stat().st_size // 2)
    rep = integrity.check_store(p, list(TABLES))
    assert not rep.ok and any(d.name in x and "XXH3-128" in x for x in rep.all_problems)


def test_a_missing_deletion_file_is_refused_at_open_by_name(tmp_path):
    """Without its deletion file a fragment's replaced rows would count (or read) again."""
    p, d = _updated(tmp_path)
    assert RolloutStore.open(p).count() == 6
    d.unlink()
    with pytest.raises(StoreDamaged, match=rf"{d.name}.*is missing"):
        RolloutStore.open(p)
    rep = integrity.check_store(p, list(TABLES))
    assert not rep.ok and any(d.name in x and "missing" in x for x in rep.all_problems)


def test_a_truncated_deletion_file_is_refused_at_open(tmp_path):
    p, d = _updated(tmp_path)
    d.write_bytes(d.read_bytes()[:-3])
    with pytest.raises(StoreDamaged, match=rf"{d.name}.*bytes.*recorded at commit"):
        RolloutStore.open(p)


# --- ordinary commands over a fragment damaged inside: one line naming `gfcr store check` -------------
def _damaged(base: Path, tmp_path: Path) -> Path:
    p = tmp_path / "st"
    shutil.copytree(base, p)
    f = _third_file(p)
    b = bytearray(f.read_bytes())
    for off in range(100, 2000, 50):  # enough to break decoding (one flip may decode silently)
        b[off] ^= 0xFF
    f.write_bytes(bytes(b))
    return p


@pytest.mark.parametrize("argv", [
    ["store", "stats", "{p}"],
    ["store", "export", "{p}", "{out}"],
    ["store", "query", "{p}", "select sum(length(rollout_id)), sum(len(token_ids)) from rollouts"],
])
def test_a_scan_of_a_damaged_fragment_ends_in_one_line_naming_store_check(base, tmp_path, argv):
    p = _damaged(base, tmp_path)
    before = {f: f.read_bytes() for f in p.rglob("*") if f.is_file() and f.name != ".manifest.lock"}
    out = tmp_path / "out.jsonl"
    res = CliRunner().invoke(app, [a.format(p=p, out=out) for a in argv])
    lines = [x for x in res.output.splitlines() if x.strip()]
    assert res.exit_code == 2, res.output
    assert len(lines) == 1 and lines[0].startswith("error: a data file of the store"), res.output
    assert f"gfcr store check {p}" in lines[0] and "LanceError" not in lines[0] and ".rs:" not in lines[0]
    after = {f: f.read_bytes() for f in p.rglob("*") if f.is_file() and f.name != ".manifest.lock"}
    assert after == before and not out.exists()


def test_a_lance_error_that_is_not_damage_keeps_its_own_message():
    assert integrity.read_damage(ValueError("Dataset at path /x was not found: LanceError(IO): Not found: "
                                            "/x/_versions, /r/lance-io/src/a.rs:1:2")) is None
    assert integrity.read_damage(ValueError("SQL error: Binder Error: column x not found")) is None
    e = RuntimeError("scan failed")
    e.__cause__ = OSError("External error: LanceError(Arrow): Invalid argument error: x, /r/lance/a.rs:1:2")
    assert integrity.read_damage(e).startswith("a data file of the store")
