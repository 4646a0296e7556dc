"""gfcr serve as a drop-in for code written against vLLM's OpenAI server, through the official ``openai``
client on loopback: agentic histories (assistant ``tool_calls`` and ``tool`` messages through the chat
template, ``tools`` given to it, hermes tool-call parsing), vLLM's sampling extras (each checked to change
the tokens as vLLM defines it, against a teacher-forced pass), the no-op SDK fields, ``/tokenize``,
``/detokenize``, ``/version``, ``/ping``, ``/metrics`` (parsed by the Prometheus client's own parser),
the Host look-alikes and the token on the API docs."""

from __future__ import annotations

import json

import httpx
import numpy as np
import openai
import pytest
import torch

from gfcr.generate.engines import GenResult
from gfcr.generate.engines.hf import HFEngine
from gfcr.generate.engines.hf_sampling import sampling_logprobs
from gfcr.serve import serve_in_thread
from gfcr.testing import tiny_tokenizer

# A ChatML template that shows tools and tool calls (as Qwen2.5's / Hermes' templates do) and reads a
# template kwarg (as Qwen3's enable_thinking).
TOOL_TEMPLATE = (
    "{% if tools %}<|im_start|>system\nTools:{% for t in tools %} {{ t['function']['name'] }}{% endfor %}<|im_end|>\n"
    "{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
    "{% if m['tool_calls'] %}{% for c in m['tool_calls'] %}<tool_call>{{ c['function'] | tojson }}</tool_call>"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% if enable_thinking %}<think>{% endif %}{% endif %}"
)
TOOLS = [{"type": "function", "function": {"name": "add", "description": "a + b", "parameters": {
    "type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}, "required": ["a", "b"]}}}]
MSGS = [{"role": "user", "content": "What is 3 + 4?"}]
HISTORY = MSGS + [
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 3, "b": 4}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "7"},
]
REPLY = 'Let me add.<tool_call>{"name": "add", "arguments": {"a": 3, "b": 4}}</tool_call>'


@pytest.fixture(scope="module")
def ttok():
    tok = tiny_tokenizer()
    tok.chat_template = TOOL_TEMPLATE
    return tok


@pytest.fixture(scope="module")
def server(tiny, ttok):
    eng = HFEngine(tiny[0], ttok, policy_version="tiny-0")
    with serve_in_thread(eng, model_name="tiny", batch_wait_ms=5, tool_call_parser="hermes") as url:
        yield url, eng


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server[0], api_key="none", max_retries=0, timeout=120)


class Scripted:
    """An engine that answers every sample with the tokens of ``reply`` then end-of-turn (a model that calls
    a tool; the random tiny model never writes one)."""

    def __init__(self, inner, reply):
        self.inner, self.reply = inner, reply
        self.seen = []

    def __getattr__(self, k):
        return getattr(self.inner, k)

    def generate(self, reqs):
        tok = self.inner.tokenizer
        ids = list(tok(self.reply, add_special_tokens=False)["input_ids"]) + [tok.eos_token_id]
        self.seen += [list(r.prompt_ids) for r in reqs]
        return [[GenResult(np.asarray(ids, np.int32), np.zeros(len(ids), np.float32), "stop",
                           prompt_ids=np.asarray(r.prompt_ids, np.int32)) for _ in range(r.params.n)] for r in reqs]


def _teacher_logits(model, ids):
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits[0].float()


# --- 1. agentic histories ----------------------------------------------------------------------


def test_parse_hermes_tool_calls_hand_worked():
    from gfcr.serve.chat import parse_hermes_tool_calls

    content, calls = parse_hermes_tool_calls(REPLY)
    assert content == "Let me add."
    assert [c["function"]["name"] for c in calls] == ["add"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"a": 3, "b": 4}
    assert calls[0]["type"] == "function" and calls[0]["id"].startswith("chatcmpl-tool-")
    two = parse_hermes_tool_calls('<tool_call>{"name": "f", "arguments": {}}</tool_call>\n<tool_call>{"name": "g", '
                                  '"arguments": {"x": "é"}}')  # the last one unclosed (cut by max_tokens)
    assert two[0] is None and [c["function"]["name"] for c in two[1]] == ["f", "g"]
    assert two[1][1]["function"]["arguments"] == '{"x": "é"}'  # ensure_ascii=False, as vLLM
    assert parse_hermes_tool_calls("no call here") is None
    assert parse_hermes_tool_calls("<tool_call>{not json}</tool_call>") is None  # then it is all content


def test_tool_call_history_is_rendered_through_the_template(client, ttok):
    r = client.chat.completions.create(model="tiny", messages=HISTORY, tools=TOOLS, tool_choice="none", max_tokens=4,
                                       temperature=0, extra_body={"return_token_ids": True})
    assert r.choices[0].finish_reason in ("stop", "length")
    want_msgs = [MSGS[0], {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function",
                 "function": {"name": "add", "arguments": {"a": 3, "b": 4}}}]},
                 {"role": "tool", "tool_call_id": "call_1", "content": "7"}]
    want = ttok.apply_chat_template(want_msgs, tools=TOOLS, tokenize=False, add_generation_prompt=True)
    got = r.choices[0].prompt_token_ids
    assert got == list(ttok(want, add_special_tokens=False)["input_ids"])
    text = ttok.decode(got)
    assert "Tools: add" in text  # the tools reached the template
    assert '<tool_call>{"name": "add", "arguments": {"a": 3, "b": 4}}</tool_call>' in text  # arguments as an object
    assert "<|im_start|>tool\n7<|im_end|>" in text


def test_auto_tool_choice_parses_the_reply_and_the_loop_continues(tiny, ttok):
    eng = Scripted(HFEngine(tiny[0], ttok, policy_version="t"), REPLY)
    with serve_in_thread(eng, model_name="tiny", batch_wait_ms=0, tool_call_parser="hermes") as url:
        c = openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=60)
        r = c.chat.completions.create(model="tiny", messages=MSGS, tools=TOOLS, max_tokens=40)
        ch = r.choices[0]
        assert ch.finish_reason == "tool_calls"
        assert ch.message.content == "Let me add."
        call = ch.message.tool_calls[0]
        assert call.function.name == "add" and json.loads(call.function.arguments) == {"a": 3, "b": 4}
        # streamed: the same message, assembled from the deltas as a client does
        content, calls, finish = "", {}, None
        for chunk in c.chat.completions.create(model="tiny", messages=MSGS, tools=TOOLS, max_tokens=40, stream=True):
            for d in chunk.choices:
                content += d.delta.content or ""
                for tc in d.delta.tool_calls or []:
                    calls.setdefault(tc.index, {"name": "", "arguments": ""})
                    calls[tc.index]["name"] += tc.function.name or ""
                    calls[tc.index]["arguments"] += tc.function.arguments or ""
                finish = d.finish_reason or finish
        assert (content, finish) == ("Let me add.", "tool_calls")
        assert calls[0]["name"] == "add" and json.loads(calls[0]["arguments"]) == {"a": 3, "b": 4}
        # the agent loop: the reply goes back into the history with the tool's answer
        history = MSGS + [ch.message.model_dump(exclude_none=True),
                          {"role": "tool", "tool_call_id": call.id, "content": "7"}]
        r2 = c.chat.completions.create(model="tiny", messages=history, tools=TOOLS, max_tokens=40)
        assert r2.choices[0].finish_reason == "tool_calls"
        assert '<|im_start|>tool\n7<|im_end|>' in ttok.decode(eng.seen[-1])
        # without tools the reply is plain content, never parsed
        r3 = c.chat.completions.create(model="tiny", messages=MSGS, max_tokens=40)
        assert r3.choices[0].message.content == REPLY and not r3.choices[0].message.tool_calls
        assert r3.choices[0].finish_reason == "stop"


def test_tool_errors_are_clear_400s(client, tiny, ttok):
    chat = client.chat.completions.create
    with pytest.raises(openai.BadRequestError, match="needs constrained decoding"):
        chat(model="tiny", messages=MSGS, tools=TOOLS, tool_choice="required")
    with pytest.raises(openai.BadRequestError, match="`tools` must be set"):
        chat(model="tiny", messages=MSGS, tool_choice="auto")
    bad = HISTORY[:1] + [{"role": "assistant", "tool_calls": [{"id": "c", "type": "function",
                                                               "function": {"name": "add", "arguments": "{oops"}}]}]
    with pytest.raises(openai.BadRequestError, match=r"tool_calls\[0\].function.arguments is not valid JSON"):
        chat(model="tiny", messages=bad)
    # a template that does not show tools: a 400 rather than tools the model never sees
    with serve_in_thread(HFEngine(*tiny, policy_version="t"), model_name="tiny", batch_wait_ms=0) as url:
        c = openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=60)
        with pytest.raises(openai.BadRequestError, match="chat template does not take `tools`"):
            c.chat.completions.create(model="tiny", messages=MSGS, tools=TOOLS, tool_choice="none")
        # a tool-call history still renders (the template drops the calls, as under vLLM)
        ok = c.chat.completions.create(model="tiny", messages=HISTORY, max_tokens=2)
        assert ok.choices[0].message.role == "assistant"
    with serve_in_thread(HFEngine(tiny[0], ttok, policy_version="t"), model_name="tiny", batch_wait_ms=0) as url:
        c = openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=60)
        with pytest.raises(openai.BadRequestError, match="requires --tool-call-parser"):
            c.chat.completions.create(model="tiny", messages=MSGS, tools=TOOLS)  # tool_choice defaults to auto
        ok = c.chat.completions.create(model="tiny", messages=MSGS, tools=TOOLS, tool_choice="none", max_tokens=2)
        assert ok.choices[0].finish_reason in ("stop", "length")


# --- 2. vLLM's sampling extras ------------------------------------------------------------------


def _ids(client, **kw):
    extra = {"return_token_ids": True} | kw.pop("extra_body", {})
    return client.completions.create(model="tiny", **kw, extra_body=extra).choices[0]


def test_min_p_keeps_only_tokens_above_min_p_times_the_top(client, tiny):
    model, tok = tiny
    eos = tok.eos_token_id
    no_eos = {"logit_bias": {str(eos): -100}}  # the tiny model's favourite token is end of turn
    kw = dict(prompt="The quick brown", max_tokens=24, temperature=1.0, seed=3, logprobs=0)
    plain = _ids(client, **kw, extra_body=no_eos)
    cut = _ids(client, **kw, extra_body=no_eos | {"min_p": 0.5})
    assert cut.token_ids != plain.token_ids  # it changes the tokens

    def probs(c):
        logits = _teacher_logits(model, c.prompt_token_ids + c.token_ids)[len(c.prompt_token_ids) - 1 : -1]
        logits[:, eos] -= 100
        return logits, torch.softmax(logits, -1)

    logits, p = probs(cut)
    for t, k in enumerate(cut.token_ids):  # vLLM's rule: p(token) >= min_p * max p (after temperature)
        assert p[t, k] >= 0.5 * p[t].max()
    lp = sampling_logprobs(logits, 1.0, min_p=0.5)  # and the log-probs are of that cut distribution
    np.testing.assert_allclose(cut.logprobs.token_logprobs, lp[np.arange(len(cut.token_ids)), cut.token_ids], atol=1e-4)
    _, p0 = probs(plain)
    assert sum(bool(p0[t, k] < 0.5 * p0[t].max()) for t, k in enumerate(plain.token_ids)) > 12  # the cut mattered


def test_repetition_penalty_is_vllms_over_prompt_and_output(client, tiny):
    model = tiny[0]
    kw = dict(prompt="1 2 3 1 2 3 1 2", max_tokens=16, temperature=0)
    plain = _ids(client, **kw)
    pen = _ids(client, **kw, extra_body={"repetition_penalty": 2.0})
    assert pen.token_ids != plain.token_ids
    prompt = pen.prompt_token_ids
    logits = _teacher_logits(model, prompt + pen.token_ids)[len(prompt) - 1 : -1]
    for t, tok in enumerate(pen.token_ids):  # greedy under x / 2 (x > 0) or x * 2 (x <= 0) for seen tokens
        seen = torch.zeros(logits.shape[-1], dtype=torch.bool)
        seen[torch.tensor(prompt + pen.token_ids[:t])] = True
        x = logits[t]
        want = torch.where(seen, torch.where(x > 0, x / 2.0, x * 2.0), x)
        assert tok == int(want.argmax())


def test_min_tokens_and_ignore_eos(client, tiny):
    eos = tiny[1].eos_token_id
    bias = {str(eos): 100}  # end of turn is then all but certain at every step
    kw = dict(model="tiny", messages=MSGS, max_tokens=8, temperature=1.0, seed=1, logit_bias=bias)
    r = client.chat.completions.create(**kw)
    assert (r.usage.completion_tokens, r.choices[0].finish_reason) == (1, "stop")
    r = client.chat.completions.create(**kw, extra_body={"min_tokens": 5, "return_token_ids": True})
    toks = r.choices[0].token_ids
    assert eos not in toks[:5] and toks[5] == eos and r.choices[0].finish_reason == "stop"  # eos at the 6th
    r = client.chat.completions.create(**kw, extra_body={"ignore_eos": True, "return_token_ids": True})
    assert r.usage.completion_tokens == 8 and r.choices[0].finish_reason == "length"
    assert r.choices[0].token_ids.count(eos) >= 7  # eos sampled and not stopping
    with pytest.raises(openai.BadRequestError, match="min_tokens"):
        client.chat.completions.create(model="tiny", messages=MSGS, max_tokens=3, extra_body={"min_tokens": 4})


def test_include_stop_str_in_output(client, tiny):
    base = dict(prompt="The quick brown fox", max_tokens=30, temperature=1.0, seed=3,
                extra_body={"logit_bias": {str(tiny[1].eos_token_id): -100}})
    text = client.completions.create(model="tiny", **base).choices[0].text
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    at = text.find(stop)
    cut = client.completions.create(model="tiny", **base, stop=[stop]).choices[0]
    kept = client.completions.create(model="tiny", prompt=base["prompt"], max_tokens=30, temperature=1.0, seed=3,
                                     stop=[stop], extra_body=base["extra_body"] | {"include_stop_str_in_output": True})
    assert cut.text == text[:at] and kept.choices[0].text == text[: at + len(stop)]
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model="tiny", prompt=base["prompt"], max_tokens=30, temperature=1.0, seed=3, stop=[stop], stream=True,
        extra_body=base["extra_body"] | {"include_stop_str_in_output": True}) if c.choices)
    assert streamed == kept.choices[0].text


def test_chat_template_kwargs_and_generation_prompt_options(client, ttok):
    def prompt_text(messages, **extra):
        r = client.chat.completions.create(model="tiny", messages=messages, max_tokens=1, temperature=0,
                                           extra_body={"return_token_ids": True} | extra)
        return ttok.decode(r.choices[0].prompt_token_ids)

    plain = prompt_text(MSGS)
    assert plain.endswith("<|im_start|>assistant\n")
    assert prompt_text(MSGS, chat_template_kwargs={"enable_thinking": True}) == plain + "<think>"
    assert prompt_text(MSGS, add_generation_prompt=False) == plain[: -len("<|im_start|>assistant\n")]
    partial = MSGS + [{"role": "assistant", "content": "The answer is"}]
    cont = prompt_text(partial, add_generation_prompt=False, continue_final_message=True)
    assert cont.endswith("<|im_start|>assistant\nThe answer is")  # no end of turn: the model continues it
    with pytest.raises(openai.BadRequestError, match="Cannot set both"):
        prompt_text(partial, continue_final_message=True)
    with pytest.raises(openai.BadRequestError, match="chat_template_kwargs may not set tools"):
        prompt_text(MSGS, chat_template_kwargs={"tools": []})


def test_sdk_no_op_fields_are_accepted_and_change_nothing(client):
    kw = dict(model="tiny", messages=MSGS, max_tokens=6, temperature=1.0, seed=9)
    a = client.chat.completions.create(**kw)
    b = client.chat.completions.create(**kw, metadata={"run": "x"}, store=False, service_tier="auto", user="u1")
    assert a.choices[0].message.content == b.choices[0].message.content
    with pytest.raises(openai.BadRequestError, match="frobnicate: unknown parameter") as ei:
        client.chat.completions.create(**kw, extra_body={"frobnicate": 1})
    assert ei.value.body["param"] == "frobnicate"


def test_render_chat_hand_worked(ttok):
    from gfcr.serve.chat import render_chat

    ids = render_chat(ttok, [{"role": "user", "content": "hi"}])
    assert ttok.decode(ids) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


# --- 3. endpoints ---------------------------------------------------------------------------------


def test_tokenize_detokenize_version_ping(server, client, ttok):
    root = server[0].removesuffix("/v1")
    r = httpx.post(f"{root}/tokenize", json={"model": "tiny", "prompt": "The quick brown fox", "return_token_strs": True})
    body = r.json()
    assert r.status_code == 200 and body["tokens"] == list(ttok("The quick brown fox")["input_ids"])
    assert body["count"] == len(body["tokens"]) and body["max_model_len"] == 1024
    assert body["token_strs"] == ttok.convert_ids_to_tokens(body["tokens"])
    chat = client.chat.completions.create(model="tiny", messages=MSGS, max_tokens=1, extra_body={"return_token_ids": True})
    t = httpx.post(f"{root}/tokenize", json={"messages": MSGS}).json()
    assert t["tokens"] == chat.choices[0].prompt_token_ids  # the same prompt the chat endpoint renders
    d = httpx.post(f"{root}/detokenize", json={"tokens": body["tokens"]})
    assert d.status_code == 200 and d.json() == {"prompt": "The quick brown fox"}
    assert httpx.post(f"{root}/detokenize", json={"tokens": [10**7]}).status_code == 400
    assert httpx.post(f"{root}/tokenize", json={"model": "other", "prompt": "x"}).status_code == 404
    v = httpx.get(f"{root}/version")
    assert v.status_code == 200 and isinstance(v.json()["version"], str) and v.json()["version"]
    for method in ("GET", "POST"):
        p = httpx.request(method, f"{root}/ping")
        assert p.status_code == 200 and p.content == b""


def test_metrics_in_prometheus_text_format(server, client):
    from prometheus_client.parser import text_string_to_metric_families

    root = server[0].removesuffix("/v1")

    def read():
        r = httpx.get(f"{root}/metrics")
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
        return {s.name + json.dumps(s.labels, sort_keys=True): s.value
                for fam in text_string_to_metric_families(r.text) for s in fam.samples}

    before = read()
    used = [client.chat.completions.create(model="tiny", messages=MSGS, max_tokens=5, temperature=1.0, seed=i).usage
            for i in range(3)]
    after = read()

    def delta(key):
        return after.get(key, 0) - before.get(key, 0)

    assert delta('gfcr_requests_total{"code": "200", "route": "/v1/chat/completions"}') == 3
    assert delta("gfcr_generation_tokens_total{}") == sum(u.completion_tokens for u in used)
    assert delta("gfcr_prompt_tokens_total{}") == sum(u.prompt_tokens for u in used)
    assert delta("gfcr_engine_calls_total{}") == 3 and delta("gfcr_batch_rows_count{}") == 3
    assert delta('gfcr_batch_rows_bucket{"le": "1.0"}') == 3  # one row each
    assert delta("gfcr_queue_time_seconds_count{}") == 3 and delta("gfcr_queue_time_seconds_sum{}") > 0
    assert after["gfcr_requests_running{}"] == 0


# --- 5. Host look-alikes and the docs behind the token ----------------------------------------------


def test_host_lookalikes_refused_trailing_dot_accepted(server):
    url = server[0]
    port = url.split(":")[2].split("/")[0]
    for bad in ("[::1]evil.example", f"[::1]evil.example:{port}", f"localhost..:{port}", f"localhost:{port}x",
                f"127.0.0.1.evil.example:{port}", "localhost:"):
        r = httpx.get(f"{url}/models", headers={"Host": bad})
        assert r.status_code == 400 and "invalid Host header" in r.json()["error"]["message"], bad
    for good in (f"localhost.:{port}", "localhost.", f"[::1]:{port}", f"LOCALHOST:{port}"):
        assert httpx.get(f"{url}/models", headers={"Host": good}).status_code == 200, good


def test_api_docs_need_the_token_when_one_is_set(engine):
    with serve_in_thread(engine, model_name="tiny", admin_token="s3cret", batch_wait_ms=0) as url:
        root = url.removesuffix("/v1")
        for path in ("/docs", "/openapi.json", "/redoc"):
            r = httpx.get(f"{root}{path}")
            assert r.status_code == 401 and "admin token" in r.json()["error"]["message"], path
            assert httpx.get(f"{root}{path}", headers={"Authorization": "Bearer wrong"}).status_code == 401
            assert httpx.get(f"{root}{path}", headers={"Authorization": "Bearer s3cret"}).status_code == 200
        assert httpx.get(f"{url}/models").status_code == 200  # the API itself is unchanged
    with serve_in_thread(engine, model_name="tiny", batch_wait_ms=0) as url:  # no token: docs stay open
        assert httpx.get(f"{url.removesuffix('/v1')}/openapi.json").status_code == 200


def test_openai_engine_sends_the_extras_and_gets_the_engines_tokens(server):
    from gfcr.generate.engines import GenRequest, SamplingParams
    from gfcr.generate.engines.openai import OpenAIEngine

    url, eng = server
    ids = eng.encode_messages(MSGS)
    p = SamplingParams(temperature=1.0, max_tokens=10, seed=4, min_p=0.5, repetition_penalty=1.5, min_tokens=3,
                       ignore_eos=True, logit_bias={eng.tokenizer.eos_token_id: 5.0})
    want = eng.generate([GenRequest(prompt_ids=ids, params=p)])[0][0]
    got = OpenAIEngine(url, "tiny", max_retries=0).generate([GenRequest(prompt_ids=ids, params=p)])[0][0]
    assert got.token_ids.tolist() == want.token_ids.tolist() and got.n_tokens == 10  # ignore_eos: all 10
    np.testing.assert_allclose(got.logprobs, want.logprobs, atol=1e-5)
    plain = eng.generate([GenRequest(prompt_ids=ids, params=SamplingParams(temperature=1.0, max_tokens=10, seed=4))])
    assert plain[0][0].token_ids.tolist() != want.token_ids.tolist()
