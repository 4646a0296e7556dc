"""User mistakes on the real ``gfcr`` command: one line on stderr naming what is wrong, exit code 2, no
traceback (unless ``--debug``), and no new file or folder left behind."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

GFCR = [sys.executable, "-m", "gfcr.cli"]


def _files(root: Path) -> set[Path]:
    return {p.relative_to(root) for p in root.rglob("*")}


def _mistake(tmp: Path, *args: str, names: str) -> str:
    """Run ``gfcr ARGS`` in ``tmp``; assert one stderr line containing ``names``, exit 2, nothing new."""
    before = _files(tmp)
    p = subprocess.run([*GFCR, *args], cwd=tmp, capture_output=True, text=True, timeout=300)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2, (p.returncode, p.stderr[-3000:])
    assert len(lines) == 1 and lines[0].startswith("error: "), p.stderr[-3000:]
    assert names in lines[0], lines[0]
    assert "Traceback" not in p.stderr + p.stdout
    assert _files(tmp) == before, sorted(map(str, _files(tmp) - before))
    return lines[0]


@pytest.fixture
def train_cfg(tmp_path, tiny_dir):
    def write(**over):
        cfg = {"run_name": "t", "output_dir": str(tmp_path / "runs"), "model": tiny_dir, "steps": 1,
               "tasks": [{"name": "arith", "n_train": 4, "n_eval": 0, "params": {"level": 1}}],
               "generate": {"topology": {"name": "group", "params": {"k": 2}}, "prompts_per_step": 2, "max_tokens": 4},
               "tensorboard": False,
               "eval": {"before": False, "after": False}}
        cfg.update(over)
        p = tmp_path / "cfg.yaml"
        p.write_text(yaml.safe_dump(cfg))
        return p
    return write


def test_store_import_typo_in_from_creates_no_store(tmp_path):
    dump = tmp_path / "d.jsonl"
    dump.write_text('{"input": "q", "output": "a", "score": 1.0, "step": 1}\n')
    _mistake(tmp_path, "store", "import", "NEW", str(dump), "--from", "verll", names="'verll'")
    assert not (tmp_path / "NEW").exists()
    # a nested new store: no parent folder left behind either
    _mistake(tmp_path, "store", "import", "a/b/NEW", str(dump), "--from", "verll", names="'verll'")


def test_store_import_missing_file_creates_no_store(tmp_path):
    _mistake(tmp_path, "store", "import", "NEW", str(tmp_path / "nope.jsonl"), "--from", "verl", names="nope.jsonl")


def test_train_misspelled_verifier_leaves_no_run_folder(tmp_path, train_cfg):
    cfg = train_cfg(verify={"verifier": "numerc"})
    _mistake(tmp_path, "train", str(cfg), names="numerc")
    _mistake(tmp_path, "train", str(cfg), "--run-dir", str(tmp_path / "new" / "run"), names="numerc")


def test_train_missing_model_path_leaves_no_run_folder(tmp_path, train_cfg):
    cfg = train_cfg(model=str(tmp_path / "models" / "nope"))
    _mistake(tmp_path, "train", str(cfg), names="nope")


def test_train_bad_value_and_bad_set(tmp_path, train_cfg):
    cfg = train_cfg()
    _mistake(tmp_path, "train", str(cfg), "--set", "steps=-3", names="steps")
    _mistake(tmp_path, "train", str(cfg), "--set", "steps", names="KEY=VALUE")
    _mistake(tmp_path, "train", str(tmp_path / "missing.yaml"), names="missing.yaml")


def test_train_notes_an_old_config_key_in_one_line(tmp_path, train_cfg):
    """A config in the older flat shape: one ``note:`` line per old key saying what to write, then the run
    (here the one error line of a bad value, so nothing trains)."""
    cfg = train_cfg(generate={"k": 2, "prompts_per_step": 2, "max_tokens": 4}, steps=0)
    p = subprocess.run([*GFCR, "train", str(cfg)], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert p.returncode == 2 and p.stderr.splitlines() == [
        "note: generate.k is the old config shape: write generate.topology: {name: group, params: {k: 2}} (read "
        "that way for now; `gfcr config migrate FILE` rewrites a file)",
        f"error: invalid TrainConfig in {cfg}: steps: Input should be greater than or equal to 1 [greater_than_equal]"]


def test_serve_missing_model_path(tmp_path):
    _mistake(tmp_path, "serve", "--model", str(tmp_path / "nope"), "--port", "1", names="nope")


def test_ross_run_missing_store_leaves_no_run_folder(tmp_path, tiny_dir):
    cfg = tmp_path / "ross.yaml"
    cfg.write_text(yaml.safe_dump({"store": "runs/run/store", "out_dir": str(tmp_path / "ross"),
                                   "upstream_model": tiny_dir, "judge": {"name": "arith-steps"}}))
    _mistake(tmp_path, "ross", "run", str(cfg), "--set", f"store={tmp_path / 'missing'}", names="missing")


def test_other_mistakes_are_one_line(tmp_path):
    _mistake(tmp_path, "store", "stats", "nostore", names="gfcr store init")
    _mistake(tmp_path, "verify", "nostore", "--verifier", "nope", names="nope")
    _mistake(tmp_path, "store", "stats", "nostore", "--bogus", names="--bogus")
    _mistake(tmp_path, "nosuchcommand", names="nosuchcommand")
    _mistake(tmp_path, "simulate", "missing.yaml", names="missing.yaml")


def test_debug_shows_the_traceback(tmp_path):
    p = subprocess.run([*GFCR, "--debug", "store", "stats", "nostore"], cwd=tmp_path, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode != 0 and "Traceback" in p.stderr and "StoreError" in p.stderr


def test_python_dash_m_gfcr_is_the_cli():
    """``python -m gfcr`` runs the same CLI (scripts and benches call it with ``sys.executable``)."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "gfcr", "ross", "run", "--help"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "Usage:" in out.stdout and "ross run" in out.stdout


def test_eval_verifier_arg_is_checked_before_the_model_loads():
    """An unknown verifier option fails in one line naming it (no model is loaded)."""
    from typer.testing import CliRunner

    from gfcr.cli import app

    res = CliRunner().invoke(app, ["eval", "--verifier-arg", "lenient_fallbak=true", "--n", "1"])
    assert res.exit_code == 2
    assert "--verifier 'numeric'" in res.output and "lenient_fallbak" in res.output
