"""Replay buffers (Replay): keep past rollouts and feed them back into later training steps.

Every buffer follows :class:`ReplayBuffer`: ``add(rollouts)`` and
``sample(batch, policy_version, rng)`` -> :class:`ReplaySample` items, each carrying the stored
rollout, its behaviour log-probs (the ``logprobs`` recorded at generation) and its version lag.

Versions and lag: the record's ``policy_version`` is a string (a checkpoint id or hash) and has no
order, so lag is measured in trainer steps: ``lag = policy_version - rollout.step`` where the
``policy_version`` argument of :meth:`sample` is the *current trainer step* (an int).

Restart: a buffer is a deterministic function of the rollouts added to it. ``add`` orders its
input canonically by (step, group_id, sample_index, rollout_id), so
:meth:`rebuild` (``store.rollouts(...)`` in one call) reproduces the state of a buffer fed step by
step. ``state_dict()`` is a JSON-able summary (ids per slot) used to compare the two.

Name → class table: :data:`BUFFERS`; factory: :func:`make_buffer`.
"""

from __future__ import annotations

from collections import OrderedDict, defaultdict, deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

from gfcr.records import GENERATED, Rollout

# ---------------------------------------------------------------------------------------------
# Pure maths
# ---------------------------------------------------------------------------------------------


def shape_importance(w: np.ndarray | float, gamma: float = 0.1) -> np.ndarray:
    """ExGRPO policy shaping of an off-policy importance weight: ``f(w) = w / (w + gamma)``.

    Shapes: any -> same. Example: w=1, γ=0.1 -> 0.9091; w=0.1 -> 0.5.
    """
    w = np.asarray(w, dtype=np.float64)
    return w / (w + gamma)


def exgrpo_bucket_weight(k: np.ndarray | float, group_size: int, sigma: float = 1.0) -> np.ndarray:
    """ExGRPO bucket weight: Gaussian density ``N(k; μ=K/2, σ)`` over the correct count k.

    Shapes: any -> same. Example: K=8, σ=1: k=4 -> 0.3989, k=6 -> 0.0540.
    """
    k = np.asarray(k, dtype=np.float64)
    mu = group_size / 2.0
    return np.exp(-0.5 * ((k - mu) / sigma) ** 2) / (sigma * np.sqrt(2.0 * np.pi))


def max_variance_subset(rewards: Sequence[float], k: int) -> np.ndarray:
    """RePO ``max_variance_k``: indices of the k-subset with the largest reward variance.

    A maximum-variance subset of reals is made of extremes (the j largest and k−j smallest), so
    all j in [0, k] are tried; ties go to the larger reward sum. Shapes: (N,) -> (k,).
    Example: [1, 1, 0, 0, 1], k=2 -> one 1 and one 0: indices [0, 2].
    """
    r = np.asarray(rewards, dtype=np.float64)
    k = min(k, r.size)
    high = np.argsort(-r, kind="stable")  # high -> low, ties by index
    low = np.argsort(r, kind="stable")  # low -> high, ties by index
    best, best_key = high[:k], (-np.inf, -np.inf)
    for j in range(k + 1):
        idx = np.concatenate([high[:j], low[: k - j]])
        if len(set(idx.tolist())) != k:
            continue
        key = (float(r[idx].var()), float(r[idx].sum()))
        if key > best_key:
            best, best_key = idx, key
    return np.sort(best)


def split_advantages(on_rewards: Sequence[float], off_rewards: Sequence[float], mode: str = "split",
                     eps: float = 1e-4) -> tuple[np.ndarray, np.ndarray]:
    """RePO advantages for G fresh and R replayed samples of one prompt.

    ``split``: each set normalised by its own mean and std; ``mixed``: one group of G+R.
    ``A = (r − mean) / (std + eps)`` with the population std (RePO's code). Shapes: (G,), (R,)
    -> (G,), (R,). Example split: on [1, 0] -> [1, −1] (up to eps), off [1, 1] -> [0, 0].
    """
    on = np.asarray(on_rewards, dtype=np.float64)
    off = np.asarray(off_rewards, dtype=np.float64)

    def norm(x: np.ndarray, ref: np.ndarray) -> np.ndarray:
        if ref.size == 0:
            return np.zeros_like(x)
        return (x - ref.mean()) / (ref.std() + eps)

    if mode == "split":
        return norm(on, on), norm(off, off)
    if mode == "mixed":
        both = np.concatenate([on, off])
        return norm(on, both), norm(off, both)
    raise ValueError(f"split_advantages: mode must be 'split' or 'mixed', got {mode!r}")


def mean_token_nll(rollout: Rollout) -> float:
    """Mean negative behaviour log-prob of a rollout's generated tokens (an entropy proxy)."""
    lp = rollout.logprobs[rollout.token_role == GENERATED]
    return float(-lp.mean()) if lp.size else 0.0


def is_correct(rollout: Rollout, threshold: float = 0.5) -> bool:
    """Verifier verdict when there is one, else ``reward >= threshold``."""
    if rollout.verified is not None:
        return bool(rollout.verified)
    return float(rollout.reward) >= threshold


# ---------------------------------------------------------------------------------------------
# Protocol and base
# ---------------------------------------------------------------------------------------------


@dataclass
class ReplaySample:
    """One replayed rollout, ready for an off-policy loss."""

    rollout: Rollout
    lag: int  # current trainer step − rollout.step
    weight: float = 1.0  # a sampling or shaping weight the buffer attaches (1 = none)
    source: str = ""  # the buffer key

    @property
    def behaviour_logprobs(self) -> np.ndarray:
        """(T,) float32 log-probs recorded at generation (0 on context tokens)."""
        return self.rollout.logprobs


@runtime_checkable
class ReplayBuffer(Protocol):
    key: str

    def add(self, rollouts: Iterable[Rollout]) -> None: ...

    def sample(self, batch: int, policy_version: int, rng: np.random.Generator | None = None) -> list[ReplaySample]: ...

    def state_dict(self) -> dict[str, Any]: ...


def _canonical(rollouts: Iterable[Rollout]) -> list[Rollout]:
    return sorted(rollouts, key=lambda r: (int(r.step), r.group_id, int(r.sample_index), r.rollout_id))


def _groups(rollouts: list[Rollout]) -> list[list[Rollout]]:
    """Canonically ordered rollouts -> groups by (step, group_id), in first-seen order."""
    out: OrderedDict[tuple[int, str], list[Rollout]] = OrderedDict()
    for r in rollouts:
        out.setdefault((int(r.step), r.group_id), []).append(r)
    return list(out.values())


class _Buffer:
    key = "base"

    def clear(self) -> None:
        raise NotImplementedError

    def add(self, rollouts: Iterable[Rollout]) -> None:
        raise NotImplementedError

    def rebuild(self, store: Any, run: str | None = None, steps: tuple[int, int] | None = None, **filters: Any) -> int:
        """Clear and refill from the store's rollouts (``store.rollouts(run=, steps=, ...)``).

        Returns the number of rollouts read. The window should match what the live buffer saw
        (e.g. the last ``steps`` of the run).
        """
        rs = store.rollouts(run=run, steps=steps, **filters)
        self.clear()
        self.add(rs)
        return len(rs)

    def _sample_lagged(self, items: list[Rollout], batch: int, policy_version: int,
                       rng: np.random.Generator | None, max_lag: int | None) -> list[ReplaySample]:
        rng = rng or np.random.default_rng()
        lags = np.array([policy_version - int(r.step) for r in items], dtype=np.int64)
        ok = np.flatnonzero(lags >= 0 if max_lag is None else (lags >= 0) & (lags <= max_lag))
        pick = rng.permutation(ok)[:batch]
        return [ReplaySample(items[i], int(lags[i]), 1.0, self.key) for i in pick]


# ---------------------------------------------------------------------------------------------
# Buffers
# ---------------------------------------------------------------------------------------------


class FIFO(_Buffer):
    """First-in-first-out window of the latest ``capacity`` rollouts; sampled uniformly.

    The plain baseline. ``max_lag`` (optional) leaves out rollouts older than that many steps.
    """

    key = "fifo"

    def __init__(self, capacity: int = 4096, max_lag: int | None = None):
        if capacity < 1:
            raise ValueError("FIFO: capacity must be >= 1")
        self.capacity, self.max_lag = capacity, max_lag
        self.items: deque[Rollout] = deque(maxlen=capacity)

    def __len__(self) -> int:
        return len(self.items)

    def clear(self) -> None:
        self.items.clear()

    def add(self, rollouts: Iterable[Rollout]) -> None:
        self.items.extend(_canonical(rollouts))

    def sample(self, batch: int, policy_version: int, rng: np.random.Generator | None = None) -> list[ReplaySample]:
        return self._sample_lagged(list(self.items), batch, policy_version, rng, self.max_lag)

    def state_dict(self) -> dict[str, Any]:
        return {"key": self.key, "ids": [r.rollout_id for r in self.items]}


class _PerPromptCache(_Buffer):
    """A bounded deque of rollouts per prompt (RePO's replay cache, AR3PO's correct-response cache)."""

    def __init__(self, maxlen: int):
        self.maxlen = maxlen
        self.cache: dict[str, deque[Rollout]] = {}

    def __len__(self) -> int:
        return sum(len(d) for d in self.cache.values())

    def clear(self) -> None:
        self.cache.clear()

    def _keep(self, r: Rollout) -> None:
        """Append ``r`` to its prompt's deque (the oldest drops out when full)."""
        self.cache.setdefault(r.prompt_id, deque(maxlen=self.maxlen)).append(r)

    def state_dict(self) -> dict[str, Any]:
        return {"key": self.key, "cache": {p: [r.rollout_id for r in d] for p, d in sorted(self.cache.items())}}


class RePO(_PerPromptCache):
    """RePO, Replay-Enhanced Policy Optimization (arXiv 2506.09340): a per-prompt replay cache.

    Rule: every fresh completion is pushed to its prompt's deque (``max_cache_size``); a prompt
    is replayed once it holds ``min_cache_to_replay`` entries, ``num_replays`` of them chosen by
    ``strategy``: ``random``, ``highest`` (reward), ``recent`` or ``variance`` (the max-variance
    k-subset, :func:`max_variance_subset`). Advantages of replayed samples are normalised apart
    from the fresh ones (:func:`split_advantages`, ``adv_norm_mode``). Defaults are the authors'
    run script (highest, 8 replays, cache 16/16, split).
    """

    key = "repo"
    STRATEGIES = ("random", "highest", "recent", "variance")

    def __init__(self, strategy: str = "highest", num_replays: int = 8, max_cache_size: int = 16,
                 min_cache_to_replay: int = 16, adv_norm_mode: str = "split"):
        if strategy not in self.STRATEGIES:
            raise ValueError(f"RePO: strategy must be one of {self.STRATEGIES}, got {strategy!r}")
        if min_cache_to_replay > max_cache_size:
            raise ValueError("RePO: min_cache_to_replay cannot exceed max_cache_size (nothing would replay)")
        self.strategy, self.num_replays = strategy, num_replays
        self.max_cache_size, self.min_cache_to_replay = max_cache_size, min_cache_to_replay
        self.adv_norm_mode = adv_norm_mode
        super().__init__(max_cache_size)

    def add(self, rollouts: Iterable[Rollout]) -> None:
        for r in _canonical(rollouts):
            self._keep(r)

    def replay_for(self, prompt_id: str, rng: np.random.Generator | None = None) -> list[Rollout]:
        """The ``num_replays`` cached rollouts of one prompt (empty until the cache is warm)."""
        items = list(self.cache.get(prompt_id, ()))
        if len(items) < self.min_cache_to_replay:
            return []
        k = min(self.num_replays, len(items))
        rewards = np.array([r.reward for r in items])
        if self.strategy == "random":
            idx = (rng or np.random.default_rng()).choice(len(items), size=k, replace=False)
        elif self.strategy == "highest":
            idx = np.argsort(-rewards, kind="stable")[:k]
        elif self.strategy == "recent":
            idx = np.arange(len(items) - k, len(items))
        else:
            idx = max_variance_subset(rewards, k)
        return [items[i] for i in idx]

    def sample(self, batch: int, policy_version: int, rng: np.random.Generator | None = None,
               prompt_ids: Sequence[str] | None = None) -> list[ReplaySample]:
        """Replays for ``prompt_ids`` (the prompts of the current batch, RePO's use) or, when not
        given, for randomly ordered warm prompts, until ``batch`` samples."""
        rng = rng or np.random.default_rng()
        pids = list(prompt_ids) if prompt_ids is not None else list(rng.permutation(sorted(self.cache)))
        out: list[ReplaySample] = []
        for p in pids:
            for r in self.replay_for(str(p), rng):
                if len(out) >= batch:
                    return out
                out.append(ReplaySample(r, policy_version - int(r.step), 1.0, self.key))
        return out

    def advantages(self, on_rewards: Sequence[float], off_rewards: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
        return split_advantages(on_rewards, off_rewards, self.adv_norm_mode)



class ExGRPO(_Buffer):
    """ExGRPO, learning to reason from experience (arXiv 2510.02245).

    Rule: per question keep its correct trajectories when ``0 < k < K`` correct in its latest
    group; an all-correct group retires the question (removed, never replayed again); k = 0
    stores nothing. Sampling draws a bucket (latest k) with weight ``N(k; K/2, σ)``, a question
    in it, and the question's lowest-entropy trajectory; ``mix_ratio`` ρ of a batch is replay.
    Off-policy weights are shaped ``w/(w+0.1)`` (:func:`shape_importance`) in the loss.
    Departure: the paper recomputes entropy under the current policy; we rank by ``entropy_fn``
    (default: the ``entropy`` signal when present, else the mean behaviour NLL).
    """

    key = "exgrpo"

    def __init__(self, group_size: int = 8, sigma: float = 1.0, mix_ratio: float = 0.5,
                 start_solved_ratio: float = 0.35, shaping_gamma: float = 0.1,
                 entropy_fn: Callable[[Rollout], float] | None = None, success_threshold: float = 0.5):
        if not 0.0 <= mix_ratio <= 1.0:
            raise ValueError(f"ExGRPO: mix_ratio must lie in [0, 1], got {mix_ratio}")
        self.group_size, self.sigma, self.mix_ratio = group_size, sigma, mix_ratio
        self.start_solved_ratio, self.shaping_gamma = start_solved_ratio, shaping_gamma
        self.entropy_fn = entropy_fn or (lambda r: float(r.signals.get("entropy", mean_token_nll(r))))
        self.success_threshold = success_threshold
        self.experience: dict[str, list[Rollout]] = {}
        self.bucket: dict[str, int] = {}  # question -> latest correct count (rescaled to group_size)
        self.retired: set[str] = set()

    def __len__(self) -> int:
        return len(self.experience)

    def clear(self) -> None:
        self.experience.clear()
        self.bucket.clear()
        self.retired.clear()

    def add(self, rollouts: Iterable[Rollout]) -> None:
        for g in _groups(_canonical(rollouts)):
            q = g[0].prompt_id
            if q in self.retired:
                continue
            correct = [r for r in g if is_correct(r, self.success_threshold)]
            k, n = len(correct), len(g)
            if k == n:
                self.retired.add(q)
                self.experience.pop(q, None)
                self.bucket.pop(q, None)
            elif k > 0:
                self.experience[q] = correct
                self.bucket[q] = int(round(k / n * self.group_size))

    def n_experience(self, batch: int) -> int:
        """How many of a ``batch`` of questions come from experience: ``round(ρ·B)``."""
        return int(round(self.mix_ratio * batch))

    def active(self, batch_solved_ratio: float) -> bool:
        """Mixed-policy training starts once the batch's solved ratio exceeds the threshold."""
        return batch_solved_ratio > self.start_solved_ratio

    def sample(self, batch: int, policy_version: int, rng: np.random.Generator | None = None) -> list[ReplaySample]:
        """Up to ``batch`` distinct questions, one lowest-entropy trajectory each."""
        rng = rng or np.random.default_rng()
        by_bucket: dict[int, list[str]] = defaultdict(list)
        for q in sorted(self.experience):
            by_bucket[self.bucket[q]].append(q)
        for b in by_bucket:
            by_bucket[b] = list(rng.permutation(by_bucket[b]))
        out: list[ReplaySample] = []
        while len(out) < batch and by_bucket:
            keys = sorted(by_bucket)
            w = exgrpo_bucket_weight(np.array(keys), self.group_size, self.sigma)
            w = w / w.sum() if w.sum() > 0 else np.full(len(keys), 1.0 / len(keys))
            b = keys[rng.choice(len(keys), p=w)]
            q = str(by_bucket[b].pop())
            if not by_bucket[b]:
                del by_bucket[b]
            best = min(self.experience[q], key=lambda r: (self.entropy_fn(r), r.rollout_id))
            out.append(ReplaySample(best, policy_version - int(best.step), 1.0, self.key))
        return out

    def shape(self, w: np.ndarray | float) -> np.ndarray:
        return shape_importance(w, self.shaping_gamma)

    def state_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "experience": {q: [r.rollout_id for r in rs] for q, rs in sorted(self.experience.items())},
            "bucket": dict(sorted(self.bucket.items())),
            "retired": sorted(self.retired),
        }


class AR3PO(_PerPromptCache):
    """AR3PO, adaptive rollout and response reuse (arXiv 2509.25808).

    Rule: cache verified-correct responses per prompt (``verified is True`` only: a reward alone
    is not enough); when a prompt's group has no correct response, add one cached correct
    response so the group's advantage is non-zero. Adaptive rollout (:meth:`adaptive_rollout`):
    sample in stages and stop sampling a prompt once one response is correct.
    Departures (NOT FOUND in the reference): cache size per prompt (``max_per_prompt`` = 4, the
    newest kept) and which cached response is injected (the newest).
    """

    key = "ar3po"

    def __init__(self, max_per_prompt: int = 4):
        self.max_per_prompt = max_per_prompt
        super().__init__(max_per_prompt)

    def add(self, rollouts: Iterable[Rollout]) -> None:
        for r in _canonical(rollouts):
            if r.verified is True:
                self._keep(r)

    def inject(self, group: Sequence[Rollout], policy_version: int) -> tuple[list[Rollout], ReplaySample | None]:
        """Return ``group`` plus one cached correct response if (and only if) the group is all-wrong
        (no member verified correct) and a cached response exists; the injected sample too."""
        g = list(group)
        if not g or any(r.verified is True for r in g):
            return g, None
        pids = {r.prompt_id for r in g}
        if len(pids) != 1:
            raise ValueError(f"AR3PO.inject: a group must share one prompt_id, got {sorted(pids)}")
        cached = self.cache.get(g[0].prompt_id)
        if not cached:
            return g, None
        r = cached[-1]
        return g + [r], ReplaySample(r, policy_version - int(r.step), 1.0, self.key)

    def sample(self, batch: int, policy_version: int, rng: np.random.Generator | None = None) -> list[ReplaySample]:
        items = [r for d in self.cache.values() for r in d]
        return self._sample_lagged(items, batch, policy_version, rng, None)

    @staticmethod
    def adaptive_rollout(prompt_ids: Sequence[str], generate: Callable[[list[str], int], dict[str, list[Rollout]]],
                         stages: int = 3, per_stage: int = 4) -> tuple[dict[str, list[Rollout]], int]:
        """Staged sampling: each stage samples ``per_stage`` responses for every prompt without a
        correct one yet. Returns (prompt -> all its responses, number of responses generated)."""
        out: dict[str, list[Rollout]] = {p: [] for p in prompt_ids}
        todo = list(prompt_ids)
        n = 0
        for _ in range(stages):
            if not todo:
                break
            got = generate(todo, per_stage)
            for p in todo:
                rs = got.get(p, [])
                out[p].extend(rs)
                n += len(rs)
            todo = [p for p in todo if not any(r.verified is True for r in out[p])]
        return out, n


BUFFERS: dict[str, type[_Buffer]] = {
    "fifo": FIFO,
    "repo": RePO,
    "exgrpo": ExGRPO,
    "ar3po": AR3PO,
}


def make_buffer(name: str, **params: Any) -> _Buffer:
    """Build a replay buffer by its name in :data:`BUFFERS`."""
    try:
        cls = BUFFERS[name.lower()]
    except KeyError:
        raise ValueError(f"unknown replay buffer {name!r}; choose one of {sorted(BUFFERS)}") from None
    return cls(**params)
