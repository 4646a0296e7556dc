"""The hf engine's per-token entropies (GenResult.entropies) give signals["entropy"] for free; they must
equal the trainer's no-grad forward (PolicyTrainer.rollout_entropy) for every topology."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from gfcr.generate.engines import GenRequest, SamplingParams
from gfcr.generate.engines.hf import HFEngine
from gfcr.generate.engines.hf_sampling import entropy_of
from gfcr.generate.topologies import make_topology
from gfcr.records import Message, Prompt
from gfcr.testing import tiny_model, tiny_tokenizer
from gfcr.train.config import LossConfig, OptimConfig
from gfcr.train.trainer import PolicyTrainer

T = 0.7


@pytest.fixture(scope="module")
def setup():
    tok = tiny_tokenizer()
    model = tiny_model(tok, seed=3)
    return HFEngine(model, tok, policy_version="v"), PolicyTrainer(model, LossConfig(), OptimConfig(), tok.pad_token_id,
                                                                  temperature=T)


def _prompts(n=2):
    return [Prompt(prompt_id=f"p{i}", task="arith", messages=[Message("user", f"What is {i} + 3?")], answer=str(i + 3))
            for i in range(n)]


def test_entropy_of_by_hand():
    lp = torch.log(torch.tensor([[0.5, 0.5, 0.0], [0.25, 0.25, 0.5]]))
    got = entropy_of(lp, lp.exp())
    assert got[0].item() == pytest.approx(math.log(2))
    assert got[1].item() == pytest.approx(-(2 * 0.25 * math.log(0.25) + 0.5 * math.log(0.5)))


@pytest.mark.parametrize("topology, kw", [
    ("group", {"k": 3}),
    ("tree", {"m": 2, "n": 1, "l": 1, "t": 2}),
    ("multi_turn", {"k": 2, "env": "calculator", "max_turns": 2}),
])
def test_engine_entropy_equals_the_trainer_forward(setup, topology, kw):
    engine, trainer = setup
    topo = make_topology(topology, params=SamplingParams(temperature=T, max_tokens=8), seed=1, **kw)
    rs = topo.generate(engine, _prompts(), "r", 0)
    assert rs and all("entropy" in r.signals for r in rs)
    if topology == "tree":
        assert any(r.parent_id is not None for r in rs)  # children: prefix entropies come from the parent
    want = trainer.rollout_entropy(rs)
    got = np.array([r.signals["entropy"] for r in rs])
    np.testing.assert_allclose(got, want, atol=1e-4)


def test_mixed_batches_and_greedy_report_entropies(setup):
    engine, _ = setup
    ids = engine.encode_messages([{"role": "user", "content": "hi"}])
    res = engine.generate([GenRequest(prompt_ids=ids, params=SamplingParams(temperature=T, max_tokens=5, seed=1)),
                           GenRequest(prompt_ids=ids, params=SamplingParams(temperature=0.0, max_tokens=5)),
                           GenRequest(prompt_ids=ids, params=SamplingParams(temperature=1.0, top_p=0.5, max_tokens=5, seed=2))])
    for (r,) in res:
        assert r.entropies is not None and len(r.entropies) == len(r.token_ids)
        assert np.isfinite(r.entropies).all() and (r.entropies >= 0).all()
    # a top-p nucleus is narrower than the full distribution at the same temperature
    full = engine.generate([GenRequest(prompt_ids=ids, params=SamplingParams(temperature=1.0, max_tokens=1, seed=2))])
    assert res[2][0].entropies[0] < full[0][0].entropies[0]
