"""The method matrix: every row of the table in docs/train.md runs 2 steps of `gfcr train` on a tiny model."""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

import pytest

from gfcr.train.config import load_config
from gfcr.train.loop import train

DOC = Path(__file__).resolve().parents[2] / "docs" / "train.md"


def _rows() -> list[tuple[str, dict]]:
    text = DOC.read_text()
    block = text[text.index("<!-- method-matrix:start -->"):text.index("<!-- method-matrix:end -->")]
    out = []
    for line in block.splitlines():
        m = re.match(r"\| (.+?) \| `(\{.*\})` \|", line)
        if m:
            out.append((m.group(1), json.loads(m.group(2))))
    return out


ROWS = _rows()


def test_the_table_is_read():
    assert len(ROWS) >= 30 and ROWS[0][0].startswith("GRPO")


@pytest.mark.parametrize("name,over", ROWS, ids=[r[0] for r in ROWS])
def test_every_documented_option_runs_two_steps(tiny_dir, tmp_path, name, over):
    base = {"model": tiny_dir, "output_dir": str(tmp_path / "runs"), "steps": 2, "tensorboard": False,
            "tasks": [{"name": "arith", "n_train": 2, "n_eval": 0, "params": {"level": 1}}],
            "generate.topology": {"name": "group", "params": {"k": 2}}, "generate.prompts_per_step": 2, "generate.max_tokens": 3, "signals.entropy": False}
    over = json.loads(json.dumps(over).replace('"@model"', json.dumps(tiny_dir)))  # a teacher: the tiny model
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)  # every row is written in the current config shape
        cfg = load_config(None, base | over)
    res = train(cfg, run_dir=tmp_path / "r", progress=False)
    rows = [json.loads(x) for x in res.metrics_path.read_text().splitlines()]
    assert res.steps_done == 2 and [r["step"] for r in rows] == [0, 1]
    assert all(r["n_rollouts"] > 0 for r in rows)
