"""ROSS evaluation through the real vLLM engine (``evaluate.engine: vllm``; ``make test-vllm``, CPU is
enough). Skipped where vllm is not importable (the main venv)."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("vllm")

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def test_ross_rows_evaluate_through_vllm_one_engine_at_a_time(tmp_path):
    from gfcr.ross.config import BenchmarkConfig, RossEvalConfig
    from gfcr.ross.evaluation import benchmark_prompts, evaluate_models
    from gfcr.testing import tiny_model, tiny_tokenizer

    path = tmp_path / "model"  # a tiny random Llama vLLM's CPU attention accepts (head size 64)
    tok = tiny_tokenizer()
    tiny_model(tok, hidden=256, layers=2).save_pretrained(path)
    tok.save_pretrained(path)
    bench = BenchmarkConfig(name="arith-1d", source="arith", params={"level": 1}, n_prompts=4, domain="math")
    ev = RossEvalConfig(k=2, ks=[1, 2], max_tokens=8, engine={"name": "vllm", "params": {
                            "enforce_eager": True, "dtype": "float32", "max_model_len": 256,
                            "kv_cache_memory_bytes": 64 << 20}})
    gens = []
    res = evaluate_models({"upstream": str(path), "ross": str(path)}, tok, [(bench, benchmark_prompts(bench))], ev,
                          on_generation=gens.append)
    for row in ("upstream", "ross"):
        r = res[row]["arith-1d"]
        assert r["info"]["engine"] == "vllm" and r["n_prompts"] == 4
    # same weights, greedy: the two rows decode the same texts
    greedy = {(g["model"], g["prompt_id"]): g["texts"] for g in gens if g["greedy"]}
    assert len(greedy) == 8
    assert all(greedy[("ross", p)] == greedy[("upstream", p)] for (m, p) in greedy if m == "ross")
