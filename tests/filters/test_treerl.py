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


def test_reference_scaling_divides_the_parent_by_its_own_count():
    """Three leaves rewarded [1, 1, 0]; leaves 0 and 1 share a segment (n = 2); leaf 2 is its own root path.
    On leaf 0's own segment, TreeRL's code gives c/√1 + (c/√1 − c_parent/√2) with c = V − V(root) = 1/3:
    1/3 + 1/3 − (1/3)/√2 = 0.431; the segment scaling gives ((1 − 2/3) + (1 − 1))/1 = 0.333."""
    parents, bps, lens, rew = [None, 0, None], [2, 4, 2], [6, 6, 6], [1.0, 1.0, 0.0]
    ref = tree_advantages(parents, bps, lens, rew, prompt_len=2)
    seg = tree_advantages(parents, bps, lens, rew, prompt_len=2, scaling="segment")
    assert ref[0][5] == pytest.approx(2 / 3 - (1 / 3) / math.sqrt(2), abs=1e-6) == pytest.approx(0.431, abs=1e-3)
    assert seg[0][5] == pytest.approx(1 / 3, abs=1e-6)
    shared = 2 * (1 / 3) / math.sqrt(2)  # the shared segment: parent = root (c = 0)
    assert ref[0][2] == pytest.approx(shared, abs=1e-6) and seg[0][2] == pytest.approx(shared, abs=1e-6)
    assert ref[2][3] == pytest.approx(2 * (-2 / 3), abs=1e-6)  # leaf 2: c = −2/3, n = 1, parent = root
    with pytest.raises(ValueError, match="scaling"):
        tree_advantages(parents, bps, lens, rew, prompt_len=2, scaling="sqrt")


def test_treerl_estimator_over_stored_tree_rollouts():
    from gfcr.testing import make_rollout

    rs = [make_rollout(i, prompt="p", n_ctx=2, n_gen=4, reward=r, group_id="t") for i, r in enumerate([1.0, 1.0, 0.0])]
    rs[1].parent_id, rs[1].branch_pos = rs[0].rollout_id, 4
    rs[1].token_ids[:4] = rs[0].token_ids[:4]
    adv = make_estimator("treerl")(rs)
    assert adv[0].shape == (6,) and adv[0][5] == pytest.approx(0.431, abs=1e-3)
    assert make_estimator("treerl", scaling="segment")(rs)[0][5] == pytest.approx(1 / 3, abs=1e-6)
