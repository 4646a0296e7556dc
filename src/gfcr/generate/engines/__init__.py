"""Generation engines: one Protocol (``generate(requests) -> n results per request``), named backends.

=========  =====================================================================
name       class
=========  =====================================================================
``hf``     :class:`HFEngine` (transformers, CPU/GPU, exact behaviour log-probs)
``openai`` :class:`OpenAIEngine` (any OpenAI-compatible server, e.g. ``gfcr serve``)
``vllm``   :class:`VLLMEngine` (offline ``vllm.LLM``; extra ``gfcr[vllm]`` on GPU, ``make vllm`` on CPU)
=========  =====================================================================

Engines of rooms above Generate (``ray``: :class:`gfcr.scale.engine.RayEngine`) are not listed
here: the composer that wants them passes them in (``make_engine(name, engines={"ray": RayEngine})``;
the training loop and the ``gfcr generate`` command do).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gfcr.generate.engines.base import Engine, GenRequest, GenResult, SamplingParams, TokenizingEngine

ENGINES: dict[str, str] = {
    "hf": "gfcr.generate.engines.hf:HFEngine",
    "openai": "gfcr.generate.engines.openai:OpenAIEngine",
    "vllm": "gfcr.generate.engines.vllm:VLLMEngine",
}


def engine_class(name: str, engines: Mapping[str, Any] | None = None) -> type:
    """The engine class named ``name`` in :data:`ENGINES` (plus ``engines``, a composer's own), or
    an import path ``pkg.mod:Class``."""
    from gfcr.config import resolve_object

    return resolve_object(name, {**ENGINES, **(engines or {})}, "engine")


def make_engine(name: str = "hf", engines: Mapping[str, Any] | None = None, **kw: Any) -> Engine:
    """Build an engine by name: ``make_engine("hf", model="default")``,
    ``make_engine("openai", base_url="http://127.0.0.1:8000/v1", model="m")``."""
    return engine_class(name, engines)(**kw)


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
