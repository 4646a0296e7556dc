"""Engine protocol and the request/result types every engine speaks.

An engine turns :class:`GenRequest` s (prompt token ids or chat messages, plus
:class:`SamplingParams`) into ``n`` :class:`GenResult` s per request: the generated token ids, the
behaviour log-prob of each (of the distribution actually sampled from, after temperature and
top-p), the finish reason and the latency. Engines never re-tokenize generated text when they can
avoid it: ``GenResult.tokens_source`` says ``"engine"`` when the ids are the sampled ones.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np
from pydantic import Field, model_validator

from gfcr.config import StrictModel


class SamplingParams(StrictModel):
    """How to sample. Mirrors the OpenAI/vLLM names."""

    n: int = Field(1, ge=1, le=4096, description="Samples per request.")
    temperature: float = Field(1.0, ge=0.0, le=10.0, description="Softmax temperature; 0 = greedy.")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling mass (1 = off).")
    max_tokens: int = Field(256, ge=1, le=1_000_000, description="Most new tokens per sample.")
    stop: list[str] = Field(default_factory=list, description=(
        "Stop strings (the tokens that complete one are kept)."))
    stop_token_ids: list[int] = Field(default_factory=list, description=(
        "Extra token ids that end a sample (eos is always one)."))
    seed: int | None = Field(None, description=(
        "Seed; the same seed gives the same tokens (sample i uses seed + i)."))
    repeat_ngram: int = Field(0, ge=0, le=4096, description=(
        "Early exit on repetition (the rule of gfcr.control.groups.EarlyExit): stop a sample, finish_reason "
        "'abort', once its last repeat_ngram generated tokens have occurred repeat_max times. 0 = off. hf "
        "engine (and gfcr serve) only."))
    repeat_max: int = Field(4, ge=2, le=4096, description=(
        "Occurrences of the trailing n-gram that stop a sample (with repeat_ngram > 0)."))
    top_k: int = Field(0, ge=0, description="Keep only the k most likely tokens before top-p (0 = off).")
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0, description=(
        "Subtracted from a token's logit once per earlier occurrence in the generated tokens (OpenAI's "
        "definition)."))
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0, description=(
        "Subtracted from a token's logit if it occurs in the generated tokens."))
    logit_bias: dict[int, float] = Field(default_factory=dict, description=(
        "Token id -> value added to its logit before sampling (-100..100)."))
    top_logprobs: int = Field(0, ge=0, le=1000, description=(
        "Also return the this many most likely tokens and their log-probs at each step (of the distribution "
        "sampled from)."))
    min_p: float = Field(0.0, ge=0.0, le=1.0, description=(
        "vLLM's min-p: after temperature, drop tokens whose probability is below min_p x the most likely "
        "token's (0 = off)."))
    repetition_penalty: float = Field(1.0, gt=0.0, le=10.0, description=(
        "vLLM's / CTRL's repetition penalty over the prompt and generated tokens: a seen token's logit is "
        "divided by it when positive, multiplied when not (1 = off)."))
    min_tokens: int = Field(0, ge=0, le=1_000_000, description=(
        "vLLM's min_tokens: eos and stop_token_ids cannot be sampled, and stop strings do not stop, before "
        "this many tokens (0 = off)."))
    ignore_eos: bool = Field(False, description=(
        "vLLM's ignore_eos: the end-of-sequence tokens do not stop a sample (stop_token_ids still do)."))

    @model_validator(mode="after")
    def _check_bias(self) -> SamplingParams:
        bad = {k: v for k, v in self.logit_bias.items() if not -100.0 <= v <= 100.0 or k < 0}
        if bad:
            raise ValueError(f"logit_bias values must lie in [-100, 100] and token ids be >= 0 (got {bad})")
        return self

    @model_validator(mode="after")
    def _check(self) -> SamplingParams:
        if any(not s for s in self.stop):
            raise ValueError("stop strings must be non-empty")
        if self.min_tokens > self.max_tokens:
            raise ValueError(f"min_tokens ({self.min_tokens}) must be at most max_tokens ({self.max_tokens})")
        return self

    def to_record(self, engine: Any) -> dict[str, Any]:
        """The ``sampling`` JSON stored with each rollout (fields left at their neutral default are omitted
        for the parameters added after the first release, so older records and new ones compare equal).
        ``engine``: its name, or the engine itself, which also records the model it serves (``model``:
        the path or name its tokenizer loads from; Diagnose's viewer decodes tokens with it)."""
        d = self.model_dump()
        for k, neutral in _LATER_NEUTRAL.items():
            if d.get(k) == neutral:
                d.pop(k)
        if d.get("logit_bias"):
            d["logit_bias"] = {str(k): v for k, v in d["logit_bias"].items()}
        if isinstance(engine, str):
            d["engine"] = engine
            return d
        d["engine"] = getattr(engine, "name", type(engine).__name__)
        model = getattr(engine, "model_name", None) or getattr(engine, "model", None)
        if isinstance(model, str) and model:
            d["model"] = model
        return d

    def has_logit_processing(self) -> bool:
        """Whether penalties or a logit bias change the logits before temperature."""
        return bool(self.frequency_penalty or self.presence_penalty or self.logit_bias
                    or self.repetition_penalty != 1.0 or self.min_tokens)


_LATER_NEUTRAL: dict[str, Any] = {"top_k": 0, "frequency_penalty": 0.0, "presence_penalty": 0.0, "logit_bias": {},
                                  "top_logprobs": 0, "min_p": 0.0, "repetition_penalty": 1.0, "min_tokens": 0,
                                  "ignore_eos": False}


@dataclass
class TokenEvent:
    """One sampled token, as an engine reports it while decoding (``GenRequest.on_token``).

    ``sample``: index of the sample within its request (``0 .. n-1``); ``top_ids`` / ``top_logprobs``:
    the ``params.top_logprobs`` most likely tokens at this step (``None`` when 0 were asked for).
    """

    sample: int
    token: int
    logprob: float
    top_ids: list[int] | None = None
    top_logprobs: list[float] | None = None


@dataclass
class GenRequest:
    """One prompt: token ids (exact) or chat messages (the engine applies the chat template)."""

    prompt_ids: list[int] | None = None
    messages: list[dict[str, Any]] | None = None
    params: SamplingParams = field(default_factory=SamplingParams)
    request_id: str | None = None
    # Optional hooks (the hf engine honours both; other engines may ignore them):
    on_token: Callable[[TokenEvent], None] | None = None  # called from the decoding thread for each token
    cancel: threading.Event | None = None  # once set, the request's samples stop (finish_reason "abort")

    @property
    def cancelled(self) -> bool:
        return self.cancel is not None and self.cancel.is_set()

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
    top_ids: np.ndarray | None = None  # int32 [T, N] the N = params.top_logprobs most likely tokens at each step
    top_logprobs: np.ndarray | None = None  # float32 [T, N] their log-probs (same distribution as ``logprobs``)

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
