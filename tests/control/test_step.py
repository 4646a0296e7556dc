"""gfcr.control.step.StepSampler on a hand-made selector, buffer and world: the selection rules both
``gfcr train`` and ``gfcr simulate`` use (reservations first, exclusions, no redraw within a step,
K − reserved for a reserved prompt's first round)."""

from __future__ import annotations

import numpy as np

from gfcr.control.step import StepSampler, observe_step
from gfcr.testing import make_rollout


class Ordered:
    """A selector that offers the pool in a fixed order and records what it observes."""

    def __init__(self, pool):
        self.pool, self.seen = list(pool), []

    def select(self, n, rng):
        return self.pool[:n]

    def observe(self, prompt_id, rewards, step):
        self.seen.append((prompt_id, list(rewards), step))


class Buffer:
    def __init__(self):
        self.added = []

    def reserve(self, n, step, rng):
        return {"p3": 1}

    def exclude(self):
        return {"p0"}

    def add(self, rollouts):
        self.added += [r.rollout_id for r in rollouts]


def test_reserve_first_exclusions_no_redraw_and_reserved_k():
    asked = []

    def world(prompt_ids, sizes, rnd):
        asked.append((list(prompt_ids), dict(sizes), rnd))
        return [[make_rollout(i, prompt=p, rollout_id=f"{p}-{rnd}-{i}") for i in range(sizes[p])] for p in prompt_ids]

    sel, buf = Ordered(["p0", "p1", "p2", "p3", "p4"]), Buffer()
    s = StepSampler(5, sel, set(sel.pool), lambda label: np.random.default_rng(0), world, buf)
    first = s.select(3)
    assert first == ["p3", "p1", "p2"]  # the reservation, then the selector skipping p0 (excluded) and p3
    s.generate(first, {p: 4 for p in first})
    assert asked[0] == (["p3", "p1", "p2"], {"p3": 3, "p1": 4, "p2": 4}, 0)  # K − 1 for the reserved prompt
    assert s.select(3) == ["p4"]  # a refill draws only what the step has not drawn
    s.generate(["p4"], {"p4": 4})
    assert asked[1] == (["p4"], {"p4": 4}, 1)  # later rounds keep K


def test_observe_step_feeds_selector_policy_and_buffer():
    class Policy:
        def decide(self, r):
            return float(r.verified)

        def observe(self, generated):
            self.generated = generated

    sel, buf, pol = Ordered(["a"]), Buffer(), Policy()
    g = [make_rollout(i, prompt="a", verified=i == 0, rollout_id=f"a{i}") for i in range(2)]
    observe_step(sel, pol, buf, [g], [g[:1]], 7)
    assert sel.seen == [("a", [1.0, 0.0], 7)] and pol.generated == [g] and buf.added == ["a0"]
