"""bench/replay_bench.py's summary: zero-variance waste per arm and its per-step difference from the baseline."""

import importlib.util
from pathlib import Path

import pytest

spec = importlib.util.spec_from_file_location("replay_bench", Path(__file__).parents[1] / "bench" / "replay_bench.py")
rb = importlib.util.module_from_spec(spec)
spec.loader.exec_module(rb)


def _stats(gen, zv_groups, zv_tokens, groups=8, effective=6):
    return {"wall_s": 10.0, "cpu_s": 9.0, "gen_tokens": gen, "effective": effective, "rows": 16, "replayed": 0,
            "groups": groups, "zero_var_groups": zv_groups, "zero_var_tokens": zv_tokens}


def test_arm_summary_waste_and_paired_step_difference():
    base = rb.arm_summary(_stats(1000, 6, 800), None, None, [1.0, 0.5], [1.0, 0.5], True)
    assert base["zero_var_group_share"] == 6 / 8 and base["zero_var_token_share"] == 0.8
    assert base["effective_per_1k_tokens"] == 6.0
    assert "zero_var_share_diff_by_step" not in base and "pass@1" not in base
    arm = rb.arm_summary(_stats(500, 2, 100), None, None, [0.5, 0.0], [1.0, 0.5], False)
    mean, lo, hi = arm["zero_var_share_diff_by_step"]
    assert mean == pytest.approx(-0.5) and lo == pytest.approx(-0.5) and hi == pytest.approx(-0.5)
    assert arm["zero_var_token_share"] == 0.2 and arm["effective_per_1k_tokens"] == 12.0


def test_markdown_table_without_evaluation_has_no_heldout_columns():
    out = {"k_eval": None, "arms": {
        "no_replay": rb.arm_summary(_stats(1000, 6, 800), None, None, [0.75], [0.75], True),
        "greso": rb.arm_summary(_stats(900, 3, 300), None, None, [0.375], [0.75], False)}}
    lines = rb.markdown_table(out).splitlines()
    assert "pass@1" not in lines[0]
    assert len(lines) == 4 and all(ln.count("|") == lines[0].count("|") for ln in lines)
    assert "| greso | 900 | 6.67 | 0 | 3/8 | 33.3% | -0.375 [-0.375, -0.375] |" in lines[3]
