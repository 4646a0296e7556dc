import pytest


@pytest.mark.slow
def test_pull_default_model_and_sample_8_answers():
    from gfcr.generate.engines import GenRequest, SamplingParams
    from gfcr.generate.engines.hf import HFEngine
    from gfcr.models import pull_default, resolve_model

    path = pull_default()  # idempotent: converts once into $GFCR_HOME
    assert (path / "config.json").exists() and list(path.glob("*.safetensors"))
    assert resolve_model(None) == str(path) == resolve_model("default")
    eng = HFEngine(str(path))
    im_end = eng.tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert eng.tokenizer.eos_token == "<|im_end|>" and im_end in eng.eos_ids
    msgs = [{"role": "user", "content": "What is 2 + 3? End with a line 'Answer: N'."}]
    res = eng.generate([GenRequest(messages=msgs, params=SamplingParams(n=8, temperature=0.7, max_tokens=32, seed=0))])[0]
    assert len(res) == 8
    assert all(r.n_tokens > 0 for r in res)
    stopped = [r for r in res if r.finish_reason == "stop"]
    assert all(int(r.token_ids[-1]) == im_end for r in stopped)
    assert len({tuple(r.token_ids.tolist()) for r in res}) > 1
    # a real instruct model writes digits about the sum in most answers
    assert sum(any(ch.isdigit() for ch in r.text) for r in res) >= 4
