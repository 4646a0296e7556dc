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
    -> control (DAPO dynamic sampling via :class:`~gfcr.control.groups.DynamicSampling`, or AR3PO
    staged sampling + injection of a cached correct response) -> observe -> update (learning rule)

Reported per strategy: generated tokens per effective sample (a generated response in a
non-zero-advantage group that entered a training batch), zero-variance share of generated
groups, the learning curve (mean solve probability over all prompts against generated tokens),
and a wall-time proxy (per generation round the longest response, since a synchronous batch waits
for its longest member, plus ``train_cost`` per trained token).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator

from gfcr.control.groups import DynamicSampling
from gfcr.control.selectors import SELECTORS, greso_batch_size, make_selector


class StrategyConfig(BaseModel):
    """One strategy: a prompt selector plus an optional group control."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="label in the report (e.g. 'dapo', 'greso')")
    selector: str = Field("uniform", description=f"prompt selector, one of {sorted(SELECTORS)}")
    selector_params: dict[str, Any] = Field(default_factory=dict, description="keyword arguments of the selector")
    control: str = Field("none", description="'none' (train on every group), 'dynamic_sampling' (DAPO) or 'ar3po'")
    gen_factor: float = Field(3.0, gt=0, description="dynamic sampling: generation batch = gen_factor x train batch")
    adaptive_gen: bool = Field(False, description="dynamic sampling: GRESO's adaptive generation batch size")
    max_num_gen_batches: int = Field(10, ge=1, description="dynamic sampling: generation rounds per step at most")
    stages: int = Field(2, ge=1, description="ar3po: sampling stages")
    per_stage: int = Field(4, ge=1, description="ar3po: responses per prompt per stage")

    @field_validator("selector")
    @classmethod
    def _known_selector(cls, v: str) -> str:
        if v.lower() not in SELECTORS:
            raise ValueError(f"unknown selector {v!r}; choose one of {sorted(SELECTORS)}")
        return v.lower()

    @field_validator("control")
    @classmethod
    def _known_control(cls, v: str) -> str:
        if v not in ("none", "dynamic_sampling", "ar3po"):
            raise ValueError(f"unknown control {v!r}; choose 'none', 'dynamic_sampling' or 'ar3po'")
        return v


def default_strategies() -> list[StrategyConfig]:
    return [
        StrategyConfig(name="uniform"),
        StrategyConfig(name="dapo", control="dynamic_sampling"),
        StrategyConfig(name="greso", selector="greso", control="dynamic_sampling", adaptive_gen=True),
        StrategyConfig(name="vade", selector="vade"),
        StrategyConfig(name="vcrl", selector="vcrl"),
        StrategyConfig(name="sec", selector="sec"),
        StrategyConfig(name="ar3po", control="ar3po"),
    ]


class SimConfig(BaseModel):
    """The simulated world, the budget and the strategies to compare."""

    model_config = ConfigDict(extra="forbid")

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
    import yaml

    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"simulator config {p} not found")
    data = yaml.safe_load(p.read_text()) or {}
    return SimConfig.model_validate(data)


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

    def update(self, trained_idx: np.ndarray, q: np.ndarray) -> None:
        """Learning rule for effective groups ``trained_idx`` (m,) with success shares q (m,)."""
        cfg = self.cfg
        untrained = np.ones(self.logit.size, dtype=bool)
        untrained[trained_idx] = False
        self.logit[untrained] += cfg.forget * (self.logit0[untrained] - self.logit[untrained])
        np.add.at(self.logit, trained_idx, cfg.lr * 4.0 * q * (1.0 - q))
        if cfg.transfer and trained_idx.size:
            share = np.bincount(self.category[trained_idx], minlength=len(cfg.category_beta)) / cfg.train_prompts
            self.logit += cfg.transfer * share[self.category]


# ---------------------------------------------------------------------------------------------
# One strategy
# ---------------------------------------------------------------------------------------------


def run_strategy(cfg: SimConfig, strat: StrategyConfig) -> dict[str, Any]:
    """Run one strategy on a fresh copy of the world until the token budget is spent."""
    t0 = time.perf_counter()
    world = World(cfg)
    rng = np.random.default_rng(cfg.seed + 1)
    g = cfg.group_size
    sel = make_selector(strat.selector, world.prompt_ids, world.cat_names, **strat.selector_params)
    index = {p: i for i, p in enumerate(world.prompt_ids)}
    tokens = 0
    n_groups = n_zero = n_effective = 0
    wall = 0.0
    solved_cache = np.zeros(cfg.n_prompts, dtype=bool)  # AR3PO: a verified-correct response is cached
    curve: list[tuple[float, float]] = [(0.0, float(world.p.mean()))]
    zero_var_recent = 0.5
    step = 0

    def gen(idx: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        nonlocal tokens, wall, n_groups
        rw, ln = world.generate(idx, k, rng)
        tokens += int(ln.sum())
        wall += float(ln.max()) if ln.size else 0.0
        return rw, ln

    def observe(idx: np.ndarray, rw: np.ndarray) -> None:
        for i, r in zip(idx.tolist(), rw, strict=True):
            sel.observe(world.prompt_ids[i], r, step)

    while tokens < cfg.budget_tokens and step < cfg.max_steps:
        if strat.control == "dynamic_sampling":
            ds = DynamicSampling(cfg.train_prompts, int(round(strat.gen_factor * cfg.train_prompts)),
                                 strat.max_num_gen_batches)
            kept_so_far = [0]

            def generate(n: int, ds: DynamicSampling = ds, kept_so_far: list[int] = kept_so_far) -> list:
                nonlocal n_groups, n_zero, zero_var_recent
                if strat.adaptive_gen:
                    remaining = (cfg.train_prompts - kept_so_far[0]) * g
                    n = greso_batch_size(remaining, zero_var_recent, g, ds.gen_prompts,
                                         min_bs=max(1, cfg.train_prompts // 4))
                idx = np.array([index[p] for p in sel.select(n, rng)], dtype=np.int64)
                rw, ln = gen(idx, g)
                observe(idx, rw)
                zv = rw.std(axis=1) == 0
                n_groups += idx.size
                n_zero += int(zv.sum())
                zero_var_recent = float(zv.mean()) if idx.size else zero_var_recent
                kept_so_far[0] += int((~zv).sum())
                return [(i, r, x) for i, r, x in zip(idx.tolist(), rw, ln, strict=True)]

            res = ds.collect(generate, rewards_of=lambda grp: grp[1])
            batch = res.groups
            t_idx = np.array([b[0] for b in batch], dtype=np.int64)
            q = np.array([b[1].mean() for b in batch])
            eff = np.ones(len(batch), dtype=bool)
            train_tokens = int(sum(b[2].sum() for b in batch))
            n_eff_samples = len(batch) * g
        elif strat.control == "ar3po":
            idx = np.array([index[p] for p in sel.select(cfg.train_prompts, rng)], dtype=np.int64)
            rw_all = [[] for _ in idx]
            ln_all = [[] for _ in idx]
            todo = np.arange(idx.size)
            for _ in range(strat.stages):
                if todo.size == 0:
                    break
                rw, ln = gen(idx[todo], strat.per_stage)
                for j, t in enumerate(todo.tolist()):
                    rw_all[t].extend(rw[j].tolist())
                    ln_all[t].extend(ln[j].tolist())
                todo = np.array([t for t in todo.tolist() if max(rw_all[t]) < 1.0], dtype=np.int64)
            n_groups += idx.size
            q_list, eff_list = [], []
            n_eff_samples = 0
            train_tokens = 0
            for t, i in enumerate(idx.tolist()):
                r = np.array(rw_all[t])
                observe(np.array([i]), r[None, :])
                gen_zero = r.std() == 0
                n_zero += int(gen_zero)
                if r.max() >= 1.0:
                    solved_cache[i] = True
                    is_eff = not gen_zero
                    qq = r.mean()
                elif solved_cache[i]:  # all wrong: inject one cached correct response
                    is_eff = True
                    qq = 1.0 / (r.size + 1)
                else:
                    is_eff, qq = False, 0.0
                eff_list.append(is_eff)
                q_list.append(qq)
                train_tokens += int(np.sum(ln_all[t]))
                if is_eff:
                    n_eff_samples += r.size
            t_idx, q, eff = idx, np.array(q_list), np.array(eff_list, dtype=bool)
        else:
            idx = np.array([index[p] for p in sel.select(cfg.train_prompts, rng)], dtype=np.int64)
            rw, ln = gen(idx, g)
            observe(idx, rw)
            zv = rw.std(axis=1) == 0
            n_groups += idx.size
            n_zero += int(zv.sum())
            t_idx, q, eff = idx, rw.mean(axis=1), ~zv
            train_tokens = int(ln.sum())
            n_eff_samples = int((~zv).sum()) * g
        n_effective += n_eff_samples
        wall += cfg.train_cost * train_tokens
        world.update(t_idx[eff], q[eff])
        sel.end_step()
        step += 1
        curve.append((float(tokens), float(world.p.mean())))

    final = curve[-1][1]
    return {
        "name": strat.name,
        "strategy": strat.model_dump(),
        "steps": step,
        "generated_tokens": tokens,
        "generated_groups": n_groups,
        "effective_samples": n_effective,
        "tokens_per_effective_sample": tokens / n_effective if n_effective else float("inf"),
        "zero_variance_share": n_zero / n_groups if n_groups else 0.0,
        "initial_solve_rate": curve[0][1],
        "final_solve_rate": final,
        "solve_rate_at_budget": solve_rate_at(curve, cfg.budget_tokens),
        "wall_time_proxy": wall,
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
    rows = ["| strategy | tokens/effective | vs uniform | vs dapo | zero-var share | solve rate @budget | wall proxy |",
            "|---|---|---|---|---|---|---|"]
    for r in report["results"]:
        rat = report["ratios"][r["name"]]
        rows.append(
            f"| {r['name']} | {r['tokens_per_effective_sample']:.0f} | {rat.get('tpe_vs_uniform', float('nan')):.2f} | "
            f"{rat.get('tpe_vs_dapo', float('nan')):.2f} | {r['zero_variance_share']:.2f} | "
            f"{r['solve_rate_at_budget']:.3f} | {r['wall_time_proxy']:.3g} |"
        )
    return "\n".join(rows)
