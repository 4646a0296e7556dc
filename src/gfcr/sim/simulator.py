"""A model-free simulator that compares Control/Replay strategies at scale (``gfcr simulate``).

The world: N prompts in difficulty categories; each has a latent solve probability (initially
Beta-distributed per category) and a mean response length (log-normal; wrong answers run
longer; responses past ``len_max`` are truncated and count as wrong). A training step trains on
a batch of groups; a prompt trained with non-zero advantage moves up in logit space by
``lr · 4q(1−q)`` (q = the group's success share, so informative groups teach most), its category
gains ``transfer`` per effective group, and every prompt not trained this step drifts back toward
its initial logit by ``forget`` (forgetting, so that revisiting and replay can matter).

Strategies run on the same seed (same world, same initial state) until the same generated-token
budget is spent. Each step runs the named stages:

    select (the real :mod:`gfcr.control.selectors` class) -> generate (vectorised sampling)
    -> control -> observe -> update (learning rule)

Controls (``StrategyConfig.control``): ``none`` (train on every group); ``dynamic_sampling``
(DAPO, via :class:`~gfcr.control.groups.DynamicSampling`); ``ar3po`` (the ``ar3po`` group policy
of :mod:`gfcr.control.policies` over a simulator sampler, then the real
:class:`~gfcr.replay.buffers.AR3PO` buffer); ``adaptive_k`` (:class:`~gfcr.control.groups.AdaptiveK`
splits the batch's B·G responses by each prompt's Beta posterior); ``repo`` and ``exgrpo`` (the
real :class:`~gfcr.replay.buffers.RePO` / :class:`~gfcr.replay.buffers.ExGRPO` buffers). The replay
controls build minimal rollout records and assemble the batch with the same calls as
``gfcr train`` (:meth:`_Run.assemble`: ``ReplayBuffer.reserve`` before generation,
``ReplayBuffer.mix`` with the loop's estimator and the ``(seed, step, "replay")`` generator after it,
``add`` after the step), so a simulated batch is the loop's batch for the same groups. Replay in
this world: a batch group (by its normalisation group) with a non-zero advantage learns like a
fresh group, times ``replay_decay ** lag`` when it holds replayed responses.
The world has no notion of an off-policy ratio; ``replay_decay`` (default 1: no discount) is an
assumption, not a measurement. GFPO is not a strategy here: response lengths in this world do
not respond to training, so its one benefit (shorter responses) cannot appear.

Reported per strategy: generated tokens per effective sample (a generated response in a
non-zero-advantage group that entered a training batch; replayed responses are reported apart
as ``replayed_samples`` and cost no generation), zero-variance share of generated groups, the learning curve (mean solve probability over all prompts against generated tokens),
and a wall-time proxy (per generation round the longest response, since a synchronous batch waits
for its longest member, plus ``train_cost`` per trained token).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import Field, field_validator, model_validator

from gfcr.config import ConfigError, StrictModel, check_component
from gfcr.control.groups import AdaptiveK, DynamicSampling
from gfcr.control.selectors import SELECTORS, greso_batch_size, make_selector
from gfcr.records import Cost, Rollout
from gfcr.replay.buffers import BUFFERS, TrainItem, make_buffer, stage_rng

CONTROLS = ("none", "dynamic_sampling", "ar3po", "adaptive_k", "repo", "exgrpo")


class StrategyConfig(StrictModel):
    """One strategy: a prompt selector plus an optional group control."""

    name: str = Field(description="label in the report (e.g. 'dapo', 'greso')")
    selector: str = Field("uniform", description=f"prompt selector, one of {sorted(SELECTORS)}")
    selector_params: dict[str, Any] = Field(default_factory=dict, description="keyword arguments of the selector")
    control: str = Field("none", description=f"group control / replay, one of {CONTROLS}")
    gen_factor: float = Field(3.0, gt=0, description="dynamic sampling: generation batch = gen_factor x train batch")
    adaptive_gen: bool = Field(False, description="dynamic sampling: GRESO's adaptive generation batch size")
    max_num_gen_batches: int = Field(10, ge=1, description="dynamic sampling: generation rounds per step at most")
    stages: int = Field(2, ge=1, description="ar3po: sampling stages")
    per_stage: int = Field(4, ge=1, description="ar3po: responses per prompt per stage")
    k_min: int = Field(2, ge=2, description="adaptive_k: fewest responses per prompt (2: a group needs two to differ)")
    k_max: int = Field(16, ge=2, description="adaptive_k: most responses per prompt")
    buffer_params: dict[str, Any] = Field(default_factory=dict,
                                          description="repo / exgrpo: keyword arguments of the replay buffer class")

    @field_validator("selector")
    @classmethod
    def _known_selector(cls, v: str) -> str:
        if v.lower() not in SELECTORS:
            raise ValueError(f"unknown selector {v!r}; choose one of {sorted(SELECTORS)}")
        return v.lower()

    @field_validator("control")
    @classmethod
    def _known_control(cls, v: str) -> str:
        if v not in CONTROLS:
            raise ValueError(f"unknown control {v!r}; choose one of {CONTROLS}")
        return v

    @model_validator(mode="after")
    def _k_range(self) -> StrategyConfig:
        if self.k_max < self.k_min:
            raise ValueError(f"k_max ({self.k_max}) must be >= k_min ({self.k_min})")
        return self

    @model_validator(mode="after")
    def _params(self) -> StrategyConfig:
        self.selector_params = check_component("strategies[].selector_params", "selector", self.selector, SELECTORS,
                                               self.selector_params, skip=("prompt_ids", "categories"))
        if self.buffer_params and self.control not in BUFFERS:
            raise ConfigError(f"strategies[].buffer_params: control {self.control!r} has no replay buffer "
                              f"(buffer_params go with {sorted(set(CONTROLS) & set(BUFFERS))})")
        self.buffer_params = check_component("strategies[].buffer_params", "buffer", self.control, BUFFERS,
                                             self.buffer_params)
        return self


def default_strategies() -> list[StrategyConfig]:
    return [
        StrategyConfig(name="uniform"),
        StrategyConfig(name="dapo", control="dynamic_sampling"),
        StrategyConfig(name="greso", selector="greso", control="dynamic_sampling", adaptive_gen=True),
        StrategyConfig(name="vade", selector="vade"),
        StrategyConfig(name="vcrl", selector="vcrl"),
        StrategyConfig(name="sec", selector="sec"),
        StrategyConfig(name="ar3po", control="ar3po"),
        StrategyConfig(name="adaptive_k", control="adaptive_k"),
        StrategyConfig(name="repo", control="repo"),
        StrategyConfig(name="exgrpo", control="exgrpo"),
    ]


class SimConfig(StrictModel):
    """The simulated world, the budget and the strategies to compare."""

    n_prompts: int = Field(2000, ge=10, description="number of prompts in the pool")
    category_beta: list[tuple[float, float]] = Field(
        default_factory=lambda: [(6.0, 1.0), (3.0, 2.0), (1.5, 3.0), (0.6, 4.0), (0.3, 8.0)],
        description="per category (easy -> hard), Beta(a, b) of the initial solve probability",
    )
    group_size: int = Field(8, ge=2, description="responses per prompt (G)")
    train_prompts: int = Field(64, ge=1, description="groups in one training batch")
    budget_tokens: float = Field(2e7, gt=0, description="generated-token budget per strategy")
    max_steps: int = Field(100000, ge=1, description="hard cap on training steps per strategy")
    len_mean: float = Field(300.0, gt=0, description="mean response length of the easiest category (tokens)")
    len_growth: float = Field(1.3, gt=0, description="mean length multiplier per harder category")
    len_sigma: float = Field(0.4, ge=0, description="log-normal sigma of response lengths")
    wrong_len_factor: float = Field(1.5, gt=0, description="wrong answers are this much longer on average")
    len_max: int = Field(2048, ge=1, description="truncation length; truncated responses count as wrong")
    lr: float = Field(0.6, ge=0, description="logit step of a prompt per effective group, times 4q(1-q)")
    transfer: float = Field(0.05, ge=0, description="logit step of a category per effective group share of the batch")
    forget: float = Field(0.002, ge=0, le=1, description="per-step drift of untrained prompts toward their initial logit")
    train_cost: float = Field(0.0005, ge=0, description="wall-time proxy units per trained token")
    replay_decay: float = Field(1.0, ge=0, le=1, description=(
        "a group made effective by replayed responses learns replay_decay ** lag (steps) as much as a fresh "
        "group; 1 = stale samples teach as much as fresh ones (an assumption: the world has no off-policy ratio)"))
    seed: int = Field(0, description="seed of the world and of every strategy's sampling")
    strategies: list[StrategyConfig] = Field(default_factory=default_strategies, description="strategies to compare")

    @field_validator("strategies")
    @classmethod
    def _unique(cls, v: list[StrategyConfig]) -> list[StrategyConfig]:
        names = [s.name for s in v]
        if len(set(names)) != len(names):
            raise ValueError(f"strategy names must be unique, got {names}")
        if not v:
            raise ValueError("give at least one strategy")
        return v


def load_config(path: str | Path) -> SimConfig:
    """Read a YAML config; unknown keys and bad values fail with the field named."""
    from gfcr.config import load_config_model

    return load_config_model(SimConfig, path)


# ---------------------------------------------------------------------------------------------
# The world
# ---------------------------------------------------------------------------------------------


def _logit(p: np.ndarray) -> np.ndarray:
    p = np.clip(p, 1e-4, 1 - 1e-4)
    return np.log(p / (1 - p))


class World:
    """Latent state of the simulated prompts. Shapes: every array is (N,)."""

    def __init__(self, cfg: SimConfig):
        rng = np.random.default_rng(cfg.seed)
        n, c = cfg.n_prompts, len(cfg.category_beta)
        self.cfg = cfg
        self.category = rng.integers(0, c, size=n)
        a = np.array([ab[0] for ab in cfg.category_beta])[self.category]
        b = np.array([ab[1] for ab in cfg.category_beta])[self.category]
        self.logit0 = _logit(rng.beta(a, b))
        self.logit = self.logit0.copy()
        self.mean_len = cfg.len_mean * cfg.len_growth ** self.category * rng.lognormal(0.0, 0.2, size=n)
        self.prompt_ids = [f"p{i:06d}" for i in range(n)]
        self.cat_names = [f"c{k}" for k in self.category]

    @property
    def p(self) -> np.ndarray:
        return 1.0 / (1.0 + np.exp(-self.logit))

    def generate(self, idx: np.ndarray, g: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """Rewards (n, g) in {0, 1} and lengths (n, g) int for prompts ``idx`` (n,)."""
        cfg = self.cfg
        correct = rng.random((idx.size, g)) < self.p[idx, None]
        mu = np.log(self.mean_len[idx, None]) + np.where(correct, 0.0, np.log(cfg.wrong_len_factor))
        lengths = np.ceil(rng.lognormal(mu, cfg.len_sigma)).astype(np.int64)
        truncated = lengths > cfg.len_max
        lengths = np.minimum(lengths, cfg.len_max)
        return (correct & ~truncated).astype(np.float64), lengths

    def update(self, trained_idx: np.ndarray, q: np.ndarray, weight: np.ndarray | None = None) -> None:
        """Learning rule for effective groups ``trained_idx`` (m,) with success shares q (m,) and
        learning weights (m,) (default 1): each group adds ``lr · w · 4q(1−q)`` to its prompt's
        logit (a prompt may appear twice: fresh + replayed group) and ``w`` to its category's share."""
        cfg = self.cfg
        w = np.ones(trained_idx.size) if weight is None else np.asarray(weight, dtype=np.float64)
        untrained = np.ones(self.logit.size, dtype=bool)
        untrained[trained_idx] = False
        self.logit[untrained] += cfg.forget * (self.logit0[untrained] - self.logit[untrained])
        np.add.at(self.logit, trained_idx, cfg.lr * w * 4.0 * q * (1.0 - q))
        if cfg.transfer and trained_idx.size:
            share = np.bincount(self.category[trained_idx], weights=w, minlength=len(cfg.category_beta)) / cfg.train_prompts
            self.logit += cfg.transfer * share[self.category]


# ---------------------------------------------------------------------------------------------
# One strategy
# ---------------------------------------------------------------------------------------------

_EMPTY_IDS = np.zeros(0, dtype=np.int32)
_EMPTY_ROLE = np.zeros(0, dtype=np.int8)
_EMPTY_LP = np.zeros(0, dtype=np.float32)
_T0 = datetime(2025, 1, 1, tzinfo=UTC)


@dataclass
class _Trained:
    """What one training step trains on: effective groups and their learning weights."""

    idx: np.ndarray  # (m,) prompt indices of the effective groups
    q: np.ndarray  # (m,) success share of each group
    weight: np.ndarray  # (m,) learning-step multiplier (1 fresh; replay_decay ** lag with replay)
    train_tokens: int  # tokens that go through the trainer (wall-time proxy)
    gen_effective: int  # generated responses in effective groups
    replayed: int = 0  # replayed responses in effective groups (or groups made effective by them)


class _Run:
    """The state of one strategy's run; each ``step_*`` method is one training step of a control."""

    def __init__(self, cfg: SimConfig, strat: StrategyConfig):
        self.cfg, self.strat = cfg, strat
        self.world = World(cfg)
        self.rng = np.random.default_rng(cfg.seed + 1)
        self.g = cfg.group_size
        self.sel = make_selector(strat.selector, self.world.prompt_ids, self.world.cat_names, **strat.selector_params)
        self.index = {p: i for i, p in enumerate(self.world.prompt_ids)}
        self.tokens = self.n_responses = 0
        self.n_groups = self.n_zero = self.n_effective = self.n_replayed = 0
        self.wall = 0.0
        self.step = 0
        self.zero_var_recent = 0.5
        self.succ = np.zeros(cfg.n_prompts)  # AdaptiveK: Beta posterior counts
        self.fail = np.zeros(cfg.n_prompts)
        self.buffer: Any = None
        if strat.control in ("repo", "exgrpo", "ar3po"):
            params = dict(strat.buffer_params)
            if strat.control == "exgrpo":
                params.setdefault("group_size", cfg.group_size)
            try:
                self.buffer = make_buffer(strat.control, **params)
            except TypeError as e:
                raise ValueError(f"strategy {strat.name!r}: bad buffer_params for {strat.control}: {e}") from e

    # --- shared stages ---------------------------------------------------------------------
    def select(self, n: int) -> np.ndarray:
        return np.array([self.index[p] for p in self.sel.select(n, self.rng)], dtype=np.int64)

    def gen(self, idx: np.ndarray, k: int, used: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """One generation round: rewards, lengths (n, k). ``used`` (n, k) bool marks the responses
        actually requested (per-prompt K below k); only those are counted."""
        rw, ln = self.world.generate(idx, k, self.rng)
        counted = ln if used is None else ln[used]
        self.tokens += int(counted.sum())
        self.n_responses += int(counted.size)
        self.wall += float(counted.max()) if counted.size else 0.0
        return rw, ln

    def observe(self, idx: np.ndarray, rw: Sequence[np.ndarray]) -> None:
        for i, r in zip(idx.tolist(), rw, strict=True):
            self.sel.observe(self.world.prompt_ids[i], r, self.step)

    def count_groups(self, zero_var: np.ndarray) -> None:
        self.n_groups += zero_var.size
        self.n_zero += int(zero_var.sum())

    def decay(self, lag: np.ndarray | float) -> np.ndarray:
        return np.asarray(self.cfg.replay_decay, dtype=np.float64) ** np.asarray(lag, dtype=np.float64)

    def rollouts(self, idx: np.ndarray, rw: np.ndarray, ln: np.ndarray, tag: str) -> list[Rollout]:
        """Minimal records of generated responses for the real replay buffers (no tokens: the
        buffers need prompt, group, step, reward, verdict; the length rides in ``cost``)."""
        out = []
        for a, i in enumerate(idx.tolist()):
            gid = f"{self.step:06d}-{tag}{a:05d}"
            for j in range(rw.shape[1]):
                ok = bool(rw[a, j] >= 1.0)
                out.append(Rollout(run_id="sim", prompt_id=self.world.prompt_ids[i], token_ids=_EMPTY_IDS,
                                   token_role=_EMPTY_ROLE, logprobs=_EMPTY_LP, step=self.step, group_id=gid,
                                   sample_index=j, reward=float(rw[a, j]), verified=ok,
                                   cost=Cost(gen_tokens=int(ln[a, j])), created_at=_T0, rollout_id=f"{gid}-{j:03d}"))
        return out

    # --- controls --------------------------------------------------------------------------
    def step_none(self) -> _Trained:
        return self.fresh_step()[0]

    def fresh_step(self) -> tuple[_Trained, np.ndarray, np.ndarray, np.ndarray]:
        """Select B prompts, generate G each, train on the groups with variance. Also returns the
        prompts, rewards and lengths (for the replay controls)."""
        idx = self.select(self.cfg.train_prompts)
        rw, ln = self.gen(idx, self.g)
        self.observe(idx, rw)
        zv = rw.std(axis=1) == 0
        self.count_groups(zv)
        fresh = _Trained(idx[~zv], rw.mean(axis=1)[~zv], np.ones(int((~zv).sum())), int(ln.sum()), int((~zv).sum()) * self.g)
        return fresh, idx, rw, ln

    def step_dynamic_sampling(self) -> _Trained:
        cfg, strat, g = self.cfg, self.strat, self.g
        ds = DynamicSampling(cfg.train_prompts, int(round(strat.gen_factor * cfg.train_prompts)), strat.max_num_gen_batches)
        kept_so_far = 0
        drawn = np.zeros(len(self.world.prompt_ids), dtype=bool)  # a refill never redraws (DAPO's epoch order)

        def generate(n: int) -> list:
            nonlocal kept_so_far
            if strat.adaptive_gen:
                remaining = (cfg.train_prompts - kept_so_far) * g
                n = greso_batch_size(remaining, self.zero_var_recent, g, ds.gen_prompts, min_bs=max(1, cfg.train_prompts // 4))
            idx = self.select(min(drawn.size, n + int(drawn.sum())))
            idx = idx[~drawn[idx]][:n]
            drawn[idx] = True
            rw, ln = self.gen(idx, g)
            self.observe(idx, rw)
            zv = rw.std(axis=1) == 0
            self.count_groups(zv)
            self.zero_var_recent = float(zv.mean()) if idx.size else self.zero_var_recent
            kept_so_far += int((~zv).sum())
            return [(i, r, x) for i, r, x in zip(idx.tolist(), rw, ln, strict=True)]

        batch = ds.collect(generate, rewards_of=lambda grp: grp[1]).groups
        return _Trained(np.array([b[0] for b in batch], dtype=np.int64), np.array([b[1].mean() for b in batch]),
                        np.ones(len(batch)), int(sum(b[2].sum() for b in batch)), len(batch) * g)

    def assemble(self, groups: list[list[Rollout]]) -> list[TrainItem]:
        """The loop's batch assembly: ``buffer.mix`` with the run's estimator (GRPO; Dr.GRPO for ExGRPO, as
        ``replay.buffer: exgrpo`` defaults to) and the step's replay generator."""
        from gfcr.filters.advantages import make_estimator

        est = make_estimator("dr_grpo" if self.strat.control == "exgrpo" else "grpo")
        return self.buffer.mix(groups, self.step, stage_rng(self.cfg.seed, self.step, "replay"), est)

    def trained(self, items: list[TrainItem], train_tokens: int) -> _Trained:
        """Effective batch groups (a non-zero advantage) → the world's learning step."""
        by: dict[str, list[TrainItem]] = {}
        for it in items:
            by.setdefault(it.group, []).append(it)
        idx, q, w, n_gen, n_rep = [], [], [], 0, 0
        for its in by.values():
            if not any(np.any(np.asarray(it.advantage) != 0) for it in its):
                continue
            rep = [it for it in its if it.replayed]
            idx.append(self.index[its[0].rollout.prompt_id])
            q.append(float(np.mean([it.rollout.reward for it in its])))
            w.append(float(self.decay(np.mean([it.lag for it in rep]))) if rep else 1.0)
            n_gen += len(its) - len(rep)
            n_rep += len(rep)
        return _Trained(np.array(idx, dtype=np.int64), np.array(q), np.array(w), train_tokens, n_gen, n_rep)

    def step_ar3po(self) -> _Trained:
        """AR3PO through the loop's protocols: the ``ar3po`` group policy (staged sampling, a prompt
        stops at its first correct response) drives a :class:`_SimSampler`, then the AR3PO buffer's
        mix gives an all-wrong group a cached correct response."""
        from gfcr.control.policies import make_group_policy

        policy = make_group_policy("ar3po", stages=self.strat.stages, per_stage=self.strat.per_stage)
        col = policy.collect(_SimSampler(self), self.cfg.train_prompts, self.strat.per_stage)
        for g in col.generated:
            self.observe(np.array([self.index[g[0].prompt_id]]), np.array([[x.reward for x in g]]))
        self.count_groups(np.array([np.std([x.reward for x in g]) == 0 for g in col.generated]))
        tr = self.trained(self.assemble(col.kept), sum(x.cost.gen_tokens for g in col.generated for x in g))
        self.buffer.add([x for g in col.kept for x in g])
        return tr

    def step_repo(self) -> _Trained:
        """Fresh groups; each batch prompt with a warm cache also replays ``num_replays`` cached
        responses as a second, separately normalised group (the RePO buffer's mix)."""
        idx = self.select(self.cfg.train_prompts)
        rw, ln = self.gen(idx, self.g)
        self.observe(idx, rw)
        self.count_groups(rw.std(axis=1) == 0)
        groups = self.rollouts_grouped(idx, rw, ln, "g")
        items = self.assemble(groups)
        replay_tokens = sum(it.rollout.cost.gen_tokens for it in items if it.replayed)
        tr = self.trained(items, int(ln.sum()) + replay_tokens)
        self.buffer.add([x for g in groups for x in g])
        return tr

    def step_exgrpo(self) -> _Trained:
        """``reserve`` picks ρ·B experience questions (once mixed-policy mode is on): K−1 fresh responses
        each, completed by the buffer's mix with the stored correct one; the rest are fresh questions."""
        cfg, g, buf = self.cfg, self.g, self.buffer
        reserved = buf.reserve(cfg.train_prompts, self.step, stage_rng(cfg.seed, self.step, "reserve"))
        e_idx = np.array([self.index[q] for q in reserved], dtype=np.int64)
        f_idx = self.select(cfg.train_prompts - e_idx.size)
        idx = np.concatenate([e_idx, f_idx])
        used = np.ones((idx.size, g), dtype=bool)
        used[: e_idx.size, g - 1] = False  # experience questions: K-1 fresh responses
        rw, ln = self.gen(idx, g, used)
        ne = e_idx.size
        groups = self.rollouts_grouped(e_idx, rw[:ne, : g - 1], ln[:ne, : g - 1], "e")
        groups += self.rollouts_grouped(f_idx, rw[ne:], ln[ne:], "f")
        self.observe(e_idx, rw[:ne, : g - 1])
        self.observe(f_idx, rw[ne:])
        self.count_groups(np.array([np.std([x.reward for x in grp]) == 0 for grp in groups]))
        items = self.assemble(groups)
        replay_tokens = sum(it.rollout.cost.gen_tokens for it in items if it.replayed)
        tr = self.trained(items, int(ln[used].sum()) + replay_tokens)
        buf.add([x for grp in groups for x in grp])
        return tr

    def rollouts_grouped(self, idx: np.ndarray, rw: np.ndarray, ln: np.ndarray, tag: str) -> list[list[Rollout]]:
        """:meth:`rollouts`, one list per prompt row."""
        flat = self.rollouts(idx, rw, ln, tag)
        k = rw.shape[1] if rw.ndim == 2 else 0
        return [flat[a * k:(a + 1) * k] for a in range(idx.size)]

    def step_adaptive_k(self) -> _Trained:
        """K_i ∝ E[p(1−p)] under each prompt's Beta(1 + successes, 1 + failures), the batch's
        B·G responses split over its prompts (:class:`~gfcr.control.groups.AdaptiveK`)."""
        cfg, strat = self.cfg, self.strat
        idx = self.select(cfg.train_prompts)
        k = AdaptiveK(strat.k_min, strat.k_max).allocate(1.0 + self.succ[idx], 1.0 + self.fail[idx], idx.size * self.g)
        kmax = int(k.max())
        used = np.arange(kmax)[None, :] < k[:, None]
        rw, ln = self.gen(idx, kmax, used)
        groups = [rw[a, : k[a]] for a in range(idx.size)]
        self.observe(idx, groups)
        n_ok = np.array([r.sum() for r in groups])
        self.succ[idx] += n_ok
        self.fail[idx] += k - n_ok
        zv = np.array([r.std() == 0 for r in groups])
        self.count_groups(zv)
        q = n_ok / k
        return _Trained(idx[~zv], q[~zv], np.ones(int((~zv).sum())), int(ln[used].sum()), int(k[~zv].sum()))


class _SimSampler:
    """The :class:`~gfcr.control.policies.Sampler` a group policy drives in the simulator: the run's
    selector, and one generation round of the world as minimal rollout records."""

    def __init__(self, run: _Run):
        self.run, self.rounds = run, 0

    def select(self, n: int) -> list[str]:
        return [self.run.world.prompt_ids[i] for i in self.run.select(n).tolist()]

    def generate(self, prompt_ids: Sequence[str], sizes: Any) -> list[list[Rollout]]:
        run, out = self.run, []
        for k in sorted({sizes[p] for p in prompt_ids}):
            ids = [p for p in prompt_ids if sizes[p] == k]
            idx = np.array([run.index[p] for p in ids], dtype=np.int64)
            rw, ln = run.gen(idx, k)
            out += run.rollouts_grouped(idx, rw, ln, f"r{self.rounds}k{k}-")
        self.rounds += 1
        return out


def run_strategy(cfg: SimConfig, strat: StrategyConfig) -> dict[str, Any]:
    """Run one strategy on a fresh copy of the world until the token budget is spent."""
    t0 = time.perf_counter()
    run = _Run(cfg, strat)
    step_fn = {"none": run.step_none, "dynamic_sampling": run.step_dynamic_sampling, "ar3po": run.step_ar3po,
               "repo": run.step_repo, "exgrpo": run.step_exgrpo, "adaptive_k": run.step_adaptive_k}[strat.control]
    world = run.world
    curve: list[tuple[float, float]] = [(0.0, float(world.p.mean()))]
    while run.tokens < cfg.budget_tokens and run.step < cfg.max_steps:
        tr = step_fn()
        run.n_effective += tr.gen_effective
        run.n_replayed += tr.replayed
        run.wall += cfg.train_cost * tr.train_tokens
        world.update(tr.idx, tr.q, tr.weight)
        run.sel.end_step()
        run.step += 1
        curve.append((float(run.tokens), float(world.p.mean())))

    n_eff, n_groups = run.n_effective, run.n_groups
    return {
        "name": strat.name,
        "strategy": strat.model_dump(),
        "steps": run.step,
        "generated_tokens": run.tokens,
        "generated_groups": n_groups,
        "generated_responses": run.n_responses,
        "effective_samples": n_eff,
        "replayed_samples": run.n_replayed,
        "tokens_per_effective_sample": run.tokens / n_eff if n_eff else float("inf"),
        "zero_variance_share": run.n_zero / n_groups if n_groups else 0.0,
        "initial_solve_rate": curve[0][1],
        "final_solve_rate": curve[-1][1],
        "solve_rate_at_budget": solve_rate_at(curve, cfg.budget_tokens),
        "wall_time_proxy": run.wall,
        "sim_seconds": time.perf_counter() - t0,
        "curve": curve,
    }


def solve_rate_at(curve: list[tuple[float, float]], tokens: float) -> float:
    """Solve rate of a learning curve at a token count (linear interpolation; clamped at the
    ends). Example: curve [(0, .2), (10, .4)] at 5 -> 0.3."""
    x = np.array([c[0] for c in curve])
    y = np.array([c[1] for c in curve])
    return float(np.interp(tokens, x, y))


# ---------------------------------------------------------------------------------------------
# Driver
# ---------------------------------------------------------------------------------------------


def simulate(cfg: SimConfig, out_dir: str | Path | None = None, plot: bool = True) -> dict[str, Any]:
    """Run every strategy of ``cfg``; when ``out_dir`` is given write ``results.json``,
    ``config.json`` (the resolved config) and ``learning_curves.png`` there (a new folder: an
    existing non-empty one is refused)."""
    results = [run_strategy(cfg, s) for s in cfg.strategies]
    report = {"config": cfg.model_dump(), "results": results, "ratios": ratios(results)}
    if out_dir is not None:
        out = Path(out_dir)
        if out.exists() and any(out.iterdir()):
            raise FileExistsError(f"{out} exists and is not empty; simulate writes a new folder (choose another)")
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.json").write_text(json.dumps(cfg.model_dump(), indent=2))
        (out / "results.json").write_text(json.dumps(report, indent=2, default=float))
        if plot:
            plot_curves(results, out / "learning_curves.png")
    return report


def ratios(results: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Tokens per effective sample of each strategy relative to 'uniform' and 'dapo' (when run)."""
    by = {r["name"]: r for r in results}
    out: dict[str, dict[str, float]] = {}
    for r in results:
        row = {}
        for base in ("uniform", "dapo"):
            if base in by and by[base]["tokens_per_effective_sample"] > 0:
                row[f"tpe_vs_{base}"] = r["tokens_per_effective_sample"] / by[base]["tokens_per_effective_sample"]
                row[f"solve_minus_{base}"] = r["solve_rate_at_budget"] - by[base]["solve_rate_at_budget"]
        out[r["name"]] = row
    return out


def plot_curves(results: list[dict[str, Any]], path: str | Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    for r in results:
        c = np.array(r["curve"])
        ax1.plot(c[:, 0], c[:, 1], label=r["name"])
    ax1.set_xlabel("generated tokens")
    ax1.set_ylabel("mean solve probability")
    ax1.set_title("learning curve")
    ax1.legend()
    names = [r["name"] for r in results]
    ax2.bar(names, [r["tokens_per_effective_sample"] for r in results])
    ax2.set_ylabel("generated tokens per effective sample")
    ax2.set_title("cost of a useful sample")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def format_table(report: dict[str, Any]) -> str:
    """A Markdown table of the headline numbers."""
    rows = ["| strategy | tokens/effective | vs uniform | vs dapo | zero-var share | replayed | solve rate @budget | wall proxy |",
            "|---|---|---|---|---|---|---|---|"]
    for r in report["results"]:
        rat = report["ratios"][r["name"]]
        rows.append(
            f"| {r['name']} | {r['tokens_per_effective_sample']:.0f} | {rat.get('tpe_vs_uniform', float('nan')):.2f} | "
            f"{rat.get('tpe_vs_dapo', float('nan')):.2f} | {r['zero_variance_share']:.2f} | {r.get('replayed_samples', 0)} | "
            f"{r['solve_rate_at_budget']:.3f} | {r['wall_time_proxy']:.3g} |"
        )
    return "\n".join(rows)
