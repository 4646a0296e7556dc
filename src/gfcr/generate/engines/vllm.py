"""The ``vllm`` engine: offline ``vllm.LLM`` generation (GPU). Install with ``pip install 'gfcr[vllm]'``.

Prompts are passed as token ids; each sample's ids and the log-prob of each sampled token are read
from vLLM's output. ``logprobs_mode="processed_logprobs"`` is requested (vLLM >= 0.10) so the
log-probs are those of the distribution sampled from (after temperature/top-p), as in ``hf``;
with older vLLM they are the raw model log-probs and ``meta["logprobs_mode"]`` says so.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from gfcr.generate.engines.base import GenRequest, GenResult


class VLLMEngine:
    """Offline vLLM engine. ``model``: HF dir/name (``None``/``"default"`` = the default model)."""

    name = "vllm"

    def __init__(self, model: Any = None, policy_version: str | None = None, **llm_kwargs: Any):
        try:
            import vllm
        except ImportError as e:
            raise ImportError("the vllm engine needs vllm: pip install 'gfcr[vllm]' (on a GPU machine)") from e
        from gfcr.models import model_hash, resolve_model

        path = resolve_model(model)
        self._vllm = vllm
        kw = {"seed": 0, "dtype": "auto"} | llm_kwargs
        self.logprobs_mode = "processed"
        try:
            self.llm = vllm.LLM(model=path, logprobs_mode="processed_logprobs", **kw)
        except TypeError:
            self.llm = vllm.LLM(model=path, **kw)
            self.logprobs_mode = "raw"
        self.tokenizer = self.llm.get_tokenizer()
        self.policy_version = policy_version or model_hash(path)
        eos = self.tokenizer.eos_token_id
        self.eos_ids = {int(eos)} if eos is not None else set()

    def encode_messages(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True) -> list[int]:
        text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def generate(self, requests: list[GenRequest]) -> list[list[GenResult]]:
        prompts, sps = [], []
        for r in requests:
            ids = r.prompt_ids if r.prompt_ids is not None else self.encode_messages(r.messages or [])
            p = r.params
            prompts.append({"prompt_token_ids": [int(t) for t in ids]})
            sps.append(self._vllm.SamplingParams(
                n=p.n, temperature=p.temperature, top_p=p.top_p, max_tokens=p.max_tokens, stop=p.stop or None,
                stop_token_ids=p.stop_token_ids or None, seed=p.seed, logprobs=0, skip_special_tokens=True,
            ))
        t0 = time.perf_counter()
        outs = self.llm.generate(prompts, sps, use_tqdm=False)
        dt = time.perf_counter() - t0
        results = []
        for prm, o in zip(prompts, outs, strict=True):
            rs = []
            for c in o.outputs:
                ids = list(c.token_ids)
                lps = [float(d[t].logprob) if d and t in d else 0.0 for t, d in zip(ids, c.logprobs or [{}] * len(ids), strict=True)]
                rs.append(GenResult(
                    token_ids=np.asarray(ids, np.int32), logprobs=np.minimum(np.asarray(lps, np.float32), 0.0),
                    finish_reason=c.finish_reason if c.finish_reason in ("stop", "length", "abort") else "stop",
                    latency_s=dt, prompt_ids=np.asarray(prm["prompt_token_ids"], np.int32), text=c.text,
                    meta={"logprobs_mode": self.logprobs_mode},
                ))
            results.append(rs)
        return results
