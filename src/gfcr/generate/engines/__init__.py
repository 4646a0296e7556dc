"""Generation engines: one Protocol (``generate(requests) -> n results per request``), named backends.

=========  =====================================================================
name       class
=========  =====================================================================
``hf``     :class:`HFEngine` (transformers, CPU/GPU, exact behaviour log-probs)
``openai`` :class:`OpenAIEngine` (any OpenAI-compatible server, e.g. ``gfcr serve``)
``vllm``   :class:`VLLMEngine` (offline ``vllm.LLM``; extra ``gfcr[vllm]``, GPU)
``ray``    :class:`gfcr.scale.engine.RayEngine` (hf/vllm engines in Ray actors; extra ``gfcr[ray]``)
=========  =====================================================================
"""

from __future__ import annotations

from typing import Any

from gfcr.generate.engines.base import Engine, GenRequest, GenResult, SamplingParams, TokenizingEngine

ENGINES: dict[str, str] = {
    "hf": "gfcr.generate.engines.hf:HFEngine",
    "openai": "gfcr.generate.engines.openai:OpenAIEngine",
    "vllm": "gfcr.generate.engines.vllm:VLLMEngine",
    "ray": "gfcr.scale.engine:RayEngine",
}


def engine_class(name: str) -> type:
    """The engine class registered under ``name`` (or an import path ``pkg.mod:Class``)."""
    import importlib

    target = ENGINES.get(name, name)
    if ":" not in target:
        raise ValueError(f"unknown engine {name!r}; choose one of {sorted(ENGINES)} or give 'pkg.module:Class'")
    mod, _, cls = target.partition(":")
    return getattr(importlib.import_module(mod), cls)


def make_engine(name: str = "hf", **kw: Any) -> Engine:
    """Build an engine by name: ``make_engine("hf", model="default")``,
    ``make_engine("openai", base_url="http://127.0.0.1:8000/v1", model="m")``."""
    return engine_class(name)(**kw)


def __getattr__(name: str) -> Any:  # lazy: importing the package must not import torch/httpx
    lazy = {"HFEngine": "hf", "OpenAIEngine": "openai", "VLLMEngine": "vllm", "sampling_logprobs": "hf"}
    if name in lazy:
        import importlib

        return getattr(importlib.import_module(f"gfcr.generate.engines.{lazy[name]}"), name)
    raise AttributeError(name)


__all__ = [
    "ENGINES",
    "Engine",
    "GenRequest",
    "GenResult",
    "HFEngine",
    "OpenAIEngine",
    "SamplingParams",
    "TokenizingEngine",
    "VLLMEngine",
    "engine_class",
    "make_engine",
    "sampling_logprobs",
]
