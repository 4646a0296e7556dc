"""Judge client against a real ``gfcr serve`` (in-process, loopback) over a tiny random model.

A randomly initialised model never writes schema-valid JSON, so every call walks the whole retry
path: malformed output, the error fed back as a user turn, and a clear failure record at the end.
"""

from __future__ import annotations

import pytest

from gfcr.filters.judge import EQUIVALENCE, JudgeClient, JudgeConfig

FIELDS = {"question": "1/2 + 1/4?", "output": "... so \\boxed{0.75}", "reference": "3/4"}


class RecordingEngine:
    """Delegates to an HF engine and records every chat conversation the server templated."""

    def __init__(self, engine):
        self.inner = engine
        self.tokenizer = engine.tokenizer
        self.conversations: list[list[dict]] = []

    @property
    def policy_version(self) -> str:
        return self.inner.policy_version

    def encode_messages(self, messages, add_generation_prompt=True):
        self.conversations.append([dict(m) for m in messages])
        return self.inner.encode_messages(messages, add_generation_prompt)

    def generate(self, requests):
        return self.inner.generate(requests)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from gfcr.generate.engines.hf import HFEngine
    from gfcr.generate.serve import serve_in_thread
    from gfcr.testing import save_tiny

    path = save_tiny(str(tmp_path_factory.mktemp("tiny-judge")))
    engine = RecordingEngine(HFEngine(path, policy_version="tiny-v0"))
    with serve_in_thread(engine, model_name="tiny-judge") as url:
        yield url, engine


def _client(url: str, cache_dir: str, cache_failures: bool) -> JudgeClient:
    cfg = JudgeConfig(base_url=url, model="tiny-judge", max_retries=2, max_tokens=12, temperature=0.0,
                      cache_dir=cache_dir, cache_failures=cache_failures, timeout_s=60)
    return JudgeClient(cfg, EQUIVALENCE)


def test_malformed_output_retries_then_fails_clearly(served, tmp_path):
    url, engine = served
    engine.conversations.clear()
    res = _client(url, str(tmp_path / "c"), cache_failures=False).judge(**FIELDS)
    assert res.ok is False and res.parsed is None
    assert res.attempts == 3 and len(res.raw_outputs) == 3
    assert res.error.startswith("no valid answer after 3 attempt(s):"), res.error
    assert res.model == "tiny-judge" and res.template == "equivalence" and not res.cached
    # the server counted real tokens: 3 prompts, 1..12 generated tokens each
    assert res.prompt_tokens > 0 and 3 <= res.completion_tokens <= 36
    # three requests reached the model; each retry carried the previous output and the error
    convs = engine.conversations
    assert len(convs) == 3
    assert [len(c) for c in convs] == [2, 4, 6]
    for k in (1, 2):
        prev, feedback = convs[k][-2], convs[k][-1]
        assert prev == {"role": "assistant", "content": res.raw_outputs[k - 1]}
        assert feedback["role"] == "user" and feedback["content"].startswith("Your answer was invalid:")
        # the fed-back error is the one the client found (no JSON / invalid JSON / schema violation)
        assert any(w in feedback["content"] for w in ("JSON", "schema")), feedback["content"]
    assert "3/4" in convs[0][1]["content"] and '"enum"' in convs[0][0]["content"]
    # no failure caching by default: a second call goes to the server again
    again = _client(url, str(tmp_path / "c"), cache_failures=False).judge(**FIELDS)
    assert not again.cached and again.attempts == 3 and len(engine.conversations) == 6
    # greedy decoding through the server is deterministic
    assert again.raw_outputs == res.raw_outputs


def test_failure_cached_only_with_cache_failures(served, tmp_path):
    url, engine = served
    engine.conversations.clear()
    client = _client(url, str(tmp_path / "c"), cache_failures=True)
    first = client.judge(**FIELDS)
    assert not first.ok and first.attempts == 3 and len(engine.conversations) == 3
    second = _client(url, str(tmp_path / "c"), cache_failures=True).judge(**FIELDS)
    assert second.cached and not second.ok
    assert second.raw_outputs == first.raw_outputs and second.error == first.error
    assert len(engine.conversations) == 3  # served from the cache: no request reached the model
