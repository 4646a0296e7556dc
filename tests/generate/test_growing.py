"""Continuous batching in the hf engine (gfcr.generate.engines.growing) and the tree decoded with it."""

import numpy as np
import pytest
import torch

from gfcr.generate.engines import GenRequest, SamplingParams
from gfcr.generate.engines.growing import merge_caches, trim_left
from gfcr.generate.topologies import EPTree
from gfcr.tasks.arith import make_arith


def test_merge_and_trim_worked_example():
    from transformers import DynamicCache

    a, b = DynamicCache(), DynamicCache()
    ka = torch.arange(1, 7, dtype=torch.float32).reshape(2, 1, 3, 1)  # 2 rows, 3 positions
    kb = torch.tensor([[[[7.0], [8.0]]]])  # 1 row, 2 positions
    a.update(ka, ka.clone(), 0)
    b.update(kb, kb.clone(), 0)
    attn_a = torch.tensor([[0, 1, 1], [1, 1, 1]])
    attn_b = torch.tensor([[1, 1]])
    cache, attn = merge_caches(a, attn_a, b, attn_b)
    assert attn.tolist() == [[0, 1, 1], [1, 1, 1], [0, 1, 1]]
    assert cache.layers[0].keys[:, 0, :, 0].tolist() == [[1, 2, 3], [4, 5, 6], [0, 7, 8]]
    cache.batch_select_indices(torch.tensor([0, 2]))  # row 1 finished: column 0 is padding for all
    attn = trim_left(cache, attn[[0, 2]])
    assert attn.tolist() == [[1, 1], [1, 1]]
    assert cache.layers[0].keys[:, 0, :, 0].tolist() == [[2, 3], [7, 8]]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_growing_batch_matches_separate_calls(tiny, temperature, monkeypatch):
    from gfcr.generate.engines import growing
    from gfcr.generate.engines.hf import HFEngine

    reused = []
    real_extend = growing._extend
    monkeypatch.setattr(growing, "_extend", lambda eng, part, *a: reused.append(len(part)) or real_extend(eng, part, *a))

    model, tok = tiny
    eng = HFEngine(model, tok, policy_version="tiny-0", max_batch=3)  # 3 slots for 8 rows: rows queue
    sp = SamplingParams(n=2, temperature=temperature, max_tokens=12, seed=5, stop_token_ids=[])
    p1 = tok("the cat sat on", add_special_tokens=False)["input_ids"]
    p2 = tok("a b", add_special_tokens=False)["input_ids"]
    added = []

    def follow(i, res):  # each first request spawns one continuing its first sample's prefix
        if i >= 2:
            return []
        pre = list(res[0].prompt_ids) + res[0].token_ids[:3].tolist()
        q = GenRequest(prompt_ids=pre, params=sp.model_copy(update={"max_tokens": 7, "seed": 11 + i}))
        added.append(q)
        return [q]

    reqs = [GenRequest(prompt_ids=p1, params=sp), GenRequest(prompt_ids=p2, params=sp.model_copy(update={"max_tokens": 5}))]
    got = eng.generate_growing(reqs, follow)
    assert len(got) == 4 and [len(g) for g in got] == [2, 2, 2, 2]
    assert sum(reused) >= 4, "the follow-up requests continue finished rows: their prefix cache is reused"
    for req, res in zip(reqs + added, got, strict=True):
        alone = eng.generate([req])[0]
        for a, b in zip(res, alone, strict=True):
            assert a.token_ids.tolist() == b.token_ids.tolist()
            np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)
            assert a.finish_reason == b.finish_reason and a.prompt_ids.tolist() == b.prompt_ids.tolist()


def test_tree_growing_and_round_by_round_give_the_same_shape(engine):
    prompts = make_arith(n=2, level=1, seed=4).prompts()
    topo = EPTree(m=3, n=2, l=1, t=2, params=SamplingParams(max_tokens=14, temperature=1.0), seed=9)
    grown = topo.generate(engine, prompts, run_id="g", step=1)
    rounds = topo._generate_rounds(engine, prompts, run_id="g", step=1)
    assert len(grown) == len(rounds) == 2 * topo.leaves_per_prompt
    for rs in (grown, rounds):
        by_prompt = {}
        for r in rs:
            by_prompt.setdefault(r.prompt_id, []).append(r)
        for members in by_prompt.values():
            assert sorted(r.sample_index for r in members) == list(range(topo.leaves_per_prompt))
            assert sorted(r.meta["tree"]["round"] for r in members) == sorted(
                [0] * 3 + [1] * 6 + [2] * 6)
    # roots get the same seeds either way: the same root paths
    root = lambda rs: sorted(r.token_ids.tolist() for r in rs if r.parent_id is None)  # noqa: E731
    assert root(grown) == root(rounds)
    by_id = {r.rollout_id: r for r in grown}
    for r in grown:
        r.validate()
        if r.parent_id:
            p = by_id[r.parent_id]
            assert r.token_ids[: r.branch_pos].tolist() == p.token_ids[: r.branch_pos].tolist()
            assert r.meta["tree"]["root"] == p.meta["tree"]["root"]
            assert r.n_generated - (r.branch_pos - int(np.argmax(r.token_role == 1))) <= 14
    again = topo.generate(engine, prompts, run_id="g", step=1)  # deterministic, whatever the finish order
    assert [(r.sample_index, r.token_ids.tolist()) for r in again] == [(r.sample_index, r.token_ids.tolist()) for r in grown]
