"""gfcr serve against the official ``openai`` client, as vLLM users call it: streaming, the error schema
and status codes, cancellation, top log-probs (checked against a teacher-forced pass) and echo."""

from __future__ import annotations

import contextlib
import threading
import time

import httpx
import numpy as np
import openai
import pytest
import torch

from gfcr.generate.engines.hf import HFEngine
from gfcr.generate.engines.hf_sampling import sampling_logprobs
from gfcr.serve import serve_in_thread
from gfcr.serve.api import ServeLimits

MSGS = [{"role": "user", "content": "What is 3 + 4?"}]
LIMITS = ServeLimits(max_n=4, max_tokens=4000, max_logprobs=5, max_request_bytes=64 * 1024)


@pytest.fixture(scope="module")
def server(tiny):
    model, tok = tiny
    eng = HFEngine(model, tok, policy_version="tiny-0")
    with serve_in_thread(eng, model_name="tiny", limits=LIMITS, batch_wait_ms=5) as url:
        yield url, eng


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server[0], api_key="none", max_retries=0, timeout=120)


def _no_eos(tok):
    return {str(tok.eos_token_id): -100}  # the tiny random model then never stops early


@contextlib.contextmanager
def _slow(model, seconds=0.005):
    """Each forward of ``model`` takes at least ``seconds``: a long request then stays long on a fast
    machine (the tiny model alone decodes 900 tokens in under a second on a fast CI machine)."""
    h = model.register_forward_hook(lambda *_: time.sleep(seconds))
    try:
        yield
    finally:
        h.remove()


# --- streaming ------------------------------------------------------------------------------


def test_chat_stream_concatenates_to_unstreamed_text(client):
    kw = dict(model="tiny", messages=MSGS, max_tokens=24, temperature=1.0, seed=7, n=2)
    full = client.chat.completions.create(**kw)
    parts, finish, usage, n_chunks = {0: [], 1: []}, {}, None, 0
    for ch in client.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True}):
        n_chunks += 1
        if ch.usage is not None:
            usage = ch.usage
        for c in ch.choices:
            parts[c.index].append(c.delta.content or "")
            if c.finish_reason:
                finish[c.index] = c.finish_reason
    for i in (0, 1):
        assert "".join(parts[i]) == full.choices[i].message.content
        assert finish[i] == full.choices[i].finish_reason
    assert n_chunks > 4  # really streamed, not one blob
    assert usage is not None and usage.model_dump() == full.usage.model_dump()


def test_completion_stream_with_stop_string_matches_unstreamed(client, tiny):
    tok = tiny[1]
    base = dict(model="tiny", prompt="The quick brown fox", max_tokens=30, temperature=1.0, seed=3,
                extra_body={"logit_bias": _no_eos(tok)})
    text = client.completions.create(**base).choices[0].text
    stop = text[len(text) // 2 : len(text) // 2 + 2]  # a stop string that does occur in this seeded sample
    assert len(stop) == 2
    full = client.completions.create(**base, stop=[stop])
    got = "".join(c.choices[0].text for c in client.completions.create(**base, stop=[stop], stream=True) if c.choices)
    assert full.choices[0].text == text[: text.find(stop)] == got
    assert full.choices[0].finish_reason == "stop"


def test_stream_logprobs_equal_unstreamed(client):
    kw = dict(model="tiny", messages=MSGS, max_tokens=10, temperature=0.8, seed=5, logprobs=True, top_logprobs=3)
    full = client.chat.completions.create(**kw).choices[0].logprobs.content
    streamed = [e for ch in client.chat.completions.create(**kw, stream=True) for c in ch.choices
                if c.logprobs for e in c.logprobs.content]
    assert [e.token for e in streamed] == [e.token for e in full]
    np.testing.assert_allclose([e.logprob for e in streamed], [e.logprob for e in full], atol=1e-6)
    assert [[t.token for t in e.top_logprobs] for e in streamed] == [[t.token for t in e.top_logprobs] for e in full]


# --- errors -----------------------------------------------------------------------------------


def _err(fn, cls, status, *needles):
    with pytest.raises(cls) as ei:
        fn()
    e = ei.value
    assert e.status_code == status, (e.status_code, str(e))
    for s in needles:
        assert s in str(e), (s, str(e))  # the client shows the server's message
    assert set(e.body) >= {"message", "type", "param", "code"} and e.body["code"] == status
    return e


def test_error_cases_status_and_message(client, tiny):
    chat, cmpl = client.chat.completions.create, client.completions.create
    _err(lambda: chat(model="nope", messages=MSGS), openai.NotFoundError, 404, "The model `nope` does not exist")
    _err(lambda: chat(model="nope", messages=MSGS, stream=True), openai.NotFoundError, 404, "does not exist")
    e = _err(lambda: cmpl(model="tiny", prompt="hi", max_tokens=1500), openai.BadRequestError, 400,
             "maximum context length is 1024 tokens", "1500 in the completion")
    assert e.body["param"] == "max_tokens"
    _err(lambda: chat(model="tiny", messages=MSGS, max_tokens=5000), openai.BadRequestError, 400, "limit of 4000")
    _err(lambda: chat(model="tiny", messages=MSGS, n=9), openai.BadRequestError, 400, "n = 9", "limit of 4")
    _err(lambda: cmpl(model="tiny", prompt=[]), openai.BadRequestError, 400, "prompt is empty")
    _err(lambda: chat(model="tiny", messages=[]), openai.BadRequestError, 400, "messages is empty")
    e = _err(lambda: chat(model="tiny", messages=MSGS, temperature=-1), openai.BadRequestError, 400, "temperature")
    assert e.body["param"] == "temperature"
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}]
    e = _err(lambda: chat(model="tiny", messages=MSGS, tools=tools), openai.BadRequestError, 400,
             "chat template does not take `tools`")
    assert e.body["param"] == "tools"
    _err(lambda: chat(model="tiny", messages=MSGS, response_format={"type": "json_object"}), openai.BadRequestError,
         400, "response_format")
    _err(lambda: cmpl(model="tiny", prompt="def f(", suffix="return 1"), openai.BadRequestError, 400, "suffix")
    _err(lambda: chat(model="tiny", messages=MSGS, extra_body={"min_q": 0.1}), openai.BadRequestError, 400,
         "min_q: unknown parameter")
    _err(lambda: chat(model="tiny", messages=MSGS, logprobs=True, top_logprobs=6), openai.BadRequestError, 400,
         "max allowed: 5")
    _err(lambda: cmpl(model="tiny", prompt="hi", logprobs=6), openai.BadRequestError, 400, "max allowed: 5")
    _err(lambda: chat(model="tiny", messages=MSGS, top_logprobs=2), openai.BadRequestError, 400,
         "`logprobs` must be set to true")
    img = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]
    _err(lambda: chat(model="tiny", messages=img), openai.BadRequestError, 400, "'image_url' is not supported")
    _err(lambda: cmpl(model="tiny", prompt="hi", logit_bias={"100000": 5}), openai.BadRequestError, 400, "logit_bias")
    _err(lambda: cmpl(model="tiny", prompt="hi", max_tokens=0), openai.BadRequestError, 400, "echo")
    _err(lambda: cmpl(model="tiny", prompt="x " * 40000), openai.APIStatusError, 413, "over this server's limit")
    # harmless values are accepted: tool_choice "none", a text response_format
    ok = chat(model="tiny", messages=MSGS, max_tokens=2, tool_choice="none", response_format={"type": "text"})
    assert ok.choices[0].message.role == "assistant"


def test_host_header_checked_on_loopback(server):
    url = server[0]
    r = httpx.get(f"{url}/models", headers={"Host": "attacker.example:8000"})
    assert r.status_code == 400 and "invalid Host header" in r.json()["error"]["message"]
    port = url.split(":")[2].split("/")[0]
    for host in (f"localhost:{port}", f"127.0.0.1:{port}"):
        assert httpx.get(f"{url}/models", headers={"Host": host}).status_code == 200


def test_invalid_json_and_unknown_routes_use_the_error_schema(server):
    url = server[0]
    r = httpx.post(f"{url}/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["message"].startswith("the request body is not valid JSON")
    r = httpx.get(f"{url}/nothing-here")
    assert r.status_code == 404 and r.json()["error"]["type"] == "NotFoundError"


def test_content_parts_equal_plain_string(client):
    parts = [{"role": "user", "content": [{"type": "text", "text": "What is"}, {"type": "text", "text": "3 + 4?"}]}]
    plain = [{"role": "user", "content": "What is\n3 + 4?"}]
    a = client.chat.completions.create(model="tiny", messages=parts, max_tokens=8, temperature=0)
    b = client.chat.completions.create(model="tiny", messages=plain, max_tokens=8, temperature=0)
    assert a.choices[0].message.content == b.choices[0].message.content
    assert a.usage.prompt_tokens == b.usage.prompt_tokens


# --- cancellation -------------------------------------------------------------------------------


def test_client_timeout_frees_the_server_within_a_second(server, tiny):
    url, _ = server
    tok = tiny[1]
    impatient = openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=1.0)
    with _slow(tiny[0]):  # the abandoned request would decode 900 tokens: at least 4.5 s
        t0 = time.monotonic()
        with pytest.raises(openai.APITimeoutError):
            impatient.completions.create(model="tiny", prompt="Count:", max_tokens=900, temperature=1.0,
                                         logit_bias=_no_eos(tok))
        t_gave_up = time.monotonic()
        assert t_gave_up - t0 < 3
        nxt = openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=30)
        r = nxt.completions.create(model="tiny", prompt="Hi", max_tokens=2, temperature=0)
        waited = time.monotonic() - t_gave_up
    assert r.choices[0].text is not None
    assert waited < 1.0, f"the next request waited {waited:.2f}s for the abandoned one"


def test_closed_stream_frees_the_server(server, tiny):
    url, _ = server
    tok = tiny[1]
    body = {"model": "tiny", "prompt": "Count:", "max_tokens": 900, "stream": True, "logit_bias": _no_eos(tok)}
    with _slow(tiny[0]):  # the closed stream would decode 900 tokens: at least 4.5 s
        with httpx.stream("POST", f"{url}/completions", json=body, timeout=30) as r:
            lines = [ln for _, ln in zip(range(6), r.iter_lines(), strict=False)]
        assert any(ln.startswith("data: {") for ln in lines)
        t0 = time.monotonic()
        c = openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=30)
        c.completions.create(model="tiny", prompt="Hi", max_tokens=2, temperature=0)
        assert time.monotonic() - t0 < 1.0


def test_shutdown_does_not_wait_for_abandoned_work(tiny):
    model, tok = tiny
    out = {}

    def long_call(url):
        try:
            out["resp"] = httpx.post(f"{url}/completions", timeout=60, json={
                "model": "tiny", "prompt": "Count:", "max_tokens": 1000, "logit_bias": _no_eos(tok)})
        except httpx.HTTPError as e:
            out["err"] = e

    with _slow(model), serve_in_thread(HFEngine(model, tok, policy_version="t"), model_name="tiny") as url:
        th = threading.Thread(target=long_call, args=(url,))
        th.start()
        time.sleep(0.8)  # the call is decoding now
        t0 = time.monotonic()
    closed_in = time.monotonic() - t0
    th.join(timeout=30)
    assert closed_in < 3.0, closed_in
    assert "err" in out or out["resp"].status_code == 503


# --- log-probs ----------------------------------------------------------------------------------


def _teacher(model, ids, prompt_len, temperature=1.0, top_p=1.0):
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0].float()
    return sampling_logprobs(logits[prompt_len - 1 : -1], temperature, top_p)


@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.7, 0.9)])
def test_chat_top_logprobs_agree_with_teacher_forcing(client, tiny, temperature, top_p):
    model, tok = tiny
    r = client.chat.completions.create(model="tiny", messages=MSGS, max_tokens=12, temperature=temperature, top_p=top_p,
                                       seed=1, logprobs=True, top_logprobs=5, extra_body={"return_token_ids": True})
    c = r.choices[0]
    ids, gen = c.prompt_token_ids, c.token_ids
    lp = _teacher(model, ids + gen, len(ids), temperature, top_p)
    for t, entry in enumerate(c.logprobs.content):
        assert entry.logprob == pytest.approx(float(lp[t, gen[t]]), abs=1e-4)
        want = torch.topk(lp[t], 5)
        got = [(e.token, e.logprob) for e in entry.top_logprobs]
        np.testing.assert_allclose([v for _, v in got], np.maximum(want.values.numpy(), -9999.0), atol=1e-4)
        finite = [k for k, v in enumerate(want.values.tolist()) if v > -9999]
        assert [got[k][0] for k in finite] == [tok.decode([int(want.indices[k])]) for k in finite]


def test_completion_echo_prompt_logprobs_and_scoring(client, server, tiny):
    model, tok = tiny
    prompt_ids = list(tok("The quick brown fox jumps", add_special_tokens=False)["input_ids"])
    r = client.completions.create(model="tiny", prompt=prompt_ids, max_tokens=6, temperature=1.0, seed=2,
                                  logprobs=3, echo=True, extra_body={"return_token_ids": True})
    c = r.choices[0]
    P = len(prompt_ids)
    assert c.logprobs.token_logprobs[0] is None and c.logprobs.top_logprobs[0] is None
    assert c.text.startswith(tok.decode(prompt_ids))
    full = prompt_ids + c.token_ids
    lp = _teacher(model, full, 1)  # every token after the first, under the model (T = 1)
    np.testing.assert_allclose(c.logprobs.token_logprobs[1:], lp[np.arange(len(full) - 1), full[1:]].numpy(), atol=1e-4)
    for t in range(1, P):
        assert len(c.logprobs.top_logprobs[t]) in (3, 4)  # top 3 plus the actual token (OpenAI: up to logprobs + 1)
    # max_tokens = 0 with echo scores the prompt only; the engine's score() gives the same numbers
    s = client.completions.create(model="tiny", prompt=prompt_ids, max_tokens=0, echo=True, logprobs=0)
    assert s.usage.completion_tokens == 0 and s.choices[0].logprobs.token_logprobs[1:] == pytest.approx(
        c.logprobs.token_logprobs[1:P], abs=1e-5)
    np.testing.assert_allclose(server[1].score(prompt_ids[:2], prompt_ids[2:]), c.logprobs.token_logprobs[2:P], atol=1e-4)


def test_stream_echo_equals_unstreamed(client):
    kw = dict(model="tiny", prompt="The quick", max_tokens=8, temperature=1.0, seed=11, echo=True, logprobs=2)
    full = client.completions.create(**kw).choices[0]
    chunks = [c.choices[0] for c in client.completions.create(**kw, stream=True) if c.choices]
    assert "".join(c.text for c in chunks) == full.text
    toks = [t for c in chunks if c.logprobs for t in c.logprobs.tokens]
    lps = [x for c in chunks if c.logprobs for x in c.logprobs.token_logprobs]
    assert toks == full.logprobs.tokens
    assert lps[0] is None and np.allclose(lps[1:], full.logprobs.token_logprobs[1:], atol=1e-6)


def test_openai_engine_reads_top_logprobs_and_error_messages(server, tiny):
    from gfcr.generate.engines import GenRequest, SamplingParams
    from gfcr.generate.engines.openai import OpenAIEngine, OpenAIEngineError

    url, eng = server
    ids = eng.encode_messages(MSGS)
    p = SamplingParams(temperature=1.0, max_tokens=6, seed=8, top_logprobs=3, top_k=50, presence_penalty=0.5)
    want = eng.generate([GenRequest(prompt_ids=ids, params=p)])[0][0]
    remote = OpenAIEngine(url, "tiny", max_retries=0)
    for req in (GenRequest(prompt_ids=ids, params=p), GenRequest(messages=MSGS, params=p)):
        got = remote.generate([req])[0][0]
        assert got.token_ids.tolist() == want.token_ids.tolist()
        np.testing.assert_array_equal(got.top_ids, want.top_ids)  # named token_id:N, no re-tokenizing
        np.testing.assert_allclose(got.top_logprobs, want.top_logprobs, atol=1e-5)
    with pytest.raises(OpenAIEngineError, match="The model `other` does not exist"):
        OpenAIEngine(url, "other", max_retries=0).generate([GenRequest(prompt_ids=ids)])


def test_stream_many_prompts_times_n_matches_unstreamed(client):
    kw = dict(model="tiny", prompt=["The quick", "Numbers: 1 2"], n=2, max_tokens=10, temperature=1.0, seed=21)
    full = client.completions.create(**kw)
    got: dict[int, str] = {}
    for ch in client.completions.create(**kw, stream=True):
        for c in ch.choices:
            got[c.index] = got.get(c.index, "") + c.text
    assert sorted(got) == [0, 1, 2, 3]
    assert [got[i] for i in range(4)] == [c.text for c in sorted(full.choices, key=lambda c: c.index)]
