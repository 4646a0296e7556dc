"""Group advantage estimators over rollouts and per-token terms (gfcr.filters.advantages)."""

from __future__ import annotations

import numpy as np
import pytest

from gfcr.filters.advantages import ESTIMATORS, answer_cluster, make_estimator, with_token_terms
from gfcr.testing import make_rollout


def _group(rewards, n_ctx=2, n_gen=2):
    return [make_rollout(i, prompt="p", n_ctx=n_ctx, n_gen=n_gen, reward=r) for i, r in enumerate(rewards)]


def test_estimators_by_hand():
    g = _group([1.0, 0.0, 0.0, 0.0])
    assert make_estimator("grpo")(g) == pytest.approx([1.5, -0.5, -0.5, -0.5], abs=1e-5)
    assert make_estimator("dr_grpo")(g) == pytest.approx([0.75, -0.25, -0.25, -0.25])
    assert make_estimator("rloo")(g) == pytest.approx([1.0, -1 / 3, -1 / 3, -1 / 3])
    assert make_estimator("reward")(g) == [1.0, 0.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="unknown advantage estimator 'gpro'"):
        make_estimator("gpro")
    assert set(ESTIMATORS) == {"grpo", "dr_grpo", "rloo", "seed_grpo", "treerl", "reward", "judge"}


def test_seed_grpo_reads_the_verifiers_answer_as_the_cluster():
    g = _group([1.0, 0.0, 0.0, 0.0])
    for r, v in zip(g, ["7", "5", "5", "3"], strict=True):
        r.verifier = {"evidence": {"value": v}}
    assert [answer_cluster(r) for r in g] == ["7", "5", "5", "3"]
    assert make_estimator("seed_grpo")(g) == pytest.approx([0.125, -0.25 / 6, -0.25 / 6, -0.25 / 6], abs=1e-4)


def test_a_per_token_term_plugs_in_without_new_code():
    """The docstring example: advantage 0.5, term [0, 0, −0.2, 0.1] with coef 2 → [.., .., 0.1, 0.7]."""
    g = _group([1.0, 0.0], n_ctx=2, n_gen=2)
    est = with_token_terms(lambda rs: [0.5, -0.5], [(2.0, lambda r: np.array([0.0, 0.0, -0.2, 0.1]))])
    a, b = est(g)
    np.testing.assert_allclose(a[2:], [0.1, 0.7], atol=1e-6)
    np.testing.assert_allclose(b[2:], [-0.9, -0.3], atol=1e-6)
    bad = with_token_terms(lambda rs: [0.0, 0.0], [(1.0, lambda r: np.zeros(3))])
    with pytest.raises(ValueError, match="token term has shape"):
        bad(g)
