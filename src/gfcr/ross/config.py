"""The ROSS run configuration: one typed YAML drives ``gfcr ross run`` and every stage command."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from gfcr.config import ConfigError as ConfigError  # re-exported: callers catch it from here
from gfcr.config import StrictModel as _Strict
from gfcr.config import load_config_model
from gfcr.evaluate import EvalConfig

VARIANTS = ("positive_sft", "ross_nomask", "ross", "ross_from_base")


class WindowConfig(_Strict):
    run: str | None = Field(None, description="Run id whose rollouts are relearned (None: every run in the store).")
    steps: tuple[int, int] | None = Field(None, description="Inclusive training-step window [first, last] (None: all).")
    task: str | None = Field(None, description="Only rollouts of this task (None: all tasks).")
    reverify: str | None = Field(None, description="Re-verify with this gfcr.filters verifier (None: trust stored verdicts).")
    dedup: bool = Field(True, description="Drop rollouts repeating another's prompt and assistant text.")
    limit: int | None = Field(None, ge=1, description="At most this many rollouts (oldest step first).")


class AuditJudgeConfig(_Strict):
    """Which judge audits (the ``llm`` judge calls the Filter room's :class:`gfcr.filters.judge.JudgeClient`)."""

    name: Literal["arith-steps", "keep-all", "llm"] = Field("arith-steps", description="Judge for the ROSS audit.")
    base_url: str | None = Field(None, description="llm judge: OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000/v1.")
    model: str | None = Field(None, description="llm judge: served model name.")
    api_key_env: str | None = Field(None, description="llm judge: environment variable holding the API key.")
    mode: Literal["select-keep", "locate-exclude"] = Field(
        "select-keep", description="llm judge: select-keep (math/code) or locate-exclude (agent trajectories).")
    version: str | None = Field(None, description="llm judge: version string keying its audits (default 1:<model>).")
    cache_dir: str | None = Field(None, description="llm judge: on-disk cache of valid answers (re-runs cost nothing).")
    retries: int = Field(2, ge=0, le=10, description="Retries after an invalid verdict, the error fed back each time.")
    concurrency: int = Field(4, ge=1, le=256, description="Judge calls in flight at once.")
    max_unit_chars: int = Field(200, ge=20, description="Lines longer than this are split at sentence ends.")
    check_answer: bool = Field(True, description="Require the kept text to still contain the verified final answer.")


class BuildConfig(_Strict):
    max_length: int | None = Field(1024, ge=8, description="Drop rollouts longer than this many tokens (None: keep all).")


class SFTConfig(_Strict):
    epochs: int = Field(3, ge=1, description="Passes over the dataset (the seed reports 3 for single-turn).")
    lr: float = Field(1e-5, gt=0, description="AdamW learning rate.")
    batch_size: int = Field(8, ge=1, description="Sequences per step (a length-grouped padded batch, or packed rows).")
    grad_clip: float = Field(1.0, ge=0, description="Gradient-norm clip (0: off).")
    seed: int = Field(0, description="Seed of the batch order and torch.")
    packing: bool = Field(
        False, description="Pack each step's batch_size sequences into rows without cross-sequence attention "
                           "(block-diagonal causal mask, positions restarting per sequence) instead of padding "
                           "length-grouped batches; same loss and gradient per batch.")
    max_tokens_per_row: int = Field(
        1024, ge=8, description="packing: at most this many tokens per packed row (a longer sequence gets a row "
                                "of its own).")


class RossEvalConfig(EvalConfig):
    """Which held-out prompts, plus the shared eval sampling (ROSS's defaults: k 8, 96 new tokens)."""

    source: Literal["store", "arith"] = Field(
        "store", description="Held-out prompts from the store (by split) or freshly generated arith prompts.")
    split: str = Field("test", description="Split of the held-out prompts.")
    n_prompts: int = Field(32, ge=1, description="Held-out prompts evaluated per model.")
    arith_level: int | None = Field(None, description="source=arith: difficulty level (gfcr.tasks.arith LEVELS).")
    arith_digits: int = Field(1, ge=1, description="source=arith: operand digits when no level is given.")
    k: int = Field(8, ge=1, description="Samples per prompt.")
    ks: list[int] = Field(default_factory=lambda: [1, 8], description="pass@k values reported (each <= k).")
    max_tokens: int = Field(96, ge=1, description="New tokens per sample.")
    temperature: float = Field(0.7, ge=0, description="Sampling temperature.")
    verifier: str = Field("numeric", description="gfcr.filters verifier deciding correctness.")
    greedy: bool = Field(True, description="Also report greedy pass@1.")
    seed: int = Field(0, description="Sampling seed.")

    @model_validator(mode="after")
    def _ks(self) -> EvalConfig:
        bad = [k for k in self.ks if k < 1 or k > self.k]
        if bad:
            raise ValueError(f"evaluate.ks must lie in 1..k={self.k}, got {bad}")
        return self


class AnalyzeConfig(_Strict):
    ter_window: int = Field(8, ge=1, description="Training steps per TER/entropy window.")
    early: tuple[int, int] | None = Field(None, description="Early step window for categories (None: first quarter).")
    late: tuple[int, int] | None = Field(None, description="Late step window for categories (None: last quarter).")
    compatibility_prompts: int = Field(16, ge=0, description="Prompts for the compatibility NLL (0: skip).")
    complementarity_prompts: int = Field(8, ge=0, description="Historically solved prompts re-sampled (0: skip).")
    complementarity_k: int = Field(32, ge=1, description="Samples per prompt for complementarity pass@1/8/32.")
    max_tokens: int = Field(96, ge=1, description="New tokens per sample in the analyses.")


class RossConfig(_Strict):
    store: str = Field(..., description="Path of the rollout store holding the historical rollouts.")
    out_dir: str = Field("runs/ross", description="Parent folder; each run writes a new sub-folder in it.")
    upstream_model: str = Field(..., description="The checkpoint after RL (HF dir/name; 'default' = SmolLM2-135M).")
    base_model: str | None = Field(None, description="The checkpoint RL started from (for the base row and init-from-base).")
    continued_rl_model: str | None = Field(None, description="Upstream trained further by RL with the same extra compute.")
    other_model: str | None = Field(None, description="Another model whose outputs the compatibility NLL scores (default: base).")
    tokenizer: str | None = Field(None, description="Tokenizer that produced the stored tokens (default: upstream's).")
    variants: list[Literal["positive_sft", "ross_nomask", "ross", "ross_from_base"]] = Field(
        default_factory=lambda: ["positive_sft", "ross_nomask", "ross"],
        description="Models to train: positive-rollout SFT, ROSS w/o mask, ROSS, ROSS initialised from base.")
    window: WindowConfig = Field(default_factory=WindowConfig, description="Which rollouts to relearn.")
    judge: AuditJudgeConfig = Field(default_factory=AuditJudgeConfig, description="The audit judge.")
    build: BuildConfig = Field(default_factory=BuildConfig, description="Dataset building.")
    train: SFTConfig = Field(default_factory=SFTConfig, description="Masked SFT.")
    evaluate: RossEvalConfig = Field(default_factory=RossEvalConfig, description="Held-out evaluation.")
    analyze: AnalyzeConfig = Field(default_factory=AnalyzeConfig, description="Analyses.")
    stages: list[Literal["select", "audit", "build", "train", "evaluate", "analyze"]] = Field(
        default_factory=lambda: ["select", "audit", "build", "train", "evaluate", "analyze"],
        description="Stages `gfcr ross run` executes, in this order.")

    @model_validator(mode="after")
    def _check(self) -> RossConfig:
        if "ross_from_base" in self.variants and not self.base_model:
            raise ValueError("variant ross_from_base needs base_model")
        return self


def load_config(path: str | Path | None = None, overrides: dict[str, Any] | None = None) -> RossConfig:
    """Read a YAML config (plus dotted overrides like ``{"train.epochs": 1}``) into :class:`RossConfig`."""
    return load_config_model(RossConfig, path, overrides)
