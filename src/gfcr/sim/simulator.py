"""A model-free simulator that compares Control/Replay strategies at scale (``gfcr simulate``).

The world: N prompts in difficulty categories; each has a latent solve probability (initially
Beta-distributed per category) and a mean response length (log-normal; wrong answers run
longer; responses past ``len_max`` are truncated and count as wrong). A training step trains on
a batch of groups; a prompt trained with non-zero advantage moves up in logit space by
``lr · 4q(1−q)`` (q = the group's success share, so informative groups teach most), its category
gains ``transfer`` per effective group, and every prompt not trained this step drifts back toward
its initial logit by ``forget`` (forgetting, so that revisiting and replay can matter).

Strategies run on the same seed (same world, same initial state) until the same generated-token
budget is spent. A step is ``gfcr train``'s own sequence (:mod:`gfcr.control.step`):

    StepSampler (the real selector; the buffer's reserve/exclude) -> GroupPolicy.collect (the real
    gfcr.control.policies class) over SimEngine (the world's draws as minimal rollout records)
    -> replay.assemble (the real buffer's mix, the loop's estimator and (seed, step, label)
    generators) -> observe_step -> the learning rule on the batch's effective groups

A strategy names its selector, group policy and buffer as ``gfcr train`` does (``selector``,
``group``, ``buffer``; ``control`` is a shorthand for a pair, e.g. ``repo``), so every Control and
Replay method runs here, and for the same world and seed the simulated batch is the loop's
(``tests/sim/test_same_batch.py``). The world has no model: ExGRPO ranks a question's trajectories
by their stored entropy (0: the smallest rollout id), where the loop asks the current policy.
Replay in this world: a batch group (by its normalisation group) with a non-zero advantage learns
like a fresh group, times ``replay_decay ** lag`` when it holds replayed responses. The world has
no notion of an off-policy ratio; ``replay_decay`` (default 1: no discount) is an assumption, not
a measurement. GFPO runs, but response lengths in this world do not respond to training, so its
one benefit (shorter responses) cannot appear.

Reported per strategy: generated tokens per effective sample (a generated response in a
non-zero-advantage group that entered a training batch; replayed responses are reported apart
as ``replayed_samples`` and cost no generation), zero-variance share of generated groups, the learning curve (mean solve probability over all prompts against generated tokens),
and a wall-time proxy (per generation round the longest response, since a synchronous batch waits
for its longest member, plus ``train_cost`` per trained token).
"""

from __future__ import annotations

import functools
import json
import time
import zlib
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np

from gfcr.control.policies import Collected, make_group_policy
from gfcr.control.selectors import make_selector
from gfcr.control.step import StepSampler, observe_step, stamp_advantages
from gfcr.filters.advantages import make_estimator
from gfcr.records import Cost, Rollout
from gfcr.replay.buffers import BUFFERS, TrainItem, assemble, make_buffer, stage_rng
from gfcr.sim.config import CONTROLS as CONTROLS  # re-exported: the config lives in gfcr.sim.config
from gfcr.sim.config import SimConfig as SimConfig
from gfcr.sim.config import StrategyConfig as StrategyConfig
from gfcr.sim.config import load_config as load_config

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

    def generate(self, idx: np.ndarray, g: int, rng: np.random.Generator, step: int = 0,
                 rnd: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """Rewards (n, g) in {0, 1} and lengths (n, g) int for prompts ``idx`` (n,), drawn from ``rng``
        (a scripted world may key its draws on ``step`` and ``rnd`` instead)."""
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


class SimRollout(Rollout):
    """A simulated response: no tokens; ``n_generated`` is its drawn length (what GFPO reads) and its
    generated ids one number from its id (two responses are never the same text, as ExGRPO's
    de-duplication assumes). What every simulated response shares is a class attribute (read-only
    mappings), so a response costs a few attribute writes: the simulator builds millions."""

    run_id, task, token_ids, token_role, logprobs = "sim", "sim", _EMPTY_IDS, _EMPTY_ROLE, _EMPTY_LP
    messages: Any = ()
    verifier: Any = MappingProxyType({})
    sampling: Any = MappingProxyType({})
    created_at = _T0

    def __init__(self, prompt_id: str, group_id: str, i: int, step: int, policy_version: str, ok: bool,
                 length: int, meta: Any):
        self.prompt_id, self.group_id, self.sample_index, self.step = prompt_id, group_id, i, step
        self.policy_version, self.reward, self.verified, self.length = policy_version, float(ok), ok, length
        self.signals, self.meta, self.rollout_id = {}, meta, f"{group_id}-{i:03d}"

    @property
    def n_generated(self) -> int:  # type: ignore[override]
        return self.length

    @property
    def cost(self) -> Cost:  # type: ignore[override]
        return Cost(gen_tokens=self.length)

    @functools.cached_property
    def generated_ids(self) -> np.ndarray:  # type: ignore[override]
        return np.array([zlib.crc32(self.rollout_id.encode())], dtype=np.int64)


@dataclass
class _Trained:
    """What one training step trains on: effective groups and their learning weights."""

    idx: np.ndarray  # (m,) prompt indices of the effective groups
    q: np.ndarray  # (m,) success share of each group
    weight: np.ndarray  # (m,) learning-step multiplier (1 fresh; replay_decay ** lag with replay)
    train_tokens: int  # tokens that go through the trainer (wall-time proxy)
    gen_effective: int  # generated responses in effective groups
    replayed: int = 0  # replayed responses in effective groups (or groups made effective by them)


class SimEngine:
    """The simulated world as a :class:`gfcr.control.step.World`: one round draws every asked prompt's
    responses in one :meth:`World.generate` call (K = the largest asked, the rest unused and not
    counted), counts the generated tokens and the round's longest response (the wall proxy)."""

    def __init__(self, run: _Run):
        self.run = run

    def __call__(self, prompt_ids: list[str], sizes: dict[str, int], rnd: int) -> list[list[Rollout]]:
        run = self.run
        if not prompt_ids:
            return []
        idx = np.fromiter((run.index[p] for p in prompt_ids), dtype=np.int64, count=len(prompt_ids))
        k = np.fromiter((sizes[p] for p in prompt_ids), dtype=np.int64, count=len(prompt_ids))
        kmax = int(k.max())
        used = None if int(k.min()) == kmax else np.arange(kmax)[None, :] < k[:, None]
        rw, ln = run.world.generate(idx, kmax, run.rng, step=run.step, rnd=rnd)
        counted = ln if used is None else ln[used]
        run.tokens += int(counted.sum())
        run.n_responses += int(counted.size)
        run.wall += float(counted.max()) if counted.size else 0.0
        ok, ln = (rw >= 1.0).tolist(), ln.tolist()
        gid, pv, meta = (f"@{run.step}#r{rnd}" if rnd else f"@{run.step}"), f"s{run.step}", MappingProxyType({"round": rnd})
        out = []
        for a, p in enumerate(prompt_ids):
            g, oks, lns = p + gid, ok[a], ln[a]
            out.append([SimRollout(p, g, j, run.step, pv, oks[j], lns[j], meta) for j in range(int(k[a]))])
        return out


class _Run:
    """The state of one strategy's run. :meth:`step_once` is ``gfcr train``'s step sequence
    (:mod:`gfcr.control.step`) over a :class:`SimEngine`; the learner is :meth:`World.update`."""

    def __init__(self, cfg: SimConfig, strat: StrategyConfig, world: Any = None):
        self.cfg, self.strat = cfg, strat
        self.world = world if world is not None else World(cfg)
        self.rng = np.random.default_rng(cfg.seed + 1)
        self.sel = make_selector(strat.selector.name, self.world.prompt_ids, self.world.cat_names,
                                 **strat.selector.params)
        self.index = {p: i for i, p in enumerate(self.world.prompt_ids)}
        self.tokens = self.n_responses = 0
        self.n_groups = self.n_zero = self.n_effective = self.n_replayed = 0
        self.wall = 0.0
        self.step = 0
        group, group_params, buffer = strat.resolved(cfg.train_prompts)
        # the buffer's defaults in other sections, as gfcr train applies them (e.g. ExGRPO.run_defaults)
        cls = BUFFERS.get(buffer or "")
        implied = cls.run_defaults(cfg.train_prompts, cfg.group_size) if hasattr(cls, "run_defaults") else {}
        if strat.group is None and strat.control == "none":
            group = implied.get("control.group", group)
        self.policy = make_group_policy(group, **group_params)
        self.buffer: Any = None
        if buffer is not None:
            params = dict(strat.buffer.params) if strat.buffer is not None else {}
            for path, value in implied.items():
                if path.startswith("replay.buffer.params."):
                    params.setdefault(path.rpartition(".")[2], value)
            try:
                self.buffer = make_buffer(buffer, **params)
            except TypeError as e:
                raise ValueError(f"strategy {strat.name!r}: bad buffer params for {buffer}: {e}") from e
        self.estimator = make_estimator(implied.get("signals.advantage", "grpo"))  # gfcr train's default
        self.engine = SimEngine(self)

    def rng_for(self, label: str) -> np.random.Generator:
        """The loop's per-stage generator of this step (``stage_rng(seed, step, label)``)."""
        return stage_rng(self.cfg.seed, self.step, label)

    def collect(self) -> Collected:
        """The group policy over this step's :class:`~gfcr.control.step.StepSampler`."""
        sampler = StepSampler(self.step, self.sel, self.index.keys(), self.rng_for, self.engine, self.buffer)
        return self.policy.collect(sampler, self.cfg.train_prompts, self.cfg.group_size)

    def assemble(self, groups: list[list[Rollout]]) -> list[TrainItem]:
        """The loop's batch assembly (:func:`gfcr.replay.buffers.assemble`) with the step's replay generator."""
        return assemble(self.buffer, groups, self.step, self.rng_for("replay"), self.estimator)

    def step_once(self) -> tuple[Collected, list[TrainItem], _Trained]:
        """One step: collect → assemble → (learner) → observe, as ``gfcr train`` runs it."""
        col = self.collect()
        items = self.assemble(col.kept)
        if getattr(self.buffer, "key", None) == "fifo":  # it replays the advantages the loop's append stage stores
            stamp_advantages(col.generated, [it for it in items if not it.replayed], self.estimator)
        for g in col.generated:
            self.n_groups += 1
            self.n_zero += len({r.reward for r in g}) < 2
        observe_step(self.sel, self.policy, self.buffer, col.generated, col.kept, self.step)
        return col, items, self.trained(items)

    def decay(self, lag: np.ndarray | float) -> np.ndarray:
        return np.asarray(self.cfg.replay_decay, dtype=np.float64) ** np.asarray(lag, dtype=np.float64)

    def trained(self, items: list[TrainItem]) -> _Trained:
        """Effective batch groups (a non-zero advantage) → the world's learning step; every batch row's
        tokens go through the trainer."""
        by: dict[str, list] = {}  # group -> [prompt, rows, reward sum, live, replayed rows, their lag sum]
        tokens = 0
        for it in items:
            r, s = it.rollout, by.get(it.group)
            if s is None:
                s = by[it.group] = [r.prompt_id, 0, 0.0, False, 0, 0]
            s[1] += 1
            s[2] += r.reward
            s[3] = s[3] or _nonzero(it.advantage)
            if it.replayed:
                s[4] += 1
                s[5] += it.lag
            tokens += r.n_generated
        live = [s for s in by.values() if s[3]]
        idx = np.array([self.index[s[0]] for s in live], dtype=np.int64)
        w = [float(self.decay(s[5] / s[4])) if s[4] else 1.0 for s in live]
        return _Trained(idx, np.array([s[2] / s[1] for s in live]), np.array(w), tokens,
                        sum(s[1] - s[4] for s in live), sum(s[4] for s in live))


def _nonzero(a: Any) -> bool:
    return a != 0 if type(a) is float else bool(np.any(np.asarray(a) != 0))


def run_strategy(cfg: SimConfig, strat: StrategyConfig) -> dict[str, Any]:
    """Run one strategy on a fresh copy of the world until the token budget is spent."""
    t0 = time.perf_counter()
    run = _Run(cfg, strat)
    world = run.world
    curve: list[tuple[float, float]] = [(0.0, float(world.p.mean()))]
    while run.tokens < cfg.budget_tokens and run.step < cfg.max_steps:
        _, _, tr = run.step_once()
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
