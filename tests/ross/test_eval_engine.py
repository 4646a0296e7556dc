"""ROSS evaluation with a chosen engine (``evaluate.engine``): hf by default, vllm or any
``make_engine`` name from each row's path; every generation can be recorded."""

from __future__ import annotations

import numpy as np
import pytest
from tests.ross.conftest import make_prompt

from gfcr.generate.engines.base import GenResult
from gfcr.ross.config import ConfigError, RossEvalConfig, load_config
from gfcr.ross.evaluation import eval_engine, evaluate_models


class FakeEngine:
    """Answers every prompt with its gold sum when the model path says 'good', else 'Answer: 0'."""

    name = "fake"
    built: list[dict] = []

    def __init__(self, model=None, policy_version=None, **kw):
        self.model, self.policy_version, self.closed = model, policy_version, False
        FakeEngine.built.append({"model": model, "version": policy_version, **kw})

    def generate(self, requests):
        out = []
        for r in requests:
            q = r.messages[-1]["content"]
            a, b = (int(x) for x in q.split("?")[0].split()[-1].split("+"))
            text = f"{a} + {b} = {a + b}\nAnswer: {a + b}" if self.model == "good" else f"{a} + {b} = 7\nAnswer: 0"
            out.append([GenResult(token_ids=np.array([1, 2], np.int32), logprobs=np.zeros(2, np.float32),
                                  finish_reason="stop", text=text) for _ in range(r.params.n)])
        return out

    def close(self):
        self.closed = True


def _bench(name="b"):
    from gfcr.ross.config import BenchmarkConfig

    prompts = [make_prompt(f"What is {a}+{b}? End with 'Answer: N'.", str(a + b), prompt_id=f"p{a}{b}", split="test")
               for a, b in ((1, 2), (3, 4), (5, 6))]
    return BenchmarkConfig(name=name, source="store", n_prompts=3), prompts


def test_engine_config_accepted_and_unknown_engine_is_a_clear_error():
    cfg = load_config(None, {"store": "s", "upstream_model": "default",
                             "evaluate.engine": {"name": "vllm", "params": {"enforce_eager": True}}})
    assert cfg.evaluate.engine.name == "vllm" and cfg.evaluate.engine.params == {"enforce_eager": True}
    assert load_config(None, {"store": "s", "upstream_model": "default"}).evaluate.engine.name == "hf"
    with pytest.raises((ConfigError, ValueError), match="unknown engine 'vlm'"):
        RossEvalConfig(engine="vlm")
    with pytest.raises((ConfigError, ValueError), match="evaluate.engine.model: each model row"):
        RossEvalConfig(engine={"name": "vllm", "model": "m"})


def _engine(name: str, **params):
    """An ``evaluate.engine`` naming a test's own engine (not in the table: built unvalidated)."""
    from gfcr.ross.config import EvalEngineConfig

    return EvalEngineConfig.model_construct(name=name, model=None, params=params)


def test_rows_are_built_from_their_paths_by_the_named_engine_and_generations_recorded():
    FakeEngine.built.clear()
    ev = RossEvalConfig(k=2, ks=[1, 2], max_tokens=8).model_copy(update={"engine": _engine("fake", dtype="float32")})
    loaded = []
    gens = []
    res = evaluate_models({"upstream": "bad", "ross": "good"}, None, [_bench()], ev, load=loaded.append,
                          engines={"fake": FakeEngine}, on_generation=gens.append)
    assert loaded == []  # a non-hf engine loads the path itself
    assert [b["model"] for b in FakeEngine.built] == ["good", "bad"]  # ross first, one engine per row
    assert all(b["dtype"] == "float32" for b in FakeEngine.built)
    assert res["ross"]["b"]["metrics"]["greedy_pass@1"]["value"] == 1.0
    assert res["upstream"]["b"]["metrics"]["greedy_pass@1"]["value"] == 0.0
    assert list(res) == ["upstream", "ross"]
    # 2 models x 3 prompts x (sampled + greedy)
    assert len(gens) == 12 and {g["greedy"] for g in gens} == {True, False}
    g = next(g for g in gens if g["model"] == "upstream" and g["greedy"] and g["prompt_id"] == "p12")
    assert g["texts"] == ["1 + 2 = 7\nAnswer: 0"] and g["benchmark"] == "b"
    assert len(next(g for g in gens if not g["greedy"])["texts"]) == 2


def test_a_loaded_model_needs_engine_hf():
    ev = RossEvalConfig().model_copy(update={"engine": _engine("fake")})
    with pytest.raises(ValueError, match="builds each model from its path"):
        eval_engine(object(), "ross", None, ev, engines={"fake": FakeEngine})


def test_hf_stays_the_default_and_wraps_the_loaded_module(tok):
    from gfcr.generate.engines.hf import HFEngine
    from gfcr.testing import tiny_model

    model = tiny_model(tok)
    eng = eval_engine("some/path", "upstream", tok, RossEvalConfig(), load=lambda p: model)
    assert isinstance(eng, HFEngine) and eng.model is model and eng.policy_version == "upstream"
