"""Corruption detection (issue 30, item 3): the 8 corruptions of a store copy (its manifest
truncated / emptied / deleted; a data fragment truncated / zeroed / deleted; the newest Lance version
manifest truncated / deleted) each fail ``RolloutStore.open`` and every ``gfcr store`` command with
one line naming the damaged file, never a wrong answer with exit 0; ``gfcr store check`` lists the
damage and the rows still readable, ``--salvage`` copies them, ``--accept`` records a rollback the
user chose."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gfcr.cli import app
from gfcr.store import RolloutStore, StoreError
from gfcr.testing import make_rollout

ROWS, COMMITS = 200, 10


@pytest.fixture(scope="module")
def base(tmp_path_factory, make_fragmented_store) -> Path:
    """A store of 200 rollouts in 10 commits of 20 (10 fragments: no compaction)."""
    return make_fragmented_store(tmp_path_factory.mktemp("base") / "st", COMMITS, ROWS // COMMITS)


def _newest_version_file(p: Path) -> Path:
    """Lance's V2 naming: ``{2^64 - 1 - version}.manifest``, so the newest has the smallest name."""
    return min((p / "rollouts.lance" / "_versions").glob("*.manifest"), key=lambda f: int(f.stem))


def _fragment_file(p: Path) -> Path:
    """The data file of the 4th fragment of the rollouts table."""
    ds = RolloutStore.open(p).dataset("rollouts")
    return p / "rollouts.lance" / "data" / ds.get_fragments()[3].metadata.files[0].path


def _truncate(f: Path) -> None:
    os.truncate(f, f.stat().st_size // 2)


def _zero(f: Path) -> None:
    f.write_bytes(b"\0" * f.stat().st_size)


# corruption name -> (which file, what is done to it, words the one-line error must hold)
CASES = {
    "manifest truncated": (lambda p: p / "gfcr-store.json", _truncate, "not valid JSON"),
    "manifest emptied": (lambda p: p / "gfcr-store.json", lambda f: f.write_text(""), "empty"),
    "manifest deleted": (lambda p: p / "gfcr-store.json", Path.unlink, "missing"),
    "fragment truncated": (_fragment_file, _truncate, "recorded at commit"),
    "fragment zeroed": (_fragment_file, _zero, "Lance footer"),
    "fragment deleted": (_fragment_file, Path.unlink, "missing"),
    "version manifest truncated": (_newest_version_file, _truncate, "damaged"),
    "version manifest deleted": (_newest_version_file, Path.unlink, "roll the table back"),
}


def _corrupt(base: Path, tmp_path: Path, case: str) -> tuple[Path, Path]:
    p = tmp_path / "st"
    shutil.copytree(base, p)
    pick, damage, _ = CASES[case]
    f = pick(p)
    damage(f)
    return p, f


def _cli(*args: object):
    return CliRunner().invoke(app, [str(a) for a in args])


def _error_lines(out: str) -> list[str]:
    return [ln for ln in out.splitlines() if ln.startswith("error:")]


@pytest.mark.parametrize("case", list(CASES))
def test_every_corruption_fails_open_and_commands_with_one_line_naming_the_file(base, tmp_path, case):
    p, f = _corrupt(base, tmp_path, case)
    named = str(f.parent if case == "version manifest deleted" else f)  # a deleted file: its folder
    with pytest.raises(StoreError) as e:  # (StoreDamaged, a StoreError)
        RolloutStore.open(p)
    msg = str(e.value)
    assert named in msg and CASES[case][2] in msg and ".rs:" not in msg and "\n" not in msg
    with pytest.raises(StoreError):  # an import (create=True) never writes a fresh manifest over it
        RolloutStore.open(p, create=True)
    for cmd in (["stats", p], ["query", p, "SELECT count(*) AS n FROM rollouts"], ["versions", p],
                ["compact", p], ["export", p, tmp_path / "out.jsonl"]):
        res = _cli("store", *cmd)
        errs = _error_lines(res.output)
        assert res.exit_code == 2 and len(errs) == 1 and named in errs[0], (cmd, res.output)
        assert "Traceback" not in res.output
    chk = _cli("store", "check", p)
    assert chk.exit_code == 2 and "damaged:" in chk.output, chk.output


@pytest.mark.parametrize("case", ["fragment truncated", "fragment zeroed", "fragment deleted"])
def test_check_lists_the_damaged_fragment_and_salvages_the_readable_rows(base, tmp_path, case):
    p, _ = _corrupt(base, tmp_path, case)
    res = _cli("store", "check", p, "--json")
    assert res.exit_code == 2
    rep = json.loads(res.stdout)
    t = next(t for t in rep["tables"] if t["name"] == "rollouts")
    bad = [f for f in t["fragments"] if not f["readable"]]
    assert not rep["ok"] and len(bad) == 1 and bad[0]["rows"] == 20
    assert t["rows"] == ROWS and t["rows_readable"] == ROWS - 20  # 9 of 10 fragments still read
    out = tmp_path / "salvaged"
    res = _cli("store", "check", p, "--salvage", out)
    assert res.exit_code == 2 and "rollouts 180 rows" in res.output
    s = RolloutStore.open(out)
    ids = s.scan(columns=["rollout_id"]).column(0).to_pylist()
    assert len(ids) == len(set(ids)) == 180
    lost = {make_rollout(3 * 20 + i).rollout_id for i in range(20)}  # the 4th commit's rows
    assert not lost & set(ids)
    assert _cli("store", "check", out).exit_code == 0


def test_deleted_newest_version_is_refused_until_accepted(base, tmp_path):
    p, _ = _corrupt(base, tmp_path, "version manifest deleted")
    assert _cli("store", "stats", p).exit_code == 2
    res = _cli("store", "check", p, "--accept")
    assert res.exit_code == 0, res.output
    s = RolloutStore.open(p)  # the user accepted the rollback: the store opens at the earlier version
    assert s.count() == ROWS - 20
    s.append([make_rollout(1000 + i) for i in range(5)])
    assert RolloutStore.open(p).count() == ROWS - 15


def test_truncated_newest_version_manifest_moved_aside_then_accepted(base, tmp_path):
    p, f = _corrupt(base, tmp_path, "version manifest truncated")
    assert _cli("store", "check", p, "--accept").exit_code == 2  # not while the damaged file is there
    f.rename(tmp_path / f.name)
    assert _cli("store", "check", p, "--accept").exit_code == 0
    assert RolloutStore.open(p).count() == ROWS - 20


@pytest.mark.parametrize("case", ["manifest truncated", "manifest deleted"])
def test_lost_manifest_is_rewritten_by_accept_with_every_row(base, tmp_path, case):
    p, _ = _corrupt(base, tmp_path, case)
    res = _cli("store", "check", p, "--accept")
    assert res.exit_code == 0, res.output
    s = RolloutStore.open(p)
    assert s.count() == ROWS and s.manifest["committed"]["rollouts"]["rows"] == ROWS


def test_a_healthy_store_checks_ok_and_records_every_commit(base, tmp_path):
    p, _ = tmp_path / "st", None
    shutil.copytree(base, p)
    s = RolloutStore.open(p)
    assert s.manifest["committed"]["rollouts"] == {"version": s.version, "rows": ROWS}
    s.compact()
    s.upsert_prompts([])
    assert RolloutStore.open(p).manifest["committed"]["rollouts"]["version"] == RolloutStore.open(p).version
    res = _cli("store", "check", p)
    assert res.exit_code == 0 and "ok:" in res.output, res.output


def test_an_interrupted_init_can_be_finished(tmp_path):
    """Tables created but no manifest yet (an init killed half way): opening with create finishes it."""
    p = tmp_path / "st"
    RolloutStore.open(p, create=True)
    (p / "gfcr-store.json").unlink()
    s = RolloutStore.open(p, create=True)
    assert s.count() == 0 and (p / "gfcr-store.json").exists()
