"""The RL training loop: one readable driver that composes the GFCR rooms by name.

Each step ``s`` (0-based) runs these stages, each timed (``seconds/<stage>`` in the metrics):

    select    PromptSelector.select(n)                       (gfcr.control, by name)
    generate  group, tree or multi_turn topology over the engine   (gfcr.generate: hf on the policy
              in place, or an engine with its own weights: an hf copy, vllm, a gfcr serve server)
    verify    Verifier.verify → reward, verified, format signal     (gfcr.filters, by name; a
              multi_turn episode is judged on its final assistant turn,
              or by the env itself: verify.reward_source)
    signals   advantages (group / multi_turn: GRPO / Dr.GRPO / RLOO over the K samples or episodes
              of a prompt; tree: TreeRL per token), overlong shaping
    entropy   signals["entropy"]: mean token entropy of each rollout under the sampling policy (the
              hf engine reports it while sampling; a no-grad forward fills it in for other engines)
    control   group control (dynamic sampling, GFPO)          (gfcr.control, by name)
    replay    mix replayed rollouts from a buffer              (gfcr.replay, by name)
    append    store.append(every generated rollout)            (gfcr.store)
    update    PolicyTrainer.update(batch)                      (gfcr.train)
    annotate  replayed rows get meta["replayed_at_step"] (+ the importance weight) via store.update
    observe   selector.observe(prompt, rewards); selector.save(store); buffer.add
    sync      push the new weights to the engine (every generate.sync_every steps and at the last
              one; gfcr.generate.sync: in_place / copy / http); rollouts record the engine's version
    checkpoint safetensors + optimizer + loop state, atomically renamed into place

Randomness is derived from ``(seed, step)``, so a resumed run draws the same prompts and samples as
an uninterrupted one. Resume (``resume=RUN_DIR``) loads the last checkpoint ``c``; rollouts the
store already holds for a later step (appended before a crash) are reused instead of regenerated,
so no step is repeated or lost and the store holds each step's rollouts exactly once. The replay
annotation of a step is idempotent (it sets that step's entries), so redoing a step after a crash
leaves each replay event recorded once.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

from gfcr.records import GENERATED, Prompt, Rollout
from gfcr.train import dist
from gfcr.train.checkpoint import STATE_FILE, latest_checkpoint, save_checkpoint
from gfcr.train.config import TrainConfig, dump_config, load_config
from gfcr.train.metrics import progress_bar, step_metrics, tensorboard_writer, truncate_metrics

STAGES = ("select", "generate", "verify", "signals", "entropy", "control", "replay", "append", "update", "annotate",
          "observe", "checkpoint")

#: topologies the loop trains on, and how their advantages are computed
TOPOLOGIES = {"group": "group advantages (signals.advantage)", "tree": "TreeRL per-token advantages",
              "multi_turn": "group advantages over the K episodes of a prompt, on the policy's tokens only"}

#: keyword arguments ``generate.params`` may give the multi_turn topology (k, seed and sampling come from the config)
MULTI_TURN_PARAMS = ("env", "max_turns", "obs_role")


class TrainError(RuntimeError):
    """The run cannot start or continue; the message says what to do."""


@dataclass
class RunResult:
    """Where a run's outputs are."""

    run_dir: Path
    store_path: Path
    metrics_path: Path
    checkpoint: Path | None
    steps_done: int
    eval_before: Any = None
    eval_after: Any = None
    last_metrics: dict[str, Any] = field(default_factory=dict)


# ---------------------------------------------------------------------------------------------
# Small pure helpers
# ---------------------------------------------------------------------------------------------


def with_replay_events(meta: dict[str, Any], step: int, weights: list[float | None]) -> dict[str, Any]:
    """A copy of ``meta`` recording that the rollout was replayed ``len(weights)`` times at ``step``.

    ``meta["replayed_at_step"]`` (list of ints, Diagnose's annotation form) and
    ``meta["replay_importance_weight"]`` (parallel list: mean importance weight of each use, ``None``
    when not measured) get exactly these entries for ``step``: earlier entries of the same step are
    replaced, so redoing a step after a crash does not count it twice. Entries stay sorted by step.

    Example: ``{"replayed_at_step": [3]}``, step 5, ``[0.9]`` → ``replayed_at_step [3, 5]``,
    ``replay_importance_weight [None, 0.9]``; applying it again gives the same.
    """
    out = dict(meta)
    at = out.get("replayed_at_step", [])
    at = [int(a) for a in (at if isinstance(at, list) else [at])]
    ws = list(out.get("replay_importance_weight", []))
    ws = (ws + [None] * len(at))[: len(at)]
    pairs = [(a, w) for a, w in zip(at, ws, strict=True) if a != int(step)]
    pairs += [(int(step), None if w is None or not np.isfinite(w) else float(w)) for w in weights]
    pairs.sort(key=lambda p: p[0])
    out["replayed_at_step"] = [a for a, _ in pairs]
    out["replay_importance_weight"] = [w for _, w in pairs]
    return out


def longest_generated_run(token_role: np.ndarray) -> int:
    """Length of the longest contiguous run of generated (role 1) tokens. token_role: ``(T,)`` → int.

    For a multi-turn episode this is its longest policy turn, the length ``max_tokens`` caps (each
    turn has its own budget), so DAPO overlong shaping reads it instead of the episode's total.
    Example: roles ``[0, 0, 1, 1, 1, 0, 1, 1, 0]`` → 3; ``[0, 0]`` → 0.
    """
    gen = np.concatenate([[False], np.asarray(token_role) == GENERATED, [False]])
    edges = np.flatnonzero(np.diff(gen.astype(np.int8)))
    return int((edges[1::2] - edges[0::2]).max()) if edges.size else 0


def final_turn_text(r: Rollout) -> str:
    """The last assistant message of a rollout (its final answer; ``""`` when it has none)."""
    from gfcr.generate.envs import last_assistant_text

    return last_assistant_text(r.messages)


def step_rng(seed: int, step: int, stage: str) -> np.random.Generator:
    """A generator that depends only on (seed, step, stage): resumed runs draw the same numbers."""
    return np.random.default_rng([int(seed), int(step), sum(ord(c) * 31**i for i, c in enumerate(stage)) % (2**31)])


class StageTimer:
    """Times named stages: ``with timer("generate"): ...``; ``seconds`` holds the totals."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - t0


# ---------------------------------------------------------------------------------------------
# Components from the other rooms (by name)
# ---------------------------------------------------------------------------------------------


def load_task_prompts(cfg: TrainConfig, split: str) -> list[Prompt]:
    """Prompts of every configured task source for ``split`` ("train" or "test", the held-out split).

    Each source is built with ``gfcr.tasks.make_source(name, **params)`` (``eval_params`` merged in
    for the held-out split); ``n``, ``split`` and ``seed`` are passed when the source's factory takes
    them, otherwise its prompts are filtered by ``prompt.split`` (when set) and cut to ``n``.
    """
    import importlib
    import inspect

    from gfcr.tasks import SOURCES, make_source

    out: list[Prompt] = []
    for t in cfg.tasks:
        n = t.n_train if split == "train" else t.n_eval
        if n == 0:
            continue
        params = dict(t.params) if split == "train" else {**t.params, **t.eval_params}
        target = SOURCES.get(t.name, t.name)
        accepted: set[str] = set()
        if ":" in target:
            mod, _, fn = target.partition(":")
            with contextlib.suppress(ImportError, AttributeError, ValueError, TypeError):
                accepted = set(inspect.signature(getattr(importlib.import_module(mod), fn)).parameters)
        extra = {k: v for k, v in (("n", n), ("split", split), ("seed", cfg.seed)) if k in accepted and k not in params}
        try:
            ps = make_source(t.name, **params, **extra).prompts()
        except (ValueError, TypeError, OSError) as e:
            raise TrainError(f"task {t.name!r} ({split} split, n={n}, params {params}): {e}") from e
        if "split" not in accepted:
            ps = [p for p in ps if p.split in (None, split)]
        out.extend(ps[:n])
    return out


# ---------------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------------


class Trainer:
    """Holds a run's components; :meth:`run` is the loop. Use :func:`train` unless embedding."""

    def __init__(self, cfg: TrainConfig, run_dir: Path, resume: bool, progress: bool = True,
                 on_step: Callable[[int, dict[str, Any]], None] | None = None):
        self.cfg = cfg
        self.run_dir = run_dir
        self.run_id = run_dir.name
        self.progress = progress and dist.is_main()
        self.device = cfg.device  # this rank's device (cuda → cuda:LOCAL_RANK under torchrun)
        self.on_step = on_step
        self.resume = resume

    def close(self) -> None:
        """Release what the engine holds (an HTTP client, Ray actors); the run folder stays as it is."""
        close = getattr(getattr(self, "engine", None), "close", None)
        if callable(close):
            close()

    # --- set-up -------------------------------------------------------------------------------
    def setup(self) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from gfcr.control.selectors import make_selector
        from gfcr.filters.verifiers import get_verifier
        from gfcr.models import resolve_model
        from gfcr.store import RolloutStore
        from gfcr.train.trainer import PolicyTrainer

        cfg = self.cfg
        _check_supported(cfg)
        torch.manual_seed(cfg.seed)
        self.device = dist.init_from_env(cfg.device)
        if dist.is_main():  # rank 0 creates the store; the other ranks open it once it exists
            self.store = RolloutStore.open(self.run_dir / "store", create=True)
        dist.barrier()
        if not dist.is_main():
            self.store = RolloutStore.open(self.run_dir / "store")
        self.train_prompts = load_task_prompts(cfg, "train")
        self.eval_prompts = load_task_prompts(cfg, "test")
        if not self.train_prompts:
            raise TrainError("the configured tasks produced no training prompts")
        self.prompt_by_id = {p.prompt_id: p for p in self.train_prompts}
        if dist.is_main():
            self.store.upsert_prompts(self.train_prompts + self.eval_prompts)
        self.selector = make_selector(
            cfg.control.selector, [p.prompt_id for p in self.train_prompts],
            [p.category for p in self.train_prompts], **cfg.control.selector_params,
        )
        self.verifier = get_verifier(cfg.verify.verifier, **cfg.verify.params)
        self.format_verifier = get_verifier("format", pattern=cfg.verify.format_pattern)
        self.group_control = None
        if cfg.control.group:
            from gfcr.control.groups import make_group_control

            params = dict(cfg.control.group_params)
            if cfg.control.group == "dynamic_sampling":
                params.setdefault("train_prompts", cfg.generate.prompts_per_step)
                params.setdefault("gen_prompts", cfg.generate.prompts_per_step)
            self.group_control = make_group_control(cfg.control.group, **params)
        self.buffer = None
        if cfg.replay.buffer:
            from gfcr.replay.buffers import make_buffer

            self.buffer = make_buffer(cfg.replay.buffer, **cfg.replay.params)

        path = resolve_model(None if cfg.model in ("default", "") else cfg.model)
        self.model_path = path
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.start_step = 0
        ckpt = latest_checkpoint(self.run_dir) if self.resume else None
        weights = ckpt if ckpt is not None else path
        self.model = AutoModelForCausalLM.from_pretrained(str(weights), dtype=torch.float32).to(self.device)
        self.model.eval()
        ref = None
        if cfg.loss.kl_coef > 0:
            ref = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(self.device)
            ref.eval()
            for p in ref.parameters():
                p.requires_grad_(False)
        self.trainer = PolicyTrainer(self.model, cfg.loss, cfg.optim, self.tokenizer.pad_token_id,
                                     temperature=cfg.generate.temperature, ref_model=ref)
        self.engine = self._make_engine()
        self.outcomes: dict[str, tuple[int, int]] = {}  # prompt → (verified, failed) rollouts so far
        if ckpt is not None:
            state = json.loads((ckpt / STATE_FILE).read_text())
            self.start_step = int(state["step"]) + 1
            self.selector.load_state_dict(state["selector"])
            opt = ckpt / "optimizer.pt"
            if opt.exists():
                self.trainer.optimizer.load_state_dict(torch.load(opt, weights_only=True))
            self.policy_version = state["policy_version"]
            if self.buffer is not None:
                self.buffer.clear()
                self.buffer.add(self._trained_rollouts(0, self.start_step - 1))
            if cfg.control.group == "adaptive_k":  # the counts are a function of the stored rollouts
                self._count_outcomes(self.store.rollouts(run=self.run_id, steps=(0, self.start_step - 1)))
        else:
            from gfcr.models import model_hash

            self.policy_version = f"s0-{model_hash(self.model, 8)}"
        from gfcr.generate.sync import make_sync

        self.sync = make_sync(cfg.generate.sync, self.engine, folder=self.run_dir / "sync",
                              admin_token=os.environ.get("GFCR_SERVE_ADMIN_TOKEN"))
        self.sync.push(self.model, self.policy_version)  # the engine starts from the trainer's weights
        self.metrics_path = self.run_dir / "metrics.jsonl"
        if dist.is_main():
            truncate_metrics(self.metrics_path, self.start_step)
        self.tb = tensorboard_writer(self.run_dir) if cfg.tensorboard and dist.is_main() else None

    def _make_engine(self) -> Any:
        """The sampling engine of ``generate.engine`` (see :mod:`gfcr.generate.sync` for how weights reach it)."""
        from gfcr.generate.engines.hf import HFEngine

        g = self.cfg.generate
        kw = dict(g.engine_params)
        if g.engine == "hf" and g.sync == "in_place":
            if kw:
                raise TrainError(f"generate.engine_params {sorted(kw)}: the in-place hf engine takes none "
                                 "(set sync: copy for a separate sampling copy, e.g. engine_params: {dtype: bfloat16})")
            return HFEngine(self.model, tokenizer=self.tokenizer, device=self.device, max_batch=g.max_batch)
        if g.engine == "hf":
            return HFEngine(self.model_path, tokenizer=self.tokenizer, device=self.device, max_batch=g.max_batch,
                            policy_version="unsynced", **kw)
        if g.engine == "vllm":
            from gfcr.generate.engines.vllm import VLLMEngine

            return VLLMEngine(self.model_path, policy_version="unsynced", weight_sync=True, **kw)
        if g.engine == "ray":
            from gfcr.scale.engine import RayEngine

            return RayEngine(model=self.model_path, tokenizer=self.tokenizer, policy_version="unsynced", **kw)
        from gfcr.generate.engines.openai import OpenAIEngine

        key_env = kw.pop("api_key_env", None)
        if key_env is not None and key_env not in os.environ:
            raise TrainError(f"generate.engine_params.api_key_env: environment variable {key_env!r} is not set")
        return OpenAIEngine(tokenizer=self.tokenizer, policy_version="unsynced",
                            api_key=os.environ[key_env] if key_env else None, **kw)

    def _trained_rollouts(self, a: int, b: int) -> list[Rollout]:
        if b < a:
            return []
        rs = self.store.rollouts(run=self.run_id, steps=(a, b))
        return [r for r in rs if r.meta.get("trained")]

    # --- stages -------------------------------------------------------------------------------
    def group_sizes(self, prompt_ids: list[str]) -> dict[str, int]:
        """Samples per prompt: ``generate.k`` for every prompt, or with ``control.group: adaptive_k``
        :class:`~gfcr.control.groups.AdaptiveK`'s split of ``len(prompt_ids) × k`` by each prompt's
        Beta(1 + verified, 1 + failed) posterior over this run's earlier rollouts."""
        k = self.cfg.generate.k
        if self.cfg.control.group != "adaptive_k":
            return {p: k for p in prompt_ids}
        a = np.array([1.0 + self.outcomes.get(p, (0, 0))[0] for p in prompt_ids])
        b = np.array([1.0 + self.outcomes.get(p, (0, 0))[1] for p in prompt_ids])
        ks = self.group_control.allocate(a, b, len(prompt_ids) * k)
        return {p: int(n) for p, n in zip(prompt_ids, ks, strict=True)}

    def _count_outcomes(self, rollouts: list[Rollout]) -> None:
        """Add verified / failed rollouts to the per-prompt counts adaptive K allocates by."""
        for r in rollouts:
            ok, bad = self.outcomes.get(r.prompt_id, (0, 0))
            self.outcomes[r.prompt_id] = (ok + (r.verified is True), bad + (r.verified is False))

    def _generate_groups(self, prompt_ids: list[str], step: int, round_: int) -> list[list[Rollout]]:
        """The Generate room's topology (K per prompt from :meth:`group_sizes`: prompts sharing a K
        share an engine call); later dynamic-sampling rounds get their own seed and group ids."""
        from gfcr.generate.engines.base import SamplingParams
        from gfcr.generate.topologies import make_topology

        g = self.cfg.generate
        params = SamplingParams(temperature=g.temperature, top_p=g.top_p, max_tokens=g.max_tokens,
                                repeat_ngram=g.repeat_ngram, repeat_max=g.repeat_max)
        sizes = self.group_sizes(prompt_ids)
        mine = dist.shard(prompt_ids)  # data parallel: each rank samples its share, every rank gets all
        rs = []
        for k in sorted({sizes[p] for p in mine}):
            topo = make_topology(g.topology, k=k, params=params, seed=self.cfg.seed * 1000 + round_, **g.params)
            rs += topo.generate(self.engine, [self.prompt_by_id[p] for p in mine if sizes[p] == k], self.run_id, step)
        if len({sizes[p] for p in mine}) > 1 or dist.world() > 1:
            order = {p: i for i, p in enumerate(prompt_ids)}
            rs = sorted((r for part in dist.all_gather(rs) for r in part),
                        key=lambda r: (order[r.prompt_id], r.sample_index))
        groups: dict[str, list[Rollout]] = {}
        for r in rs:
            if round_:
                r.group_id = f"{r.group_id}#r{round_}"
            groups.setdefault(r.group_id, []).append(r)
        return list(groups.values())

    def _verify(self, groups: list[list[Rollout]]) -> None:
        """reward, verified, ``verifier`` evidence and the format signal of every rollout. A multi_turn
        episode is judged on its final assistant turn, and its reward comes from ``verify.reward_source``
        (:func:`gfcr.generate.envs.episode_reward`): ``r.verifier`` then also records ``reward_source``
        (configured), ``reward_from`` (what decided) and the env's ``env_reward`` / ``env_success``."""
        from gfcr.filters.apply import verdict_record
        from gfcr.generate.envs import episode_reward

        vc = self.cfg.verify
        bonus = vc.format_bonus
        multi_turn = self.cfg.generate.topology == "multi_turn"  # (TrainConfig refuses env rewards otherwise)
        for grp in groups:
            for r in grp:
                p = self.prompt_by_id[r.prompt_id]
                text = final_turn_text(r) if multi_turn else r.completion
                v = self.verifier.verify(text, answer=p.answer, tests=p.tests, rollout=r)
                f = self.format_verifier.verify(text)
                r.verified = v.passed
                r.verifier = verdict_record(self.verifier, v)
                r.signals["format"] = float(f.score)
                score = float(v.score)
                if multi_turn:
                    env_reward, env_success = r.signals.get("env_reward"), r.meta.get("env_success")
                    score, r.verified, used = episode_reward(vc.reward_source, float(v.score), v.passed,
                                                             env_reward, env_success, vc.env_weight)
                    r.verifier |= {"reward_source": vc.reward_source, "reward_from": used,
                                   "env_reward": env_reward, "env_success": env_success}
                    r.signals["verifier_score"] = float(v.score)
                r.reward = score + bonus * float(f.score)

    def _signals(self, groups: list[list[Rollout]]) -> None:
        """Overlong shaping, then ``signals["advantage"]``: the group advantage, or for a tree the mean of
        the leaf's TreeRL per-token advantages over its generated tokens (what replay and Diagnose read)."""
        from gfcr.filters.signals import ADVANTAGES, dapo_overlong_penalty

        s, g = self.cfg.signals, self.cfg.generate
        for grp in groups:
            if s.length_reward == "shorter_better":
                self._shorter_better(grp)
            if s.overlong_buffer:
                lengths = ([longest_generated_run(r.token_role) for r in grp] if g.topology == "multi_turn"
                           else [r.n_generated for r in grp])
                pens = dapo_overlong_penalty(lengths, g.max_tokens, s.overlong_buffer, s.overlong_penalty)
                for r, pen in zip(grp, pens, strict=True):
                    r.signals["overlong_penalty"] = float(pen)
                    r.reward += float(pen)
            if g.topology == "tree":
                for r, a in zip(grp, self._advantages(grp), strict=True):
                    gen = np.asarray(r.token_role) == GENERATED
                    r.signals["advantage"] = float(np.asarray(a)[gen].mean()) if gen.any() else 0.0
                continue
            adv = ADVANTAGES[s.advantage]([r.reward for r in grp])
            for r, a in zip(grp, adv, strict=True):
                r.signals["advantage"] = float(a)

    def _shorter_better(self, grp: list[Rollout]) -> None:
        """ShorterBetter (arXiv 2504.21370) on one group: the correctness part of each reward becomes
        ``alpha·1[verified] − beta·|length − SOL|`` (:func:`gfcr.control.groups.sol_rewards`); the
        format bonus stays on top. Lengths are generated tokens (all policy turns for multi_turn)."""
        from gfcr.control.groups import ShorterBetter

        sb = ShorterBetter(**self.cfg.signals.length_params)
        shaped = sb.rewards([r.verified is True for r in grp], [r.n_generated for r in grp])
        bonus = self.cfg.verify.format_bonus
        for r, v in zip(grp, shaped, strict=True):
            r.signals["length_reward"] = float(v)
            r.reward = float(v) + bonus * float(r.signals.get("format", 0.0))

    def _advantages(self, rollouts: list[Rollout]) -> list[Any]:
        """What the update trains fresh rollouts with: ``signals["advantage"]`` (group), or TreeRL's
        per-token advantages recomputed from the stored rewards of each whole tree (``tree``)."""
        if self.cfg.generate.topology != "tree":
            return [r.signals.get("advantage", 0.0) for r in rollouts]
        from gfcr.generate.topologies import tree_advantages_for

        tok = tree_advantages_for(rollouts)
        return [tok[r.rollout_id] for r in rollouts]

    def _entropy(self, groups: list[list[Rollout]]) -> None:
        """``signals["entropy"]``: mean token entropy of the generated tokens under the sampling policy.
        The hf engine reports it while sampling (free); for the rollouts of engines that do not
        (vllm, servers other than gfcr serve) one no-grad forward per micro-batch computes it (the policy has not been
        updated since it sampled them)."""
        rs = [r for g in groups for r in g if "entropy" not in r.signals]
        if not rs:
            return
        for r, e in zip(rs, self.trainer.rollout_entropy(rs), strict=True):
            if np.isfinite(e):
                r.signals["entropy"] = float(e)

    def _annotate_replay(self, step: int, replayed: list[Any], weights: np.ndarray) -> None:
        """Record the replay events of ``step`` on the replayed rows in the store (one ``store.update``)."""
        from gfcr.records import table_to_rollouts

        uses: dict[str, list[float | None]] = {}
        for s, w in zip(replayed, weights, strict=True):
            uses.setdefault(s.rollout.rollout_id, []).append(float(w))
        stored = table_to_rollouts(self.store.get(list(uses)))
        if len(stored) != len(uses):
            missing = sorted(set(uses) - {r.rollout_id for r in stored})
            raise TrainError(f"replayed rollout(s) {missing[:3]} are not in the run's store; the replay buffer and the store disagree")
        for r in stored:
            r.meta = with_replay_events(r.meta, step, uses[r.rollout_id])
        if dist.is_main():
            self.store.update(stored)
        by_id = {r.rollout_id: r.meta for r in stored}
        for s in replayed:  # keep the buffer's copies in step with the store
            s.rollout.meta = dict(by_id[s.rollout.rollout_id])

    def _collect(self, step: int, timer: StageTimer) -> tuple[list[list[Rollout]], list[list[Rollout]], dict[str, Any]]:
        """select → generate → verify → signals → group control. Returns (all groups, kept groups, info)."""
        cfg = self.cfg
        n = cfg.generate.prompts_per_step
        rounds = [0]
        generated: list[list[Rollout]] = []

        def one_round(n_prompts: int) -> list[list[Rollout]]:
            with timer("select"):
                pids = self.selector.select(min(n_prompts, len(self.train_prompts)), step_rng(cfg.seed, step, f"select{rounds[0]}"))
            with timer("generate"):
                groups = self._generate_groups(pids, step, rounds[0])
            with timer("verify"):
                self._verify(groups)
            with timer("signals"):
                self._signals(groups)
            if cfg.signals.entropy:
                with timer("entropy"):
                    self._entropy(groups)
            rounds[0] += 1
            generated.extend(groups)
            return groups

        info: dict[str, Any] = {}
        gc = self.group_control
        if gc is not None and cfg.control.group == "dynamic_sampling":
            res = gc.collect(one_round)
            kept = res.groups
            info = {"ds_rounds": res.n_gen_batches, "ds_reached_target": float(res.reached_target)}
        else:
            kept = one_round(n)
            if gc is not None and cfg.control.group == "gfpo":
                with timer("control"):
                    new_kept = []
                    for grp in kept:
                        idx, adv = gc.filter([r.reward for r in grp], [r.n_generated for r in grp])
                        for r, a in zip(grp, adv, strict=True):
                            r.signals["advantage"] = float(a)
                        new_kept.append([grp[i] for i in idx])
                    kept = new_kept
        return generated, kept, info

    def _reuse(self, step: int) -> tuple[list[list[Rollout]], list[list[Rollout]]]:
        """Rollouts a crashed attempt of ``step`` already appended: regroup them, keep the trained ones."""
        rs = sorted(self.store.rollouts(run=self.run_id, steps=(step, step)), key=lambda r: (r.group_id, r.sample_index))
        by: dict[str, list[Rollout]] = {}
        for r in rs:
            by.setdefault(r.group_id, []).append(r)
        groups = list(by.values())
        kept = [[r for r in g if r.meta.get("trained")] for g in groups]
        return groups, [g for g in kept if g]

    # --- loop ---------------------------------------------------------------------------------
    def run(self, stop_after: int | None = None) -> RunResult:
        cfg = self.cfg
        last: dict[str, Any] = {}
        ckpt = latest_checkpoint(self.run_dir)
        end = cfg.steps if stop_after is None else min(cfg.steps, self.start_step + stop_after)
        with progress_bar(self.progress, cfg.steps, self.start_step) as bar:
            for step in range(self.start_step, end):
                timer = StageTimer()
                t_step = time.perf_counter()
                stored = self.store.scan(run=self.run_id, steps=(step, step), columns=["rollout_id"]).num_rows
                reused = stored > 0
                if reused:
                    generated, kept = self._reuse(step)
                    info: dict[str, Any] = {"reused_rollouts": float(stored)}
                else:
                    generated, kept, info = self._collect(step, timer)
                if cfg.control.group == "adaptive_k" and generated:
                    sizes = [len(g) for g in generated]
                    info |= {"k_min": float(min(sizes)), "k_max": float(max(sizes)), "k_mean": float(np.mean(sizes))}
                train_rs = [r for g in kept for r in g]
                replayed = []
                with timer("replay"):
                    if self.buffer is not None and cfg.replay.per_step:
                        replayed = self.buffer.sample(cfg.replay.per_step, step, step_rng(cfg.seed, step, "replay"))
                if not reused:
                    with timer("append"):
                        trained_ids = {r.rollout_id for r in train_rs}
                        for g in generated:
                            for r in g:
                                r.meta["trained"] = r.rollout_id in trained_ids
                        if dist.is_main():
                            self.store.append([r for g in generated for r in g])
                with timer("update"):
                    batch = train_rs + [s.rollout for s in replayed]
                    advs = self._advantages(train_rs) + [s.rollout.signals.get("advantage", 0.0) for s in replayed]
                    ustats = self.trainer.update(batch, advs) if batch else {}
                if replayed:
                    with timer("annotate"):
                        iw = self.trainer.last_importance_weight[len(train_rs):]
                        self._annotate_replay(step, replayed, iw)
                        info["replay_lag_mean"] = float(np.mean([s.lag for s in replayed]))
                        if np.isfinite(iw).any():
                            info["replay_iw_mean"] = float(np.nanmean(iw))
                with timer("observe"):
                    for g in generated:
                        self.selector.observe(g[0].prompt_id, [r.reward for r in g], step)
                    if cfg.control.group == "adaptive_k":
                        self._count_outcomes([r for g in generated for r in g])
                    if dist.is_main():
                        self.selector.save(self.store)
                    if self.buffer is not None:
                        self.buffer.add(train_rs)
                with timer("checkpoint"):
                    from gfcr.models import model_hash

                    self.policy_version = f"s{step + 1}-{model_hash(self.model, 8)}"
                    is_last = step == cfg.steps - 1 or step == end - 1
                if (step + 1) % cfg.generate.sync_every == 0 or is_last:
                    with timer("sync"):
                        self.sync.push(self.model, self.policy_version)
                with timer("checkpoint"):
                    if ((step + 1) % cfg.checkpoint.every == 0 or is_last) and dist.is_main():
                        ckpt = save_checkpoint(self, step)
                last = step_metrics(step, generated, kept, replayed, ustats, timer.seconds, info)
                last["seconds/step"] = time.perf_counter() - t_step
                last["policy_version"] = self.policy_version
                if dist.is_main():
                    with open(self.metrics_path, "a") as fh:
                        fh.write(json.dumps(last, sort_keys=True) + "\n")
                if self.tb is not None:
                    for k, v in last.items():
                        if isinstance(v, int | float):
                            self.tb.add_scalar(k, v, step)
                if self.on_step is not None and dist.is_main():
                    self.on_step(step, last)
                bar(step, last)
        if self.tb is not None:
            self.tb.close()
        return RunResult(self.run_dir, self.run_dir / "store", self.metrics_path, ckpt, end, last_metrics=last)


# ---------------------------------------------------------------------------------------------
# Entry point
# ---------------------------------------------------------------------------------------------


def new_run_dir(cfg: TrainConfig) -> Path:
    """A fresh folder ``output_dir/run_name-YYYYmmdd-HHMMSS[-n]`` (never an existing one)."""
    base = Path(cfg.output_dir)
    base.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    d = base / f"{cfg.run_name}-{stamp}"
    i = 1
    while d.exists():
        d = base / f"{cfg.run_name}-{stamp}-{i}"
        i += 1
    d.mkdir()
    return d


_RESUMABLE_CHANGES = {"steps", "eval", "tensorboard", "output_dir", "run_name"}


def prepare_run(cfg: TrainConfig, resume: str | Path | None = None, run_dir: str | Path | None = None) -> tuple[Path, bool]:
    """Pick the run folder, check a resume is consistent, write the resolved config."""
    if resume is not None:
        d = Path(resume)
        if not (d / "config.yaml").exists():
            raise TrainError(f"--resume {d}: not a gfcr run folder (no config.yaml)")
        old = load_config(d / "config.yaml").model_dump(mode="json")
        new = cfg.model_dump(mode="json")
        changed = sorted(k for k in new if new[k] != old.get(k) and k not in _RESUMABLE_CHANGES)
        if changed:
            raise TrainError(
                f"--resume {d}: the config differs from the run's config.yaml in {changed}; "
                "only steps/eval/tensorboard may change on resume (start a new run otherwise)"
            )
        dump_config(cfg, d / "config.yaml")
        return d, True
    if run_dir is not None:
        d = Path(run_dir)
        if d.exists() and any(d.iterdir()):
            raise TrainError(f"run folder {d} exists and is not empty; gfcr never overwrites a run (use --resume)")
        d.mkdir(parents=True, exist_ok=True)
    else:
        d = new_run_dir(cfg)
    dump_config(cfg, d / "config.yaml")
    return d, False


def train(cfg: TrainConfig, resume: str | Path | None = None, run_dir: str | Path | None = None,
          progress: bool = True, stop_after: int | None = None,
          on_step: Callable[[int, dict[str, Any]], None] | None = None) -> RunResult:
    """Run (or resume) training. Evaluates before/after when ``cfg.eval`` asks; returns where things are."""
    _check_supported(cfg)
    if cfg.generate.engine == "openai":
        _check_server(cfg.generate.engine_params)
    dist.init_from_env(cfg.device)
    d, resuming = dist.broadcast(prepare_run(cfg, resume, run_dir) if dist.is_main() else None)
    t = Trainer(cfg, d, resuming, progress=progress, on_step=on_step)
    try:
        t.setup()
        return _train(t, d, progress, stop_after)
    finally:
        t.close()


def _train(t: Trainer, d: Path, progress: bool, stop_after: int | None) -> RunResult:
    cfg = t.cfg
    say = _say if progress else (lambda msg: None)
    before = None
    main = dist.is_main()  # data parallel: rank 0 evaluates while the others wait
    if main and cfg.eval.before and t.eval_prompts and not (d / "eval_before.json").exists():
        say(f"evaluating the initial policy on {len(t.eval_prompts)} held-out prompts ...")
        before = evaluate_policy(t)
        before.save(d / "eval_before.json")
        say(f"before: {before.summary()}")
    dist.barrier()
    res = t.run(stop_after=stop_after)
    res.eval_before = before
    if main and cfg.eval.after and t.eval_prompts and res.steps_done == cfg.steps:
        say(f"evaluating the trained policy on {len(t.eval_prompts)} held-out prompts ...")
        after = evaluate_policy(t)
        after.save(d / "eval_after.json")
        res.eval_after = after
        say(f"after: {after.summary()}")
    dist.barrier()
    return res


def _say(msg: str) -> None:
    from rich.console import Console

    Console(stderr=True).print(msg)


def _check_supported(cfg: TrainConfig) -> None:
    if cfg.generate.topology not in TOPOLOGIES:
        raise TrainError(
            f"generate.topology {cfg.generate.topology!r} is not wired into the training loop; use one of "
            f"{sorted(TOPOLOGIES)}"
        )
    if cfg.generate.topology == "multi_turn":
        _check_multi_turn(cfg.generate.params)
    if cfg.generate.topology == "tree" and cfg.control.group == "gfpo":
        raise TrainError(
            "control.group 'gfpo' keeps a subset of each group, which would cut a tree's leaves out from under "
            "its TreeRL advantages; use dynamic_sampling (it keeps or drops whole trees) or no group control"
        )
    needs = {"vllm": "pip install 'gfcr[vllm]' on a GPU machine (or use engine: hf)", "ray": "pip install 'gfcr[ray]'"}
    if cfg.generate.engine in needs:
        import importlib.util

        if importlib.util.find_spec(cfg.generate.engine) is None:
            raise TrainError(f"generate.engine {cfg.generate.engine!r} needs the {cfg.generate.engine} package: "
                             f"{needs[cfg.generate.engine]}")
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and cfg.generate.engine in ("openai", "ray"):
        raise TrainError(f"generate.engine {cfg.generate.engine!r} is one shared sampler; data-parallel runs "
                         "(WORLD_SIZE > 1) give each rank its own engine: use hf or vllm")
    if cfg.control.group not in (None, "dynamic_sampling", "gfpo", "adaptive_k"):
        raise TrainError(
            f"control.group {cfg.control.group!r} is not wired into the training loop; use dynamic_sampling, gfpo "
            "or adaptive_k"
        )
    if cfg.control.group == "adaptive_k" and cfg.generate.topology == "tree":
        raise TrainError("control.group 'adaptive_k' sets K per prompt; a tree's size is its shape (m, n, l, t), "
                         "not K: use it with the group or multi_turn topology")


def _check_server(params: dict[str, Any]) -> None:
    """Fail before anything is written when the openai engine's server does not answer."""
    import httpx

    url = str(params["base_url"]).rstrip("/") + "/models"
    try:
        resp = httpx.get(url, timeout=10.0)
    except httpx.TransportError as e:
        raise TrainError(f"generate.engine_params.base_url: no server answers at {url} ({type(e).__name__}); start "
                         "one with `gfcr serve --model MODEL --allow-weight-updates` first") from e
    if resp.status_code != 200:
        raise TrainError(f"generate.engine_params.base_url: GET {url} -> HTTP {resp.status_code}")


def _check_multi_turn(params: dict[str, Any]) -> None:
    from gfcr.generate.envs import ENVS

    extra = sorted(set(params) - set(MULTI_TURN_PARAMS))
    if extra:
        raise TrainError(
            f"generate.params {extra} are not multi_turn options; give only {list(MULTI_TURN_PARAMS)} "
            "(k, temperature and max_tokens are set in generate itself; max_tokens is per turn)"
        )
    env = params.get("env")
    if not isinstance(env, str) or not (env in ENVS or ":" in env):
        raise TrainError(
            f"generate.topology multi_turn needs generate.params.env: one of {sorted(ENVS)} or 'pkg.module:Class' "
            f"(got {env!r}), e.g. generate: {{topology: multi_turn, params: {{env: calculator, max_turns: 3}}}}"
        )
    mt = params.get("max_turns", 4)
    if not isinstance(mt, int) or isinstance(mt, bool) or mt < 1:
        raise TrainError(f"generate.params.max_turns must be an integer >= 1, got {mt!r}")


def evaluate_policy(t: Trainer) -> Any:
    """Evaluate the run's current policy on its held-out prompts with the run's verifier. A multi_turn
    run is evaluated on the same env episodes it trains on (same env, ``max_turns``, ``obs_role``,
    and ``verify.reward_source`` deciding what counts as solved): :func:`gfcr.evaluate.evaluate_episodes`."""
    from gfcr.evaluate import evaluate_episodes, evaluate_model

    e, g = t.cfg.eval, t.cfg.generate
    verifier = t.verifier

    def verify(p: Prompt, text: str) -> bool:
        return bool(verifier.verify(text, answer=p.answer, tests=p.tests).passed)

    verify.__name__ = t.cfg.verify.verifier
    max_tokens = e.max_tokens or g.max_tokens
    if g.topology == "multi_turn":
        return evaluate_episodes(
            t.engine, t.eval_prompts, env=g.params["env"], max_turns=g.params.get("max_turns", 4),
            obs_role=g.params.get("obs_role", "user"), k=e.k, verifier=verify,
            reward_source=t.cfg.verify.reward_source, env_weight=t.cfg.verify.env_weight, greedy=e.greedy,
            temperature=e.temperature, max_tokens=max_tokens, seed=t.cfg.seed,
        )
    return evaluate_model(
        t.engine, t.eval_prompts, k=e.k, verifier=verify, greedy=e.greedy, temperature=e.temperature,
        max_tokens=max_tokens, seed=t.cfg.seed, batch_size=g.max_batch,
    )
