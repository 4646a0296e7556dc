"""configs/opd-arith.yaml names a hub teacher (SmolLM2-360M-Instruct): where it is neither cached nor
downloadable, `gfcr train` must fail at once with one line naming the teacher and the fix, before
anything is written (no traceback, no run folder). Network: none (the hub is switched off)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import gfcr
from gfcr.train.distill import DistillConfig, teacher_missing

ROOT = Path(__file__).resolve().parents[2]


def test_gfcr_train_opd_arith_without_the_teacher_fails_with_one_line(tmp_path):
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "hf"), PYTHONPATH=str(Path(gfcr.__file__).resolve().parents[1]),
               GFCR_DEBUG="0")
    p = subprocess.run([sys.executable, "-m", "gfcr", "train", str(ROOT / "configs" / "opd-arith.yaml"),
                        "--set", f"output_dir={tmp_path / 'runs'}", "--no-progress"],
                       capture_output=True, text=True, env=env, timeout=300)
    lines = [x for x in (p.stdout + p.stderr).splitlines() if x.strip()]
    assert p.returncode == 2, p.stdout + p.stderr
    assert len(lines) == 1, lines
    (line,) = lines
    assert line.startswith("error: distill teacher 'smollm2-360m' (distill.teachers.0.model): "
                           "HuggingFaceTB/SmolLM2-360M-Instruct is not in the local Hugging Face cache")
    assert "--set distill.teachers.0.model=DIR" in line and "Traceback" not in p.stderr
    assert not (tmp_path / "runs").exists()  # nothing written


def _cfg(model):
    return DistillConfig.model_validate({"teachers": [{"name": "t", "model": model}]})


def test_teacher_missing_asks_the_hub_only_for_uncached_hub_names(tmp_path, monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    asked = []

    def down(name):
        asked.append(name)
        raise ConnectionError("Name or service not known")

    assert teacher_missing(_cfg("default"), probe=down) is None
    (tmp_path / "m").mkdir()
    assert teacher_missing(_cfg(str(tmp_path / "m")), probe=down) is None  # a local folder: resolve_model's job
    assert asked == []
    why = teacher_missing(_cfg("org-x/model-y"), probe=down)
    assert asked == ["org-x/model-y"]
    assert why.startswith("distill teacher 't' (distill.teachers.0.model): org-x/model-y is not in the local")
    assert "ConnectionError: Name or service not known" in why and "\n" not in why
    assert teacher_missing(_cfg("org-x/model-y"), probe=lambda name: None) is None  # the hub answers: download later
