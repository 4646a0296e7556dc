"""What the report says is true (issue 45): a reward that is the verdict is one line, not two
identical ones; a one-step store's finding does not speak of "the last 3 steps"."""

from __future__ import annotations

import numpy as np
from diag_helpers import group

from gfcr.diagnose.detectors import detect
from gfcr.diagnose.metrics import step_metrics
from gfcr.diagnose.report import _merge_equal, build_report
from gfcr.store import RolloutStore


def test_merge_equal_hand_worked():
    got = _merge_equal({"a": np.array([1.0, 0.0]), "b": np.array([1.0, 0.0]), "x": np.array([2.0, np.nan])})
    assert list(got) == ["a = b", "x"]
    assert list(_merge_equal({"a": np.array([1.0, np.nan]), "b": np.array([1.0, np.nan])})) == ["a = b"]
    assert list(_merge_equal({"a": np.array([1.0, 0.0]), "b": np.array([1.0, 0.5])})) == ["a", "b"]


def test_reward_that_is_the_verdict_is_drawn_once(tmp_path):
    st = RolloutStore.open(tmp_path / "st", create=True)
    rows = []
    for step in range(3):
        rows += group("r", step, f"p{step}", [1.0, 0.0, 1.0, 0.0], [True, False, True, False])
    st.append(rows)
    html = build_report(st)
    assert "mean reward = verified (pass) rate" in html
    chart = html.split('aria-label="Reward and pass rate"')[1].split("</svg>")[0]
    assert chart.count("mean reward") == chart.count("mean reward = verified (pass) rate") > 0  # one series


def test_a_one_step_store_does_not_speak_of_three_steps(tmp_path):
    st = RolloutStore.open(tmp_path / "st", create=True)
    st.append(group("r", 0, "p0", [0.0] * 4, [False] * 4) + group("r", 0, "p1", [0.0] * 4, [False] * 4))
    (f,) = [f for f in detect(step_metrics(st)) if f.detector == "zero_reward"]
    assert "on its one judged step" in f.message and "3 steps" not in f.message
