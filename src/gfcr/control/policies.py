"""Group policies (Control): how many samples each prompt gets, how many sampling rounds run, and
which samples of a group survive into the batch. The training loop and the simulator call them
through :class:`GroupPolicy` without knowing which method is behind it.

A policy drives a :class:`Sampler` (:class:`gfcr.control.step.StepSampler` over the caller's world:
the loop's generate → verify → reward, the simulator's scripted draws) and returns a
:class:`Collected` (every generated group, the surviving groups, counters). Decisions read
``decide(rollout)``: the verdict (:func:`gfcr.records.accuracy`) by default, the shaped
reward with ``decide_on="reward"``.

=====================  ===============================================================================
name                   rule
=====================  ===============================================================================
``single`` (default)   one round: ``n`` prompts × K samples, every group survives
``adaptive_k``         :class:`AdaptiveK`: the ``n·K`` budget split by each
                       prompt's Beta(1 + verified, 1 + failed) posterior over the run's earlier rollouts
``dynamic_sampling``   DAPO (arXiv 2503.14476): rounds of ``gen_prompts`` prompts until
                       ``train_prompts`` groups whose *accuracy* varies (verl recipe
                       ``dapo_ray_trainer.py``: ``filter_groups.metric: acc``), at most
                       ``max_num_gen_batches`` rounds
``gfpo``               GFPO (arXiv 2508.09726): sample K, keep the ``k`` shortest (or most accurate
                       per token); advantages are then normalised over the survivors only
``ar3po``              AR3PO's adaptive rollout (arXiv 2509.25808): ``stages`` rounds of
                       ``per_stage`` samples, a prompt stops being sampled once one is correct; its
                       stages form one group
``starpo_s``           RAGEN's StarPO-S (arXiv 2504.20073): one round, keep the ``int(ratio·n)`` groups
                       with the highest reward std (``kind: std``; ``std_rev`` the lowest)
=====================  ===============================================================================

One class per method, named after its paper, holds its rule, its defaults (the ``__init__``
keywords, what ``control.group_params`` sets) and its policy (``collect``/``observe``); the pure
maths it uses is in :mod:`gfcr.control.groups`. Table :data:`GROUP_POLICIES` (the one name table of
the family, read by ``gfcr train`` and ``gfcr simulate``); factory :func:`make_group_policy`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import numpy as np

from gfcr.control.greso_rules import greso_batch_size
from gfcr.control.groups import (
    DynamicSamplingResult,
    allocate_k,
    beta_variance_weight,
    gfpo_advantages,
    gfpo_keep,
    has_variance,
)
from gfcr.records import Rollout, accuracy

Group = list[Rollout]
G = TypeVar("G")


def decider(decide_on: str) -> Callable[[Rollout], float]:
    """What Control decisions read: ``accuracy`` (the verdict; default) or ``reward`` (the shaped reward)."""
    if decide_on == "accuracy":
        return accuracy
    if decide_on == "reward":
        return lambda r: float(r.reward)
    raise ValueError(f"decide_on must be 'accuracy' or 'reward', got {decide_on!r}")


class Sampler(Protocol):
    """What a group policy drives: prompt selection and one generation round."""

    def select(self, n: int) -> list[str]: ...

    def generate(self, prompt_ids: Sequence[str], sizes: Mapping[str, int]) -> list[Group]: ...


@dataclass
class Collected:
    """One step's collection: every generated group, the surviving groups, and counters."""

    generated: list[Group]
    kept: list[Group]
    info: dict[str, float] = field(default_factory=dict)


class GroupPolicy(Protocol):
    decide: Callable[[Rollout], float]  # what its decisions read (the loop's selector observes the same)

    def collect(self, sampler: Sampler, n_prompts: int, k: int) -> Collected: ...

    def observe(self, generated: Sequence[Group]) -> None: ...


class _Stateless:
    decide: Callable[[Rollout], float] = staticmethod(accuracy)

    def observe(self, generated: Sequence[Group]) -> None:
        return None


class SingleRound(_Stateless):
    """One round of ``n`` prompts × K samples; every group survives."""

    def __init__(self, decide_on: str = "accuracy"):
        self.decide = decider(decide_on)

    def collect(self, sampler: Sampler, n_prompts: int, k: int) -> Collected:
        pids = sampler.select(n_prompts)
        groups = sampler.generate(pids, {p: k for p in pids})
        return Collected(groups, list(groups))


class AdaptiveK:
    """Adaptive samples per prompt: spend the group budget where the outcome is most uncertain.

    Rule: ``K_i ∝ E[p_i(1-p_i)]`` under each prompt's Beta(1 + verified, 1 + failed) posterior over the
    run's earlier rollouts (:func:`~gfcr.control.groups.beta_variance_weight`), the step's ``n·K``
    budget split by :func:`~gfcr.control.groups.allocate_k`, each K_i in [k_min, k_max]; ``observe``
    adds a step's outcomes (rebuilt from the store on resume). Source: the per-prompt Beta posterior
    of VADE (arXiv 2511.18902) applied to the group size instead of the prompt choice; no single paper
    in our references states this exact rule, so the proportional-to-variance allocation is our choice.
    """

    def __init__(self, k_min: int = 2, k_max: int = 16, decide_on: str = "accuracy"):
        self.k_min, self.k_max = k_min, k_max
        self.decide = decider(decide_on)
        self.outcomes: dict[str, tuple[int, int]] = {}

    def allocate(self, alpha: Sequence[float], beta: Sequence[float], budget: int) -> np.ndarray:
        """(N,) int samples per prompt summing to ``budget`` (within the caps)."""
        return allocate_k(beta_variance_weight(np.asarray(alpha), np.asarray(beta)), budget, self.k_min, self.k_max)

    def sizes(self, prompt_ids: Sequence[str], k: int) -> dict[str, int]:
        a = np.array([1.0 + self.outcomes.get(p, (0, 0))[0] for p in prompt_ids])
        b = np.array([1.0 + self.outcomes.get(p, (0, 0))[1] for p in prompt_ids])
        ks = self.allocate(a, b, len(prompt_ids) * k)
        return {p: int(n) for p, n in zip(prompt_ids, ks, strict=True)}

    def collect(self, sampler: Sampler, n_prompts: int, k: int) -> Collected:
        pids = sampler.select(n_prompts)
        groups = sampler.generate(pids, self.sizes(pids, k))
        sizes = [len(g) for g in groups] or [0]
        return Collected(groups, list(groups), {"k_min": float(min(sizes)), "k_max": float(max(sizes)),
                                                "k_mean": float(np.mean(sizes))})

    def observe(self, generated: Sequence[Group]) -> None:
        for g in generated:  # a group is one prompt's samples
            for p in {r.prompt_id for r in g}:
                wins = sum(self.decide(r) >= 0.5 for r in g if r.prompt_id == p)
                ok, bad = self.outcomes.get(p, (0, 0))
                self.outcomes[p] = (ok + wins, bad + sum(r.prompt_id == p for r in g) - wins)


class DynamicSampling(_Stateless):
    """DAPO dynamic sampling (arXiv 2503.14476): oversample, keep groups whose decisions (accuracy) vary,
    refill until the train batch is full or ``max_num_gen_batches`` generation rounds ran.

    Rule (:meth:`refill`): ``while kept < train_prompts and rounds < max_num_gen_batches: gen_prompts
    groups → keep std > 0``; the batch is cut to ``train_prompts`` groups. When the cap is hit the
    (short) batch is returned with ``reached_target=False`` instead of raising, so the caller decides.

    ``train_prompts`` / ``gen_prompts`` default to the step's ``n`` prompts (verl's recipe draws
    3× as many per round; set ``gen_prompts`` for that). A refill round draws only prompts the
    step has not drawn yet: the recipe (verl ``recipe/dapo/dapo_ray_trainer.py``) refills with
    ``continue`` inside ``for batch_dict in self.train_dataloader``, i.e. the epoch's next prompts,
    never one drawn before in the epoch. The step's sampler (:class:`gfcr.control.step.StepSampler`)
    excludes them; a round left with no prompt (the pool used up) generates nothing.
    ``adaptive_gen``: GRESO's adaptive generation batch (:func:`~gfcr.control.greso_rules.greso_batch_size`,
    arXiv 2506.02177): a round draws ``remaining responses / (1 − zv) / K · 1.25`` prompts, clipped to
    [train_prompts / 4, gen_prompts], with zv the zero-variance share of the latest round (0.5 at first).
    """

    def __init__(self, train_prompts: int | None = None, gen_prompts: int | None = None,
                 max_num_gen_batches: int = 10, adaptive_gen: bool = False, decide_on: str = "accuracy"):
        if train_prompts is not None and train_prompts < 1:
            raise ValueError("DynamicSampling: train_prompts must be >= 1")
        if max_num_gen_batches < 1:
            raise ValueError("DynamicSampling: max_num_gen_batches must be >= 1")
        self.train_prompts, self.gen_prompts, self.max_rounds = train_prompts, gen_prompts, max_num_gen_batches
        self.adaptive_gen, self.zero_var_recent = adaptive_gen, 0.5
        self.decide = decider(decide_on)

    def refill(self, generate: Callable[[int], list[G]], rewards_of: Callable[[G], Sequence[float]] | None = None,
               train_prompts: int | None = None, gen_prompts: int | None = None) -> DynamicSamplingResult[G]:
        """Call ``generate(gen_prompts)`` (returns groups) until the batch is full or the cap hits.

        ``rewards_of(group)`` gives what a group's test reads; by default a group is a list of objects
        with a ``reward`` attribute. ``train_prompts`` / ``gen_prompts`` default to this object's (and
        ``gen_prompts`` to ``train_prompts``).
        """
        rewards_of = rewards_of or (lambda g: [r.reward for r in g])  # type: ignore[attr-defined]
        train = train_prompts or self.train_prompts or 1
        gen = gen_prompts or self.gen_prompts or train
        kept: list[G] = []
        n_gen = n_groups = n_zero = 0
        while len(kept) < train and n_gen < self.max_rounds:
            groups = generate(gen)
            n_gen += 1
            n_groups += len(groups)
            for g in groups:
                if has_variance(rewards_of(g)):
                    kept.append(g)
                else:
                    n_zero += 1
        return DynamicSamplingResult(kept[:train], n_gen, n_groups, n_zero, max(len(kept) - train, 0), len(kept) >= train)

    def collect(self, sampler: Sampler, n_prompts: int, k: int) -> Collected:
        train, gen = self.train_prompts or n_prompts, self.gen_prompts or n_prompts
        generated: list[Group] = []
        kept = [0]

        def one_round(n: int) -> list[Group]:
            if self.adaptive_gen:
                n = greso_batch_size((train - kept[0]) * k, self.zero_var_recent, k, gen, min_bs=max(1, train // 4))
            pids = sampler.select(n)
            if not pids:  # every prompt of the pool was drawn this step
                return []
            groups = sampler.generate(pids, {p: k for p in pids})
            generated.extend(groups)
            if self.adaptive_gen and groups:  # GRESO's batch size reads the round's zero-variance share
                live = sum(has_variance([self.decide(r) for r in g]) for g in groups)
                kept[0] += live
                self.zero_var_recent = 1.0 - live / len(groups)
            return groups

        res = self.refill(one_round, lambda g: [self.decide(r) for r in g], train, gen)
        return Collected(generated, res.groups, {"ds_rounds": float(res.n_gen_batches),
                                                 "ds_reached_target": float(res.reached_target)})

    def observe(self, generated: Sequence[Group]) -> None:
        """GRESO's zero-variance share of the step's last round (``meta["round"]``), so a resumed run
        rebuilt from the store draws the batch sizes an uninterrupted one draws."""
        if not self.adaptive_gen or not generated:
            return
        last = max(int(g[0].meta.get("round", 0)) for g in generated)
        rnd = [g for g in generated if int(g[0].meta.get("round", 0)) == last]
        self.zero_var_recent = 1.0 - sum(has_variance([self.decide(r) for r in g]) for g in rnd) / len(rnd)


class GFPO(_Stateless):
    """GFPO, Group Filtered Policy Optimization (arXiv 2508.09726): sample a larger group, train on
    the top k by length or by accuracy per token; adaptive k by difficulty.

    Rule: keep :func:`~gfcr.control.groups.gfpo_keep` (``length``: shortest; ``token_efficiency``: highest
    accuracy per token); advantages are then normalised over the kept set only. Adaptive: k from the
    group's mean accuracy: >= 0.75 easy, >= 0.5 medium, >= 0.25 hard, else very hard (k 4/6/8/8 for
    G=16, the verl recipe's counts). Departure: the paper assigns difficulty by quartiles of an online
    estimate; we use fixed mean-accuracy bins (``bins``).
    """

    def __init__(self, k: int = 8, metric: str = "length", adaptive: bool = False,
                 adaptive_k: Sequence[int] = (4, 6, 8, 8), bins: Sequence[float] = (0.75, 0.5, 0.25),
                 decide_on: str = "accuracy"):
        if len(adaptive_k) != 4 or len(bins) != 3:
            raise ValueError("GFPO: adaptive_k needs 4 counts (easy..very hard) and bins 3 thresholds")
        self.k, self.metric, self.adaptive = k, metric, adaptive
        self.adaptive_k, self.bins = tuple(adaptive_k), tuple(bins)
        self.decide = decider(decide_on)

    def k_for(self, rewards: Sequence[float]) -> int:
        if not self.adaptive:
            return self.k
        m = float(np.mean(rewards))
        for thr, kk in zip(self.bins, self.adaptive_k, strict=False):
            if m >= thr:
                return kk
        return self.adaptive_k[-1]

    def filter(self, rewards: Sequence[float], lengths: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """(kept indices (k,), advantages (G,)) for one group."""
        k = min(self.k_for(rewards), len(rewards))
        kept = gfpo_keep(rewards, lengths, k, self.metric)
        return kept, gfpo_advantages(rewards, kept)

    def survivors(self, g: Group) -> Group:
        acc = [self.decide(r) for r in g]
        k = min(self.k_for(acc), len(g))
        return [g[i] for i in sorted(gfpo_keep(acc, [r.n_generated for r in g], k, self.metric).tolist())]

    def collect(self, sampler: Sampler, n_prompts: int, k: int) -> Collected:
        pids = sampler.select(n_prompts)
        groups = sampler.generate(pids, {p: k for p in pids})
        return Collected(groups, [self.survivors(g) for g in groups])


class AR3POPolicy(_Stateless):
    """AR3PO adaptive rollout: ``stages`` rounds of ``per_stage`` samples (default K); prompts with a
    correct sample leave the pool. A prompt's stages become one group (its first stage's
    ``group_id``, sample indices continued). Stage count and size are NOT FOUND in the paper's
    public text; defaults are ours."""

    def __init__(self, stages: int = 2, per_stage: int | None = None, decide_on: str = "accuracy"):
        if stages < 1:
            raise ValueError("ar3po: stages must be >= 1")
        self.stages, self.per_stage = stages, per_stage
        self.decide = decider(decide_on)

    def collect(self, sampler: Sampler, n_prompts: int, k: int) -> Collected:
        per = self.per_stage or k
        pids = sampler.select(n_prompts)
        merged: dict[str, Group] = {}
        todo = list(pids)
        rounds = 0
        for _ in range(self.stages):
            if not todo:
                break
            rounds += 1
            for g in sampler.generate(todo, {p: per for p in todo}):
                first = merged.setdefault(g[0].prompt_id, [])
                for r in g:
                    if first:
                        r.group_id, r.sample_index = first[0].group_id, len(first)
                    first.append(r)
            todo = [p for p in todo if not any(self.decide(r) >= 0.5 for r in merged.get(p, []))]
        groups = [merged[p] for p in pids if p in merged]
        return Collected(groups, list(groups), {"ar3po_stages": float(rounds),
                                                "samples_per_prompt": float(np.mean([len(g) for g in groups]))})


def starpo_s_keep(rewards: Sequence[Sequence[float]], ratio: float = 0.25, kind: str = "std") -> list[int]:
    """StarPO-S trajectory filtering: indices of the ``int(ratio · n_groups)`` groups with the highest
    (``std``) or lowest (``std_rev``) unbiased reward std, highest first (ties: the earlier group).

    RAGEN-AI/RAGEN ``ragen/trainer/agent_trainer.py`` ``_filter_rollout`` (L461–500):
    ``in_group_std = rm_scores.std(-1)`` (torch: unbiased), ``top_groups = in_group_std.topk(int(ratio ·
    num_groups))``; ``ratio = 1`` keeps every group; ``config/base.yaml``: ratio 0.25, type std.
    Shapes: n_groups lists of K → list. Example: rewards [[1, 0, 1, 0], [1, 1, 1, 1], [0, 0, 0, 1],
    [1, 0, 0, 0]], ratio 0.5 → stds [0.577, 0, 0.5, 0.5] → [0, 2].
    """
    if kind not in ("std", "std_rev"):
        raise ValueError(f"StarPO-S: kind must be 'std' or 'std_rev', got {kind!r}")
    if not 0.0 < ratio <= 1.0:
        raise ValueError(f"StarPO-S: ratio must be in (0, 1], got {ratio}")
    n = len(rewards)
    if ratio == 1.0:
        return list(range(n))
    std = np.array([np.std(g, ddof=1) if len(g) > 1 else 0.0 for g in rewards])
    order = np.argsort(-std if kind == "std" else std, kind="stable")
    return [int(i) for i in order[: int(ratio * n)]]


class StarPOSPolicy(_Stateless):
    """StarPO-S (RAGEN, arXiv 2504.20073) variance filtering for multi-turn (or any) groups: one round of
    ``n`` prompts × K, then only the ``int(ratio · n)`` groups whose trajectory rewards vary most
    (:func:`starpo_s_keep`) train. Reads the trajectory reward (``rollout.reward``, RAGEN's summed
    ``rm_scores``), not ``decide_on``. Departure: RAGEN filters env groups that share one seed; here a
    group is a prompt's K episodes, the same thing under the multi_turn topology."""

    def __init__(self, ratio: float = 0.25, kind: str = "std", decide_on: str = "accuracy"):
        starpo_s_keep([], ratio, kind)  # checks the parameters
        self.ratio, self.kind = ratio, kind
        self.decide = decider(decide_on)

    def collect(self, sampler: Sampler, n_prompts: int, k: int) -> Collected:
        pids = sampler.select(n_prompts)
        groups = sampler.generate(pids, {p: k for p in pids})
        keep = starpo_s_keep([[float(r.reward) for r in g] for g in groups], self.ratio, self.kind)
        return Collected(groups, [groups[i] for i in sorted(keep)], {"starpo_kept_groups": float(len(keep))})


GROUP_POLICIES: dict[str, Callable[..., Any]] = {
    "single": SingleRound,
    "adaptive_k": AdaptiveK,
    "dynamic_sampling": DynamicSampling,
    "gfpo": GFPO,
    "ar3po": AR3POPolicy,
    "starpo_s": StarPOSPolicy,
}


def make_group_policy(name: str | None, decide_on: str = "accuracy", **params: Any) -> GroupPolicy:
    """Build a group policy by its name in :data:`GROUP_POLICIES` (``None`` = ``single``)."""
    try:
        cls = GROUP_POLICIES[name or "single"]
    except KeyError:
        raise ValueError(f"unknown group policy {name!r}; choose one of {sorted(GROUP_POLICIES)}") from None
    return cls(decide_on=decide_on, **params)
