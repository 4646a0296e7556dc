"""`gfcr demo` is plain composition: importing it runs nothing, the stages run in a fixed order,
each timed; ROSS and the report stages are tested on real stores in tests/ross and tests/diagnose."""

from __future__ import annotations

import io
import subprocess
import sys

import pytest
from rich.console import Console

from gfcr import demo


def test_stages_run_in_order_and_are_timed(tmp_path):
    d = demo.run_demo(output_dir=str(tmp_path), only=["ross", "report"], console=Console(file=io.StringIO()))
    assert demo.STAGES == ("model", "train", "ross", "report", "summary")
    assert list(d.seconds) == ["ross", "report", "summary"] and list(d.cpu_seconds) == list(d.seconds)
    assert not any(tmp_path.iterdir())  # without a train stage, ROSS and the report skip and write nothing


def test_unknown_stage_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="rosss"):
        demo.run_demo(output_dir=str(tmp_path), only=["rosss"], console=Console(file=io.StringIO()))


def test_importing_the_demo_has_no_side_effects():
    """Importing the demo loads no room and no model code; importing the rooms never loads the demo."""
    code = ("import sys, gfcr.demo; a = sorted(m for m in ('gfcr.train', 'gfcr.ross', 'gfcr.diagnose', 'torch') "
            "if m in sys.modules); del sys.modules['gfcr.demo']; import gfcr.train.loop, gfcr.ross.pipeline, "
            "gfcr.diagnose.report; print(a, 'gfcr.demo' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    assert out.stdout.strip() == "[] False"


def test_demo_config_is_valid_and_small():
    cfg = demo.demo_config()
    full = demo.demo_config(full=True)
    assert cfg.steps < full.steps
    n_eval = sum(t.n_eval for t in cfg.tasks)
    assert n_eval <= sum(t.n_eval for t in full.tasks)
    # per-step generation budget of the CPU demo (prompts x K x tokens) stays within the 2-core sizing
    assert cfg.generate.prompts_per_step * cfg.generate.k * cfg.generate.max_tokens <= 4 * 4 * 64


def test_overrides_set_fields_on_top_of_the_demo_config():
    base = demo.demo_config()
    cfg = demo.demo_config(overrides={"steps": 2, "eval.k": 3})
    assert (cfg.steps, cfg.eval.k) == (2, 3)
    assert cfg.eval.max_tokens == base.eval.max_tokens and cfg.tasks == base.tasks  # the rest as the demo sets it


def test_a_bad_set_is_an_error_before_anything_runs(tmp_path):
    from typer.testing import CliRunner

    from gfcr.cli import app

    out = CliRunner().invoke(app, ["demo", "--output-dir", str(tmp_path / "runs"), "--set", "generate.kk=3"])
    assert out.exit_code == 2 and "generate.kk" in out.output
    assert not (tmp_path / "runs").exists()


def _eval(greedy: list[bool], correct: list[int], n: int = 2):
    from gfcr.evaluate import EvalResult, Metric

    rows = [{"prompt_id": f"p{i}", "n": n, "correct": c, "greedy_correct": g}
            for i, (g, c) in enumerate(zip(greedy, correct, strict=True))]
    m = {"greedy_pass@1": Metric(sum(greedy) / len(greedy), 0, 1), "pass@1": Metric(sum(correct) / (n * len(rows)), 0, 1)}
    return EvalResult(n_prompts=len(rows), n_samples=n * len(rows), metrics=m, per_prompt=rows)


def test_rl_gain_says_plainly_when_the_run_is_too_short():
    """Two prompts flipped right out of 32: McNemar p = 0.5, so the demo says its run cannot show a gain."""
    before = _eval([False] * 32, [0] * 32)
    after = _eval([True, True] + [False] * 30, [1, 1] + [0] * 30)
    lines = demo.rl_gain_lines(after, before, steps=4, full=False)
    assert lines[0].startswith("RL gain, greedy_pass@1: +0.062") and "p = 0.5" in lines[0]
    assert lines[0].endswith("not significant")
    assert "too short to show an RL gain (4 steps, 32 held-out prompts)" in lines[-1]


def test_rl_gain_reports_a_significant_gain_without_the_caveat():
    """Twelve prompts flipped right, none wrong: McNemar p = 2 * 0.5**12 ≈ 0.0005."""
    before = _eval([False] * 32, [0] * 32)
    after = _eval([True] * 12 + [False] * 20, [2] * 12 + [0] * 20)
    lines = demo.rl_gain_lines(after, before, steps=20, full=True)
    assert lines[0].endswith(": significant") and "p = 0.00049" in lines[0]
    assert not any("too short" in ln for ln in lines)


def test_text_is_printed_unwrapped_so_a_markdown_row_stays_one_line():
    # the demo printed the ROSS table through an 80-column console, which broke each row in two
    out = io.StringIO()
    say = demo.printer(Console(file=out, width=80, color_system=None))
    row = "| ross − positive_sft | arith | greedy_pass@1 | +0.0 [+0.0, +0.0] | 0 / 0 | 1 | 1 | not significant |"
    say(row)
    assert out.getvalue().splitlines() == [row]
