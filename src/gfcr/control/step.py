"""One RL step's Control sequence, the one ``gfcr train`` and ``gfcr simulate`` both run.

A step is::

    sampler  = StepSampler(step, selector, pool, rng_for, world, buffer) # this module
    col      = policy.collect(sampler, n, K)                             # gfcr.control.policies
    items    = assemble(buffer, col.kept, step, rng_for("replay"), est)  # gfcr.replay.buffers
    ... update the learner on items ...
    observe_step(selector, policy, buffer, col.generated, col.kept, step)  # this module

Only the *world* differs: in ``gfcr train`` it is :class:`gfcr.train.collect.StepCollector`
(topology over the engine, verifier, reward, teachers, partial rollouts); in ``gfcr simulate`` it is
a simulated world whose per-prompt success probabilities are given (:mod:`gfcr.sim.simulator`).
The learner differs too (a policy update; a logit step). What reaches the learner is the same
calls on the same objects, so simulated and trained behaviour cannot drift apart (tested:
``tests/sim/test_same_batch.py``).

Example: a pool of 4 prompts, ExGRPO's buffer reserves ``{"p3": 1}`` (one stored correct
response of p3), ``select(2)`` → ``["p3", <one selector draw other than p3>]``; the first
``generate`` asks the world for ``K − 1`` samples of p3 and K of the other.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from gfcr.records import GENERATED, Rollout

Group = list[Rollout]


class World(Protocol):
    """One generation round: ``sizes[p]`` samples of each prompt, verified and rewarded, as groups
    (one per prompt, in ``prompt_ids`` order unless the world says otherwise); ``rnd`` counts the
    step's rounds from 0."""

    def __call__(self, prompt_ids: list[str], sizes: dict[str, int], rnd: int) -> list[Group]: ...


@contextlib.contextmanager
def _untimed(name: str) -> Iterator[None]:
    yield


class StepSampler:
    """The :class:`~gfcr.control.policies.Sampler` of one step.

    ``select(n)``: on the first call the buffer's ``reserve`` (prompts whose group replay completes)
    comes first, then the selector's draw of ``n − reserved`` skipping what the buffer excludes,
    what is reserved and what this step already drew (DAPO's refill rounds draw the epoch's next
    prompts, issue 47). Each call draws with ``rng_for("select<i>")``; the reservation with
    ``rng_for("reserve")``. ``generate(prompt_ids, sizes)``: one round of the world; in round 0 a
    reserved prompt's K shrinks by its reserved count (at least 1).
    """

    def __init__(self, step: int, selector: Any, pool: Collection[str], rng_for: Callable[[str], np.random.Generator],
                 world: World, buffer: Any = None, timer: Callable[[str], Any] = _untimed):
        self.step, self.selector, self.pool, self.rng_for, self.world = step, selector, pool, rng_for, world
        self.buffer, self.timer = buffer, timer
        self.selects = self.rounds = 0
        self.reserved: dict[str, int] = {}
        self.drawn: set[str] = set()

    def select(self, n: int) -> list[str]:
        with self.timer("select"):
            first = self.selects == 0
            if first and self.buffer is not None:
                self.reserved = self.buffer.reserve(n, self.step, self.rng_for("reserve"))
            skip = (self.buffer.exclude() if self.buffer is not None else set()) | set(self.reserved) | self.drawn
            want = n - len(self.reserved) if first else n
            ask = min(len(self.pool), want + len(skip & self.pool))
            got = self.selector.select(ask, self.rng_for(f"select{self.selects}"))
            self.selects += 1
            fresh = [p for p in got if p not in skip][: max(want, 0)]
            self.drawn.update(fresh)
            return (list(self.reserved) if first else []) + fresh

    def generate(self, prompt_ids: Sequence[str], sizes: Mapping[str, int]) -> list[Group]:
        rnd = self.rounds
        self.rounds += 1
        sizes = dict(sizes)
        if rnd == 0:  # a reserved prompt's group is completed from replay
            sizes = {p: max(1, k - self.reserved.get(p, 0)) for p, k in sizes.items()}
        return self.world(list(prompt_ids), sizes, rnd)


def scalar_advantage(r: Rollout, a: Any) -> float:
    """A rollout's advantage as one number: the float, or a per-token array's mean over generated tokens."""
    a = np.asarray(a, dtype=np.float64)
    if a.ndim == 0:
        return float(a)
    gen = np.asarray(r.token_role) == GENERATED
    return float(a[gen].mean()) if gen.any() else 0.0


def stamp_advantages(generated: Sequence[Group], fresh: Sequence[Any], estimator: Callable[[Group], list[Any]]) -> None:
    """``signals["advantage"]``: what each rollout was trained with (a fresh batch row's advantage; its
    group's estimate when it was not trained). The loop's append stage; what the FIFO buffer replays."""
    for g in generated:
        for r, a in zip(g, estimator(g), strict=True):
            r.signals["advantage"] = scalar_advantage(r, a)
    for it in fresh:
        it.rollout.signals["advantage"] = scalar_advantage(it.rollout, it.advantage)


def observe_step(selector: Any, policy: Any, buffer: Any, generated: Sequence[Group], kept: Sequence[Group],
                 step: int) -> None:
    """What a step teaches Control: the selector sees each generated group's decisions
    (``policy.decide``, the verdict by default), the group policy its groups, the buffer the kept
    rollouts."""
    for g in generated:
        selector.observe(g[0].prompt_id, [policy.decide(r) for r in g], step)
    policy.observe(generated)
    if buffer is not None:
        buffer.add([r for g in kept for r in g])
