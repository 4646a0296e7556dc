"""The RL training loop: one readable driver that composes the GFCR rooms through their protocols.

Each step ``s`` (0-based) runs these stages, each timed (``seconds/<stage>`` in the metrics); the
loop never branches on a method's name:

    collect   GroupPolicy.collect(sampler, n, K)                   (gfcr.control.policies)
                sampler.select: ReplayBuffer.reserve + PromptSelector.select (gfcr.control.selectors)
                sampler.generate: Topology over the engine → Verifier.verify →
                RewardComposition.apply (gfcr.generate, gfcr.filters) → with a distill section, the
                task's teacher scores every generated token (gfcr.train.distill, stage ``teacher``)
    replay    ReplayBuffer.mix(kept groups, s, rng, estimator) → TrainItems: the batch, with the
              advantages, loss weights and loss forms each method prescribes (gfcr.replay);
              estimator = the group advantage (+ per-token terms, gfcr.filters.advantages);
              rows past the staleness bound η are dropped (AReaL)
    append    store.append(every generated rollout; meta.kept / meta.trained)
    update    PolicyTrainer.update(batch)                           (gfcr.train.trainer)
    annotate  replayed rows get meta["replayed_at_step"] and their importance weight
    observe   selector.observe(prompt, accuracy); GroupPolicy.observe; buffer.add(kept rollouts)
    sync      weights to the engine (every generate.sync_every steps and at the last)
    checkpoint safetensors + optimizer + loop state, renamed into place

``policy_version`` is the cheap string ``s<updates>`` (no weight hash per step); the lag of a batch
row is the number of updates since the version that sampled it.

Resume (``resume=RUN_DIR``) loads the last checkpoint ``c``; the group policy, the buffer and
AdaptThink's reference accuracies are rebuilt from the store's rollouts of steps ``<= c``. A step
whose rollouts the store already holds (a crash between append and checkpoint) runs through the
same stages with a sampler that returns the stored rollouts instead of generating: the selector
selects (and adapts) exactly as it did, so the resumed run equals an uninterrupted one given the
seed (tested: same prompts, samples and weights). With partial rollouts the held pool travels with
the checkpoint, and a step replayed from the store restores the pool written just before its append
(gfcr.control.partial).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from gfcr.control.partial import PENDING_FILE, POOL_FILE, load_pool, save_pool
from gfcr.control.step import observe_step, scalar_advantage, stamp_advantages  # noqa: F401
from gfcr.records import Rollout
from gfcr.replay.buffers import assemble
from gfcr.train import dist
from gfcr.train.checkpoint import STATE_FILE, latest_checkpoint, save_checkpoint
from gfcr.train.config import TrainConfig
from gfcr.train.metrics import progress_bar, step_metrics, tensorboard_writer, truncate_metrics
from gfcr.train.run_setup import (  # noqa: F401  (re-exported: the loop's public helpers)
    TrainError,
    build_engine,
    check_server,
    check_supported,
    evaluate_policy,
    load_task_prompts,
    new_run_dir,
    prepare_run,
    reward_composition,
)
from gfcr.train.sampling import (  # noqa: F401  (re-exported)
    StageTimer,
    final_turn_text,
    step_rng,
    version_number,
    with_replay_events,
)

STAGES = ("select", "generate", "verify", "teacher", "entropy", "replay", "append", "update", "annotate", "observe", "sync",
          "checkpoint")


@dataclass
class RunResult:
    """Where a run's outputs are."""

    run_dir: Path
    store_path: Path | str  #: the run folder's store/, or the URI of ``store`` in the config
    metrics_path: Path
    checkpoint: Path | None
    steps_done: int
    eval_before: Any = None
    eval_after: Any = None
    last_metrics: dict[str, Any] = field(default_factory=dict)


class TrainingRun:
    """One training run: its components, and :meth:`run`, the loop. The policy update itself is
    :class:`gfcr.train.trainer.PolicyTrainer` (``self.update``). Use :func:`train` unless embedding."""

    def __init__(self, cfg: TrainConfig, run_dir: Path, resume: bool, progress: bool = True,
                 on_step: Callable[[int, dict[str, Any]], None] | None = None):
        self.cfg, self.run_dir, self.run_id, self.resume = cfg, run_dir, run_dir.name, resume
        self.store_at: Path | str = cfg.store or run_dir / "store"  # a local folder or an object-store URI
        self.progress = progress and dist.is_main()
        self.device = cfg.device
        self.on_step = on_step

    def close(self) -> None:
        """Release what the engine holds (an HTTP client, Ray actors); the run folder stays as it is."""
        close = getattr(getattr(self, "engine", None), "close", None)
        if callable(close):
            close()

    def setup(self) -> None:
        """Build every part of the run from the config: store, prompts, Control, signals, verifiers,
        model, trainer, engine, resumed state, weight sync, metrics.

        Long because: the parts are built in dependency order, each in one to three lines; splitting
        would pass most of them from one helper to the next.
        """
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from gfcr.control.policies import make_group_policy
        from gfcr.control.selectors import make_selector
        from gfcr.filters.advantages import TOKEN_TERMS, make_estimator, with_token_terms
        from gfcr.filters.verifiers import get_verifier
        from gfcr.generate.sync import make_sync
        from gfcr.models import resolve_model
        from gfcr.replay.buffers import make_buffer
        from gfcr.store import RolloutStore
        from gfcr.train.collect import StepCollector
        from gfcr.train.distill import build_teachers
        from gfcr.train.trainer import PolicyTrainer

        cfg = self.cfg
        check_supported(cfg)
        torch.manual_seed(cfg.seed)
        self.device = dist.init_from_env(cfg.device)
        if dist.is_main():  # rank 0 creates the store; the other ranks open it once it exists
            self.store = RolloutStore.open(self.store_at, create=True)
        dist.barrier()
        if not dist.is_main():
            self.store = RolloutStore.open(self.store_at)
        self.train_prompts = load_task_prompts(cfg, "train")
        self.eval_prompts = load_task_prompts(cfg, "test")
        if not self.train_prompts:
            raise TrainError("the configured tasks produced no training prompts")
        self.prompt_by_id = {p.prompt_id: p for p in self.train_prompts}
        if dist.is_main():
            self.store.upsert_prompts(self.train_prompts + self.eval_prompts)
        c = cfg.control
        self.selector = make_selector(c.selector.name, [p.prompt_id for p in self.train_prompts],
                                      [p.category for p in self.train_prompts], **c.selector.params)
        self.policy = make_group_policy(c.group.name if c.group else None, c.decide_on,
                                        **(c.group.params if c.group else {}))
        b = cfg.replay.buffer
        self.buffer = make_buffer(b.name, **b.params) if b else None
        if hasattr(self.buffer, "loss_agg"):
            self.buffer.loss_agg = cfg.loss.agg  # RePO's split averages rows or, under token-mean, tokens
        from gfcr.control.partial import PartialPool

        g = cfg.generate
        self.partial = PartialPool(g.partial_budget, g.max_tokens) if g.partial_budget else None
        self.staleness = None
        if c.staleness_eta is not None:
            from gfcr.control.groups import StalenessBound

            self.staleness = StalenessBound(eta=c.staleness_eta, mode="drop")
        terms = [(t.coef, TOKEN_TERMS[t.name](**t.params)) for t in cfg.signals.token_terms]
        d = cfg.distill  # on-policy distillation: the teacher term joins the (rl_coef-weighted) group advantage
        terms += [(d.coef, TOKEN_TERMS["teacher_kl"](discount=d.discount))] if d is not None else []
        a = cfg.signals.advantage  # resolved at config load (never None here)
        self.estimator = with_token_terms(make_estimator(a.name, **a.params), terms,  # type: ignore[union-attr]
                                          base_coef=d.rl_coef if d is not None else 1.0)
        self.reward = reward_composition(cfg)
        self.verifier = get_verifier(cfg.verify.verifier.name, **cfg.verify.verifier.params)
        self.format_verifier = get_verifier("format", pattern=cfg.verify.format_pattern)

        self.model_path = resolve_model(None if cfg.model in ("default", "") else cfg.model)
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.teachers = None if d is None else build_teachers(d, self.tokenizer, temperature=cfg.generate.temperature,
                                                               top_p=cfg.generate.top_p, device=self.device)
        ckpt = latest_checkpoint(self.run_dir) if self.resume else None
        weights = ckpt if ckpt is not None else self.model_path
        self.model = AutoModelForCausalLM.from_pretrained(str(weights), dtype=torch.float32).to(self.device)
        self.model.eval()
        ref = None
        if cfg.loss.kl_coef > 0:
            ref = AutoModelForCausalLM.from_pretrained(self.model_path, dtype=torch.float32).to(self.device)
            ref.eval().requires_grad_(False)
        self.update = PolicyTrainer(self.model, cfg.loss, cfg.optim, self.tokenizer.pad_token_id,
                                    temperature=cfg.generate.temperature, ref_model=ref)
        self.engine = build_engine(cfg, self.model, self.model_path, self.tokenizer, self.device)
        self.collector = StepCollector(cfg, self.run_id, self.engine, self.prompt_by_id, self.verifier,
                                       self.format_verifier, self.reward, self.teachers, self.partial,
                                       entropy=self.update.rollout_entropy, seeder=self._seeder())
        self.start_step, self.policy_version = 0, "s0"
        if ckpt is not None:
            state = json.loads((ckpt / STATE_FILE).read_text())
            self.start_step, self.policy_version = int(state["step"]) + 1, state["policy_version"]
            self.selector.load_state_dict(state["selector"])
            opt = ckpt / "optimizer.pt"
            if opt.exists():
                self.update.optimizer.load_state_dict(torch.load(opt, weights_only=True))
            self._rebuild(self.start_step - 1)
            if self.partial is not None and (ckpt / POOL_FILE).exists():  # the held partial rollouts
                self.partial.held = load_pool(ckpt / POOL_FILE)
        self.sync = make_sync(cfg.generate.sync, self.engine, folder=self.run_dir / "sync",
                              admin_token=os.environ.get("GFCR_SERVE_ADMIN_TOKEN"))
        self.sync.push(self.model, self.policy_version)  # the engine starts from the trainer's weights
        self.metrics_path = self.run_dir / "metrics.jsonl"
        if dist.is_main():
            truncate_metrics(self.metrics_path, self.start_step)
        self.tb = tensorboard_writer(self.run_dir) if cfg.tensorboard and dist.is_main() else None

    def _seeder(self) -> Any:
        """The run's :class:`gfcr.train.seeding.StepSeeder` (``retrieve:``), or None."""
        r = self.cfg.retrieve
        if r is None:
            return None
        from gfcr.store import RolloutStore
        from gfcr.train.seeding import StepSeeder

        own = r.store is None
        return StepSeeder(r, self.store if own else RolloutStore.open(r.store), self.run_id if own else None)

    def _rebuild(self, last: int) -> None:
        """Group-policy, buffer and AdaptThink state from the store's rollouts of steps ``0..last``."""
        rs = self.store.rollouts(run=self.run_id, steps=(0, last)) if last >= 0 else []
        self.reward.seed_ref_accuracy(rs)
        for s in range(last + 1):
            step_rs = sorted((r for r in rs if r.step == s), key=lambda r: (r.group_id, r.sample_index))
            by: dict[str, list[Rollout]] = {}
            for r in step_rs:
                by.setdefault(r.group_id, []).append(r)
            self.policy.observe(list(by.values()))
            if self.buffer is not None:
                self.buffer.add([r for r in step_rs if r.meta.get("kept", r.meta.get("trained"))])

    def _stored(self, step: int) -> dict[int, list[Rollout]] | None:
        """The rollouts a crashed attempt of ``step`` already appended, by round (None: none)."""
        rs = self.store.rollouts(run=self.run_id, steps=(step, step))
        if not rs:
            return None
        out: dict[int, list[Rollout]] = {}
        for r in rs:
            out.setdefault(int(r.meta.get("round", 0)), []).append(r)
        return out

    def _batch(self, kept: list[list[Rollout]], step: int) -> list[Any]:
        """The replay buffer's mix (or the plain groups), each row's lag, then the staleness bound."""
        items = assemble(self.buffer, kept, step, step_rng(self.cfg.seed, step, "replay"), self.estimator,
                         entropy=self.update.rollout_entropy)
        now = version_number(self.policy_version, step)
        for it in items:
            it.lag = now - version_number(it.rollout.policy_version, int(it.rollout.step))
        if self.staleness is not None:
            ok = self.staleness.accept([now - it.lag for it in items], now)
            items = [it for it, keep in zip(items, ok, strict=True) if keep]
        return items

    def _annotate(self, step: int, replayed: list[Any], weights: np.ndarray) -> None:
        """Record the replay events of ``step`` on the replayed rows in the store (one ``store.update``)."""
        from gfcr.records import table_to_rollouts

        uses: dict[str, list[float | None]] = {}
        for it, w in zip(replayed, weights, strict=True):
            uses.setdefault(it.rollout.rollout_id, []).append(float(w))
        stored = table_to_rollouts(self.store.get(list(uses)))
        if len(stored) != len(uses):
            missing = sorted(set(uses) - {r.rollout_id for r in stored})
            raise TrainError(f"replayed rollout(s) {missing[:3]} are not in the run's store; the replay buffer and the store disagree")
        for r in stored:
            r.meta = with_replay_events(r.meta, step, uses[r.rollout_id])
        if dist.is_main():
            self.store.update(stored)
        by_id = {r.rollout_id: r.meta for r in stored}
        for it in replayed:  # keep the buffer's copies in step with the store
            it.rollout.meta = dict(by_id[it.rollout.rollout_id])

    # --- the loop -------------------------------------------------------------------------------
    def step(self, step: int) -> dict[str, Any]:
        """One training step (the stages of the module docstring); returns its metrics row."""
        cfg, timer, t0 = self.cfg, StageTimer(), time.perf_counter()
        stored = self._stored(step)
        col_ = self.collector
        col_.begin(step, self.policy_version, timer, stored)
        col_.partial_rounds = {}
        if stored is not None and self.partial is not None:  # killed between append and checkpoint: the pool after it
            pend = self.run_dir / PENDING_FILE
            held, info = load_pool(pend, with_info=True) if pend.exists() else ([], {})
            if info.get("step") != step:
                raise TrainError(f"step {step}: the store holds its rollouts but {PENDING_FILE} is "
                                 f"{'missing' if not pend.exists() else 'of step ' + str(info.get('step'))}; "
                                 "the partial-rollout pool cannot be restored exactly (start a new run)")
            self.partial.held, col_.partial_rounds = held, info["rounds"]
        col = self.policy.collect(col_.sampler(self.selector, self.buffer), cfg.generate.prompts_per_step, cfg.generate.k)
        info = dict(col.info) | ({"reused_rollouts": float(sum(map(len, stored.values())))} if stored else {})
        if self.partial is not None:
            info |= {"partial_held_groups": float(len(self.partial.held)), "partial_held_tokens": float(self.partial.held_tokens())}
        with timer("replay"):
            items = self._batch(col.kept, step)
            fresh = [it for it in items if not it.replayed]
            replayed = [it for it in items if it.replayed]
            info["n_live"] = float(sum(bool(np.any(np.asarray(it.advantage) != 0)) for it in items))
        kept_ids = {r.rollout_id for g in col.kept for r in g}
        trained_ids = {it.rollout.rollout_id for it in fresh}
        if stored is None:
            with timer("append"):
                stamp_advantages(col.generated, fresh, self.estimator)
                for r in (r for g in col.generated for r in g):
                    r.meta["kept"], r.meta["trained"] = r.rollout_id in kept_ids, r.rollout_id in trained_ids
                if dist.is_main() and self.partial is not None:  # the pool after this step, before its rows land
                    save_pool(self.partial.held, self.run_dir / PENDING_FILE, {"step": step, "rounds": col_.partial_rounds})
                if dist.is_main():
                    self.store.append([r for g in col.generated for r in g])
        with timer("update"):
            ustats = self.update.update([it.rollout for it in items], [it.advantage for it in items],
                                        [it.weight for it in items], [it.shaping for it in items]) if items else {}
        if replayed:
            with timer("annotate"):
                iw = self.update.last_importance_weight[[i for i, it in enumerate(items) if it.replayed]]
                self._annotate(step, replayed, iw)
                info["replay_lag_mean"] = float(np.mean([it.lag for it in replayed]))
                if np.isfinite(iw).any():
                    info["replay_iw_mean"] = float(np.nanmean(iw))
        with timer("observe"):
            observe_step(self.selector, self.policy, self.buffer, col.generated, col.kept, step)
            if dist.is_main():
                self.selector.save(self.store)
        self.policy_version = f"s{version_number(self.policy_version, step) + 1}"
        is_last = step == cfg.steps - 1 or step == self._end - 1
        if (step + 1) % cfg.generate.sync_every == 0 or is_last:
            with timer("sync"):
                self.sync.push(self.model, self.policy_version)
        if ((step + 1) % cfg.checkpoint.every == 0 or is_last) and dist.is_main():
            with timer("checkpoint"):
                self.ckpt = save_checkpoint(self, step)
        row = step_metrics(step, col.generated, col.kept, replayed, ustats, timer.seconds, info)
        return row | {"seconds/step": time.perf_counter() - t0, "policy_version": self.policy_version}

    def run(self, stop_after: int | None = None) -> RunResult:
        cfg, last = self.cfg, {}
        self.ckpt = latest_checkpoint(self.run_dir)
        self._end = cfg.steps if stop_after is None else min(cfg.steps, self.start_step + stop_after)
        with progress_bar(self.progress, cfg.steps, self.start_step) as bar:
            for step in range(self.start_step, self._end):
                last = self.step(step)
                if dist.is_main():
                    with open(self.metrics_path, "a") as fh:
                        fh.write(json.dumps(last, sort_keys=True) + "\n")
                for k, v in last.items() if self.tb is not None else ():
                    if isinstance(v, int | float):
                        self.tb.add_scalar(k, v, step)
                if self.on_step is not None and dist.is_main():
                    self.on_step(step, last)
                bar(step, last)
        if self.tb is not None:
            self.tb.close()
        return RunResult(self.run_dir, self.store_at, self.metrics_path, self.ckpt, self._end, last_metrics=last)


def train(cfg: TrainConfig, resume: str | Path | None = None, run_dir: str | Path | None = None,
          progress: bool = True, stop_after: int | None = None,
          on_step: Callable[[int, dict[str, Any]], None] | None = None) -> RunResult:
    """Run (or resume) training. Evaluates before/after when ``cfg.eval`` asks; returns where things are."""
    check_supported(cfg)
    if "base_url" in cfg.generate.engine.params:
        check_server(cfg.generate.engine.params)  # a server must answer before anything is written
    dist.init_from_env(cfg.device)
    d, resuming = dist.broadcast(prepare_run(cfg, resume, run_dir) if dist.is_main() else None)
    t = TrainingRun(cfg, d, resuming, progress=progress, on_step=on_step)
    try:
        t.setup()
        say = _say if progress else (lambda msg: None)
        before, main = None, dist.is_main()  # data parallel: rank 0 evaluates while the others wait
        if main and cfg.eval.before and t.eval_prompts and not (d / "eval_before.json").exists():
            say(f"evaluating the initial policy on {len(t.eval_prompts)} held-out prompts ...")
            before = evaluate_policy(t, "before")
            before.save(d / "eval_before.json")
            say(f"before: {before.summary()}")
        dist.barrier()
        res = t.run(stop_after=stop_after)
        res.eval_before = before
        if main and cfg.eval.after and t.eval_prompts and res.steps_done == cfg.steps:
            say(f"evaluating the trained policy on {len(t.eval_prompts)} held-out prompts ...")
            res.eval_after = evaluate_policy(t, "after")
            res.eval_after.save(d / "eval_after.json")
            say(f"after: {res.eval_after.summary()}")
        dist.barrier()
        return res
    finally:
        t.close()


def _say(msg: str) -> None:
    from rich.console import Console

    Console(stderr=True).print(msg)
