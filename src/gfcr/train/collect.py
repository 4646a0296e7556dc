"""The world of a training step: :class:`StepCollector`, built once per run from the engine, the
generation config (topology), the verifier, the reward composition, the teachers and the partial
rollout pool. One call is one generation round of :mod:`gfcr.control.step`'s sequence:

    generate  Topology over the engine (K per prompt; prompts sharing a K share an engine call); with
              ``retrieve:``, each prompt first gets its retrieved seeds (gfcr.train.seeding)
    verify    Verifier.verify → verdict, format signal, RewardComposition.apply per group
    teacher   with a distill section: each task's teacher scores every generated token
    entropy   ``signals["entropy"]`` where the engine did not report it (one no-grad forward)

A step replayed from the store (a crash between append and checkpoint) returns the stored
rollouts of each round instead of generating, and checks they are the ones this run would have
drawn. The collector never reads the run that built it: the run hands it the step, the policy
version and the stored rollouts (:meth:`StepCollector.begin`), and it hands back groups.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from gfcr.control.step import StepSampler
from gfcr.records import Rollout
from gfcr.train import dist
from gfcr.train.run_setup import TrainError
from gfcr.train.sampling import StageTimer, final_turn_text, step_rng, version_number


class StepCollector:
    """Generation, verdict, reward, teacher and entropy for one round (a :class:`~gfcr.control.step.World`).

    ``entropy`` is the trainer's ``rollout_entropy`` (rollouts → (N,) nats); ``partial`` a
    :class:`gfcr.control.partial.PartialPool` or None; ``seeder`` a :class:`gfcr.train.seeding.StepSeeder`
    (``retrieve:``; the prompts of every round get their retrieved seeds) or None.
    """

    def __init__(self, cfg: Any, run_id: str, engine: Any, prompt_by_id: dict[str, Any], verifier: Any,
                 format_verifier: Any, reward: Any, teachers: Any = None, partial: Any = None,
                 entropy: Callable[[list[Rollout]], np.ndarray] | None = None, seeder: Any = None):
        self.cfg, self.run_id, self.engine, self.prompt_by_id = cfg, run_id, engine, prompt_by_id
        self.seeder = seeder
        self.verifier, self.format_verifier, self.reward = verifier, format_verifier, reward
        self.teachers, self.partial, self.rollout_entropy = teachers, partial, entropy
        self.partial_rounds: dict[str, Any] = {}  # this step's returned groups per round (partial_pending.arrow)
        self.step, self.policy_version, self.stored, self.timer = 0, "s0", None, StageTimer()

    def begin(self, step: int, policy_version: str, timer: StageTimer,
              stored: dict[int, list[Rollout]] | None = None) -> None:
        """Start step ``step`` (``stored``: round → the rollouts a crashed attempt already appended)."""
        self.step, self.policy_version, self.timer, self.stored = step, policy_version, timer, stored

    def sampler(self, selector: Any, buffer: Any) -> StepSampler:
        """The step's :class:`~gfcr.control.step.StepSampler` over this collector."""
        seed, step = self.cfg.seed, self.step
        return StepSampler(step, selector, self.prompt_by_id.keys(), lambda label: step_rng(seed, step, label),
                           self, buffer, self.timer)

    def __call__(self, prompt_ids: list[str], sizes: dict[str, int], rnd: int) -> list[list[Rollout]]:
        """One round: stored rollouts, or generate → verify → teacher → entropy (each timed)."""
        if self.stored is not None:
            return self.from_store(rnd, prompt_ids)
        with self.timer("generate"):
            groups = self.generate_groups(list(prompt_ids), dict(sizes), self.step, rnd)
        with self.timer("verify"):
            self.verify(groups)
        if self.teachers is not None:
            with self.timer("teacher"):
                self.score_teacher(groups)
        if self.cfg.signals.entropy:
            with self.timer("entropy"):
                self.entropy(groups)
        return groups

    def from_store(self, rnd: int, prompt_ids: list[str]) -> list[list[Rollout]]:
        """Round ``rnd`` of a step the store already holds, grouped by prompt in selection order."""
        if self.partial is not None:
            return self.partial_from_store(self.step, rnd, list(prompt_ids), self.stored)
        rows = self.stored.get(rnd, [])
        by: dict[str, list[Rollout]] = {}
        for r in sorted(rows, key=lambda r: (r.group_id, r.sample_index)):
            by.setdefault(r.prompt_id, []).append(r)
        if sorted(by) != sorted(set(prompt_ids)):
            raise TrainError(f"step {self.step} round {rnd}: the store holds rollouts of prompts {sorted(by)[:4]}, but the "
                             f"resumed run selects {sorted(prompt_ids)[:4]}; the run cannot continue exactly (start a new run)")
        self.reward.seed_ref_accuracy(rows)
        return [by[p] for p in dict.fromkeys(prompt_ids)]

    # --- the stages ---------------------------------------------------------------------------
    def generate_groups(self, prompt_ids: list[str], sizes: dict[str, int], step: int, rnd: int) -> list[list[Rollout]]:
        """The topology over the engine, K per prompt from ``sizes`` (prompts sharing a K share an engine
        call); later rounds get their own seed and ``#r<round>`` group ids; ``meta["round"]`` is set."""
        from gfcr.generate.engines.base import SamplingParams
        from gfcr.generate.run import build_topology

        g = self.cfg.generate
        cap = g.max_tokens if self.partial is None else min(g.max_tokens, self.partial.budget)  # Kimi's per-step budget
        params = SamplingParams(temperature=g.temperature, top_p=g.top_p, max_tokens=cap,
                                repeat_ngram=g.repeat_ngram, repeat_max=g.repeat_max)
        mine = dist.shard(prompt_ids)  # data parallel: each rank samples its share, every rank gets all
        prompt = self.prompt_by_id
        if self.seeder is not None:  # retrieval-guided seeds: the run's solved cases so far as earlier turns
            if rnd == 0:
                self.seeder.refresh(step)
            prompt = {p.prompt_id: p for p in self.seeder.seed([self.prompt_by_id[p] for p in mine])}
        rs: list[Rollout] = []
        for k in sorted({sizes[p] for p in mine}):
            topo = build_topology(g.topology, params, self.cfg.seed * 1000 + rnd, k=k)
            rs += topo.generate(self.engine, [prompt[p] for p in mine if sizes[p] == k], self.run_id, step)
        if self.seeder is not None:
            for r in rs:
                r.meta["retrieved"] = list(prompt[r.prompt_id].meta["retrieved"])
        if len({sizes[p] for p in mine}) > 1 or dist.world() > 1:
            order = {p: i for i, p in enumerate(prompt_ids)}
            rs = sorted((r for part in dist.all_gather(rs) for r in part), key=lambda r: (order[r.prompt_id], r.sample_index))
        groups: dict[str, list[Rollout]] = {}
        for r in rs:
            r.meta["round"] = rnd
            if rnd:
                r.group_id = f"{r.group_id}#r{rnd}"
            groups.setdefault(r.group_id, []).append(r)
        if self.partial is None:
            return list(groups.values())
        now = version_number(self.policy_version, step)  # partial rollouts: hold the unfinished, finish the held
        held = self.partial.resume(self._continuation(params, step), now, step) if rnd == 0 else []
        out = held + self.partial.admit(list(groups.values()), now)
        self.partial_rounds[str(rnd)] = {"prompts": list(prompt_ids), "groups": [[r.rollout_id for r in g] for g in out]}
        return out

    def partial_from_store(self, step: int, rnd: int, prompt_ids: list[str], stored: dict[int, list[Rollout]]) -> list[list[Rollout]]:
        """Partial rollouts, a step replayed from the store: round ``rnd``'s groups in the order the killed
        attempt returned them (``partial_pending.arrow``; held groups that completed come first)."""
        rec = self.partial_rounds.get(str(rnd))
        by_id = {r.rollout_id: r for rs in stored.values() for r in rs}
        if rec is None or rec["prompts"] != list(prompt_ids) or any(i not in by_id for g in rec["groups"] for i in g):
            raise TrainError(f"step {step} round {rnd}: the store's rollouts and the saved partial-rollout pool do not match "
                             "what the resumed run selects; the run cannot continue exactly (start a new run)")
        groups = [[by_id[i] for i in g] for g in rec["groups"]]
        self.reward.seed_ref_accuracy([r for g in groups for r in g])
        return groups

    def _continuation(self, params: Any, step: int) -> Any:
        """Partial rollouts' engine call: each rollout continued from its own tokens (one request each)."""
        from gfcr.generate.engines.base import GenRequest

        def cont(rollouts: list[Rollout], allow: list[int]) -> list[tuple[Any, Any, str]]:
            seed = self.cfg.seed * 1000 + 10 * step
            reqs = [GenRequest(prompt_ids=[int(t) for t in r.token_ids],
                               params=params.model_copy(update={"n": 1, "seed": seed + 7919 * i, "max_tokens": a}))
                    for i, (r, a) in enumerate(zip(rollouts, allow, strict=True))]
            return [(res.token_ids, res.logprobs, res.finish_reason) for (res,) in self.engine.generate(reqs)]

        return cont

    def verify(self, groups: list[list[Rollout]]) -> None:
        """Verdict (``verified``, evidence, ``signals["correctness"]``: the verdict's score, or a multi_turn
        episode's reward by ``verify.reward_source``), the format signal, then the reward composition per
        group (:class:`gfcr.filters.reward.RewardComposition`)."""
        from gfcr.filters.apply import verdict_record
        from gfcr.filters.verifiers import stated_answer_format
        from gfcr.generate.envs import episode_reward

        vc = self.cfg.verify
        for grp in groups:
            for r in grp:
                p = self.prompt_by_id[r.prompt_id]
                text = final_turn_text(r)  # the last assistant turn: the answer (the whole completion when single-turn)
                v = self.verifier.verify(text, answer=p.answer, tests=p.tests, rollout=r,
                                         answer_format=stated_answer_format(p))
                r.verified, r.verifier = v.passed, verdict_record(self.verifier, v)
                r.signals["format"] = float(self.format_verifier.verify(text).score)
                score = float(v.score)
                if "env" in r.meta:  # an env episode (MultiTurn records its env): verify.reward_source decides
                    env_reward, env_success = r.signals.get("env_reward"), r.meta.get("env_success")
                    score, r.verified, used = episode_reward(vc.reward_source, float(v.score), v.passed,
                                                             env_reward, env_success, vc.env_weight)
                    r.verifier |= {"reward_source": vc.reward_source, "reward_from": used,
                                   "env_reward": env_reward, "env_success": env_success}
                    r.signals["verifier_score"] = float(v.score)
                r.signals["correctness"] = score
            self.reward.apply(grp)

    def score_teacher(self, groups: list[list[Rollout]]) -> None:
        """On-policy distillation: each rollout's task teacher scores its generated tokens
        (``meta["teacher"]``, ``signals["teacher_kl"]``; :func:`gfcr.train.distill.score_rollouts`)."""
        from gfcr.train.distill import score_rollouts

        score_rollouts([r for g in groups for r in g], self.teachers)

    def entropy(self, groups: list[list[Rollout]]) -> None:
        """``signals["entropy"]`` for rollouts whose engine did not report it (one no-grad forward)."""
        rs = [r for g in groups for r in g if "entropy" not in r.signals]
        for r, e in zip(rs, self.rollout_entropy(rs) if rs else [], strict=True):
            if np.isfinite(e):
                r.signals["entropy"] = float(e)
