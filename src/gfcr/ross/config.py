"""The ROSS run configuration: one typed YAML drives ``gfcr ross run`` and every stage command.

Every method it chooses is written in the one shape of :class:`gfcr.config.Method`, ``KEY: NAME``
or ``KEY: {name: NAME, params: {...}}``: ``window.reverify``, ``evaluate.verifier``, a benchmark's
``verifier`` and ``evaluate.engine``. The older flat keys (``window.reverify_params``,
``evaluate.verifier_params``, ``evaluate.engine_params``, a benchmark's ``verifier_params``) load
through :func:`migrate`, one note per key.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from gfcr.config import ConfigError as ConfigError  # re-exported: callers catch it from here
from gfcr.config import StrictModel, check_component, load_config_model, move_old_params
from gfcr.evaluate import EvalConfig
from gfcr.filters.judge import JudgeConfig
from gfcr.generate.config import EngineConfig
from gfcr.train.config import VerifierMethod
from gfcr.train.sft import AutocastDtype

VARIANTS = ("positive_sft", "ross_nomask", "ross", "ross_from_base")


class ReverifyMethod(VerifierMethod):
    """``window.reverify``: a verifier of :data:`gfcr.filters.verifiers.VERIFIERS` (params: its ``Config``)."""

    path: ClassVar[str] = "window.reverify"


class EvalVerifierMethod(VerifierMethod):
    """``evaluate.verifier``: the verifier deciding correctness in the held-out evaluation."""

    path: ClassVar[str] = "evaluate.verifier"


class BenchmarkVerifierMethod(VerifierMethod):
    """``evaluate.benchmarks[].verifier``: one benchmark's own verifier (replaces ``evaluate.verifier``)."""

    path: ClassVar[str] = "evaluate.benchmarks[].verifier"


class EvalEngineConfig(EngineConfig):
    """``evaluate.engine``: the engine each model row is evaluated with, built from the row's own
    model (so ``model`` is not given here; ``params`` are the engine's other keyword arguments)."""

    params_path: ClassVar[str] = "evaluate.engine.params"
    where: ClassVar[str] = "evaluate.engine"

    def supplied(self) -> tuple[str, ...]:
        return ("model", "tokenizer", "policy_version")

    @model_validator(mode="after")
    def _no_model(self) -> EvalEngineConfig:
        from gfcr.generate.engines import ENGINES

        if self.name not in ENGINES and ":" not in self.name:
            raise ConfigError(f"evaluate.engine: unknown engine {self.name!r}; choose one of "
                              f"{', '.join(ENGINES)} or give pkg.mod:Class")
        if self.model is not None:
            raise ConfigError("evaluate.engine.model: each model row is evaluated from its own checkpoint; "
                              "leave model out")
        return self


class WindowConfig(StrictModel):
    run: str | None = Field(None, description=(
        "Run id whose rollouts are relearned (None: every run in the store)."))
    steps: tuple[int, int] | None = Field(None, description=(
        "Inclusive training-step window [first, last] (None: all)."))
    task: str | None = Field(None, description="Only rollouts of this task (None: all tasks).")
    reverify: ReverifyMethod | None = Field(None, description=(
        "Re-verify with this gfcr.filters verifier and its params (None: trust stored verdicts), e.g. "
        "`reverify: {name: numeric, params: {lenient_fallback: true}}` (default: the strict stated answer "
        "format, truncated never verified)."))
    dedup: bool = Field(True, description="Drop rollouts repeating another's prompt and assistant text.")
    limit: int | None = Field(None, ge=1, description="At most this many rollouts (oldest step first).")



#: the keys of the llm judge's endpoint, written flat under ``judge:`` and kept in ``judge.llm``
_LLM_KEYS = ("base_url", "model", "api_key_env", "cache_dir")


class AuditJudgeConfig(StrictModel):
    """Which judge audits. The ``llm`` judge's endpoint is the Filter room's
    :class:`gfcr.filters.judge.JudgeConfig` (``judge.llm``), called through its
    :class:`~gfcr.filters.judge.JudgeClient`; ``base_url``, ``model``, ``api_key_env`` and
    ``cache_dir`` may also be written flat under ``judge:``. Retries and concurrency are the
    audit's own (each retry goes through ROSS's stricter verdict validation)."""

    name: Literal["arith-steps", "keep-all", "llm"] = Field("arith-steps", description=(
        "Judge for the ROSS audit."))
    llm: JudgeConfig | None = Field(None, description=(
        "llm judge: the endpoint (gfcr.filters.judge.JudgeConfig: base_url, model, api_key_env, max_tokens "
        "(1024 here), timeout_s (120 here), cache_dir, ...)."))
    mode: Literal["select-keep", "locate-exclude"] = Field(
        "select-keep", description=(
            "llm judge: select-keep (math/code) or locate-exclude (agent trajectories)."))
    version: str | None = Field(None, description=(
        "llm judge: version string keying its audits (default 3:<model>)."))
    retries: int = Field(2, ge=0, le=10, description=(
        "Retries after an invalid verdict, the error fed back each time."))
    concurrency: int = Field(4, ge=1, le=256, description="Judge calls in flight at once.")
    max_unit_chars: int = Field(200, ge=20, description="Lines longer than this are split at sentence ends.")
    check_answer: bool = Field(True, description=(
        "Require the kept text to still contain the verified final answer."))
    eos_rule: Literal["after-answer", "neighbours"] = Field(
        "after-answer", description=(
            "End-of-sequence rule: after-answer supervises the eos closing the last assistant turn when the "
            "kept text ends on the verified answer's line (so ROSS teaches the model to stop); neighbours "
            "(the former rule) only when the characters around it are kept, never after excluded trailing "
            "text."))
    recheck: bool = Field(True, description=(
        "llm judge: an independent second call re-checks each usable verdict and may confirm, revise its "
        "boundaries or discard (the paper's re-check for math/code; on by default). The rule-based judges "
        "have none."))

    @model_validator(mode="before")
    @classmethod
    def _flat_llm_keys(cls, data: Any) -> Any:
        if not isinstance(data, dict) or not set(_LLM_KEYS) & set(data):
            return data
        data = dict(data)
        llm = dict(data.get("llm") or {"max_tokens": 1024, "timeout_s": 120.0})
        for key in _LLM_KEYS:
            if key in data:
                if key in llm:
                    raise ConfigError(f"judge: {key!r} given both flat and under judge.llm; keep one")
                llm[key] = data.pop(key)
        data["llm"] = llm
        return data

    @model_validator(mode="after")
    def _llm_needs_endpoint(self) -> AuditJudgeConfig:
        if self.name == "llm" and self.llm is None:
            raise ConfigError("judge: the llm judge needs base_url and model (an OpenAI-compatible endpoint)")
        if self.llm is not None and self.llm.api_key is not None:
            raise ConfigError("judge.api_key: give api_key_env (the name of an environment variable) instead, "
                              "so the key is not written into the run folder")
        return self


class BuildConfig(StrictModel):
    max_length: int | None = Field(1024, ge=8, description=(
        "Drop rollouts longer than this many tokens (None: keep all)."))


class SFTConfig(StrictModel):
    epochs: int = Field(3, ge=1, description="Passes over the dataset (the seed reports 3 for single-turn).")
    lr: float = Field(1e-5, gt=0, description="AdamW learning rate.")
    batch_size: int = Field(8, ge=1, description=(
        "Sequences per step (a length-grouped padded batch, or packed rows)."))
    grad_clip: float = Field(1.0, ge=0, description="Gradient-norm clip (0: off).")
    seed: int = Field(0, description="Seed of the batch order and torch.")
    packing: bool = Field(
        False, description=(
            "Pack each step's batch_size sequences into rows without cross-sequence attention "
            "(block-diagonal causal mask, positions restarting per sequence) instead of padding "
            "length-grouped batches; same loss and gradient per batch."))
    max_tokens_per_row: int = Field(
        1024, ge=8, description=(
            "packing: at most this many tokens per packed row (a longer sequence gets a row of its own)."))
    max_pad_fraction: float = Field(
        0.05, ge=0, le=1, description=(
            "Run each step as micro-batches whose padding is at most this fraction of their tokens "
            "(gradients accumulated, same loss); 1: one tensor per step."))
    checkpoint_every: int = Field(
        50, ge=0, description=(
            "Save a resumable state (weights, optimizer, schedule, position) to "
            "RUN_DIR/checkpoints/<variant> every this many steps and at each epoch's end; `gfcr ross train` "
            "on the same run folder continues from it (0: epoch ends only)."))
    autocast: AutocastDtype | None = Field(
        None, description="Run the forwards in torch.autocast of this dtype (faster where the "
                          "CPU or GPU has bfloat16 matrix units, e.g. AMX: bench/sft_autocast_bench.py); "
                          "weights, gradients and the saved model stay float32. None: float32 throughout.")


class EpisodeEvalConfig(StrictModel):
    env: str = Field(..., description=(
        "Env name (calculator, python, retry) or 'pkg.module:Class' the episodes run in."))
    max_turns: int = Field(4, ge=1, description="Turn budget per episode (as in training).")
    obs_role: str = Field("user", description="Role of the env's observations in the chat.")
    reward_source: Literal["verifier", "env", "env_or_verifier", "weighted"] = Field(
        "verifier", description="What decides that an episode is solved (gfcr.generate.envs.episode_reward).")


class BenchmarkConfig(StrictModel):
    name: str = Field(..., description="Column name in the evaluation table.")
    source: str = Field("store", description=(
        "'store' (the store's prompts of `split`) or a gfcr.tasks source (arith, reasoning_gym, jsonl_math, "
        "jsonl_code, or pkg.mod:fn)."))
    params: dict[str, Any] = Field(default_factory=dict, description=(
        "Keyword arguments of the task source (e.g. {level: 2} for arith, {dataset: basic_arithmetic} for "
        "reasoning_gym)."))
    split: str = Field("test", description="Split of the held-out prompts.")
    task: str | None = Field(None, description=(
        "source=store: only prompts of this task (default: window.task)."))
    n_prompts: int = Field(32, ge=1, description="Distinct held-out prompts evaluated per model.")
    domain: str = Field("default", description="Domain whose average this benchmark enters (math, code, …).")
    verifier: BenchmarkVerifierMethod | None = Field(None, description=(
        "Verifier for this benchmark, name and params (default: evaluate.verifier, name and params)."))
    max_tokens: int | None = Field(None, ge=1, description=(
        "New tokens per sample (default: evaluate.max_tokens)."))
    episodes: EpisodeEvalConfig | None = Field(None, description="Evaluate as multi-turn env episodes "
                                               "(gfcr.evaluate.evaluate_episodes) instead of single answers.")

    @model_validator(mode="after")
    def _params(self) -> BenchmarkConfig:
        from gfcr.tasks import SOURCES

        if self.source != "store":
            self.params = check_component("evaluate.benchmarks[].params", "task source", self.source, SOURCES, self.params)
        elif self.params:
            raise ConfigError("evaluate.benchmarks[].params: source 'store' takes no params (it reads the store's prompts)")
        return self


class RossEvalConfig(EvalConfig):
    """Which held-out benchmarks, plus the shared eval sampling (ROSS's defaults: k 8, 96 new tokens)."""

    benchmarks: list[BenchmarkConfig] = Field(
        default_factory=lambda: [BenchmarkConfig(name="heldout")],
        description="Held-out benchmarks: one table column each, averaged per domain.")
    k: int = Field(8, ge=0, description="Samples per prompt (0: greedy only).")
    ks: list[int] = Field(default_factory=lambda: [1, 8], description="pass@k values reported (each <= k).")
    max_tokens: int = Field(96, ge=1, description="New tokens per sample.")
    temperature: float = Field(0.7, ge=0, description="Sampling temperature of the k samples.")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling of the k samples.")
    verifier: EvalVerifierMethod = Field(default_factory=lambda: EvalVerifierMethod(name="numeric"), description=(
        "gfcr.filters verifier deciding correctness and its params, e.g. `verifier: {name: numeric, params: "
        "{lenient_fallback: true}}` (default params: the stated answer format only)."))
    allow_truncated: bool = Field(False, description=(
        "Count samples cut by the token limit when correct (off: wrong)."))
    greedy: bool = Field(True, description="Also report greedy pass@1.")
    seed: int = Field(0, description="Sampling seed.")
    batch_size: int = Field(32, ge=1, description="Prompts per generation batch.")
    pairs: list[tuple[str, str]] | None = Field(
        None, description=(
            "Model pairs (A, B) compared per prompt; None: ROSS against every other row, ROSS w/o mask "
            "against positive SFT, ROSS from base against ROSS."))
    engine: EvalEngineConfig = Field(default_factory=EvalEngineConfig, description=(
        "Engine each model row is evaluated with (gfcr.generate.engines): hf (loads the model in this "
        "process), vllm (from the model's path), or pkg.mod:Class; one model in memory at a time. Its "
        "params are the engine's keyword arguments (vllm: enforce_eager, dtype, max_model_len, "
        "kv_cache_memory_bytes, ...): `engine: {name: vllm, params: {enforce_eager: true}}`."))
    save_generations: bool = Field(False, description=(
        "Also write every generation (greedy and sampled) to RUN_DIR/generations.jsonl, one line per model, "
        "benchmark and prompt (for process measures such as false claims)."))

    @model_validator(mode="after")
    def _ks(self) -> RossEvalConfig:
        if self.k == 0:
            if not self.greedy:
                raise ValueError("evaluate: k=0 and greedy=false evaluates nothing")
            self.ks = []
            return self
        bad = [k for k in self.ks if k < 1 or k > self.k]
        if bad:
            raise ValueError(f"evaluate.ks must lie in 1..k={self.k}, got {bad}")
        names = [b.name for b in self.benchmarks]
        if len(set(names)) != len(names):
            raise ValueError(f"evaluate.benchmarks: names must be distinct, got {names}")
        return self


class AnalyzeConfig(StrictModel):
    ter_window: int = Field(8, ge=1, description="Training steps per TER/entropy window.")
    ter_ma: int = Field(8, ge=1, description=(
        "Moving-average length (steps) of the per-step TER and entropy (the paper: 8)."))
    early: tuple[int, int] | None = Field(None, description=(
        "Early step window for categories (None: first quarter)."))
    late: tuple[int, int] | None = Field(None, description=(
        "Late step window for categories (None: last quarter)."))
    domains: dict[str, str] = Field(default_factory=dict, description=(
        "task → domain for the per-domain category analysis (default: the task name before ':')."))
    compatibility_prompts: int = Field(16, ge=0, description="Prompts for the compatibility NLL (0: skip).")
    compatibility_tries: int = Field(4, ge=1, description=(
        "Samples drawn per prompt (at evaluate.temperature) to find a correct one for the current/other "
        "model rows."))
    compatibility_filter: bool = Field(True, description=(
        "Keep only correct current/other samples (the paper compares correct answers); off: the first "
        "sample, unfiltered."))
    teacher_jsonl: str | None = Field(None, description=(
        "An external teacher's answers, JSONL lines {prompt_id, text}: scored as a fourth compatibility row "
        "(re-tokenized by the scored model)."))
    complementarity_prompts: int = Field(8, ge=0, description=(
        "The hardest historically solved prompts re-sampled (0: skip)."))
    complementarity_k: int = Field(32, ge=1, description=(
        "Samples per prompt for complementarity pass@1/8/32."))
    max_tokens: int = Field(96, ge=1, description="New tokens per sample in the analyses.")


class RossConfig(StrictModel):
    store: str = Field(..., description="Path of the rollout store holding the historical rollouts.")
    out_dir: str = Field("runs/ross", description="Parent folder; each run writes a new sub-folder in it.")
    upstream_model: str | None = Field(None, description=(
        "The checkpoint after RL (HF dir/name; 'default' = SmolLM2-135M); needed by train, evaluate and "
        "analyze, not by select and audit."))
    base_model: str | None = Field(None, description=(
        "The checkpoint RL started from (for the base row and init-from-base)."))
    continued_rl_model: str | None = Field(None, description=(
        "Upstream trained further by RL with the same extra compute."))
    other_model: str | None = Field(None, description=(
        "Another model whose outputs the compatibility NLL scores (default: base)."))
    tokenizer: str | None = Field(None, description=(
        "Tokenizer that produced the stored tokens (default: audit and align read the store's recorded "
        "model when it is a local folder, else upstream's)."))
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

    @model_validator(mode="before")
    @classmethod
    def _old_shape(cls, data: Any) -> Any:
        """A config in the older flat shape (``evaluate.verifier_params``...) in the one method shape,
        one note per old key (:func:`migrate`)."""
        return migrate(data, note=True) if isinstance(data, dict) else data

    @model_validator(mode="after")
    def _check(self) -> RossConfig:
        if "ross_from_base" in self.variants and not self.base_model:
            raise ValueError("variant ross_from_base needs base_model")
        return self


#: (section, old key, the method key it moves under, the method a config names when it does not)
OLD_PARAMS: tuple[tuple[str, str, str, str | None], ...] = (
    ("window", "reverify_params", "reverify", None),
    ("evaluate", "verifier_params", "verifier", "numeric"),
    ("evaluate", "engine_params", "engine", "hf"),
)


def migrate(data: dict[str, Any], note: bool = False) -> dict[str, Any]:
    """``data`` (a ROSS config mapping) with each older flat key under its method, as
    ``{name, params}`` (:func:`gfcr.config.move_old_params`; ``note``: one line per key); ``data``
    itself is not changed. A benchmark's ``verifier_params`` without its own ``verifier`` go to
    ``evaluate.verifier``'s name. Example: ``{"evaluate": {"verifier_params": {"lenient_fallback": True}}}``
    becomes ``{"evaluate": {"verifier": {"name": "numeric", "params": {"lenient_fallback": True}}}}``."""
    data = dict(data)
    for section, old, key, default in OLD_PARAMS:
        if isinstance(data.get(section), dict) and old in data[section]:
            data[section] = dict(data[section])
            move_old_params(data[section], section, old, key, default, note)
    ev = data.get("evaluate")
    benches = ev.get("benchmarks") if isinstance(ev, dict) else None
    if isinstance(benches, list) and any(isinstance(b, dict) and "verifier_params" in b for b in benches):
        given = ev.get("verifier", "numeric")
        default = given if isinstance(given, str) else (given or {}).get("name", "numeric")
        data["evaluate"] = ev = dict(ev)
        ev["benchmarks"] = [dict(b) if isinstance(b, dict) else b for b in benches]
        for i, b in enumerate(ev["benchmarks"]):
            if isinstance(b, dict) and "verifier_params" in b:
                if b["verifier_params"] is None:
                    b.pop("verifier_params")  # the old default: evaluate.verifier's
                    continue
                if b.get("verifier") is None:
                    b.pop("verifier", None)
                move_old_params(b, f"evaluate.benchmarks[{i}]", "verifier_params", "verifier", default, note)
    return data


def load_config(path: str | Path | None = None, overrides: dict[str, Any] | None = None) -> RossConfig:
    """Read a YAML config (plus dotted overrides like ``{"train.epochs": 1}``) into :class:`RossConfig`."""
    return load_config_model(RossConfig, path, overrides)
