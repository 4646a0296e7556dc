import httpx
import numpy as np
import pytest

from gfcr.generate.engines import GenRequest, SamplingParams, make_engine
from gfcr.generate.engines.openai import OpenAIEngine, OpenAIEngineError
from gfcr.serve import free_port, serve_in_thread

MSGS = [{"role": "user", "content": "What is 3 + 4?"}]


@pytest.fixture(scope="module")
def server(engine):
    with serve_in_thread(engine, model_name="tiny") as url:
        yield url


def test_openai_engine_greedy_matches_hf(engine, server):
    ids = engine.encode_messages(MSGS)
    p = SamplingParams(temperature=0.0, max_tokens=12, n=1)
    want = engine.generate([GenRequest(prompt_ids=ids, params=p)])[0][0]
    client = make_engine("openai", base_url=server, model="tiny")
    got = client.generate([GenRequest(prompt_ids=ids, params=p), GenRequest(messages=MSGS, params=p)])
    for g in (got[0][0], got[1][0]):
        assert g.token_ids.tolist() == want.token_ids.tolist()
        assert g.tokens_source == "engine"
        np.testing.assert_allclose(g.logprobs, want.logprobs, atol=1e-5)
        np.testing.assert_allclose(g.entropies, want.entropies, atol=1e-5)  # gfcr serve's token_entropies
        assert g.prompt_ids.tolist() == ids
        assert g.finish_reason == want.finish_reason


def test_seeded_sampling_through_server_and_n(engine, server):
    ids = engine.encode_messages(MSGS)
    p = SamplingParams(temperature=1.0, max_tokens=8, n=3, seed=11)
    want = engine.generate([GenRequest(prompt_ids=ids, params=p)])[0]
    got = OpenAIEngine(server, "tiny").generate([GenRequest(prompt_ids=ids, params=p)])[0]
    assert [g.token_ids.tolist() for g in got] == [w.token_ids.tolist() for w in want]


def test_server_endpoints_and_errors(server):
    models = httpx.get(f"{server}/models").json()
    assert models["data"][0]["id"] == "tiny"
    r = httpx.post(f"{server}/chat/completions", json={"model": "tiny", "messages": MSGS, "max_tokens": 5,
                                                      "logprobs": True, "temperature": 0})
    body = r.json()
    assert r.status_code == 200 and body["choices"][0]["message"]["role"] == "assistant"
    assert len(body["choices"][0]["logprobs"]["content"]) == body["usage"]["completion_tokens"]
    bad = httpx.post(f"{server}/completions", json={"prompt": [10**7], "max_tokens": 2})
    assert bad.status_code == 400
    with pytest.raises(OpenAIEngineError, match="HTTP 4"):
        OpenAIEngine(server, "tiny", max_retries=0).generate([GenRequest(prompt_ids=[10**7])])


def test_openai_engine_retries_then_reports_unreachable():
    port = free_port()  # nothing listens here (loopback only)
    e = OpenAIEngine(f"http://127.0.0.1:{port}/v1", "x", max_retries=2, backoff_s=0.01)
    with pytest.raises(OpenAIEngineError, match="after 3 attempts"):
        e.generate([GenRequest(prompt_ids=[1, 2], params=SamplingParams(max_tokens=2))])
