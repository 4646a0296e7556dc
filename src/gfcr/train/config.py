"""The typed training config: one pydantic model, loaded from YAML, unknown keys are errors.

Every method of the other rooms is chosen in one shape (:class:`gfcr.config.Method`): ``KEY: NAME``
or ``KEY: {name: NAME, params: {...}}`` (``control.selector``, ``control.group``, ``replay.buffer``,
``signals.advantage``, ``signals.length_reward``, ``verify.verifier``, ``generate.engine``,
``generate.topology``). A name is looked up in its room's name → class table and its ``params``
checked against that method's parameters, so a bad name or key fails at config load with one line
naming the path and the choices. Configs in the older flat shape (``control.selector_params``,
``generate.k``...) load through :func:`gfcr.train.config_migrate.migrate`, one note per old key.
The resolved config (every default filled in) is written to ``RUN_DIR/config.yaml``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, Literal

import yaml
from pydantic import AliasChoices, Field, field_validator, model_validator

from gfcr.config import ConfigError as ConfigError  # re-exported: callers catch it from here
from gfcr.config import Method, StrictModel, check_component, load_config_model
from gfcr.control.methods import GroupMethod, SelectorMethod
from gfcr.evaluate import EvalConfig as _EvalConfig
from gfcr.generate.config import EngineConfig, TopologyConfig
from gfcr.replay.methods import BufferMethod
from gfcr.tasks import TaskConfig as _TaskConfig
from gfcr.train.config_migrate import migrate
from gfcr.train.distill import DistillConfig
from gfcr.train.seeding import TrainRetrieveConfig


def _known(field_name: str, value: str | None, table: Any, allow_path: bool = False) -> str | None:
    """``value`` if it names an entry of ``table`` (or ``pkg.mod:obj`` when allowed), else one clear error."""
    if value is None or value in table or (allow_path and ":" in value):
        return value
    extra = " or 'pkg.module:object'" if allow_path else ""
    raise ValueError(f"{field_name} {value!r} does not exist; choose one of {sorted(table)}{extra}")


class TrainTaskConfig(_TaskConfig):
    """A task source (``name``, ``params``: the shared task vocabulary) and how many prompts each split gives."""

    n_train: int = Field(256, ge=1, description="Training prompts drawn from the task's train split.")
    n_eval: int = Field(32, ge=0, description="Held-out prompts for evaluation (the task's 'test' split).")
    eval_params: dict[str, Any] = Field(default_factory=dict, description=(
        "Keyword arguments merged over params for the held-out split (e.g. a test-file path)."))

    path: ClassVar[str] = "tasks[]"

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        from gfcr.tasks import SOURCES

        return _known("tasks[].name", v, SOURCES, allow_path=True)  # type: ignore[return-value]

    @model_validator(mode="after")
    def _eval_params(self) -> TrainTaskConfig:
        from gfcr.tasks import SOURCES

        self.eval_params = check_component("tasks[].eval_params", "task source", self.name, SOURCES, self.eval_params)
        return self


#: what the training run hands each engine itself (so generate.engine.params may not set it)
_RUN_SUPPLIES: dict[str, tuple[str, ...]] = {
    "hf": ("model", "tokenizer", "device", "max_batch", "policy_version"),
    "vllm": ("model", "policy_version", "weight_sync"),
    "openai": ("tokenizer", "policy_version"),
    "ray": ("model", "tokenizer", "policy_version"),
}


class TrainEngineConfig(EngineConfig):
    """Generate's engine sub-config as training uses it: ``generate.engine: NAME`` or
    ``generate.engine: {name: NAME, params: {...}}``, as in ``gfcr generate``. The policy is the run's
    ``model``; ``model`` here is only the served model name of the openai engine."""

    name: Literal["hf", "vllm", "openai", "ray"] = Field("hf", description=(
        "Generation engine: 'hf' (transformers; samples with the policy being trained in place unless sync "
        "is 'copy'), 'vllm' (in-process vLLM on the same GPU, weights copied after each update), 'openai' (a "
        "`gfcr serve --allow-weight-updates` server, weights pushed over HTTP through a safetensors file), "
        "'ray' (generation actors on a Ray cluster, gfcr.scale.RayEngine; weights put in Ray's object store "
        "once and loaded by every actor)."))
    params: dict[str, Any] = Field(default_factory=dict, validation_alias=AliasChoices("params", "args"),
                                   description=(
        "Keyword arguments of the engine, checked against the engine's "
        "parameters at config load. openai: base_url (required), model, max_concurrency, max_retries, "
        "backoff_s, timeout_s, extra_body; api_key_env names an environment variable holding the key (keys "
        "are never written into the run folder). vllm: vllm.LLM arguments (gpu_memory_utilization, "
        "max_model_len, dtype, enforce_eager...). hf with sync 'copy': dtype of the sampling copy (e.g. "
        "bfloat16). ray: workers, inner (hf or vllm), inner_params, actor_options, address, num_cpus."))

    extra_engines: ClassVar[dict[str, str]] = {"ray": "gfcr.scale.engine:RayEngine"}
    params_path: ClassVar[str] = "generate.engine.params"
    where: ClassVar[str] = "generate.engine"

    def supplied(self) -> tuple[str, ...]:
        return _RUN_SUPPLIES[self.name]

    @model_validator(mode="after")
    def _policy_is_the_run_model(self) -> TrainEngineConfig:
        if self.model is not None and self.name != "openai":
            raise ConfigError("generate.engine.model: the engine samples the run's policy (the top-level `model`); "
                              "only the openai engine takes a served model name here")
        if "api_key" in self.params:
            raise ConfigError("generate.engine.params.api_key: give api_key_env (the name of an environment variable) "
                              "instead, so the key is not written into the run folder's config.yaml")
        return self


class TrainTopologyConfig(TopologyConfig):
    """Generate's topology sub-config as training uses it: ``generate.topology: NAME`` or
    ``generate.topology: {name: NAME, params: {k: 8}}``, as in ``gfcr generate``."""

    path: ClassVar[str] = "generate.topology"

    def require(self, given: set[str]) -> None:
        """A training run's multi_turn topology names its env (the calculator default is only for a look)."""
        if self.name == "multi_turn" and "env" not in given:
            from gfcr.generate.envs import ENVS

            raise ConfigError(f"generate.topology multi_turn needs generate.topology.params.env: one of {sorted(ENVS)} "
                              "or 'pkg.module:Class', e.g. generate: {topology: {name: multi_turn, params: {env: "
                              "calculator, max_turns: 3}}}")


class TrainGenerateConfig(StrictModel):
    """Generation in a training run: Generate's engine and topology sub-configs, written as ``gfcr
    generate`` writes them (``engine: {name, params}``, ``topology: {name, params}``), plus what the
    training step adds (prompts per step, sampling, weight sync)."""

    engine: TrainEngineConfig = Field(default_factory=TrainEngineConfig, description=(
        "The engine (gfcr.generate.config.EngineConfig): `engine: hf` or `engine: {name: hf, params: "
        "{...}}`."))
    sync: Literal["auto", "in_place", "copy", "http", "vllm_reload"] = Field("auto", description=(
        "How new weights reach the engine (gfcr.generate.sync): 'in_place' (hf on the training module: "
        "nothing moves), 'copy' (an engine with its own weights loads the state dict: hf copy, vllm, ray "
        "actors), 'http' (POST to gfcr serve), 'vllm_reload' (openai engine on vLLM's own server in dev "
        "mode: reload_weights from a checkpoint folder, then reset its prefix cache). 'auto': in_place for "
        "hf, copy for vllm and ray, http for openai."))
    sync_every: int = Field(1, ge=1, description=(
        "Push weights to the engine every N updates (N > 1: rollouts up to N-1 updates stale, recorded in "
        "policy_version; the truncated-IS/clipped ratio corrects them). The last step always pushes. Needs "
        "sync 'copy' or 'http'."))
    topology: TrainTopologyConfig = Field(default_factory=TrainTopologyConfig, description=(
        "Rollout topology (gfcr.generate.config.TopologyConfig): 'group' (params.k samples per prompt, "
        "group advantages), 'tree' (EPTree; TreeRL per-token advantages; its shape m, n, l, t, "
        "min_prefix_frac, no_fork_after in params; k does not apply) or 'multi_turn' (params.k policy-env "
        "episodes per prompt, group advantages on the policy's tokens only; env, max_turns, obs_role in "
        "params; max_tokens is per turn). Written `topology: NAME` or `topology: {name: NAME, params: "
        "{k: 8}}`."))
    prompts_per_step: int = Field(4, ge=1, description="Prompts selected per training step.")
    temperature: float = Field(0.7, gt=0.0, le=5.0, description=(
        "Sampling temperature (the training forward divides logits by it too)."))
    top_p: float = Field(1.0, gt=0.0, le=1.0, description=(
        "Nucleus mass; keep 1.0 unless the trainer also applies top-p."))
    max_tokens: int = Field(64, ge=1, description="Most new tokens per rollout.")
    max_batch: int = Field(32, ge=1, description="Most sequences decoded together.")
    repeat_ngram: int = Field(0, ge=0, description=(
        "Early exit on repetition (gfcr.control.groups.EarlyExit's rule, Kimi k1.5-style): stop a rollout, "
        "finish_reason 'abort', once its last repeat_ngram tokens have occurred repeat_max times; saves the "
        "tokens a degenerate loop would burn up to max_tokens. 0 = off. hf engine and gfcr serve."))
    repeat_max: int = Field(4, ge=2, description=(
        "Occurrences of the trailing n-gram that stop a rollout (with repeat_ngram > 0)."))
    partial_budget: int | None = Field(None, ge=1, description=(
        "Partial rollouts (Kimi k1.5, gfcr.control.partial): most new tokens per rollout per step; a rollout "
        "cut by this budget below max_tokens is carried into the next step and continued from its own tokens "
        "(its segments keep their behaviour log-probs and per-token policy versions, meta.token_versions); "
        "its group trains in the step its last member finishes. null = off (every rollout runs to max_tokens "
        "in its step). Group topology only."))

    @property
    def k(self) -> int:
        """Rollouts per prompt: ``generate.topology.params.k`` (the group size K; a tree's own shape
        decides its size)."""
        return self.topology.k


class VerifierMethod(Method):
    """``verify.verifier``: a verifier of :data:`gfcr.filters.verifiers.VERIFIERS` (params: its ``Config``)."""

    kind: ClassVar[str] = "verifier"
    path: ClassVar[str] = "verify.verifier"

    @classmethod
    def table(cls) -> Any:
        from gfcr.filters.verifiers import VERIFIERS

        return VERIFIERS


class AdvantageMethod(Method):
    """``signals.advantage``: an advantage estimator of :data:`gfcr.filters.advantages.ESTIMATORS`."""

    kind: ClassVar[str] = "advantage estimator"
    path: ClassVar[str] = "signals.advantage"

    @classmethod
    def table(cls) -> Any:
        from gfcr.filters.advantages import ESTIMATORS

        return ESTIMATORS


class LengthRewardMethod(Method):
    """``signals.length_reward``: a length reward of :data:`LENGTH_REWARDS` (ShorterBetter)."""

    kind: ClassVar[str] = "length reward"
    path: ClassVar[str] = "signals.length_reward"

    @classmethod
    def table(cls) -> Any:
        return LENGTH_REWARDS


class VerifyConfig(StrictModel):
    verifier: VerifierMethod = Field(default_factory=lambda: VerifierMethod(name="numeric"), description=(
        "Verifier in gfcr.filters (math, exact, numeric, format, code, env, composite) and its params; "
        "numeric uses a lenient final-answer extraction (boxed, 'Answer:' line, else the last number). "
        "Written `verifier: numeric` or `verifier: {name: numeric, params: {lenient_fallback: true}}`."))
    format_pattern: str = Field(r"(?im)^\s*answer:\s*-?[\d,.]+", description=(
        "Regex of the requested answer format; a match sets the 'format' signal to 1."))
    format_bonus: float = Field(0.0, ge=0.0, description=(
        "Reward added when the format matches (0 = off; the format signal is recorded either way)."))
    reward_source: Literal["verifier", "env", "env_or_verifier", "weighted"] = Field("verifier", description=(
        "Where a multi_turn episode's reward comes from: 'verifier' (the verifier on the final assistant "
        "turn), 'env' (the env's own info['reward'/'success']; 0 when it reports nothing), 'env_or_verifier' "
        "(the env's when it reported, else the verifier's) or 'weighted' (env_weight*env + "
        "(1-env_weight)*verifier). Only multi_turn episodes carry an env signal; other topologies need "
        "'verifier'. The format bonus is added on top either way."))
    env_weight: float = Field(0.5, ge=0.0, le=1.0, description=(
        "Weight of the env's reward under reward_source 'weighted' (the verifier's score gets 1 - "
        "env_weight)."))


class TokenTermConfig(StrictModel):
    name: str = Field(description="A per-token advantage term in gfcr.filters.advantages.TOKEN_TERMS.")
    coef: float = Field(1.0, description="Its weight: advantage[t] += coef * term[t].")
    params: dict[str, Any] = Field(default_factory=dict, description=(
        "Keyword arguments of the term's factory."))

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        from gfcr.filters.advantages import TOKEN_TERMS

        return _known("signals.token_terms[].name", v, TOKEN_TERMS)  # type: ignore[return-value]

    @model_validator(mode="after")
    def _params(self) -> TokenTermConfig:
        from gfcr.filters.advantages import TOKEN_TERMS

        self.params = check_component("signals.token_terms[].params", "token term", self.name, TOKEN_TERMS, self.params)
        return self


class PRMConfig(StrictModel):
    scorer: str = Field("arith_steps", description=(
        "Step scorer in gfcr.filters.reward.STEP_SCORERS (arith_steps: each stated equation a op b = c "
        "checked)."))
    aggregate: Literal["product", "min", "last"] = Field("product", description=(
        "How step scores become one score (product: Lightman et al.)."))
    weight: float = Field(1.0, description="reward += weight * aggregated score.")

    @field_validator("scorer")
    @classmethod
    def _scorer(cls, v: str) -> str:
        from gfcr.filters.reward import STEP_SCORERS

        return _known("signals.prm.scorer", v, STEP_SCORERS)  # type: ignore[return-value]


class AdaptThinkConfig(StrictModel):
    delta: float = Field(0.05, description=(
        "AdaptThink's bonus for a NoThinking response (the paper's scripts: 0.05)."))


class SignalsConfig(StrictModel):
    advantage: AdvantageMethod | None = Field(None, description=(
        "Group advantage estimator (gfcr.filters.advantages): grpo (mean/std), dr_grpo (mean only), rloo "
        "(leave-one-out), seed_grpo (mean-centred, scaled by semantic entropy; params alpha, form, "
        "estimator, likelihood), treerl (per-token TreeRL values of a tree; params scaling "
        "reference|segment), reward (the reward itself: AdaptThink), judge (GRPO of reward + weight x a "
        "pairwise or listwise judge's score in the group; params mode, judge, weight, base). null: treerl "
        "for the tree topology, reward with adapt_think, else grpo."))
    token_terms: list[TokenTermConfig] = Field(default_factory=list, description=(
        "Per-token terms added to every advantage (e.g. a distillation signal); empty = none."))
    prm: PRMConfig | None = Field(None, description=(
        "Process score added to the reward (gfcr.filters.reward): null = off."))
    adapt_think: AdaptThinkConfig | None = Field(None, description=(
        "AdaptThink reward (arXiv 2505.13417): correctness − the prompt's reference accuracy + "
        "delta·1[NoThinking]; the advantage is that reward. null = off."))
    overlong_buffer: int = Field(0, ge=0, description=(
        "DAPO soft overlong punishment buffer in tokens (0 = off)."))
    overlong_penalty: float = Field(1.0, ge=0.0, description="DAPO overlong penalty factor.")
    length_reward: LengthRewardMethod | None = Field(None, description=(
        "Length control of the reward: 'shorter_better' (ShorterBetter, arXiv 2504.21370) replaces a "
        "rollout's correctness reward by alpha·1[verified] − beta·|length − SOL|, SOL = the group's shortest "
        "verified length (its mean length when none is verified); the format bonus and the overlong penalty "
        "still add on top; params alpha (default 1.0), beta (per token, default 0.001). null = off."))
    entropy: bool = Field(True, description=(
        "Write signals['entropy'] (mean token entropy under the sampling policy) for every rollout. The hf "
        "engine (also behind gfcr serve and in ray actors) reports it while sampling, at no cost; for "
        "rollouts of engines that do not (vllm, other OpenAI-compatible servers) a no-grad forward computes "
        "it, ~0.75x the generation time on CPU. Off: no forward; rollouts keep what the engine reported, if "
        "anything (Diagnose falls back to nll_mean)."))


class ControlConfig(StrictModel):
    selector: SelectorMethod = Field(default_factory=lambda: SelectorMethod(name="uniform"), description=(
        "Prompt selector in gfcr.control (uniform, greso, vcrl, vade, sec) and its params: `selector: greso` "
        "or `selector: {name: greso, params: {p_min: 0.01}}`."))
    group: GroupMethod | None = Field(None, description=(
        "Group policy in gfcr.control.policies (adaptive_k, dynamic_sampling, gfpo, ar3po, starpo_s) and "
        "its params; null = single (one round, every group)."))
    decide_on: Literal["accuracy", "reward"] = Field("accuracy", description=(
        "What Control decisions read (dynamic sampling, GFPO, AdaptiveK, every selector's observation): "
        "accuracy (the verdict, 1/0; the reward where there is none) or reward (the shaped reward)."))
    staleness_eta: int | None = Field(None, ge=0, description=(
        "AReaL's staleness bound η: a batch row whose policy lag (updates since the policy that sampled it) "
        "exceeds η is dropped; null = off."))


class ReplayConfig(StrictModel):
    buffer: BufferMethod | None = Field(None, description=(
        "Replay buffer in gfcr.replay (fifo, repo, exgrpo, ar3po) and its params; null = no replay. ar3po "
        "also turns on control.group ar3po (its staged rollout) unless another group policy is named."))
    per_step: int = Field(0, ge=0, description=(
        "fifo only: past rollouts mixed into each update (RePO replays num_replays per batch prompt, ExGRPO "
        "mix_ratio of the prompts, AR3PO one per all-wrong group)."))


class LossConfig(StrictModel):
    agg: Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"] = Field("seq-mean-token-mean", description=(
        "Loss aggregation: token-mean (DAPO), seq-mean-token-mean (GRPO), "
        "seq-mean-token-sum-norm (Dr.GRPO)."))
    clip_low: float = Field(0.2, ge=0.0, le=1.0, description=(
        "Lower clip range ε_low of the importance ratio."))
    clip_high: float = Field(0.2, ge=0.0, le=10.0, description=(
        "Upper clip range ε_high (DAPO clip-higher uses 0.28)."))
    clip: bool = Field(True, description=(
        "Clip the importance ratio to [1 − clip_low, 1 + clip_high] (PPO/GRPO). false: the unclipped "
        "−A·ratio (ExGRPO's loss_remove_clip, the default with replay.buffer exgrpo)."))
    norm_len: int | None = Field(None, ge=1, description=(
        "Constant length for seq-mean-token-sum-norm (default: generate.max_tokens)."))
    kl_coef: float = Field(0.0, ge=0.0, description=(
        "Weight of the k3 KL to the initial (reference) policy; 0 = no reference model."))
    tis_cap: float | None = Field(None, gt=0.0, description=(
        "Cap of the behaviour importance weight exp(proximal − behaviour) for stale/replayed rollouts (AReaL "
        "decoupled loss: the clipped ratio against the policy at the start of the update, times that "
        "weight); null = off. Unset with generate.partial_budget, it is 5.0 (AReaL's off-policy default); "
        "set null to turn it off there."))
    tis_mode: Literal["mask", "clamp"] = Field("mask", description=(
        "mask (AReaL: tokens whose weight exceeds tis_cap get weight 0) or clamp (truncated IS: min(weight, "
        "tis_cap))."))
    mask_truncated: bool = Field(False, description=(
        "DAPO overlong filtering: rollouts that hit max_tokens get no loss."))


class OptimConfig(StrictModel):
    lr: float = Field(1e-6, gt=0.0, description="AdamW learning rate.")
    weight_decay: float = Field(0.0, ge=0.0, description="AdamW weight decay.")
    betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW betas.")
    grad_clip: float = Field(1.0, ge=0.0, description="Max global gradient norm (0 = no clipping).")
    micro_batch: int = Field(4, ge=1, description=(
        "Sequences per forward/backward; gradients accumulate to one optimizer step per update."))
    epochs: int = Field(1, ge=1, description=(
        "Passes over each step's batch; >1 makes later passes off-policy (clipping matters)."))
    mini_batch: int | None = Field(None, ge=1, description=(
        "PPO mini-batch: rollouts per optimizer step (verl's ppo_mini_batch_size); the step's batch is cut "
        "in order into mini-batches, each one optimizer step with its own token/sequence denominators, so "
        "epochs × mini-batches steps per training step. null = the whole batch is one mini-batch (one step "
        "per epoch). Unset with replay.buffer exgrpo, it is half the step's prompts_per_step × k rows (the "
        "authors' script: two optimizer steps a step)."))


class CheckpointConfig(StrictModel):
    every: int = Field(1, ge=1, description="Save a checkpoint every N steps (and always at the last step).")
    keep_last: int = Field(1, ge=1, description="Checkpoints kept on disk (older ones are deleted).")


class TrainEvalConfig(_EvalConfig):
    """When to evaluate, plus the shared eval sampling (k, greedy, max_tokens = generate.max_tokens when None, temperature)."""

    before: bool = Field(False, description="Evaluate the policy on held-out prompts before training.")
    after: bool = Field(False, description="Evaluate the policy on held-out prompts after training.")
    store: bool = Field(True, description=(
        "Keep every eval generation in RUN/evals as eval runs 'eval-before' and 'eval-after' (single-answer "
        "tasks; compare them with `gfcr compare RUN/evals eval-after eval-before`)."))


class TrainConfig(StrictModel):
    """A whole run. Every field has a default, so a YAML file only names what it changes."""

    run_name: str = Field("run", description="Prefix of the run folder name under output_dir.")
    output_dir: str = Field("runs", description=(
        "Folder that holds run folders (relative paths are relative to the working directory)."))
    seed: int = Field(0, description="Seed of prompt selection, sampling and the data order.")
    model: str = Field("default", description=(
        "Policy model: an HF directory/name, or 'default' (SmolLM2-135M-Instruct)."))
    device: str = Field("cpu", description="torch device for training and hf generation.")
    steps: int = Field(20, ge=1, description=(
        "Training steps (each: select → generate → verify → signals → control → replay → append → update → "
        "observe → checkpoint)."))
    tasks: list[TrainTaskConfig] = Field(default_factory=lambda: [TrainTaskConfig()], description=(
        "Task sources; their train prompts form the pool."))
    generate: TrainGenerateConfig = Field(default_factory=TrainGenerateConfig, description="Generation.")
    verify: VerifyConfig = Field(default_factory=VerifyConfig, description="Outcome verification.")
    signals: SignalsConfig = Field(default_factory=SignalsConfig, description=(
        "Filter signals (advantages, shaping)."))
    control: ControlConfig = Field(default_factory=ControlConfig, description=(
        "Prompt selection and group control."))
    replay: ReplayConfig = Field(default_factory=ReplayConfig, description="Replay buffer and mixing.")
    loss: LossConfig = Field(default_factory=LossConfig, description="Policy-gradient loss.")
    optim: OptimConfig = Field(default_factory=OptimConfig, description="Optimizer.")
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig, description="Checkpointing.")
    eval: TrainEvalConfig = Field(default_factory=TrainEvalConfig, description=(
        "Held-out evaluation around training."))
    distill: DistillConfig | None = Field(None, description=(
        "On-policy distillation (gfcr.train.distill): teachers that score every sampled token; each "
        "generated token's advantage gets -coef*(log p_student - log p_teacher) on top of rl_coef x the "
        "group advantage. One teacher per task = multi-teacher (MOPD). null = off."))
    retrieve: TrainRetrieveConfig | None = Field(None, description=(
        "Retrieval-guided seeds (gfcr.train.seeding): each selected prompt gets the k nearest solved "
        "prompts of a store, one verified solution each, as earlier turns (rollouts record them in "
        "meta.retrieved); null = off."))
    tensorboard: bool = Field(True, description=(
        "Also log metrics to TensorBoard when the tensorboard package is installed."))
    store: str | None = Field(None, description=(
        "Where the run's rollouts are stored: a local folder or an s3://, gs://, az:// URI (docs/store.md, "
        "'Stores on object storage'); null = the run folder's store/. --resume reopens the same store."))

    @model_validator(mode="before")
    @classmethod
    def _old_shape(cls, data: Any) -> Any:
        """A config in the older flat shape (``control.selector_params``, ``generate.k``...) in the one
        method shape, one note per old key (:func:`gfcr.train.config_migrate.migrate`)."""
        return migrate(data, note=True) if isinstance(data, dict) else data

    @model_validator(mode="after")
    def _check(self) -> TrainConfig:
        """Defaults that depend on other sections, then the cross-section rules, in the order they build on each other.

        Long because: each rule is two to four lines over several sections; split apart they would
        lose the order they must run in.
        """
        self._method_defaults()
        if self.loss.agg == "seq-mean-token-sum-norm" and self.loss.norm_len is None:
            self.loss.norm_len = self.generate.max_tokens
        if self.eval.max_tokens is None:
            self.eval.max_tokens = self.generate.max_tokens
        buffer = self.replay.buffer.name if self.replay.buffer else None
        if self.replay.per_step and buffer != "fifo":
            raise ValueError("replay.per_step is the fifo buffer's count; set replay.buffer: fifo, or use the buffer's own "
                             "params (repo: num_replays, exgrpo: mix_ratio; ar3po injects one per all-wrong group)")
        if self.replay.buffer is not None and buffer == "fifo":
            self.replay.buffer.params.setdefault("per_step", self.replay.per_step)
        s = self.signals
        if s.advantage is None:
            s.advantage = AdvantageMethod(
                name="treerl" if self.generate.topology.name == "tree" else "reward" if s.adapt_think else "grpo")
        if s.length_reward and s.adapt_think:
            raise ValueError("signals.length_reward and signals.adapt_think both replace the correctness reward; choose one")
        group = self.control.group.name if self.control.group else None
        if self.generate.topology.name == "tree" and group in ("gfpo", "adaptive_k", "ar3po"):
            raise ValueError(f"control.group {group!r} changes a group's members or size, which a tree's "
                             "shape (m, n, l, t) fixes: use dynamic_sampling (whole trees) or no group policy")
        if not self.tasks:
            raise ValueError("tasks: name at least one task source")
        if self.distill is None and any(t.name == "teacher_kl" for t in self.signals.token_terms):
            raise ValueError("signals.token_terms 'teacher_kl' needs a distill section (the teachers that score the rollouts)")
        if self.distill is not None and any(t.name == "teacher_kl" for t in self.signals.token_terms):
            raise ValueError("with a distill section, set the teacher term's weight with distill.coef (not signals.token_terms)")
        if self.verify.reward_source != "verifier" and self.generate.topology.name != "multi_turn":
            raise ValueError(f"verify.reward_source {self.verify.reward_source!r} reads the env's own verdict, which "
                             "only multi-turn episodes have: set generate.topology: multi_turn, or reward_source: verifier")
        g = self.generate
        if g.partial_budget is not None and g.topology.name != "group":
            raise ValueError(f"generate.partial_budget continues single rollouts from their tokens; topology "
                             f"{g.topology.name!r} shapes its rollouts itself: use topology group, or partial_budget: null")
        if g.partial_budget is not None and "tis_cap" not in self.loss.model_fields_set:
            self.loss.tis_cap = PARTIAL_TIS_CAP  # a partial rollout's segments are off-policy: AReaL's decoupled loss
        engine = g.engine.name
        if g.sync == "auto":
            g.sync = {"hf": "in_place", "vllm": "copy", "openai": "http", "ray": "copy"}[engine]
        allowed = {"hf": ("in_place", "copy"), "vllm": ("copy",), "openai": ("http", "vllm_reload"), "ray": ("copy",)}[engine]
        if g.sync not in allowed:
            raise ValueError(f"generate.sync {g.sync!r} does not work with engine {engine!r}; use one of {list(allowed)}")
        if g.repeat_ngram and engine == "vllm":
            raise ValueError("generate.repeat_ngram (early exit on repetition) is not supported by the vllm engine; "
                             "set it to 0 or use hf / gfcr serve")
        if g.sync == "in_place" and g.sync_every != 1:
            raise ValueError("generate.sync_every > 1 needs an engine with its own weights (sync 'copy' or 'http'): "
                             "an in-place hf engine always samples with the current weights")
        if g.sync == "in_place" and g.engine.params:
            raise ValueError(f"generate.engine.params {sorted(g.engine.params)}: the in-place hf engine takes none (set "
                             "sync: copy for a separate sampling copy, e.g. engine: {name: hf, params: {dtype: bfloat16}})")
        if engine == "openai" and not g.engine.params.get("base_url"):
            raise ValueError("engine 'openai' needs generate.engine.params.base_url, e.g. http://127.0.0.1:8000/v1 of a "
                             "`gfcr serve --allow-weight-updates` server")
        return self

    def _method_defaults(self) -> None:
        """The defaults a method sets in other sections, declared on its class (``run_defaults``, e.g.
        :meth:`gfcr.replay.buffers.ExGRPO.run_defaults`): each ``section.field`` the config does not name
        takes the method's value (a method's name becomes that method); ``section.method.params.key``
        fills a missing key of that method's params."""
        from pydantic import TypeAdapter

        from gfcr.replay.buffers import BUFFERS

        cls = BUFFERS.get(self.replay.buffer.name if self.replay.buffer else "")
        for path, value in (cls.run_defaults(self.generate.prompts_per_step, self.generate.k)
                            if hasattr(cls, "run_defaults") else {}).items():
            section, name, *key = path.split(".")
            sec = getattr(self, section)
            if key:  # ("params", k): the method is named (the buffer whose defaults these are)
                getattr(sec, name).params.setdefault(key[-1], value)
            elif name not in sec.model_fields_set:
                setattr(sec, name, TypeAdapter(type(sec).model_fields[name].annotation).validate_python(value))


#: ``loss.tis_cap`` when ``generate.partial_budget`` is set and the config leaves ``tis_cap`` unset: AReaL's
#: decoupled objective for off-policy data, with its cap (inclusionAI/AReaL ``examples/math/gsm8k_grpo.yaml``:
#: ``use_decoupled_loss: true``, ``rejection_sampling: {metric: ratio, upper: 5.0}``, token mask; the older
#: ``behave_imp_weight_cap=5.0``). AReaL's dataclass default is off because its default is synchronous RL
#: (``max_head_offpolicyness: 0``); partial rollouts are never synchronous.
PARTIAL_TIS_CAP = 5.0

#: length rewards (``signals.length_reward``) → their class, whose parameters ``signals.length_reward.params`` gives
LENGTH_REWARDS: dict[str, str] = {"shorter_better": "gfcr.filters.reward:ShorterBetter"}


def load_config(path: str | Path | None = None, overrides: dict[str, Any] | None = None) -> TrainConfig:
    """Read a YAML config (``None`` = all defaults), apply dotted ``overrides`` (``{"optim.lr": 1e-5}``)."""
    return load_config_model(TrainConfig, path, overrides)


def dump_config(cfg: TrainConfig, path: str | Path) -> Path:
    """Write the resolved config (every field, defaults filled in) as YAML."""
    p = Path(path)
    p.write_text(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))
    return p
