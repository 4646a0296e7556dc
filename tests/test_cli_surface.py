"""The ``gfcr`` command as a newcomer first meets it: ``--version``, what a re-run says it did, a
missing import path named as such, and every ``--help`` readable at 80 columns."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import gfcr

GFCR = [sys.executable, "-m", "gfcr.cli"]
SRC = str(Path(gfcr.__file__).resolve().parents[1])  # the children import the gfcr this process imports


def _gfcr(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", ""), "COLUMNS": "80"}
    return subprocess.run([*GFCR, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_version_prints_the_installed_package_version(tmp_path):
    p = _gfcr(tmp_path, "--version")
    assert p.returncode == 0, p.stderr
    assert p.stdout == f"gfcr {version('gfcr')}\n"
    assert p.stderr == ""


def test_walkthrough_run_twice_says_nothing_new(tmp_path):
    from gfcr.store import RolloutStore

    first = _gfcr(tmp_path, "store", "walkthrough", "runs/tour")
    assert first.returncode == 0, first.stderr
    store = RolloutStore.open(tmp_path / "runs" / "tour")
    n, versions = store.count(), len(store.versions())
    assert n > 0
    counts = dict(re.findall(r"^\s+(\S+) dump: (.+?) \(tokens", first.stdout, re.M))
    assert set(counts) == {"verl", "trl", "prime-rl", "roll"}, first.stdout
    assert sum(int(c.split(" new")[0]) for c in counts.values()) == n
    assert all(c.endswith(", 0 already stored") for c in counts.values()), counts

    again = _gfcr(tmp_path, "store", "walkthrough", "runs/tour")
    assert again.returncode == 0, again.stderr
    counts2 = dict(re.findall(r"^\s+(\S+) dump: (.+?) \(tokens", again.stdout, re.M))
    for fmt, c in counts.items():  # the same dumps again: each row already there, none written
        assert counts2[fmt] == f"{int(c.split(' new')[0])} already stored, 0 new", again.stdout
    assert "imported" not in again.stdout
    store = RolloutStore.open(tmp_path / "runs" / "tour")
    assert store.count() == n and len(store.versions()) == versions


def test_import_of_an_unchanged_dump_reports_no_new_rows(tmp_path):
    from gfcr.store import RolloutStore
    from gfcr.store.samples import write_verl

    dump = write_verl(tmp_path / "verl")
    first = _gfcr(tmp_path, "store", "import", "st", str(dump), "--from", "verl")
    assert first.returncode == 0, first.stderr
    assert "imported 24 new rollouts (0 already stored)" in first.stdout
    versions = len(RolloutStore.open(tmp_path / "st").versions())
    again = _gfcr(tmp_path, "store", "import", "st", str(dump), "--from", "verl")
    assert again.returncode == 0, again.stderr
    assert "imported 0 new rollouts (24 already stored)" in again.stdout and "holds 24 rollouts" in again.stdout
    assert len(RolloutStore.open(tmp_path / "st").versions()) == versions  # nothing committed


def test_import_missing_path_is_named_as_missing(tmp_path):
    from gfcr.store.samples import write_verl

    dump = write_verl(tmp_path / "verl")
    for files in (["nope.jsonl"], [str(dump), "gone/dir"]):
        p = _gfcr(tmp_path, "store", "import", "NEW", *files, "--from", "verl")
        assert p.returncode == 2
        missing = files[-1]
        assert p.stderr == f"error: no such file or folder: {missing}\n", p.stderr
        assert not (tmp_path / "NEW").exists()  # checked before the store is created


_HELP_CHECK = r"""
import json, re, sys
from typer.testing import CliRunner
from typer.main import get_command
from gfcr.cli import app

def walk(cmd, path):
    yield path, cmd
    if hasattr(cmd, "list_commands"):
        ctx = cmd.context_class(cmd)
        for name in cmd.list_commands(ctx):
            yield from walk(cmd.get_command(ctx, name), [*path, name])

out = []
for path, cmd in walk(get_command(app), []):
    res = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "80"})
    names = [o for p in cmd.params for o in (*p.opts, *p.secondary_opts) if o.startswith("-")]
    out.append({"path": " ".join(path), "code": res.exit_code, "text": res.output, "names": names})
print(json.dumps(out))
"""


def test_every_help_is_readable_at_80_columns(tmp_path):
    """Every command's ``--help`` at COLUMNS=80: each option name whole, no line over 80 columns,
    nothing cut with an ellipsis (the rich layout cut ``--allow-weight-updates`` of ``gfcr serve``)."""
    import json

    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", ""), "COLUMNS": "80"}
    p = subprocess.run([sys.executable, "-c", _HELP_CHECK], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    helps = json.loads(p.stdout)
    paths = {h["path"] for h in helps}
    assert {"", "serve", "store import", "ross run", "scale generate", "train"} <= paths
    bad = []
    for h in helps:
        text = h["text"]
        cut = [o for o in h["names"] if not re.search(rf"(?<![\w-]){re.escape(o)}(?![\w-])", text)]
        wide = [ln for ln in text.splitlines() if len(ln) > 80]
        if h["code"] != 0 or cut or wide or "…" in text:
            bad.append((h["path"] or "gfcr", h["code"], cut, wide[:1], "…" in text))
    assert not bad, bad
