"""Prompt selection (Control): which prompts to roll out next.

Every selector follows :class:`PromptSelector`: ``select(n, rng) -> prompt_ids`` before a rollout,
``observe(prompt_id, rewards, step)`` after it. Selectors keep their per-prompt state in numpy
arrays indexed by the pool's prompt order, so one class serves both the training loop (a few
hundred prompts a step) and the simulator (10k prompts, vectorised).

Persistence: ``state_dict()`` / ``load_state_dict()`` for in-memory use; ``save(store)`` writes
the per-prompt state to the store's ``prompts`` table (``store.set_control(key, ...)``) and the
global state (GRESO's p_easy/p_hard, SEC's Q-values, pending step counters) with
``store.put_state("control." + key, ...)``; ``load(store)`` restores both.

Step boundaries: statistics that a method adapts once per training step (GRESO's exploration
probabilities, SEC's Q-values) are accumulated by ``observe`` and folded in by ``end_step()``;
``select`` calls ``end_step()`` itself when observations are pending, so a caller that only uses
``select``/``observe`` gets the paper's once-per-step update.

Name → class table: :data:`SELECTORS`; factory: :func:`make_selector`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from gfcr.control.greso_rules import (  # noqa: F401  (re-exported: the pure maths of GRESO)
    GRESO_GROUP_TESTS,
    greso_adapt,
    greso_batch_size,
    greso_group_kind,
    greso_keep_prob,
)

# ---------------------------------------------------------------------------------------------
# Pure maths
# ---------------------------------------------------------------------------------------------


def binary_group_variance(k: np.ndarray | int, g: np.ndarray | int) -> np.ndarray:
    """Unbiased variance of a 0/1 group with k successes out of g: ``k(g-k) / (g(g-1))``.

    Shapes: broadcastable ints -> float array. g < 2 gives 0. Example: k=2, g=4 -> 4/12 = 1/3.
    """
    k = np.asarray(k, dtype=np.float64)
    g = np.asarray(g, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        v = np.where(g >= 2, k * (g - k) / (g * (g - 1)), 0.0)
    return v


def vcrl_score(rewards: Sequence[float]) -> float:
    """VCRL normalised group variance ``p = s^2 / s^2_max`` in [0, 1] (1 = most informative).

    ``s^2`` is the unbiased sample variance of the group's rewards (for 0/1 rewards this is
    ``k(G-k)/(G(G-1))``); ``s^2_max = G/(4(G-1))`` (G even) or ``(G+1)/(4G)`` (G odd), the
    largest value a 0/1 group can reach. Rewards outside [0, 1] are clipped to 1.
    Example: rewards [1, 0, 0, 0] -> (3/12) / (4/12) = 0.75.
    """
    r = np.asarray(rewards, dtype=np.float64)
    g = r.size
    if g < 2:
        return 0.0
    s2 = float(r.var(ddof=1))
    s2_max = g / (4.0 * (g - 1)) if g % 2 == 0 else (g + 1) / (4.0 * g)
    return float(min(s2 / s2_max, 1.0))


def beta_decay(alpha: np.ndarray, beta: np.ndarray, prior_a: float, prior_b: float,
               gamma: float, elapsed: np.ndarray | float) -> tuple[np.ndarray, np.ndarray]:
    """Shrink Beta posteriors toward the prior by ``gamma**elapsed``: ``a0 + gamma^t (a - a0)``.

    Shapes: alpha, beta, elapsed (N,) -> two (N,) arrays. Example: a=5, a0=1, gamma=0.5, t=1 -> 3.
    """
    f = np.power(gamma, np.asarray(elapsed, dtype=np.float64))
    return prior_a + f * (alpha - prior_a), prior_b + f * (beta - prior_b)


def group_abs_advantage(rewards: Sequence[float], eps: float = 1e-6) -> float:
    """Mean |GRPO advantage| of one group: ``mean_i |r_i - mean| / (std + eps)`` (unbiased std).

    A group with equal rewards (or a singleton) gives 0. Example: [1, 0] -> mean 0.5,
    std 0.7071 -> 0.7071.
    """
    r = np.asarray(rewards, dtype=np.float64)
    if r.size < 2:
        return 0.0
    sd = float(r.std(ddof=1))
    if sd == 0.0:
        return 0.0
    return float(np.mean(np.abs(r - r.mean())) / (sd + eps))


def softmax(x: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    """Boltzmann probabilities ``exp(x/τ) / Σ exp(x/τ)`` (max-shifted). Shapes: (A,) -> (A,)."""
    z = np.asarray(x, dtype=np.float64) / temperature
    z = z - z.max()
    e = np.exp(z)
    return e / e.sum()


# ---------------------------------------------------------------------------------------------
# Protocol and shared machinery
# ---------------------------------------------------------------------------------------------


@runtime_checkable
class PromptSelector(Protocol):
    """Chooses prompts to roll out and learns from their group rewards."""

    key: str

    def select(self, n: int, rng: np.random.Generator) -> list[str]: ...

    def observe(self, prompt_id: str, rewards: Sequence[float], step: int) -> None: ...

    def end_step(self) -> None: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class _PoolSelector:
    """Pool bookkeeping, persistence and the per-prompt array state shared by all selectors.

    Subclasses list their per-prompt arrays in ``_arrays`` (name -> dtype, default) and their
    global scalars in ``_globals``; everything else is derived.
    """

    key = "base"
    _arrays: dict[str, tuple[str, float]] = {}
    _globals: tuple[str, ...] = ()

    def __init__(self, prompt_ids: Sequence[str], categories: Sequence[str | None] | None = None,
                 key: str | None = None):
        ids = [str(p) for p in prompt_ids]
        if not ids:
            raise ValueError(f"{type(self).__name__}: the prompt pool is empty; pass at least one prompt id")
        if len(set(ids)) != len(ids):
            raise ValueError(f"{type(self).__name__}: duplicate prompt ids in the pool")
        if categories is not None and len(categories) != len(ids):
            raise ValueError(f"{type(self).__name__}: {len(categories)} categories for {len(ids)} prompts")
        self.prompt_ids = ids
        self.index = {p: i for i, p in enumerate(ids)}
        self.categories = [str(c) if c is not None else "none" for c in (categories or ["none"] * len(ids))]
        if key is not None:
            self.key = key
        self.step = 0  # the latest step observed (+1 once a step ends)
        self._pending = False
        for name, (dtype, default) in self._arrays.items():
            setattr(self, name, np.full(len(ids), default, dtype=dtype))

    @classmethod
    def from_prompts(cls, prompts: Sequence[Any], **params: Any) -> _PoolSelector:
        """Build over ``gfcr.records.Prompt`` objects (uses prompt_id and category)."""
        return cls([p.prompt_id for p in prompts], [p.category for p in prompts], **params)

    def __len__(self) -> int:
        return len(self.prompt_ids)

    def _idx(self, prompt_id: str) -> int:
        try:
            return self.index[prompt_id]
        except KeyError:
            raise KeyError(f"{type(self).__name__}: prompt {prompt_id!r} is not in the selector's pool") from None

    def _take(self, order: np.ndarray, n: int) -> list[str]:
        return [self.prompt_ids[i] for i in order[:n]]

    def _check_n(self, n: int) -> int:
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        return min(int(n), len(self.prompt_ids))

    # --- step boundary -------------------------------------------------------------------
    def observe(self, prompt_id: str, rewards: Sequence[float], step: int) -> None:
        r = np.asarray(rewards, dtype=np.float64)
        if r.ndim != 1 or r.size == 0:
            raise ValueError(f"rewards for {prompt_id!r} must be a non-empty 1-D sequence")
        if not np.isfinite(r).all():
            raise ValueError(f"rewards for {prompt_id!r} must be finite")
        i = self._idx(prompt_id)
        self.step = max(self.step, int(step))
        self._pending = True
        self._observe(i, r, int(step))

    def _observe(self, i: int, r: np.ndarray, step: int) -> None:
        raise NotImplementedError

    def end_step(self) -> None:
        """Fold the observations of the finished step into the method's global state."""
        if self._pending:
            self._end_step()
        self._pending = False

    def _end_step(self) -> None:
        pass

    # --- state ---------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "prompt_ids": list(self.prompt_ids),
            "arrays": {n: getattr(self, n).tolist() for n in self._arrays},
            "globals": {n: _plain(getattr(self, n)) for n in self._globals},
            "step": self.step,
            "pending": self._pending,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pos = [self.index.get(p, -1) for p in state["prompt_ids"]]
        src = np.array([j for j, p in enumerate(pos) if p >= 0], dtype=np.int64)
        dst = np.array([p for p in pos if p >= 0], dtype=np.int64)
        for n, (dtype, _) in self._arrays.items():
            vals = np.asarray(state["arrays"][n], dtype=dtype)
            getattr(self, n)[dst] = vals[src] if len(src) else vals[:0]
        for n in self._globals:
            v = state["globals"][n]
            cur = getattr(self, n)
            setattr(self, n, np.asarray(v, dtype=cur.dtype) if isinstance(cur, np.ndarray) else v)
        self.step = int(state["step"])
        self._pending = bool(state["pending"])

    def prompt_state(self, prompt_id: str) -> dict[str, Any]:
        i = self._idx(prompt_id)
        return {n: _plain(getattr(self, n)[i]) for n in self._arrays}

    def save(self, store: Any) -> None:
        """Per-prompt state -> ``prompts.control[key]``; global state -> ``state['control.<key>']``."""
        # prompts that moved off the defaults, plus any the store already holds state for (so a
        # prompt that returned to its defaults is not left with stale state)
        ids = {self.prompt_ids[i] for i in self._touched()}
        ids |= {p for p in store.get_control(self.key) if p in self.index}
        store.set_control(self.key, {p: self.prompt_state(p) for p in sorted(ids)})
        g = self.state_dict()
        store.put_state(f"control.{self.key}", {"globals": g["globals"], "step": g["step"], "pending": g["pending"]})

    def load(self, store: Any) -> None:
        """Restore what :meth:`save` wrote; prompts the store has no state for keep their defaults."""
        per_prompt = store.get_control(self.key) or {}
        for pid, st in per_prompt.items():
            i = self.index.get(pid)
            if i is None or not st:
                continue
            for n in self._arrays:
                if n in st:
                    getattr(self, n)[i] = st[n]
        g = store.get_state(f"control.{self.key}")
        if g is not None:
            for n in self._globals:
                cur = getattr(self, n)
                v = g["globals"][n]
                setattr(self, n, np.asarray(v, dtype=cur.dtype) if isinstance(cur, np.ndarray) else v)
            self.step = int(g["step"])
            self._pending = bool(g["pending"])

    def _touched(self) -> np.ndarray:
        """Indices of prompts whose state differs from the defaults (only those are written)."""
        mask = np.zeros(len(self.prompt_ids), dtype=bool)
        for n, (_, default) in self._arrays.items():
            mask |= getattr(self, n) != default
        return np.flatnonzero(mask)


def _plain(x: Any) -> Any:
    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, np.generic):
        return x.item()
    return x


# ---------------------------------------------------------------------------------------------
# Selectors
# ---------------------------------------------------------------------------------------------


class Uniform(_PoolSelector):
    """Uniform sampling without replacement: the baseline every other selector is compared to."""

    key = "uniform"
    _arrays = {"n_seen": ("int64", 0)}

    def select(self, n: int, rng: np.random.Generator) -> list[str]:
        self.end_step()
        n = self._check_n(n)
        return self._take(rng.permutation(len(self.prompt_ids)), n)

    def _observe(self, i: int, r: np.ndarray, step: int) -> None:
        self.n_seen[i] += 1


class GRESO(_PoolSelector):
    """GRESO, "Act Only When It Pays" (arXiv 2506.02177): skip prompts likely to give zero variance.

    Rule: a prompt whose last k consecutive groups were all-correct is kept with probability
    ``max(p_easy**k, 0.01)``, all-wrong with ``max(p_hard**k, 0.01)``; after each step
    p_easy/p_hard move by ±delta so the observed easy/hard zero-variance shares approach target/3
    and 2·target/3. All-correct: every reward >= ``easy_threshold``; all-wrong: every reward <=
    ``hard_threshold`` (:func:`greso_group_kind`, ``group_test="each"``). GRESO's code compares
    the group *mean* (Infini-AI-Lab/GRESO ``verl/trainer/ttis/presampling_selector.py`` l. 61,
    82-88) on its 1.0 / 0.1 / 0.0 reward scale at n = 8, where that mean test is this per-reward
    one; on 0/1 rewards it is not (``group_test="mean"``, gfcr before issue 47).
    Departures: candidates are drawn from a fresh random permutation of the whole pool each call
    (the reference code filters its dataloader's shuffled epoch); when a pass over the pool keeps
    fewer than n prompts, further passes are made (at most ``max_passes``), then the rest is
    filled uniformly from the skipped prompts. The adaptive rollout batch size is the pure
    function :func:`greso_batch_size`. The shares that adapt p count the streaks' groups (GRESO's
    ``compute_reward_metrics`` counts all-1.0 and all-0.1 groups only: 0/1 rewards have no third value).
    """

    key = "greso"
    _arrays = {"k_easy": ("int64", 0), "k_hard": ("int64", 0), "n_seen": ("int64", 0)}
    _globals = ("p_easy", "p_hard", "n_obs", "n_easy", "n_hard")

    def __init__(self, prompt_ids: Sequence[str], categories: Sequence[str | None] | None = None,
                 key: str | None = None, p_easy: float = 0.5, p_hard: float = 0.5,
                 target_zero_variance: float = 0.25, delta: float = 0.01, p_min: float = 0.05,
                 p_max: float = 0.95, min_keep: float = 0.01, easy_threshold: float = 0.98,
                 hard_threshold: float = 0.11, max_passes: int = 20, group_test: str = "each"):
        super().__init__(prompt_ids, categories, key)
        if group_test not in GRESO_GROUP_TESTS:
            raise ValueError(f"GRESO: group_test must be one of {GRESO_GROUP_TESTS}, got {group_test!r}")
        self.group_test = group_test
        for name, v in (("p_easy", p_easy), ("p_hard", p_hard), ("target_zero_variance", target_zero_variance)):
            if not 0.0 <= v <= 1.0:
                raise ValueError(f"GRESO: {name} must lie in [0, 1], got {v}")
        self.p_easy, self.p_hard = float(p_easy), float(p_hard)
        self.target = float(target_zero_variance)
        self.delta, self.p_min, self.p_max, self.min_keep = delta, p_min, p_max, min_keep
        self.easy_threshold, self.hard_threshold = easy_threshold, hard_threshold
        self.max_passes = max_passes
        self.n_obs = self.n_easy = self.n_hard = 0

    def keep_prob(self) -> np.ndarray:
        """(N,) current keep probability of every prompt in the pool."""
        return greso_keep_prob(self.k_easy, self.k_hard, self.p_easy, self.p_hard, self.min_keep)

    def select(self, n: int, rng: np.random.Generator) -> list[str]:
        self.end_step()
        n = self._check_n(n)
        keep = self.keep_prob()
        chosen = np.zeros(len(self.prompt_ids), dtype=bool)
        out: list[int] = []
        for _ in range(self.max_passes):
            order = rng.permutation(len(self.prompt_ids))
            order = order[~chosen[order]]
            passed = order[rng.random(order.size) < keep[order]]
            take = passed[: n - len(out)]
            chosen[take] = True
            out.extend(take.tolist())
            if len(out) >= n:
                break
        if len(out) < n:
            rest = rng.permutation(np.flatnonzero(~chosen))[: n - len(out)]
            out.extend(rest.tolist())
        return [self.prompt_ids[i] for i in out]

    def _observe(self, i: int, r: np.ndarray, step: int) -> None:
        easy, hard = greso_group_kind(r, self.easy_threshold, self.hard_threshold, self.group_test)
        self.n_seen[i] += 1
        self.n_obs += 1
        if easy:
            self.k_easy[i] += 1
            self.k_hard[i] = 0
            self.n_easy += 1
        elif hard:
            self.k_hard[i] += 1
            self.k_easy[i] = 0
            self.n_hard += 1
        else:
            self.k_easy[i] = 0
            self.k_hard[i] = 0

    def _end_step(self) -> None:
        if self.n_obs:
            self.p_easy = greso_adapt(self.p_easy, self.n_easy / self.n_obs, self.target / 3.0,
                                      self.delta, self.p_min, self.p_max)
            self.p_hard = greso_adapt(self.p_hard, self.n_hard / self.n_obs, 2.0 * self.target / 3.0,
                                      self.delta, self.p_min, self.p_max)
        self.n_obs = self.n_easy = self.n_hard = 0


class VCRL(_PoolSelector):
    """VCRL, variance-based curriculum RL (arXiv 2509.19803): prefer prompts whose last group had
    high normalised reward variance ``p = s²/s²_max``.

    Rule: sample n prompts without replacement with weight ``p`` (never-seen prompts get weight 1,
    i.e. optimistic); prompts with ``p < kappa`` get weight ``floor`` so they are revisited rarely.
    Departures: the paper's threshold schedule and memory bank were NOT FOUND in the reference;
    ``kappa`` (0.3) and ``floor`` (0.05) are our parameters, and the memory-bank replay is left to
    the Replay stage (:mod:`gfcr.replay`).
    """

    key = "vcrl"
    _arrays = {"score": ("float64", 1.0), "n_seen": ("int64", 0)}

    def __init__(self, prompt_ids: Sequence[str], categories: Sequence[str | None] | None = None,
                 key: str | None = None, kappa: float = 0.3, floor: float = 0.05):
        super().__init__(prompt_ids, categories, key)
        if not 0.0 < floor <= 1.0:
            raise ValueError(f"VCRL: floor must lie in (0, 1], got {floor}")
        self.kappa, self.floor = kappa, floor

    def weights(self) -> np.ndarray:
        """(N,) sampling weight of every prompt."""
        return np.where(self.score >= self.kappa, np.maximum(self.score, self.floor), self.floor)

    def select(self, n: int, rng: np.random.Generator) -> list[str]:
        self.end_step()
        n = self._check_n(n)
        w = self.weights()
        # weighted sampling without replacement (Efraimidis-Spirakis keys)
        keys = np.log(rng.random(w.size)) / w
        return self._take(np.argsort(-keys, kind="stable"), n)

    def _observe(self, i: int, r: np.ndarray, step: int) -> None:
        self.score[i] = vcrl_score(np.clip(r, 0.0, 1.0))
        self.n_seen[i] += 1


class VADE(_PoolSelector):
    """VADE, variance-aware dynamic sampling (arXiv 2511.18902): Beta posterior per prompt and
    Thompson sampling on the Bernoulli variance.

    Rule: keep ``Beta(alpha, beta)`` per prompt (``alpha += #correct``, ``beta += #wrong``, a reward
    counts as correct when ``>= success_threshold``); draw ``p~ ~ Beta`` and pick the n prompts with
    the largest ``p~(1 - p~)``. Posteriors shrink toward the prior by ``gamma**steps_elapsed``.
    Departures: the paper's exact information-gain criterion and its two-scale decay rates were
    NOT FOUND; we use ``p(1-p)`` and one decay rate ``gamma`` (0.99 per step), applied lazily
    when a prompt is observed or selected.
    """

    key = "vade"
    _arrays = {"alpha": ("float64", 1.0), "beta": ("float64", 1.0), "last_step": ("int64", 0)}

    def __init__(self, prompt_ids: Sequence[str], categories: Sequence[str | None] | None = None,
                 key: str | None = None, prior_alpha: float = 1.0, prior_beta: float = 1.0,
                 gamma: float = 0.99, success_threshold: float = 0.5):
        if prior_alpha <= 0 or prior_beta <= 0:
            raise ValueError("VADE: prior_alpha and prior_beta must be > 0")
        if not 0.0 < gamma <= 1.0:
            raise ValueError(f"VADE: gamma must lie in (0, 1], got {gamma}")
        self._arrays = {"alpha": ("float64", prior_alpha), "beta": ("float64", prior_beta),
                        "last_step": ("int64", 0)}
        super().__init__(prompt_ids, categories, key)
        self.prior_alpha, self.prior_beta, self.gamma = prior_alpha, prior_beta, gamma
        self.success_threshold = success_threshold

    def posterior(self, step: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(N,), (N,) decayed posterior parameters as of ``step`` (default: the current step)."""
        step = self.step if step is None else step
        return beta_decay(self.alpha, self.beta, self.prior_alpha, self.prior_beta, self.gamma,
                          np.maximum(step - self.last_step, 0))

    def select(self, n: int, rng: np.random.Generator) -> list[str]:
        self.end_step()
        n = self._check_n(n)
        a, b = self.posterior()
        p = rng.beta(a, b)
        score = p * (1.0 - p)
        return self._take(np.argsort(-score, kind="stable"), n)

    def _observe(self, i: int, r: np.ndarray, step: int) -> None:
        a, b = beta_decay(self.alpha[i], self.beta[i], self.prior_alpha, self.prior_beta, self.gamma,
                          max(step - int(self.last_step[i]), 0))
        c = int(np.count_nonzero(r >= self.success_threshold))
        self.alpha[i] = a + c
        self.beta[i] = b + (r.size - c)
        self.last_step[i] = step


class SEC(_PoolSelector):
    """SEC, Self-Evolving Curriculum (arXiv 2505.14970): a non-stationary bandit over categories.

    Rule: arm probabilities ``softmax(Q / temperature)``; each batch slot draws an arm, then a
    prompt of that arm uniformly (without replacement). After a step, arm reward = mean over the
    arm's groups of mean |GRPO advantage|; ``Q <- (1 - lr) Q + lr r`` for all arms (arms not
    drawn get r = 0, as in the reference code).
    Defaults lr=0.5, temperature=0.4 (the paper's Math recipe). Departure: when an arm runs out of
    prompts in one call, its remaining slots are redrawn among the other arms.
    """

    key = "sec"
    _arrays = {"n_seen": ("int64", 0)}
    _globals = ("q", "arm_sum", "arm_count")

    def __init__(self, prompt_ids: Sequence[str], categories: Sequence[str | None] | None = None,
                 key: str | None = None, lr: float = 0.5, temperature: float = 0.4):
        super().__init__(prompt_ids, categories, key)
        if temperature <= 0:
            raise ValueError(f"SEC: temperature must be > 0, got {temperature}")
        self.arms = sorted(set(self.categories))
        arm_of = {a: j for j, a in enumerate(self.arms)}
        self.arm_index = np.array([arm_of[c] for c in self.categories], dtype=np.int64)
        self.members = [np.flatnonzero(self.arm_index == j) for j in range(len(self.arms))]
        self.lr, self.temperature = lr, temperature
        self.q = np.zeros(len(self.arms))
        self.arm_sum = np.zeros(len(self.arms))
        self.arm_count = np.zeros(len(self.arms))

    def probs(self) -> np.ndarray:
        """(A,) arm probabilities, in the order of ``self.arms``."""
        return softmax(self.q, self.temperature)

    def select(self, n: int, rng: np.random.Generator) -> list[str]:
        self.end_step()
        n = self._check_n(n)
        left = [rng.permutation(m).tolist() for m in self.members]
        p = self.probs()
        out: list[int] = []
        while len(out) < n:
            avail = np.array([len(x) > 0 for x in left])
            pp = np.where(avail, p, 0.0)
            pp = pp / pp.sum()
            arms = rng.choice(len(self.arms), size=n - len(out), p=pp)
            for a in arms:
                if left[a]:
                    out.append(left[a].pop())
        return [self.prompt_ids[i] for i in out]

    def _observe(self, i: int, r: np.ndarray, step: int) -> None:
        a = self.arm_index[i]
        self.arm_sum[a] += group_abs_advantage(r)
        self.arm_count[a] += 1
        self.n_seen[i] += 1

    def _end_step(self) -> None:
        r_new = np.divide(self.arm_sum, self.arm_count, out=np.zeros_like(self.arm_sum), where=self.arm_count > 0)
        self.q = (1.0 - self.lr) * self.q + self.lr * r_new
        self.arm_sum[:] = 0.0
        self.arm_count[:] = 0.0


SELECTORS: dict[str, type[_PoolSelector]] = {
    "uniform": Uniform,
    "greso": GRESO,
    "vcrl": VCRL,
    "vade": VADE,
    "sec": SEC,
}


def make_selector(name: str, prompt_ids: Sequence[str], categories: Sequence[str | None] | None = None,
                  **params: Any) -> _PoolSelector:
    """Build a selector by its name in :data:`SELECTORS` (e.g. from a YAML config)."""
    try:
        cls = SELECTORS[name.lower()]
    except KeyError:
        raise ValueError(f"unknown prompt selector {name!r}; choose one of {sorted(SELECTORS)}") from None
    return cls(prompt_ids, categories, **params)
