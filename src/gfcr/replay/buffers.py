"""Replay buffers (Replay): keep past rollouts and feed them back into later training steps.

Every buffer follows :class:`ReplayBuffer`. The loop and the simulator call only ``reserve`` (before
generation: prompts whose groups replay will complete this step, and with how many replayed members),
``mix`` via :func:`assemble` (after generation: what the step trains on, :class:`TrainItem` s with the
advantage, loss weight and loss form each paper prescribes) and ``add`` (after the update).
``sample(batch, policy_version, rng)`` -> :class:`ReplaySample` s remains for library use.

``mix(groups, step, rng, estimator)`` per method (``estimator`` is the run's group advantage):

- no buffer / :func:`fresh_items`: every group with ``estimator(group)``.
- FIFO: fresh groups as above, plus ``per_step`` uniformly drawn past rollouts with their stored
  advantage (a baseline, no paper).
- RePO: each batch prompt whose cache is warm adds ``num_replays`` cached rollouts as a second,
  separately normalised group (``adv_norm_mode: split``, unbiased std, +1e-4) or one G+R group
  (``mixed``); replayed rows weigh ``off_policy_loss_coef`` (SihengLi99/RePO
  ``src/replay_grpo_trainer.py`` L1135, L1452–1478, L1700; replay drawn before the cache update,
  L1349–1352).
- AR3PO: a group with no verified-correct member gets the newest cached correct response and the
  group is normalised again with it: ``[0, 0, 0, 0] + 1 → [−0.447 ×4, +1.789]`` under GRPO.
- ExGRPO: ``reserve`` picks ρ·B experience questions (bucket weights N(k; K/2, 1)); each such group
  is generated with K−1 fresh samples and ``mix`` adds the question's lowest-entropy stored
  trajectory (entropy under the current policy when the loop provides it) to make one group of K;
  the replayed row's loss is ``−A·f(w)``, ``f(w) = w/(w+0.1)``, ``w = π_θ/π_behaviour``, unclipped
  (ElliottYan/LUFFY ``ExGRPO/.../mix_core_alg.py`` L133–143, L189; collate L150–190).

Versions and lag: a record's ``policy_version`` string has no order, so lag is in trainer steps:
``lag = policy_version - rollout.step``, ``policy_version`` of :meth:`sample` the current step (int).

Restart: a buffer is a deterministic function of the rollouts added to it. ``add`` orders its input
canonically by (step, group_id, sample_index, rollout_id), so :meth:`rebuild` (``store.rollouts(...)``
in one call) reproduces a buffer fed step by step; ``state_dict()`` (ids per slot) compares the two.

Name → class table: :data:`BUFFERS`; factory: :func:`make_buffer`.
"""

from __future__ import annotations

from collections import OrderedDict, defaultdict, deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

from gfcr.records import Rollout
from gfcr.replay.maths import (  # noqa: F401  (re-exported: the buffers' pure maths)
    exgrpo_bucket_weight,
    is_correct,
    max_variance_subset,
    mean_token_nll,
    n_loss_tokens,
    repo_set_weights,
    shape_importance,
    split_advantages,
    stage_rng,
)

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


Advantage = float | np.ndarray
Estimator = Callable[[Sequence[Rollout]], list[Advantage]]
Entropy = Callable[[Sequence[Rollout]], np.ndarray]


@dataclass
class TrainItem:
    """One row of a policy update: a rollout, its advantage, and how the loss treats it.

    ``weight`` multiplies the row's loss (RePO's ``off_policy_loss_coef`` on replayed rows);
    ``shaping`` = γ switches the row to ExGRPO's shaped, unclipped loss ``−A·w/(w+γ)``;
    ``group`` names the set its advantage was normalised in; ``lag`` counts trainer steps since
    the rollout was generated (replayed rows; the loop re-measures it from policy versions).
    """

    rollout: Rollout
    advantage: Advantage
    weight: float = 1.0
    shaping: float | None = None
    group: str = ""
    replayed: bool = False
    lag: int = 0


def fresh_items(groups: Sequence[Sequence[Rollout]], estimator: Estimator) -> list[TrainItem]:
    """Every rollout of every group with its group's advantage (the no-replay batch)."""
    out = []
    for g in groups:
        if g:
            gid = g[0].group_id
            out += [TrainItem(r, a, 1.0, None, gid) for r, a in zip(g, estimator(list(g)), strict=True)]
    return out


def assemble(buffer: Any, kept: Sequence[Sequence[Rollout]], step: int, rng: np.random.Generator,
             estimator: Estimator, entropy: Entropy | None = None) -> list[TrainItem]:
    """A step's batch (the call of :mod:`gfcr.control.step`): ``buffer.mix``, or with no buffer :func:`fresh_items`."""
    return fresh_items(kept, estimator) if buffer is None else buffer.mix(kept, step, rng, estimator, entropy=entropy)


@runtime_checkable
class ReplayBuffer(Protocol):
    key: str

    def add(self, rollouts: Iterable[Rollout]) -> None: ...

    def reserve(self, n_prompts: int, step: int, rng: np.random.Generator) -> dict[str, int]: ...

    def mix(self, groups: Sequence[Sequence[Rollout]], step: int, rng: np.random.Generator, estimator: Estimator,
            entropy: Entropy | None = None) -> list[TrainItem]: ...

    def exclude(self) -> set[str]: ...

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

    def reserve(self, n_prompts: int, step: int, rng: np.random.Generator) -> dict[str, int]:
        """Prompts whose groups this step completes from replay → replayed members each (none here)."""
        return {}

    def exclude(self) -> set[str]:
        """Prompts the selector should no longer draw (ExGRPO's retired set; none here)."""
        return set()

    def mix(self, groups: Sequence[Sequence[Rollout]], step: int, rng: np.random.Generator, estimator: Estimator,
            entropy: Entropy | None = None) -> list[TrainItem]:
        return fresh_items(groups, estimator)

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

    def __init__(self, capacity: int = 4096, max_lag: int | None = None, per_step: int = 0):
        if capacity < 1:
            raise ValueError("FIFO: capacity must be >= 1")
        self.capacity, self.max_lag, self.per_step = capacity, max_lag, per_step
        self.items: deque[Rollout] = deque(maxlen=capacity)

    def mix(self, groups: Sequence[Sequence[Rollout]], step: int, rng: np.random.Generator, estimator: Estimator,
            entropy: Entropy | None = None) -> list[TrainItem]:
        """Fresh groups plus ``per_step`` past rollouts with the advantage stored when they were trained."""
        out = fresh_items(groups, estimator)
        for s in self.sample(self.per_step, step, rng) if self.per_step else []:
            out.append(TrainItem(s.rollout, float(s.rollout.signals.get("advantage", 0.0)),
                                 group=f"replay:{s.rollout.group_id}", replayed=True, lag=s.lag))
        return out

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

    Loss aggregation (``loss_sets``): RePO's ``compute_loss`` (``src/replay_grpo_trainer.py``
    L1669–1700) computes ``on_loss = _aggregate(ℓ, on_mask)`` and ``off_loss = _aggregate(ℓ,
    off_mask)`` and adds them, ``loss = on_loss + off_policy_loss_coef·off_loss``. Under
    ``loss_type: grpo`` (the authors' script) ``_aggregate`` is ``seq_loss.mean()`` over *all* B
    rows of the micro-batch (L1679–1681: rows outside the mask give 0 but count), so the two
    terms together are one mean over every row: ``pooled``, the default (4 fresh + 3 replayed
    rows weigh 1/7 each). Under ``loss_type: bnpo`` (token-mean) each term is a mean over its
    own tokens (L1683–1684): ``split`` gives that, each set averaged over its own rows (the
    run's seq-mean aggregations) or tokens (the run's ``loss.agg: token-mean``) and the two added, the
    paper's ``J_on + λ·J_off``: 4 fresh + 3 replayed rows weigh 1/4 and 1/3. It is done with
    the rows' loss weights (:func:`repo_set_weights`), exact when the step's batch is one
    mini-batch (``optim.mini_batch: null``, the default).
    """

    key = "repo"
    STRATEGIES = ("random", "highest", "recent", "variance")

    def __init__(self, strategy: str = "highest", num_replays: int = 8, max_cache_size: int = 16,
                 min_cache_to_replay: int = 16, adv_norm_mode: str = "split", off_policy_loss_coef: float = 1.0,
                 loss_sets: str = "pooled"):
        if strategy not in self.STRATEGIES:
            raise ValueError(f"RePO: strategy must be one of {self.STRATEGIES}, got {strategy!r}")
        if min_cache_to_replay > max_cache_size:
            raise ValueError("RePO: min_cache_to_replay cannot exceed max_cache_size (nothing would replay)")
        if adv_norm_mode not in ("split", "mixed"):
            raise ValueError(f"RePO: adv_norm_mode must be 'split' or 'mixed', got {adv_norm_mode!r}")
        self.strategy, self.num_replays = strategy, num_replays
        self.max_cache_size, self.min_cache_to_replay = max_cache_size, min_cache_to_replay
        if loss_sets not in ("pooled", "split"):
            raise ValueError(f"RePO: loss_sets must be 'pooled' or 'split', got {loss_sets!r}")
        self.adv_norm_mode, self.off_policy_loss_coef = adv_norm_mode, off_policy_loss_coef
        self.loss_sets = loss_sets
        self.loss_agg = "seq-mean-token-mean"  # the run's loss.agg (the loop sets it): rows or tokens for split
        super().__init__(max_cache_size)

    def mix(self, groups: Sequence[Sequence[Rollout]], step: int, rng: np.random.Generator, estimator: Estimator,
            entropy: Entropy | None = None) -> list[TrainItem]:
        """Each group, plus (warm cache) ``num_replays`` cached rollouts of its prompt as a second
        group ``<group>#replay`` normalised on its own (``split``: the fresh group keeps the run's
        estimator) or one group with the fresh samples (``mixed``: both normalised together)."""
        out: list[TrainItem] = []
        for g in groups:
            if not g:
                continue
            reps = self.replay_for(g[0].prompt_id, rng)
            if not reps:
                out += fresh_items([g], estimator)
                continue
            gid = g[0].group_id
            a_on, a_off = split_advantages([r.reward for r in g], [r.reward for r in reps], self.adv_norm_mode)
            on = estimator(list(g)) if self.adv_norm_mode == "split" else [float(a) for a in a_on]
            out += [TrainItem(r, a, group=gid) for r, a in zip(g, on, strict=True)]
            rgid = f"{gid}#replay" if self.adv_norm_mode == "split" else gid
            out += [TrainItem(r, float(a), self.off_policy_loss_coef, None, rgid, True, step - int(r.step))
                    for r, a in zip(reps, a_off, strict=True)]
        if self.loss_sets == "split":
            sizes = [n_loss_tokens(it.rollout) if self.loss_agg == "token-mean" else 1.0 for it in out]
            for it, w in zip(out, repo_set_weights([it.replayed for it in out], sizes, self.off_policy_loss_coef),
                             strict=True):
                it.weight = float(w)
        return out

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
    """ExGRPO, learning to reason from experience (arXiv 2510.02245; code ElliottYan/LUFFY ``ExGRPO/``).

    Rule (``experience_trainer_ops.py`` L22–63, ``mix_trainer_experience.py`` L375–390, L538):
    mixed-policy training switches on (for good) after the first step whose share of correct
    responses exceeds ``start_solved_ratio``; from the next step on, a question whose group has
    ``0 < k < K`` correct adds its new (unseen) correct trajectories to its experience and moves to
    bucket k; an all-correct group retires the question (experience dropped, never replayed, and
    :meth:`exclude` asks the selector to skip it). ``reserve`` draws ``int(ρ·B)`` questions (bucket
    weights ``N(k; K/2, σ)``); ``mix`` completes each one's group of K−1 fresh samples with its
    lowest-entropy trajectory (current-policy entropy when the loop passes ``entropy``, else the
    stored ``entropy`` signal) and marks that row for the shaped loss ``w/(w+γ)``.
    Departure: an experience group's replayed member is not counted in k at collection (the code
    counts it).
    """

    key = "exgrpo"

    @staticmethod
    def run_defaults(prompts_per_step: int, k: int) -> dict[str, Any]:
        """What a run with this buffer sets where its config is silent, as the authors' ``run_exgrpo.sh``:
        Dr.GRPO advantages (``grpo_use_std=False``), no clip (``loss_remove_clip``), Σ tokens / max length
        (``loss_remove_token_mean``), two optimizer steps a step (``ppo_mini_batch_size=64`` of
        ``train_batch_size=128``), and groups of the run's K."""
        return {"signals.advantage": "dr_grpo", "loss.clip": False, "loss.agg": "seq-mean-token-sum-norm",
                "optim.mini_batch": -(-prompts_per_step * k // 2), "replay.buffer.params.group_size": k}

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
        self.active = False
        self.reserved: list[str] = []

    def __len__(self) -> int:
        return len(self.experience)

    def clear(self) -> None:
        self.experience.clear()
        self.bucket.clear()
        self.retired.clear()
        self.active = False
        self.reserved = []

    def add(self, rollouts: Iterable[Rollout]) -> None:
        """Collect / retire per group, then switch mixed-policy mode on when the step's solved share
        passes the threshold; rollouts of several steps are taken step by step (so a rebuild from
        the store equals the live buffer)."""
        by_step: OrderedDict[int, list[Rollout]] = OrderedDict()
        for r in _canonical(rollouts):
            by_step.setdefault(int(r.step), []).append(r)
        for rs in by_step.values():
            for g in _groups(rs):
                self._collect(g)
            solved = float(np.mean([is_correct(r, self.success_threshold) for r in rs])) if rs else 0.0
            self.active = self.active or solved > self.start_solved_ratio

    def _collect(self, g: list[Rollout]) -> None:
        q = g[0].prompt_id
        if q in self.retired:
            return
        correct = [r for r in g if is_correct(r, self.success_threshold)]
        k, n = len(correct), len(g)
        if k == n:
            self.retired.add(q)
            self.experience.pop(q, None)
            self.bucket.pop(q, None)
        elif k > 0 and self.active:
            have = {tuple(r.generated_ids.tolist()) for r in self.experience.get(q, [])}
            new = [r for r in correct if tuple(r.generated_ids.tolist()) not in have]
            self.experience[q] = self.experience.get(q, []) + new
            self.bucket[q] = int(round(k / n * self.group_size))

    def exclude(self) -> set[str]:
        return set(self.retired)

    def n_experience(self, batch: int) -> int:
        """How many of a ``batch`` of questions come from experience: ``int(ρ·B)`` (the collate's truncation)."""
        return int(self.mix_ratio * batch)

    def reserve(self, n_prompts: int, step: int, rng: np.random.Generator) -> dict[str, int]:
        """``min(int(ρ·B), #questions with experience)`` questions for this step, one replayed member each."""
        n = min(self.n_experience(n_prompts), len(self.experience)) if self.active else 0
        self.reserved = self._draw(n, rng) if n else []
        return {q: 1 for q in self.reserved}

    def best(self, q: str, entropy: Entropy | None = None) -> Rollout:
        """The question's lowest-entropy stored trajectory (ties: smaller rollout id)."""
        cands = sorted(self.experience[q], key=lambda r: r.rollout_id)
        ent = np.asarray(entropy(cands)) if entropy is not None else np.array([self.entropy_fn(r) for r in cands])
        return cands[int(np.argmin(ent))]

    def mix(self, groups: Sequence[Sequence[Rollout]], step: int, rng: np.random.Generator, estimator: Estimator,
            entropy: Entropy | None = None) -> list[TrainItem]:
        """Reserved questions' groups (K−1 fresh) + their best trajectory, normalised as one group; the
        replayed row takes the shaped loss. Other groups as they are."""
        todo = [q for q in self.reserved if q in self.experience]
        out: list[TrainItem] = []
        for g in groups:
            if not g:
                continue
            q = g[0].prompt_id
            if q not in todo:
                out += fresh_items([g], estimator)
                continue
            todo.remove(q)
            best = self.best(q, entropy)
            adv = estimator(list(g) + [best])
            gid = g[0].group_id
            out += [TrainItem(r, a, group=gid) for r, a in zip(g, adv[:-1], strict=True)]
            out.append(TrainItem(best, adv[-1], 1.0, self.shaping_gamma, gid, True, step - int(best.step)))
        return out

    def sample(self, batch: int, policy_version: int, rng: np.random.Generator | None = None) -> list[ReplaySample]:
        """Up to ``batch`` distinct questions drawn by bucket weight, one lowest-entropy trajectory each."""
        return [ReplaySample(b, policy_version - int(b.step), 1.0, self.key)
                for b in map(self.best, self._draw(batch, rng or np.random.default_rng()))]

    def _draw(self, batch: int, rng: np.random.Generator) -> list[str]:
        """Up to ``batch`` distinct questions, each bucket ``k`` drawn with weight ``N(k; K/2, σ)``."""
        by_bucket: dict[int, list[str]] = defaultdict(list)
        for q in sorted(self.experience):
            by_bucket[self.bucket[q]].append(q)
        for b in by_bucket:
            by_bucket[b] = list(rng.permutation(by_bucket[b]))
        out: list[str] = []
        while len(out) < batch and by_bucket:
            keys = sorted(by_bucket)
            w = exgrpo_bucket_weight(np.array(keys), self.group_size, self.sigma)
            w = w / w.sum() if w.sum() > 0 else np.full(len(keys), 1.0 / len(keys))
            b = keys[rng.choice(len(keys), p=w)]
            out.append(str(by_bucket[b].pop()))
            if not by_bucket[b]:
                del by_bucket[b]
        return out

    def shape(self, w: np.ndarray | float) -> np.ndarray:
        return shape_importance(w, self.shaping_gamma)

    def state_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "experience": {q: [r.rollout_id for r in rs] for q, rs in sorted(self.experience.items())},
            "bucket": dict(sorted(self.bucket.items())),
            "retired": sorted(self.retired),
            "active": self.active,
        }


class AR3PO(_PerPromptCache):
    """AR3PO, adaptive rollout and response reuse (arXiv 2509.25808).

    Rule: cache verified-correct responses per prompt (``verified is True`` only: a reward alone
    is not enough); when a prompt's group has no correct response, add one cached correct
    response so the group's advantage is non-zero. Its adaptive rollout (sample in stages, stop a
    prompt at its first correct response) is the ``ar3po`` group policy (:mod:`gfcr.control.policies`).
    Departures (NOT FOUND in the reference): cache size per prompt (``max_per_prompt`` = 4, the
    newest kept) and which cached response is injected (the newest).
    """

    key = "ar3po"

    @staticmethod
    def run_defaults(prompts_per_step: int, k: int) -> dict[str, Any]:
        """What a run with this buffer sets where its config is silent: the staged rollout (AR3PO is both)."""
        return {"control.group": "ar3po"}

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

    def mix(self, groups: Sequence[Sequence[Rollout]], step: int, rng: np.random.Generator, estimator: Estimator,
            entropy: Entropy | None = None) -> list[TrainItem]:
        """Each all-wrong group with a cached correct response gets it, and the group is normalised
        again with it (GRPO: ``[0, 0, 0, 0] + 1 → [−0.447 ×4, +1.789]``); other groups as they are."""
        out: list[TrainItem] = []
        for g in groups:
            merged, inj = self.inject(g, step)
            if inj is None:
                out += fresh_items([g], estimator)
                continue
            adv = estimator(merged)
            gid = g[0].group_id
            out += [TrainItem(r, a, group=gid) for r, a in zip(g, adv[:-1], strict=True)]
            out.append(TrainItem(inj.rollout, adv[-1], group=gid, replayed=True, lag=inj.lag))
        return out


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
