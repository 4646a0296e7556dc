"""Judge client against a real ``gfcr serve`` (in-process, loopback) over a tiny random model.

A randomly initialised model never writes schema-valid JSON, so every call walks the whole retry
path: malformed output, the error fed back as a user turn, and a clear failure record at the end.
"""

from __future__ import annotations

import pytest

from gfcr.filters.judge import EQUIVALENCE, JudgeClient, JudgeConfig

FIELDS = {"question": "1/2 + 1/4?", "output": "... so \\boxed{0.75}", "reference": "3/4"}


class _RecordingTokenizer:
    """The engine's tokenizer, recording every conversation passed to its chat template."""

    def __init__(self, tok, conversations):
        self._tok, self._conversations = tok, conversations

    def apply_chat_template(self, messages, *a, **kw):
        self._conversations.append([dict(m) for m in messages])
        return self._tok.apply_chat_template(messages, *a, **kw)

    def __call__(self, *a, **kw):
        return self._tok(*a, **kw)

    def __len__(self):
        return len(self._tok)

    def __getattr__(self, name):
        return getattr(self._tok, name)


class RecordingEngine:
    """Delegates to an HF engine and records every chat conversation the server templated (the server
    renders chats through the tokenizer's chat template, as vLLM does)."""

    def __init__(self, engine):
        self.inner = engine
        self.conversations: list[list[dict]] = []
        self.tokenizer = _RecordingTokenizer(engine.tokenizer, self.conversations)

    def __getattr__(self, name):
        return getattr(self.inner, name)

    @property
    def policy_version(self) -> str:
        return self.inner.policy_version

    def generate(self, requests):
        return self.inner.generate(requests)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from gfcr.generate.engines.hf import HFEngine
    from gfcr.serve import serve_in_thread
    from gfcr.testing import save_tiny

    path = save_tiny(str(tmp_path_factory.mktemp("tiny-judge")))
    engine = RecordingEngine(HFEngine(path, policy_version="tiny-v0"))
    with serve_in_thread(engine, model_name="tiny-judge") as url:
        yield url, engine


def _client(url: str, cache_dir: str, cache_failures: bool) -> JudgeClient:
    cfg = JudgeConfig(base_url=url, model="tiny-judge", max_retries=2, max_tokens=8, temperature=0.0,
                      cache_dir=cache_dir, cache_failures=cache_failures, timeout_s=60)
    return JudgeClient(cfg, EQUIVALENCE)


def test_malformed_output_retries_then_fails_clearly_and_caches_only_if_asked(served, tmp_path):
    url, engine = served
    engine.conversations.clear()
    cache = str(tmp_path / "cache")
    res = _client(url, cache, cache_failures=True).judge(**FIELDS)
    assert res.ok is False and res.parsed is None
    assert res.attempts == 3 and len(res.raw_outputs) == 3
    assert res.error.startswith("no valid answer after 3 attempt(s):"), res.error
    assert res.model == "tiny-judge" and res.template == "equivalence" and not res.cached
    # the server counted real tokens: 3 prompts, 1..8 generated tokens each
    assert res.prompt_tokens > 0 and 3 <= res.completion_tokens <= 24
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
    # cache_failures=True: the second call is served from the cache, no request reaches the model
    again = _client(url, cache, cache_failures=True).judge(**FIELDS)
    assert again.cached and not again.ok and len(engine.conversations) == 3
    assert again.raw_outputs == res.raw_outputs and again.error == res.error
    # cache_failures=False: the cached failure is not used; the call goes to the server again
    fresh = _client(url, cache, cache_failures=False).judge(**FIELDS)
    assert not fresh.cached and fresh.attempts == 3 and len(engine.conversations) == 6
    assert fresh.raw_outputs == res.raw_outputs  # greedy decoding through the server is deterministic
