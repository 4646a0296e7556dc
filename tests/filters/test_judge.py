"""Judge client against a canned-response OpenAI-compatible server on 127.0.0.1."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from gfcr.filters.judge import EQUIVALENCE, RUBRIC, JudgeClient, JudgeConfig, extract_json, validate_json


class FakeServer:
    """Answers /v1/chat/completions with the next canned reply; records every request."""

    def __init__(self, replies: list[str]):
        self.replies = list(replies)
        self.requests: list[dict] = []
        self.lock = threading.Lock()
        outer = self

        class H(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with outer.lock:
                    outer.requests.append(body)
                    text = outer.replies.pop(0) if outer.replies else "still not json"
                out = json.dumps({"choices": [{"message": {"role": "assistant", "content": text}}],
                                  "usage": {"prompt_tokens": 11, "completion_tokens": 7}}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *a):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server_factory():
    made = []

    def make(replies):
        s = FakeServer(replies)
        made.append(s)
        return s

    yield make
    for s in made:
        s.close()


FIELDS = {"question": "1/2 + 1/4?", "output": "... so \\boxed{0.75}", "reference": "3/4"}


def test_success_path_and_cache(server_factory, tmp_path):
    srv = server_factory(['{"verdict": "Correct", "reason": "0.75 = 3/4"}', '{"verdict": "Correct"}'])
    cfg = JudgeConfig(base_url=srv.url, model="fake", cache_dir=str(tmp_path / "cache"))
    res = JudgeClient(cfg, EQUIVALENCE).judge(**FIELDS)
    assert res.ok and res.parsed["verdict"] == "Correct" and res.attempts == 1
    assert res.prompt_tokens == 11 and res.completion_tokens == 7 and res.latency_s > 0
    assert res.raw_outputs == ['{"verdict": "Correct", "reason": "0.75 = 3/4"}']
    req = srv.requests[0]
    assert req["model"] == "fake" and "3/4" in req["messages"][1]["content"]
    assert '"enum"' in req["messages"][0]["content"]  # schema shown to the judge
    # a re-run is served from the disk cache: no new request
    again = JudgeClient(cfg, EQUIVALENCE).judge(**FIELDS)
    assert again.cached and again.parsed == res.parsed and len(srv.requests) == 1
    # different params -> different cache key -> a new request
    cfg2 = cfg.model_copy(update={"temperature": 0.5})
    JudgeClient(cfg2, EQUIVALENCE).judge(**FIELDS)
    assert len(srv.requests) == 2


def test_retry_feeds_error_back(server_factory):
    srv = server_factory(["I think it is correct", '```json\n{"score": 11, "rationale": "x"}\n```',
                          '{"score": 8, "rationale": "clear"}'])
    cfg = JudgeConfig(base_url=srv.url, model="fake", max_retries=2)
    res = JudgeClient(cfg, RUBRIC).judge(question="q", response="r", rubric="be clear")
    assert res.ok and res.parsed == {"score": 8, "rationale": "clear"} and res.attempts == 3
    assert len(res.raw_outputs) == 3
    second = srv.requests[1]["messages"]
    assert second[-2]["role"] == "assistant" and second[-2]["content"] == "I think it is correct"
    assert "no JSON object found" in second[-1]["content"]
    third = srv.requests[2]["messages"]
    assert "schema violation at score" in third[-1]["content"]


def test_clear_failure_record(server_factory, tmp_path):
    srv = server_factory(["nope", "nope again"])
    cfg = JudgeConfig(base_url=srv.url, model="fake", max_retries=1, cache_dir=str(tmp_path))
    res = JudgeClient(cfg, EQUIVALENCE).judge(**FIELDS)
    assert not res.ok and res.parsed is None and res.attempts == 2
    assert res.error.startswith("no valid answer after 2 attempt(s)")
    assert list(tmp_path.iterdir()) == []  # failures are not cached by default


def test_unreachable_endpoint_is_a_failure_record():
    # a loopback port nobody listens on
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    cfg = JudgeConfig(base_url=f"http://127.0.0.1:{port}/v1", model="m", max_retries=0, timeout_s=2)
    res = JudgeClient(cfg, EQUIVALENCE).judge(**FIELDS)
    assert not res.ok and "request failed" in res.error


def test_judge_many_bounded_concurrency(server_factory):
    replies = [json.dumps({"verdict": "Correct" if i % 2 == 0 else "Incorrect"}) for i in range(6)]
    srv = server_factory(replies)
    cfg = JudgeConfig(base_url=srv.url, model="fake", concurrency=2)
    items = [dict(FIELDS, reference=str(i)) for i in range(6)]
    out = JudgeClient(cfg, EQUIVALENCE).judge_many(items)
    assert len(out) == 6 and all(r.ok for r in out)
    assert sorted(r.parsed["verdict"] for r in out) == ["Correct"] * 3 + ["Incorrect"] * 3


def test_template_missing_field():
    with pytest.raises(ValueError, match="needs field 'reference'"):
        EQUIVALENCE.render({"question": "q", "output": "o"})


def test_extract_and_validate_json():
    assert extract_json('text {"a": 1} tail') == ({"a": 1}, None)
    assert extract_json("```json\n{\"a\": [1, 2]}\n```")[0] == {"a": [1, 2]}
    assert extract_json("no braces")[1] == "no JSON object found in the answer"
    assert validate_json({"verdict": "Maybe"}, EQUIVALENCE.schema).startswith("schema violation at verdict")
    assert validate_json({"verdict": "Correct"}, EQUIVALENCE.schema) is None
