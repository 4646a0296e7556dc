"""The training loop's per-step JSONL row: zero-variance share and the tokens those groups cost."""

from gfcr.testing import make_rollout
from gfcr.train.metrics import step_metrics


def test_zero_variance_share_and_tokens_hand_worked():
    # group a: rewards 1, 1 (no variance, 6 + 4 generated tokens); group b: 1, 0 (variance);
    # group c: 0, 0, 0 (no variance, 3 x 5 tokens); a single-row group never counts as zero variance
    a = [make_rollout(0, prompt="a", n_gen=6, reward=1.0), make_rollout(1, prompt="a", n_gen=4, reward=1.0)]
    b = [make_rollout(2, prompt="b", n_gen=7, reward=1.0), make_rollout(3, prompt="b", n_gen=9, reward=0.0)]
    c = [make_rollout(i, prompt="c", n_gen=5, reward=0.0, verified=False) for i in range(4, 7)]
    d = [make_rollout(7, prompt="d", n_gen=8, reward=0.0, verified=False)]
    row = step_metrics(3, [a, b, c, d], [b], [], {}, {"generate": 1.0}, {})
    assert row["n_prompts"] == 4 and row["n_rollouts"] == 8
    assert row["zero_variance_share"] == 2 / 4
    assert row["zero_variance_tokens"] == 6 + 4 + 3 * 5
    assert row["gen_tokens"] == 6 + 4 + 7 + 9 + 15 + 8
    assert row["n_trained"] == 2 and row["seconds/generate"] == 1.0
