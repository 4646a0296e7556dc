"""vLLM engine (GPU only: every test skips without CUDA and vllm): token-faithful sampling, and
weight sync (load a trainer's state dict, then sample from it; 2 training steps on engine vllm)."""

import pytest

torch = pytest.importorskip("torch")

MSGS = [{"role": "user", "content": "What is 2 + 2?"}]


def _sample_and_check_against(eng, model, again: bool = False):
    """Sample 2 answers (seeded); their log-probs must be ``model``'s teacher-forced ones."""
    import numpy as np

    from gfcr.generate.engines import GenRequest, SamplingParams
    from gfcr.generate.engines.hf import teacher_forced_logprobs

    p = SamplingParams(n=2, temperature=1.0, max_tokens=16, seed=3)
    res = eng.generate([GenRequest(messages=MSGS, params=p)])[0]
    if again:  # the same seed gives the same tokens
        rep = eng.generate([GenRequest(messages=MSGS, params=p)])[0]
        assert [r.token_ids.tolist() for r in res] == [r.token_ids.tolist() for r in rep]
    for r in res:
        full = np.concatenate([r.prompt_ids, r.token_ids])
        ref = teacher_forced_logprobs(model, full, len(r.prompt_ids), 1.0)
        np.testing.assert_allclose(r.logprobs, ref, atol=2e-2)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_vllm_engine_samples_token_faithfully(tmp_path):
    pytest.importorskip("vllm")
    from transformers import AutoModelForCausalLM

    from gfcr.generate.engines import make_engine
    from gfcr.testing import save_tiny

    path = save_tiny(str(tmp_path / "tiny"))
    eng = make_engine("vllm", model=path, gpu_memory_utilization=0.2, enforce_eager=True)
    _sample_and_check_against(eng, AutoModelForCausalLM.from_pretrained(path), again=True)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_vllm_engine_load_weights_then_samples_from_the_new_weights(tmp_path):
    pytest.importorskip("vllm")
    from gfcr.generate.engines import make_engine
    from gfcr.testing import save_tiny, tiny_model, tiny_tokenizer

    path = save_tiny(str(tmp_path / "tiny"))
    eng = make_engine("vllm", model=path, gpu_memory_utilization=0.2, enforce_eager=True, weight_sync=True,
                      dtype="float32")
    new = tiny_model(tiny_tokenizer(), seed=7)  # what a trainer holds after updates
    eng.load_weights(new.state_dict(), policy_version="s1-test")
    assert eng.policy_version == "s1-test"
    _sample_and_check_against(eng, new)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_train_two_steps_on_the_vllm_engine(tmp_path):
    pytest.importorskip("vllm")
    import json

    from gfcr.testing import save_tiny
    from gfcr.train.config import load_config
    from gfcr.train.loop import train

    path = save_tiny(str(tmp_path / "tiny"))
    cfg = load_config(None, {
        "model": path, "device": "cuda", "output_dir": str(tmp_path / "runs"), "steps": 2, "tensorboard": False,
        "tasks": [{"name": "arith", "n_train": 8, "n_eval": 0, "params": {"level": 1}}],
        "generate.engine": "vllm", "generate.k": 2, "generate.prompts_per_step": 2, "generate.max_tokens": 8,
        "generate.engine_params": {"gpu_memory_utilization": 0.2, "enforce_eager": True, "dtype": "float32"},
        "optim.lr": 0.05,
    })
    res = train(cfg, progress=False)
    metrics = [json.loads(x) for x in res.metrics_path.read_text().splitlines()]
    assert len(metrics) == 2 and all("seconds/sync" in m for m in metrics)
    from gfcr.store import RolloutStore

    versions = {r.step: r.policy_version for r in RolloutStore.open(res.store_path).rollouts()}
    assert versions[1] == metrics[0]["policy_version"]
