"""Engine protocol and the request/result types every engine speaks.

An engine turns :class:`GenRequest` s (prompt token ids or chat messages, plus
:class:`SamplingParams`) into ``n`` :class:`GenResult` s per request: the generated token ids, the
behaviour log-prob of each (of the distribution actually sampled from, after temperature and
top-p), the finish reason and the latency. Engines never re-tokenize generated text when they can
avoid it: ``GenResult.tokens_source`` says ``"engine"`` when the ids are the sampled ones.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator


class SamplingParams(BaseModel):
    """How to sample. Mirrors the OpenAI/vLLM names."""

    model_config = ConfigDict(extra="forbid")

    n: int = Field(1, ge=1, le=4096, description="Samples per request.")
    temperature: float = Field(1.0, ge=0.0, le=10.0, description="Softmax temperature; 0 = greedy.")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling mass (1 = off).")
    max_tokens: int = Field(256, ge=1, le=1_000_000, description="Most new tokens per sample.")
    stop: list[str] = Field(default_factory=list, description="Stop strings (the tokens that complete one are kept).")
    stop_token_ids: list[int] = Field(default_factory=list, description="Extra token ids that end a sample (eos is always one).")
    seed: int | None = Field(None, description="Seed; the same seed gives the same tokens (sample i uses seed + i).")
    repeat_ngram: int = Field(0, ge=0, le=4096, description="Early exit on repetition (the rule of gfcr.control.groups.EarlyExit): stop a sample, finish_reason 'abort', once its last repeat_ngram generated tokens have occurred repeat_max times. 0 = off. hf engine (and gfcr serve) only.")
    repeat_max: int = Field(4, ge=2, le=4096, description="Occurrences of the trailing n-gram that stop a sample (with repeat_ngram > 0).")

    @model_validator(mode="after")
    def _check(self) -> SamplingParams:
        if any(not s for s in self.stop):
            raise ValueError("stop strings must be non-empty")
        return self

    def to_record(self, engine: Any) -> dict[str, Any]:
        """The ``sampling`` JSON stored with each rollout. ``engine``: its name, or the engine itself,
        which also records the model it serves (``model``: the path or name its tokenizer loads from)."""
        d = self.model_dump()
        if isinstance(engine, str):
            d["engine"] = engine
            return d
        d["engine"] = getattr(engine, "name", type(engine).__name__)
        model = getattr(engine, "model_name", None) or getattr(engine, "model", None)
        if isinstance(model, str) and model:
            d["model"] = model
        return d


@dataclass
class GenRequest:
    """One prompt: token ids (exact) or chat messages (the engine applies the chat template)."""

    prompt_ids: list[int] | None = None
    messages: list[dict[str, Any]] | None = None
    params: SamplingParams = field(default_factory=SamplingParams)
    request_id: str | None = None

    def __post_init__(self) -> None:
        if (self.prompt_ids is None) == (self.messages is None):
            raise ValueError("GenRequest needs exactly one of prompt_ids or messages")
        if self.prompt_ids is not None and len(self.prompt_ids) == 0:
            raise ValueError("GenRequest.prompt_ids is empty")


@dataclass
class GenResult:
    """One sample. ``prompt_ids`` are the exact context tokens (after templating) when known."""

    token_ids: np.ndarray  # int32 [T] generated ids
    logprobs: np.ndarray  # float32 [T] behaviour log-probs
    finish_reason: str  # "stop" | "length" | "abort" | "error"
    latency_s: float = 0.0
    prompt_ids: np.ndarray | None = None  # int32 [P]
    text: str | None = None
    tokens_source: str = "engine"  # "engine" (exact ids) or "retokenized"
    meta: dict[str, Any] = field(default_factory=dict)
    entropies: np.ndarray | None = None  # float32 [T] entropy of the distribution each token was sampled from (hf)

    @property
    def n_tokens(self) -> int:
        return int(len(self.token_ids))


@runtime_checkable
class Engine(Protocol):
    """A generation backend. ``generate`` returns, per request, ``params.n`` results."""

    name: str
    policy_version: str

    def generate(self, requests: list[GenRequest]) -> list[list[GenResult]]: ...


class TokenizingEngine(Engine, Protocol):
    """An engine with a local tokenizer (hf, vllm): topologies that continue from token prefixes need one."""

    tokenizer: Any
