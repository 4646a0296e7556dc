"""TreeRL per-token advantages (gfcr.filters.treerl) on hand-worked trees, both scalings."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gfcr.filters.advantages import make_estimator
from gfcr.filters.treerl import shared_prefix_lengths, tree_advantages, tree_values


def test_tree_values_and_segment_scaling_hand_worked():
    # prompt of 2 tokens; path 0 (6 tokens, reward 1); path 1 forks from 0 at 4 (reward 0);
    # path 2 forks from 0 at 3 (5 tokens, reward 0)
    parents, bps, lens, rew = [None, 0, 0], [2, 4, 3], [6, 6, 5], [1.0, 0.0, 0.0]
    S = shared_prefix_lengths(parents, bps, lens)
    assert S.tolist() == [[6, 4, 3], [4, 6, 3], [3, 3, 5]]
    values, counts = tree_values(parents, bps, lens, rew)
    np.testing.assert_allclose(values[0], [1 / 3, 1 / 3, 1 / 3, 1 / 2, 1, 1])
    assert counts[0].tolist() == [3, 3, 3, 2, 1, 1]
    adv = tree_advantages(parents, bps, lens, rew, prompt_len=2, scaling="segment")
    s = (1 / 6 + 1 / 6) / math.sqrt(2)
    np.testing.assert_allclose(adv[0], [0, 0, 0, s, 7 / 6, 7 / 6], atol=1e-6)
    np.testing.assert_allclose(adv[1], [0, 0, 0, s, -5 / 6, -5 / 6], atol=1e-6)
    np.testing.assert_allclose(adv[2], [0, 0, 0, -2 / 3, -2 / 3], atol=1e-6)


def test_reference_scaling_is_treerl_code_rloo_and_own_count():
    """Three leaves rewarded [1, 1, 0]; leaves 0 and 1 share a segment (n = 2); leaf 2 is its own root path.
    TreeRL's code RLOO-centres the leaves (×N/(N−1) = 3/2 of R − mean), so c = 3/2·(V − V(root)) = 1/2 on
    leaf 0's own segment and on the shared one, and divides each node by √ of its own count:
    1/2 + (1/2 − (1/2)/√2) = 0.646 (the plain mean-centred 0.431 was short by the factor 3/2);
    the segment scaling gives ((1 − 2/3) + (1 − 1))/1 = 0.333."""
    parents, bps, lens, rew = [None, 0, None], [2, 4, 2], [6, 6, 6], [1.0, 1.0, 0.0]
    ref = tree_advantages(parents, bps, lens, rew, prompt_len=2)
    seg = tree_advantages(parents, bps, lens, rew, prompt_len=2, scaling="segment")
    assert ref[0][5] == pytest.approx(1.0 - 0.5 / math.sqrt(2), abs=1e-6) == pytest.approx(0.646, abs=1e-3)
    assert ref[0][5] == pytest.approx(1.5 * (2 / 3 - (1 / 3) / math.sqrt(2)), abs=1e-6)  # 3/2 × 0.431
    assert seg[0][5] == pytest.approx(1 / 3, abs=1e-6)
    assert ref[0][2] == pytest.approx(2 * 0.5 / math.sqrt(2), abs=1e-6)  # the shared segment: parent = root (c = 0)
    assert seg[0][2] == pytest.approx(2 * (1 / 3) / math.sqrt(2), abs=1e-6)
    assert ref[2][3] == pytest.approx(2 * 1.5 * (-2 / 3), abs=1e-6)  # leaf 2: c = 3/2·(−2/3), n = 1, parent = root
    with pytest.raises(ValueError, match="scaling"):
        tree_advantages(parents, bps, lens, rew, prompt_len=2, scaling="sqrt")
    with pytest.raises(ValueError, match="overall_norm"):
        tree_advantages(parents, bps, lens, rew, prompt_len=2, overall_norm="step")
    assert [a.tolist() for a in tree_advantages([None], [2], [5], [1.0], 2)] == [[0.0] * 5]  # one leaf: no RLOO


def test_reference_deeper_tree_and_the_token_mean_shift():
    """A (2 tokens, leaves B, F, G) → B (3, reward 1) and E (1) → F (2, reward 0), G (4, reward 1); D (5, reward 0)
    its own root path. N = 4, mean 1/2, RLOO factor 4/3. Checked against TreeRL's own leaf_normalize,
    compute_weighted_update and gather_paths run on the same tree (values to 4 decimals)."""
    parents, bps, lens, rew = [None, 0, 1, None], [2, 4, 5, 2], [7, 7, 9, 7], [1.0, 0.0, 1.0, 0.0]
    ref = tree_advantages(parents, bps, lens, rew, prompt_len=2)
    u_a = 4 / 3 * (2 / 3 - 1 / 2) / math.sqrt(3)  # A: V = 2/3, n = 3; its parent is the root (u = 0)
    u_b, u_e, u_f = 4 / 3 * 0.5, 4 / 3 * 0.0 / math.sqrt(2), 4 / 3 * -0.5
    np.testing.assert_allclose(ref[0][2:], [2 * u_a] * 2 + [u_b - u_a + u_b] * 3, atol=1e-5)
    np.testing.assert_allclose(ref[1][2:], [2 * u_a] * 2 + [u_e - u_a + u_e] + [u_f - u_e + u_f] * 2, atol=1e-5)
    np.testing.assert_allclose(ref[0][2:], [0.2566, 0.2566, 1.205, 1.205, 1.205], atol=1e-4)
    # overall_norm token: m = Σ R'·L / Σ L over the leaves' generated lengths [5, 5, 7, 5] is shifted off every node
    tok = tree_advantages(parents, bps, lens, rew, prompt_len=2, overall_norm="token")
    m = float(np.dot(4 / 3 * (np.array(rew) - 0.5), [5, 5, 7, 5]) / 22)
    u_root, u_a2, u_b2 = -m / 2, (4 / 3 * (2 / 3 - 1 / 2) - m) / math.sqrt(3), 4 / 3 * 0.5 - m
    np.testing.assert_allclose(tok[0][2:], [u_a2 - u_root + u_a2] * 2 + [u_b2 - u_a2 + u_b2] * 3, atol=1e-5)
    np.testing.assert_allclose(tok[0][2:], [0.2169, 0.2169, 1.1188, 1.1188, 1.1188], atol=1e-4)


def test_treerl_estimator_over_stored_tree_rollouts():
    from gfcr.testing import make_rollout

    rs = [make_rollout(i, prompt="p", n_ctx=2, n_gen=4, reward=r, group_id="t") for i, r in enumerate([1.0, 1.0, 0.0])]
    rs[1].parent_id, rs[1].branch_pos = rs[0].rollout_id, 4
    rs[1].token_ids[:4] = rs[0].token_ids[:4]
    adv = make_estimator("treerl")(rs)
    assert adv[0].shape == (6,) and adv[0][5] == pytest.approx(0.646, abs=1e-3)
    assert make_estimator("treerl", scaling="segment")(rs)[0][5] == pytest.approx(1 / 3, abs=1e-6)
