"""Early exit on repetition in the hf engine (SamplingParams.repeat_ngram / repeat_max): the
incremental counter equals EarlyExit's tail_ngram_count, and a stopped sample is a prefix of the
unstopped one, cut exactly where the rule first fires."""

from __future__ import annotations

import numpy as np
import pytest

from gfcr.control.groups import EarlyExit, tail_ngram_count
from gfcr.generate.engines import GenRequest, SamplingParams
from gfcr.generate.engines.hf_sampling import NgramCounter


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_ngram_counter_equals_tail_ngram_count(n):
    rng = np.random.default_rng(n)
    toks = rng.integers(0, 3, size=200).tolist()  # a 3-letter alphabet: many repeats
    c = NgramCounter(n)
    for i, t in enumerate(toks):
        assert c.add(t) == tail_ngram_count(toks[: i + 1], n)


def test_ngram_counter_by_hand_and_off():
    c = NgramCounter(2)
    assert [c.add(t) for t in [1, 2, 1, 2]] == [0, 1, 1, 2]
    assert [NgramCounter(0).add(t) for t in [1, 1, 1]] == [0, 0, 0]


def test_engine_stops_a_repeating_sample_where_the_rule_first_fires(engine):
    ids = engine.encode_messages([{"role": "user", "content": "Count to ten."}])
    free = engine.generate([GenRequest(prompt_ids=ids, params=SamplingParams(temperature=0.0, max_tokens=80))])[0][0]
    p = SamplingParams(temperature=0.0, max_tokens=80, repeat_ngram=1, repeat_max=3)
    cut = engine.generate([GenRequest(prompt_ids=ids, params=p)])[0][0]
    toks = free.token_ids.tolist()
    rule = EarlyExit(ngram=1, max_repeats=3)
    first = next((i + 1 for i in range(len(toks)) if rule.should_stop(toks[: i + 1]) == "repetition"), None)
    assert first is not None, "the tiny model's greedy answer should repeat a token 3 times within 80 tokens"
    assert cut.finish_reason == "abort" and cut.meta["early_exit"] == "repetition"
    assert cut.token_ids.tolist() == toks[:first]  # a prefix, cut at the first firing
    np.testing.assert_allclose(cut.logprobs, free.logprobs[:first], atol=1e-6)
    off = engine.generate([GenRequest(prompt_ids=ids, params=SamplingParams(temperature=0.0, max_tokens=80))])[0][0]
    assert "early_exit" not in off.meta and off.token_ids.tolist() == toks  # off by default


def test_gfcr_serve_honours_repeat_ngram(engine):
    from gfcr.generate.engines.openai import OpenAIEngine
    from gfcr.serve import serve_in_thread

    ids = engine.encode_messages([{"role": "user", "content": "Count to ten."}])
    p = SamplingParams(temperature=0.0, max_tokens=80, repeat_ngram=1, repeat_max=3)
    want = engine.generate([GenRequest(prompt_ids=ids, params=p)])[0][0]
    with serve_in_thread(engine, model_name="tiny") as url:
        got = OpenAIEngine(url, "tiny").generate([GenRequest(prompt_ids=ids, params=p)])[0][0]
    assert got.finish_reason == "abort" and got.token_ids.tolist() == want.token_ids.tolist()
