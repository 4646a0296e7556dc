"""hf engine sampling parameters (top-k, penalties, logit bias, top log-probs), cancellation, scoring,
and the pure helpers of gfcr serve's wire format, on hand-worked examples."""

from __future__ import annotations

import math
import threading

import numpy as np
import pytest
import torch

from gfcr.generate.engines import GenRequest, SamplingParams
from gfcr.generate.engines.hf_sampling import penalized_logits, sampling_logprobs
from gfcr.serve import LOOPBACK_NAMES, host_allowed, is_loopback
from gfcr.serve.api import (
    APIError,
    DeltaText,
    ServeLimits,
    cut_at_stop,
    resolve_max_tokens,
)
from gfcr.serve.chat import chat_messages

MSGS = [{"role": "user", "content": "What is 3 + 4?"}]


# --- pure rules ---------------------------------------------------------------------------------


def test_top_k_and_penalties_hand_worked():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.2]]))
    assert sampling_logprobs(logits, 1.0, top_k=1)[0].tolist() == [0.0, -math.inf, -math.inf]
    lp = sampling_logprobs(logits, 1.0, top_k=2)[0]
    np.testing.assert_allclose(lp[:2].exp().numpy(), [0.625, 0.375], atol=1e-6)
    out = penalized_logits(torch.ones((1, 3)), torch.tensor([[2.0, 1.0, 0.0]]), torch.tensor([0.5]), torch.tensor([0.25]))
    np.testing.assert_allclose(out[0].numpy(), [-0.25, 0.25, 1.0])


def test_host_allowed_examples():
    assert host_allowed("127.0.0.1:8000", LOOPBACK_NAMES) and host_allowed("[::1]:8000", LOOPBACK_NAMES)
    assert host_allowed("LOCALHOST", LOOPBACK_NAMES) and host_allowed("localhost.:80", LOOPBACK_NAMES)
    assert not host_allowed("evil.example:8000", LOOPBACK_NAMES)
    assert not host_allowed("127.0.0.1.evil.example", LOOPBACK_NAMES)
    assert not host_allowed(None, LOOPBACK_NAMES) and not host_allowed("", LOOPBACK_NAMES)
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost") and not is_loopback("0.0.0.0")


def test_delta_text_holds_back_a_possible_stop_string():
    pieces = {1: "a", 2: "#", 3: "#b"}
    d = DeltaText(lambda ids: "".join(pieces[i] for i in ids), ["##"])
    assert [d.push(1), d.push(2), d.push(3)] == ["", "a", ""]
    assert d.finish("a") == "" and d.sent == "a"
    d2 = DeltaText(lambda ids: "".join(pieces[i] for i in ids), [])
    assert [d2.push(1), d2.push(2)] == ["a", "#"] and d2.finish("a##b") == "#b"
    assert cut_at_stop("ab\ncd", ["\n"]) == "ab"


def test_resolve_max_tokens_and_messages():
    lim = ServeLimits(max_tokens=500, default_max_tokens=256)
    assert resolve_max_tokens(None, 1000, 1024, lim) == 24  # what the context leaves
    assert resolve_max_tokens(None, 10, 1024, lim) == 256
    assert resolve_max_tokens(14, 10, 1024, lim) == 14
    with pytest.raises(APIError, match=r"1100 tokens \(1000 in the messages, 100 in the completion\)"):
        resolve_max_tokens(100, 1000, 1024, lim)
    with pytest.raises(APIError, match="limit of 500"):
        resolve_max_tokens(501, 10, 1024, lim)
    got = chat_messages([{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                         {"role": "assistant", "content": None}])
    assert got == [{"role": "user", "content": "a\nb"}, {"role": "assistant", "content": ""}]
    with pytest.raises(APIError, match="needs a string 'role'"):
        chat_messages([{"content": "x"}])


# --- the engine -----------------------------------------------------------------------------------


def _gen(engine, ids, **kw):
    return engine.generate([GenRequest(prompt_ids=ids, params=SamplingParams(**kw))])[0]


def test_logit_bias_top_k_and_stop_token_ids(engine):
    ids = engine.encode_messages(MSGS)
    forced = 100
    r = _gen(engine, ids, temperature=1.0, max_tokens=6, seed=0, logit_bias={forced: 100.0})[0]
    assert r.token_ids.tolist() == [forced] * 6
    greedy = _gen(engine, ids, temperature=0.0, max_tokens=8)[0]
    banned = int(greedy.token_ids[0])
    r2 = _gen(engine, ids, temperature=0.0, max_tokens=8, logit_bias={banned: -100.0})[0]
    assert banned not in r2.token_ids.tolist()
    k1 = _gen(engine, ids, temperature=1.0, max_tokens=8, seed=3, top_k=1)[0]
    assert k1.token_ids.tolist() == greedy.token_ids.tolist()
    np.testing.assert_allclose(k1.logprobs, 0.0, atol=1e-6)  # one token left: probability 1
    stop_at = int(greedy.token_ids[3])
    r3 = _gen(engine, ids, temperature=0.0, max_tokens=8, stop_token_ids=[stop_at])[0]
    first = greedy.token_ids.tolist().index(stop_at)
    assert r3.token_ids.tolist() == greedy.token_ids[: first + 1].tolist() and r3.finish_reason == "stop"


def test_penalties_match_a_manual_greedy_loop(engine, tiny):
    model, _ = tiny
    ids = engine.encode_messages(MSGS)
    r = _gen(engine, ids, temperature=0.0, max_tokens=10, frequency_penalty=1.5, presence_penalty=0.5,
             logit_bias={7: 2.0})[0]
    seq, counts = list(ids), torch.zeros(model.config.vocab_size)
    bias = torch.zeros(model.config.vocab_size)
    bias[7] = 2.0
    for t in range(r.n_tokens):
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([seq])).logits[0, -1].float()
        x = logits - 1.5 * counts - 0.5 * (counts > 0).float() + bias
        lp = torch.log_softmax(x, -1)
        want = int(torch.argmax(lp))
        assert int(r.token_ids[t]) == want
        assert float(r.logprobs[t]) == pytest.approx(float(lp[want]), abs=1e-4)
        counts[want] += 1
        seq.append(want)
    plain = _gen(engine, ids, temperature=0.0, max_tokens=10)[0]
    assert plain.token_ids.tolist() != r.token_ids.tolist()  # the penalties did change something


def test_top_logprobs_and_score_match_teacher_forcing(engine, tiny):
    model, _ = tiny
    ids = engine.encode_messages(MSGS)
    r = _gen(engine, ids, temperature=1.0, max_tokens=10, seed=4, top_logprobs=4)[0]
    assert r.top_ids.shape == (r.n_tokens, 4) and r.top_logprobs.shape == (r.n_tokens, 4)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids + r.token_ids.tolist()])).logits[0].float()
    lp = torch.log_softmax(logits[len(ids) - 1 : -1], -1)
    top = torch.topk(lp, 4)
    np.testing.assert_array_equal(r.top_ids, top.indices.numpy())
    np.testing.assert_allclose(r.top_logprobs, top.values.numpy(), atol=1e-4)
    # score(): the same numbers as the recorded behaviour log-probs (T = 1, no cuts), batched or alone
    np.testing.assert_allclose(engine.score(ids, r.token_ids.tolist()), r.logprobs, atol=1e-4)
    other = ids[:5]
    both = engine.score_batch([(ids, r.token_ids.tolist()), (other, ids[5:9])], top_n=2)
    np.testing.assert_allclose(both[0].logprobs, r.logprobs, atol=1e-4)
    np.testing.assert_allclose(both[1].logprobs, engine.score(other, ids[5:9]), atol=1e-4)
    assert both[1].top_ids.shape == (4, 2)
    with pytest.raises(ValueError, match="at least one prompt token"):
        engine.score([], [1, 2])


def test_cancel_stops_one_request_and_leaves_the_others(engine):
    ids = engine.encode_messages(MSGS)
    p = SamplingParams(temperature=1.0, max_tokens=12, seed=9, logit_bias={engine.tokenizer.eos_token_id: -100.0})
    ev, seen = threading.Event(), []

    def on_token(e):
        seen.append(e.token)
        if len(seen) == 3:
            ev.set()

    alone = engine.generate([GenRequest(prompt_ids=ids, params=p)])[0][0]
    got = engine.generate([GenRequest(prompt_ids=ids, params=p, on_token=on_token, cancel=ev),
                           GenRequest(prompt_ids=ids, params=p)])
    cut, other = got[0][0], got[1][0]
    assert cut.finish_reason == "abort" and cut.meta.get("cancelled") and cut.n_tokens == 3
    assert cut.token_ids.tolist() == seen == alone.token_ids[:3].tolist()
    assert other.token_ids.tolist() == alone.token_ids.tolist() and other.n_tokens == 12


# --- the vectorised sampling step ---------------------------------------------------------------


def test_inverse_cdf_sample_hand_worked():
    from gfcr.generate.engines.hf_sampling import inverse_cdf_sample

    probs = torch.tensor([[0.5, 0.3, 0.2]] * 4)
    assert inverse_cdf_sample(probs, torch.tensor([0.1, 0.5, 0.9, 0.0])).tolist() == [0, 1, 2, 0]
    holed = torch.tensor([[0.5, 0.0, 0.5], [0.0, 0.0, 1.0]])
    assert inverse_cdf_sample(holed, torch.tensor([0.5, 0.0])).tolist() == [2, 2]  # empty tokens never drawn
    # a uniform that rounds to the total (or past it) still lands on the last token with mass
    assert inverse_cdf_sample(torch.tensor([[0.7, 0.3, 0.0]]), torch.tensor([1.0])).tolist() == [1]


def test_vectorised_draws_follow_the_recorded_distribution(engine, tiny):
    """600 one-token samples (one seeded row each) at T = 0.8, top-k 6: the token frequencies match the
    probabilities of the distribution the engine records (chi-square, 5 degrees of freedom)."""
    model, _ = tiny
    ids = engine.encode_messages(MSGS)
    res = _gen(engine, ids, n=600, temperature=0.8, top_k=6, max_tokens=1, seed=2024, stop_token_ids=[])
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0, -1:].float()
    p = sampling_logprobs(logits, 0.8, top_k=6)[0].exp()
    support = torch.nonzero(p > 0)[:, 0].tolist()
    drawn = [int(r.token_ids[0]) for r in res]
    assert set(drawn) <= set(support) and len(support) == 6
    counts = np.array([drawn.count(t) for t in support], dtype=float)
    expected = 600 * p[support].numpy()
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 20.5  # the 0.999 quantile of chi-square(5); a sampler off by a token or a row fails it
    for r in res[:20]:  # and each recorded log-prob is that of the drawn token
        assert float(r.logprobs[0]) == pytest.approx(math.log(float(p[int(r.token_ids[0])])), abs=1e-4)


def test_a_seed_gives_the_same_tokens_whatever_shares_its_batch(tiny):
    """A seeded request decoded alone, in batches of other requests (other prompts, temperatures, top-p,
    top-k, penalties, greedy rows), split across engine batches, and asked for more tokens (past a block
    of uniforms) gives the same tokens: each row draws from its own stream."""
    from gfcr.generate.engines.hf import HFEngine
    from gfcr.generate.engines.hf_sampling import NOISE_BLOCK

    model, tok = tiny
    eng = HFEngine(model, tok, policy_version="tiny-0", max_batch=4)
    ids = eng.encode_messages(MSGS)
    n_tok = NOISE_BLOCK + 6
    no_eos = {t: -100.0 for t in eng.eos_ids}  # every sample runs its full length
    seeded = GenRequest(prompt_ids=ids, params=SamplingParams(n=3, temperature=1.0, top_p=0.95, max_tokens=n_tok,
                                                              seed=77, logit_bias=no_eos))
    alone = [r.token_ids.tolist() for r in eng.generate([seeded])[0]]
    assert all(len(t) == n_tok for t in alone) and len({tuple(t) for t in alone}) == 3
    others = [
        GenRequest(prompt_ids=[5, 6, 7, 8, 9], params=SamplingParams(n=2, temperature=0.7, max_tokens=9, seed=1)),
        GenRequest(prompt_ids=ids[:6], params=SamplingParams(temperature=0.0, max_tokens=30)),
        GenRequest(messages=MSGS, params=SamplingParams(temperature=1.2, top_k=5, frequency_penalty=0.5, max_tokens=12)),
    ]
    for reqs, at, eng_batch in (([seeded, *others], 0, 4), ([*others, seeded], 3, 32), ([others[0], seeded, others[2]], 1, 32)):
        eng.max_batch = eng_batch  # 4: the seeded rows are split across engine batches with other rows
        got = [r.token_ids.tolist() for r in eng.generate(reqs)[at]]
        assert got == alone, (eng_batch, at)
    longer = eng.generate([GenRequest(prompt_ids=ids, params=seeded.params.model_copy(update={"max_tokens": 2 * n_tok}))])[0]
    assert [r.token_ids.tolist()[:n_tok] for r in longer] == alone  # a longer request extends the same draws
