"""EPTree forking points and per-leaf token accounting (tree vs group)."""

import math

import numpy as np
import pytest

from gfcr.generate.engines import SamplingParams
from gfcr.generate.topologies import (
    EPTree,
    Group,
    choose_forks,
    fork_end,
    make_topology,
    sampled_tokens,
    token_accounting,
    tree_token_saving,
)
from gfcr.records import GENERATED
from gfcr.tasks.arith import make_arith
from gfcr.testing import make_rollout


def test_choose_forks_plain_top_n_vs_minimum_prefix():
    ent = [np.array([5.0, 1.0, 2.0, 3.0])]
    # TreeRL's rule: the two highest -log p tokens, wherever they are
    assert choose_forks(ent, [0], 2, min_prefix_frac=0.0) == [(0, 0), (0, 3)]
    # window = offsets >= ceil(0.5 * 4) = 2: the opening token (5.0) is passed over
    assert choose_forks(ent, [0], 2, min_prefix_frac=0.5) == [(0, 3), (0, 2)]
    # window = offsets >= ceil(0.6 * 4) = 3: one candidate inside, the rest filled from outside by entropy
    assert choose_forks(ent, [0], 3, min_prefix_frac=0.6) == [(0, 3), (0, 0), (0, 2)]


def test_choose_forks_segments_used_and_ends():
    # path 0 is a root (6 tokens); path 1 is a child that branched at offset 4 (own segment: 4, 5)
    ent = [np.array([9.0, 0.1, 0.2, 4.0, 0.3, 1.0]), np.array([9.0, 0.1, 0.2, 4.0, 7.0, 0.5])]
    # window for both: offsets >= 3; path 1 may not fork inside the shared prefix (offsets < 4)
    assert choose_forks(ent, [0, 4], 2, min_prefix_frac=0.5) == [(1, 4), (0, 3)]
    # already forked at (1, 4) and (0, 3): the next best in the window
    assert choose_forks(ent, [0, 4], 2, min_prefix_frac=0.5, used=[(1, 4), (0, 3)]) == [(0, 5), (1, 5)]
    # TreeRL's answer mask: path 0 may not fork at offset >= 4
    assert choose_forks(ent, [0, 4], 3, min_prefix_frac=0.5, ends=[4, None]) == [(1, 4), (0, 3), (1, 5)]
    # ties: lower path, then lower offset
    assert choose_forks([np.ones(3), np.ones(3)], [0, 0], 3, min_prefix_frac=0.0) == [(0, 0), (0, 1), (0, 2)]
    assert choose_forks([np.ones(3)], [0], 0) == []
    with pytest.raises(ValueError, match="min_prefix_frac"):
        choose_forks(ent, [0, 4], 1, min_prefix_frac=1.0)


def test_fork_end_masks_after_the_answer_word():
    assert fork_end(["So", " the", " answer", " is", " 4"], ["answer"]) == 3
    assert fork_end(["ĠCONCLUSION", ":"], ["answer", "conclusion"]) == 1
    assert fork_end(["1", "+", "2"], ["answer"]) is None


def test_token_accounting_counts_only_sampled_tokens_of_children():
    root = make_rollout(0, n_ctx=4, n_gen=10)
    # child shares prompt (4) + 6 generated tokens with the root, then samples 3 of its own
    child = make_rollout(1, n_ctx=4, n_gen=9, parent_id=root.rollout_id, branch_pos=10)
    assert sampled_tokens(root) == 10 and sampled_tokens(child) == 3
    acc = token_accounting([root, child])
    assert (acc.leaves, acc.leaf_tokens, acc.sampled_tokens) == (2, 19, 13)
    assert acc.sampled_per_leaf == 6.5 and acc.leaf_tokens_per_leaf == 9.5
    group = [make_rollout(i, n_ctx=4, n_gen=10) for i in range(2)]
    assert token_accounting(group).sampled_per_leaf == 10.0
    assert tree_token_saving([root, child], group) == pytest.approx(1 - 6.5 / 10)


def test_tree_samples_fewer_tokens_per_leaf_than_group(engine):
    prompts = make_arith(n=2, level=1, seed=0).prompts()
    params = SamplingParams(max_tokens=16, temperature=1.0)
    tree = EPTree(m=2, n=2, l=1, t=2, params=params, seed=5)  # min_prefix_frac = 0.5 by default
    group = Group(k=tree.leaves_per_prompt, params=params, seed=5)
    tr = tree.generate(engine, prompts, run_id="t")
    gr = group.generate(engine, prompts, run_id="g")
    assert len(tr) == len(gr) == 2 * tree.leaves_per_prompt  # equal leaf count
    by_id = {r.rollout_id: r for r in tr}
    for r in tr:
        assert r.cost.gen_tokens == sampled_tokens(r)  # cost records what the engine sampled
        if r.parent_id is None:
            continue
        parent = by_id[r.parent_id]
        n_prompt = len(parent.token_ids) - parent.n_generated
        off = r.branch_pos - n_prompt
        assert off == r.meta["tree"]["fork_offset"]
        if parent.n_generated >= 4:  # enough in-window candidates: the fork lies in the parent's second half
            assert off >= math.ceil(0.5 * parent.n_generated)
        assert np.all(r.token_role[r.branch_pos:] == GENERATED)
    t, g = token_accounting(tr), token_accounting(gr)
    assert t.leaves == g.leaves and g.sampled_tokens == g.leaf_tokens
    assert t.sampled_tokens < g.sampled_tokens
    assert tree_token_saving(tr, gr) > 0.2
    assert tr[0].sampling["tree"]["min_prefix_frac"] == 0.5


def test_eptree_config_is_checked_and_backward_compatible():
    with pytest.raises(ValueError, match="min_prefix_frac"):
        EPTree(min_prefix_frac=1.5)
    t = make_topology("tree", k=8, m=3, n=1, l=2, t=1, params=SamplingParams(), seed=0, min_prefix_frac=0.0)
    assert isinstance(t, EPTree) and t.leaves_per_prompt == 3 * (1 + 2) and t.min_prefix_frac == 0.0
    assert EPTree(6, 2, 1, 2, SamplingParams(), 0).min_prefix_frac == 0.5
