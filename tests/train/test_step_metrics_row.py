"""The training loop's per-step JSONL row and progress bar: the store's per-step summary of the
step's rollouts (``gfcr.store.stepstats.summarize``), under the names ``gfcr report`` uses."""

from gfcr.diagnose.metrics import step_metrics as report_metrics
from gfcr.store import RolloutStore
from gfcr.store.stepstats import STEP_COLUMNS
from gfcr.testing import make_rollout
from gfcr.train.metrics import bar_text, step_metrics


def _groups(step: int = 3):
    # group a: rewards 1, 1 (no variance, 6 + 4 generated tokens); group b: 1, 0 (variance);
    # group c: 0, 0, 0 (no variance, 3 x 5 tokens); a single-row group d never counts as a group
    def r(i, prompt, n_gen, reward, verified=True):
        return make_rollout(i, step=step, prompt=prompt, n_gen=n_gen, reward=reward, verified=verified,
                            signals={"advantage": 0.0 if prompt in "acd" else (0.5 if reward else -0.5)})
    a = [r(0, "a", 6, 1.0), r(1, "a", 4, 1.0)]
    b = [r(2, "b", 7, 1.0), r(3, "b", 9, 0.0, False)]
    c = [r(i, "c", 5, 0.0, False) for i in range(4, 7)]
    d = [r(7, "d", 8, 0.0, False)]
    return [a, b, c, d]


def test_zero_variance_share_and_tokens_hand_worked():
    a, b, c, d = _groups()
    row = step_metrics(3, [a, b, c, d], [b], [], {}, {"generate": 1.0}, {})
    assert row["n_prompts"] == 4 and row["n_rollouts"] == 8 and row["n_groups"] == 3
    assert row["zero_var_share"] == 2 / 3  # a and c among the three groups of two or more
    assert row["wasted_tokens"] == 6 + 4 + 3 * 5 + 8  # zero-advantage groups (d too: its advantage is 0)
    assert row["gen_tokens"] == 6 + 4 + 7 + 9 + 15 + 8
    assert row["verified_rate"] == 3 / 8 and row["reward_mean"] == 3 / 8
    assert row["n_trained"] == 2 and row["seconds/generate"] == 1.0
    for old in ("zero_variance_share", "zero_variance_tokens", "pass_rate", "length_mean", "truncated_share"):
        assert old not in row  # one vocabulary: the report's names only


def test_progress_bar_and_report_agree_on_the_same_rows(tmp_path):
    """What the progress bar shows for a step equals ``gfcr report``'s metrics table for the rows the
    loop stored at that step: every shared column, under the same name."""
    store = RolloutStore.open(tmp_path / "s", create=True)
    rows = {}
    for step in (0, 1):
        groups = _groups(step)
        if step == 1:
            for r in groups[1]:
                r.finish_reason = "length"
        store.append([r for g in groups for r in g])  # what the loop appends
        rows[step] = step_metrics(step, groups, [], [], {}, {"step": 1.0}, {})
    report = {r["step"]: r for r in report_metrics(store).to_pylist()}
    for step, row in rows.items():
        for c in STEP_COLUMNS:
            want = report[step][c]
            want = float(want) if want is not None and not isinstance(want, int | float) else want
            assert row[c] == want, (step, c, row[c], want)
        text = bar_text(row)
        for key in ("reward_mean", "verified_rate", "zero_var_share"):
            assert f"{key} {report[step][key]:.2f}" in text, (text, key)
    assert rows[1]["trunc_rate"] == 2 / 8 and rows[0]["trunc_rate"] == 0.0


def test_a_step_with_no_rollouts():
    row = step_metrics(0, [], [], [], {}, {}, {})
    assert row["n_rollouts"] == 0 and row["reward_mean"] is None and row["zero_var_share"] is None
    assert "verified_rate -" in bar_text(row)
