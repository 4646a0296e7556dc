import math

import numpy as np
import pytest
import torch

from gfcr.generate.engines import GenRequest, SamplingParams
from gfcr.generate.engines.hf_sampling import sampling_logprobs

MSGS = [{"role": "user", "content": "What is 12 + 7? Answer: N"}]


def _independent_tf_logprobs(model, ids, prompt_len, temperature):
    """A separate teacher-forced forward pass (written here, not the engine's helper)."""
    x = torch.tensor([list(ids)])
    with torch.no_grad():
        logits = model(input_ids=x).logits[0]
    lp = torch.log_softmax(logits[:-1] / temperature, dim=-1)
    tgt = x[0, 1:]
    return lp.gather(-1, tgt[:, None])[:, 0].numpy()[prompt_len - 1 :]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logprobs_match_teacher_forced_forward(engine, tiny, temperature):
    model, _ = tiny
    reqs = [
        GenRequest(messages=MSGS, params=SamplingParams(n=3, temperature=temperature, max_tokens=24, seed=5)),
        GenRequest(prompt_ids=[5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17],
                   params=SamplingParams(n=2, temperature=temperature, max_tokens=24, seed=9)),
    ]
    res = engine.generate(reqs)
    assert [len(r) for r in res] == [3, 2]
    for group in res:
        for r in group:
            assert len(r.token_ids) == len(r.logprobs) > 0
            full = np.concatenate([r.prompt_ids, r.token_ids])
            ref = _independent_tf_logprobs(model, full, len(r.prompt_ids), temperature)
            np.testing.assert_allclose(r.logprobs, ref, atol=1e-4, rtol=0)


def test_same_seed_same_tokens_and_different_seed_differs(engine):
    p = SamplingParams(n=2, temperature=1.0, max_tokens=16, seed=123)
    a = engine.generate([GenRequest(messages=MSGS, params=p)])[0]
    b = engine.generate([GenRequest(messages=MSGS, params=p)])[0]
    for x, y in zip(a, b, strict=True):
        assert x.token_ids.tolist() == y.token_ids.tolist()
    c = engine.generate([GenRequest(messages=MSGS, params=p.model_copy(update={"seed": 999}))])[0]
    assert [x.token_ids.tolist() for x in a] != [x.token_ids.tolist() for x in c]
    # samples inside one request differ (sample i uses seed + i)
    assert a[0].token_ids.tolist() != a[1].token_ids.tolist()


def test_finish_reasons_and_max_tokens(engine):
    res = engine.generate([GenRequest(messages=MSGS, params=SamplingParams(n=4, temperature=1.0, max_tokens=7, seed=1))])[0]
    for r in res:
        assert len(r.token_ids) <= 7
        if r.finish_reason == "length":
            assert len(r.token_ids) == 7
        else:
            assert r.finish_reason == "stop" and int(r.token_ids[-1]) in engine.eos_ids


def test_stop_token_ids_end_a_sample(engine):
    # stop on every token id: the first sampled token ends the sample with reason "stop"
    every = list(range(len(engine.tokenizer)))
    r = engine.generate([GenRequest(messages=MSGS, params=SamplingParams(max_tokens=10, seed=0, stop_token_ids=every))])[0][0]
    assert len(r.token_ids) == 1 and r.finish_reason == "stop"


def test_top_p_logprobs_hand_worked():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.2]]))
    lp = sampling_logprobs(logits, temperature=1.0, top_p=0.7)[0]
    assert math.isclose(float(lp[0]), math.log(0.625), abs_tol=1e-6)
    assert math.isclose(float(lp[1]), math.log(0.375), abs_tol=1e-6)
    assert float(lp[2]) == float("-inf")
    # temperature 0.5 squares then renormalises: [0.25, 0.09, 0.04] / 0.38
    lp2 = sampling_logprobs(logits, temperature=0.5)[0]
    assert math.isclose(float(lp2[0]), math.log(0.25 / 0.38), abs_tol=1e-6)


def test_top_p_samples_stay_in_nucleus_and_logprobs_match(engine, tiny):
    model, _ = tiny
    r = engine.generate([GenRequest(messages=MSGS, params=SamplingParams(n=2, temperature=0.9, top_p=0.5, max_tokens=12, seed=3))])[0]
    for x in r:
        full = torch.tensor([np.concatenate([x.prompt_ids, x.token_ids]).tolist()])
        with torch.no_grad():
            logits = model(input_ids=full).logits[0]
        P = len(x.prompt_ids)
        lp = sampling_logprobs(logits[P - 1 : -1], 0.9, 0.5)
        ref = lp.gather(-1, full[0, P:][:, None])[:, 0].numpy()
        assert np.all(np.isfinite(ref))
        np.testing.assert_allclose(x.logprobs, ref, atol=1e-4)


def test_greedy_is_deterministic_and_continues_prefix(engine):
    p = SamplingParams(temperature=0.0, max_tokens=10)
    a = engine.generate([GenRequest(messages=MSGS, params=p)])[0][0]
    b = engine.generate([GenRequest(messages=MSGS, params=p.model_copy(update={"seed": 77}))])[0][0]
    assert a.token_ids.tolist() == b.token_ids.tolist()
    # continuing from prompt + first 4 generated tokens reproduces the rest (greedy)
    if len(a.token_ids) > 5:
        prefix = np.concatenate([a.prompt_ids, a.token_ids[:4]]).tolist()
        c = engine.generate([GenRequest(prompt_ids=prefix, params=p.model_copy(update={"max_tokens": 6}))])[0][0]
        assert c.token_ids.tolist() == a.token_ids[4:10].tolist()


def test_engine_from_loaded_model_and_load_weights(tiny):
    from gfcr.generate.engines.hf import HFEngine
    from gfcr.testing import tiny_model

    model, tok = tiny
    other = tiny_model(tok, seed=1)
    e = HFEngine(tiny_model(tok, seed=0), tok)
    v0 = e.policy_version
    e.load_weights(other.state_dict())
    assert e.policy_version != v0
    e.load_weights(model)
    assert e.policy_version == v0


def test_bad_request_is_rejected():
    with pytest.raises(ValueError, match="exactly one"):
        GenRequest()
    with pytest.raises(ValueError):
        SamplingParams(temperature=-1)


def test_rows_finishing_early_leave_the_rest_of_the_batch_unchanged(engine, tiny):
    """Finished rows are dropped from the batch (and its KV cache) mid-decode: the rows still
    running must keep exact log-probs and sample the same tokens as when decoded alone."""
    model, _ = tiny
    lengths = [3, 20, 7, 14]
    reqs = [GenRequest(messages=MSGS, params=SamplingParams(temperature=1.0, max_tokens=m, seed=40 + i))
            for i, m in enumerate(lengths)]
    reqs.append(GenRequest(prompt_ids=[5, 6, 7, 8, 9, 10, 11], params=SamplingParams(temperature=1.0, max_tokens=18, seed=7)))
    together = [r[0] for r in engine.generate(reqs)]
    assert len({len(r.token_ids) for r in together}) > 2  # rows really finish at different steps
    for req, r in zip(reqs, together, strict=True):
        alone = engine.generate([req])[0][0]
        assert r.token_ids.tolist() == alone.token_ids.tolist()
        full = np.concatenate([r.prompt_ids, r.token_ids])
        ref = _independent_tf_logprobs(model, full, len(r.prompt_ids), 1.0)
        np.testing.assert_allclose(r.logprobs, ref, atol=1e-4, rtol=0)
