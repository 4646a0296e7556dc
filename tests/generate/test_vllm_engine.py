import pytest

torch = pytest.importorskip("torch")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_vllm_engine_samples_token_faithfully(tmp_path):
    pytest.importorskip("vllm")
    import numpy as np

    from gfcr.generate.engines import GenRequest, SamplingParams, make_engine
    from gfcr.generate.engines.hf import teacher_forced_logprobs
    from gfcr.testing import save_tiny

    path = save_tiny(str(tmp_path / "tiny"))
    eng = make_engine("vllm", model=path, gpu_memory_utilization=0.2, enforce_eager=True)
    p = SamplingParams(n=2, temperature=1.0, max_tokens=16, seed=3)
    res = eng.generate([GenRequest(messages=[{"role": "user", "content": "What is 2 + 2?"}], params=p)])[0]
    again = eng.generate([GenRequest(messages=[{"role": "user", "content": "What is 2 + 2?"}], params=p)])[0]
    assert [r.token_ids.tolist() for r in res] == [r.token_ids.tolist() for r in again]
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path)
    for r in res:
        full = np.concatenate([r.prompt_ids, r.token_ids])
        ref = teacher_forced_logprobs(model, full, len(r.prompt_ids), 1.0)
        np.testing.assert_allclose(r.logprobs, ref, atol=2e-2)
