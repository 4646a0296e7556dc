"""The loop's own batch assembly on hand-worked groups: every replay method and every group policy.

Each test builds a real :class:`TrainingRun` on a tiny model and runs :meth:`TrainingRun.step`
(StepCollector/StepSampler → GroupPolicy.collect → RewardComposition → ReplayBuffer.mix → PolicyTrainer.update);
only generation and the verdict are scripted (``Script``), so the numbers the update receives are
the loop's, and they are checked against values worked out by hand from each paper's rule.
"""

from __future__ import annotations

import numpy as np
import pytest

from gfcr.testing import make_rollout
from gfcr.train.config import load_config
from gfcr.train.loop import TrainingRun, prepare_run

S3 = 3 ** -0.5


def _run(tiny_dir, tmp_path, n_train=1, **over) -> TrainingRun:
    base = {"model": tiny_dir, "output_dir": str(tmp_path / "runs"), "steps": 8, "tensorboard": False,
            "tasks": [{"name": "arith", "n_train": n_train, "n_eval": 0, "params": {"level": 1}}],
            "generate.topology.params.k": 4, "generate.prompts_per_step": 1, "generate.max_tokens": 4, "signals.entropy": False}
    cfg = load_config(None, base | over)
    d, _ = prepare_run(cfg)
    t = TrainingRun(cfg, d, False, progress=False)
    t.setup()
    t._end = cfg.steps
    return t


class Script:
    """Scripted rounds: ``plan[step][round]`` is a list (one per prompt of that round, in selection order)
    of per-sample verdicts (1/0), or (verdict, n_generated) pairs. Records what the update receives."""

    def __init__(self, t: TrainingRun, plan: dict[int, list[list[list]]], answers: dict | None = None):
        self.t, self.plan, self.answers = t, plan, answers or {}
        self.batches: list[dict] = []
        t.collector.generate_groups = self.generate
        t.collector.verify = self.verify
        real = t.update.update

        def spy(rollouts, advantages, weights=None, shaping=None):
            self.batches.append({"ids": [r.rollout_id for r in rollouts], "rollouts": list(rollouts),
                                 "adv": [np.asarray(a) for a in advantages], "w": list(weights), "shaping": list(shaping)})
            return real(rollouts, advantages, weights, shaping)

        t.update.update = spy

    def generate(self, prompt_ids, sizes, step, rnd):
        groups = []
        for j, p in enumerate(prompt_ids):
            spec = self.plan[step][rnd][j]
            assert len(spec) == sizes[p], f"step {step} round {rnd}: the loop asked for {sizes[p]} samples of {p}"
            g = []
            for i, s in enumerate(spec):
                ok, n_gen = (s if isinstance(s, tuple) else (s, 2))
                r = make_rollout(i, run=self.t.run_id, step=step, prompt=p, n_ctx=2, n_gen=n_gen, seed=step * 100 + rnd,
                                 group_id=f"{p}@{step}" + (f"#r{rnd}" if rnd else ""), signals={},
                                 policy_version=self.t.policy_version, meta={"round": rnd},
                                 rollout_id=f"{p}-{step}-{rnd}-{i}")
                r.token_ids = r.token_ids % 200  # inside the tiny vocabulary
                r.verified = bool(ok)
                g.append(r)
            groups.append(g)
        return groups

    def verify(self, groups):
        for g in groups:
            for r in g:
                r.signals["correctness"] = float(r.verified)
                r.signals["format"] = 0.0
                r.verifier = {"name": "scripted", "evidence": {"value": self.answers.get(r.rollout_id, "x")}}
            self.t.reward.apply(g)


def adv(batch):
    return [float(np.mean(a)) for a in batch["adv"]]


def test_single_round_grpo_unbiased(tiny_dir, tmp_path):
    t = _run(tiny_dir, tmp_path)
    sc = Script(t, {0: [[[1, 0, 0, 0]]]})
    t.step(0)
    (b,) = sc.batches
    assert adv(b) == pytest.approx([1.5, -0.5, -0.5, -0.5], abs=1e-5) and b["w"] == [1.0] * 4 and b["shaping"] == [None] * 4
    t.close()


def test_ar3po_injects_cached_correct_and_renormalises(tiny_dir, tmp_path):
    """AR3PO: [0,0,0,0] + the cached correct answer → [−0.447 ×4, +1.789] (GRPO over the 5)."""
    t = _run(tiny_dir, tmp_path, **{"replay.buffer": "ar3po", "control.group": {"name": "ar3po", "params": {"stages": 1}}})
    assert t.cfg.control.group.name == "ar3po"
    sc = Script(t, {0: [[[1, 0, 0, 0]]], 1: [[[0, 0, 0, 0]]]})
    t.step(0)
    t.step(1)
    b = sc.batches[1]
    np.testing.assert_allclose(adv(b), [-0.447214] * 4 + [1.788854], atol=1e-5)
    injected = b["rollouts"][-1]
    assert injected.rollout_id.endswith("-0-0-0") and injected.verified is True and b["w"][-1] == 1.0
    meta = t.store.get([injected.rollout_id]).column("meta").to_pylist()[0]
    assert '"replayed_at_step": [1]' in meta  # the replay is recorded on the stored row
    t.close()


def test_ar3po_staged_rollout_merges_stages_into_one_group(tiny_dir, tmp_path):
    t = _run(tiny_dir, tmp_path, **{"generate.topology.params.k": 2, "control.group": {"name": "ar3po", "params": {"stages": 3}}})
    sc = Script(t, {0: [[[0, 0]], [[1, 0]]]})  # stage 2 is not run: the prompt is solved after stage 1
    t.step(0)
    (b,) = sc.batches
    rs = b["rollouts"]
    assert len({r.group_id for r in rs}) == 1 and [r.sample_index for r in rs] == [0, 1, 2, 3]
    assert adv(b) == pytest.approx([-0.5, -0.5, 1.5, -0.5], abs=1e-5)
    t.close()


def test_repo_split_unbiased_replay_group_and_weight(tiny_dir, tmp_path):
    """RePO: the cached [1,0,0,0] replays as its own group → [1.5, −0.5, −0.5, −0.5] (torch.std, unbiased),
    weighted off_policy_loss_coef; the fresh [1,1,0,0] keeps GRPO [0.866, 0.866, −0.866, −0.866]."""
    t = _run(tiny_dir, tmp_path, **{"replay.buffer.name": "repo", "replay.buffer.params": {
        "strategy": "recent", "num_replays": 4, "max_cache_size": 4, "min_cache_to_replay": 4, "off_policy_loss_coef": 0.5}})
    sc = Script(t, {0: [[[1, 0, 0, 0]]], 1: [[[1, 1, 0, 0]]]})
    t.step(0)
    assert len(sc.batches[0]["ids"]) == 4  # the cache is filled after the step (RePO L1349–1352)
    t.step(1)
    b = sc.batches[1]
    g = 0.5 / np.std([1, 1, 0, 0], ddof=1)
    np.testing.assert_allclose(adv(b), [g, g, -g, -g, 1.5, -0.5, -0.5, -0.5], atol=1e-3)
    assert b["w"] == [1.0] * 4 + [0.5] * 4
    assert all(r.step == 0 for r in b["rollouts"][4:])
    t.close()


def test_exgrpo_start_threshold_mixed_group_shaping_and_retirement(tiny_dir, tmp_path):
    t = _run(tiny_dir, tmp_path, **{"replay.buffer": "exgrpo", "signals.advantage": "dr_grpo",
                                    "generate.prompts_per_step": 2})
    assert t.buffer.group_size == 4
    sc = Script(t, {
        0: [[[1, 0, 0, 0]]],  # solved share 0.25 <= 0.35: stays on-policy
        1: [[[1, 1, 0, 0]]],  # 0.5 > 0.35: mixed-policy from step 2 (nothing collected at the switch)
        2: [[[1, 1, 0, 0]]],  # collected: 2 correct trajectories, bucket 2
        3: [[[0, 0, 0]]],  # reserved: K−1 = 3 fresh + the stored lowest-entropy correct one
        4: [[[1, 1, 1]]],  # reserved again; with the replayed member all 4 correct
    })
    for s in range(3):
        t.step(s)
        assert all(x is None for x in sc.batches[-1]["shaping"]) and len(sc.batches[-1]["ids"]) == 4
    assert not t.buffer.retired and len(t.buffer.experience[t.train_prompts[0].prompt_id]) == 2
    t.step(3)
    b = sc.batches[3]
    assert adv(b) == pytest.approx([-0.25, -0.25, -0.25, 0.75])  # mean-centred over the mixed group (grpo_use_std=False)
    assert b["shaping"] == [None, None, None, 0.1] and b["rollouts"][-1].step == 2
    cands = sorted(t.buffer.experience[t.train_prompts[0].prompt_id], key=lambda r: r.rollout_id)
    ent = t.update.rollout_entropy(cands)
    assert b["ids"][-1] == cands[int(np.argmin(ent))].rollout_id  # lowest entropy under the current policy
    t.step(4)  # the fresh members all correct: the question does not retire (its k counts fresh samples only)
    assert adv(sc.batches[4]) == pytest.approx([0, 0, 0, 0])
    t.close()


def test_exgrpo_retired_questions_are_not_selected(tiny_dir, tmp_path):
    from gfcr.train.sampling import StageTimer

    t = _run(tiny_dir, tmp_path, n_train=3, **{"replay.buffer": "exgrpo"})
    pool = [p.prompt_id for p in t.train_prompts]
    t.buffer.retired = {pool[0], pool[2]}
    for s in range(4):
        t.collector.begin(s, t.policy_version, StageTimer())
        assert t.collector.sampler(t.selector, t.buffer).select(2) == [pool[1]]
    t.close()


def test_dynamic_sampling_decides_on_accuracy_not_the_shaped_reward(tiny_dir, tmp_path):
    """All wrong with overlong penalties [0, −0.5, 0, 0] has reward variance but no accuracy variance:
    DAPO (metric acc) drops it and samples another round; decide_on: reward keeps it."""
    plan = {0: [[[(0, 2), (0, 3), (0, 2), (0, 2)]], [[1, 0, 0, 0]]]}
    over = {"control.group": {"name": "dynamic_sampling", "params": {"max_num_gen_batches": 3}}, "signals.overlong_buffer": 2}
    t = _run(tiny_dir, tmp_path, n_train=2, **over)  # two prompts: a refill round never redraws one (issue 47)
    sc = Script(t, plan)
    t.step(0)
    (b,) = sc.batches
    assert all(r.group_id.endswith("#r1") for r in b["rollouts"])
    (first,) = [r.reward for r in t.store.rollouts() if r.sample_index == 1 and "#r" not in r.group_id]
    assert first == pytest.approx(-0.5)  # round 0's dropped group, another prompt than round 1's
    t.close()
    t = _run(tiny_dir, tmp_path, n_train=2, **over, **{"control.decide_on": "reward"})
    sc = Script(t, plan)
    t.step(0)
    assert not any(r.group_id.endswith("#r1") for r in sc.batches[0]["rollouts"])
    t.close()


def test_dynamic_sampling_refills_never_redraw_a_prompt_of_the_step(tiny_dir, tmp_path):
    """Issue 47: DAPO's refill rounds take the epoch's next prompts (verl ``recipe/dapo/dapo_ray_trainer.py``:
    ``continue`` inside ``for batch_dict in self.train_dataloader``); gfcr's redrew prompts drawn that
    step. Pool of 4, one prompt a round: three zero-variance rounds, then one with variance, then the
    next step; every round of a step draws a new prompt, and a round with the pool used up generates nothing."""
    zero, mixed = [[0, 0, 0, 0]], [[1, 0, 0, 0]]
    plan = {0: [zero, zero, zero, mixed], 1: [zero, zero, zero, zero]}
    t = _run(tiny_dir, tmp_path, n_train=4, **{"control.group": {"name": "dynamic_sampling",
                                                                 "params": {"max_num_gen_batches": 6}}})
    sc = Script(t, plan)  # a fifth round of step 1 would find no plan: generation must not be called
    t.step(0)
    t.step(1)
    rounds: dict[int, list[str]] = {}
    for r in t.store.rollouts():
        if r.sample_index == 0:
            rounds.setdefault(r.step, []).append(r.prompt_id)
    pool = sorted(p.prompt_id for p in t.train_prompts)
    assert sorted(rounds[0]) == pool and sorted(rounds[1]) == pool  # 4 rounds, 4 distinct prompts each step
    solved = {r.prompt_id for r in t.store.rollouts() if r.step == 0 and r.verified}
    assert [r.prompt_id for r in sc.batches[0]["rollouts"]] == [*solved] * 4  # the round with variance trains
    t.close()


def test_gfpo_keeps_the_shortest_and_normalises_over_them(tiny_dir, tmp_path):
    t = _run(tiny_dir, tmp_path, **{"control.group": {"name": "gfpo", "params": {"k": 2}}})
    sc = Script(t, {0: [[[(1, 3), (0, 9), (0, 2), (1, 8)]]]})
    t.step(0)
    (b,) = sc.batches
    assert [r.sample_index for r in b["rollouts"]] == [0, 2]
    assert adv(b) == pytest.approx([2 ** -0.5, -(2 ** -0.5)], abs=1e-5)
    t.close()


def test_adaptive_k_sizes_follow_the_posterior(tiny_dir, tmp_path):
    from gfcr.control.policies import AdaptiveK

    t = _run(tiny_dir, tmp_path, n_train=2, **{"control.group": {"name": "adaptive_k", "params": {"k_min": 2, "k_max": 6}},
                                               "generate.prompts_per_step": 2})
    pids = [p.prompt_id for p in t.train_prompts]
    t.policy.outcomes = {pids[0]: (3, 3), pids[1]: (0, 9)}
    want = AdaptiveK(2, 6).allocate(np.array([4.0, 1.0]), np.array([4.0, 10.0]), 8)
    # E[p(1-p)]: Beta(4, 4) → 16/72 = 0.222, Beta(1, 10) → 10/132 = 0.076; k_min 2 each, the other 4 split
    # 2.98 / 1.02 → floors [2, 1], the last by largest remainder → [5, 3]
    assert t.policy.sizes(pids, 4) == dict(zip(pids, want.tolist(), strict=True)) and want.tolist() == [5, 3]
    t.close()


def test_seed_grpo_scales_by_semantic_entropy(tiny_dir, tmp_path):
    t = _run(tiny_dir, tmp_path, **{"signals.advantage": "seed_grpo"})
    p = t.train_prompts[0].prompt_id
    answers = {f"{p}-0-0-{i}": a for i, a in enumerate(["7", "5", "5", "3"])}
    sc = Script(t, {0: [[[1, 0, 0, 0]]]}, answers)
    t.step(0)
    assert adv(sc.batches[0]) == pytest.approx([0.125, -0.25 / 6, -0.25 / 6, -0.25 / 6], abs=1e-4)
    t.close()


def test_staleness_bound_drops_rows_past_eta(tiny_dir, tmp_path):
    t = _run(tiny_dir, tmp_path, **{"replay.buffer": "fifo", "replay.per_step": 8, "control.staleness_eta": 1})
    sc = Script(t, {s: [[[1, 0, 0, 0]]] for s in range(3)})
    for s in range(3):
        t.step(s)
    b = sc.batches[2]
    steps = sorted(r.step for r in b["rollouts"])
    assert steps == [1] * 4 + [2] * 4  # step-0 rows (lag 2 > η = 1) are dropped
    t.close()


def test_a_registered_token_term_reaches_the_update(tiny_dir, tmp_path, monkeypatch):
    """An extra per-token signal (as on-policy distillation will add) plugs in by name: no loop change."""
    from gfcr.filters import advantages

    monkeypatch.setitem(advantages.TOKEN_TERMS, "last_token_bonus",
                        lambda value=1.0: (lambda r: np.eye(len(r.token_ids))[-1] * value))
    t = _run(tiny_dir, tmp_path, **{"signals.token_terms": [{"name": "last_token_bonus", "coef": 0.5,
                                                             "params": {"value": 2.0}}]})
    sc = Script(t, {0: [[[1, 0, 0, 0]]]})
    t.step(0)
    (b,) = sc.batches
    for a, base in zip(b["adv"], [1.5, -0.5, -0.5, -0.5], strict=True):
        assert a.shape == (4,) and a[-1] == pytest.approx(base + 1.0, abs=1e-5) and a[-2] == pytest.approx(base, abs=1e-5)
    t.close()


def _repo(tiny_dir, tmp_path, **params):
    return _run(tiny_dir, tmp_path, **{"replay.buffer.name": "repo", "replay.buffer.params": {
        "strategy": "recent", "num_replays": 3, "max_cache_size": 4, "min_cache_to_replay": 4} | params})


def test_repo_split_averages_fresh_and_replayed_rows_apart(tiny_dir, tmp_path):
    """RePO's two losses (``loss_sets: split``): 4 fresh + 3 replayed rows weigh 1/4 and 1/3 of the loss
    (the batch mean divides by 7 rows, so the weights are 7/4 and 7/3); ``pooled`` (RePO's loss_type grpo,
    the default) keeps 1/7 each. The loss the update computes is the sum of the two means."""
    import torch

    from gfcr.train.losses import aggregate

    t = _repo(tiny_dir, tmp_path, loss_sets="split")
    sc = Script(t, {0: [[[1, 0, 0, 0]]], 1: [[[1, 1, 0, 0]]]})
    t.step(0)
    t.step(1)
    b = sc.batches[1]
    n = len(b["w"])
    assert n == 7 and [r.step for r in b["rollouts"]] == [1] * 4 + [0] * 3
    np.testing.assert_allclose(np.array(b["w"]) / n, [0.25] * 4 + [1 / 3] * 3)
    per_row = torch.tensor([[1.0], [2.0], [3.0], [4.0], [10.0], [20.0], [30.0]])  # one loss value per row
    loss = aggregate(per_row * torch.tensor(b["w"])[:, None], torch.ones(7, 1), "seq-mean-token-mean")
    assert float(loss) == pytest.approx(np.mean([1, 2, 3, 4]) + np.mean([10, 20, 30]))
    t.close()
    t = _repo(tiny_dir, tmp_path)
    assert t.buffer.loss_sets == "pooled"
    sc = Script(t, {0: [[[1, 0, 0, 0]]], 1: [[[1, 1, 0, 0]]]})
    t.step(0)
    t.step(1)
    assert sc.batches[1]["w"] == [1.0] * 7  # one mean over the 7 rows: 1/7 each
    t.close()


def test_exgrpo_alone_follows_the_authors_script(tiny_dir, tmp_path):
    """``replay.buffer: exgrpo`` alone: Dr.GRPO advantage (grpo_use_std=False), no clip
    (loss_remove_clip=True), Σ tokens / max length (loss_remove_token_mean=True); the mixed group
    [0, 0, 0 | 1] trains at [−0.25, −0.25, −0.25, +0.75], not GRPO's [−0.5, −0.5, −0.5, +1.5]."""
    t = _run(tiny_dir, tmp_path, **{"replay.buffer": "exgrpo", "generate.prompts_per_step": 2})
    c = t.cfg
    assert (c.signals.advantage.name, c.loss.clip, c.loss.agg, c.loss.norm_len) == \
        ("dr_grpo", False, "seq-mean-token-sum-norm", 4)
    sc = Script(t, {0: [[[1, 0, 0, 0]]], 1: [[[1, 1, 0, 0]]], 2: [[[1, 1, 0, 0]]], 3: [[[0, 0, 0]]]})
    for s in range(4):
        t.step(s)
    b = sc.batches[3]
    assert b["shaping"] == [None, None, None, 0.1]
    assert adv(b) == pytest.approx([-0.25, -0.25, -0.25, 0.75])
    t.close()
    over = {"replay.buffer": "exgrpo", "signals.advantage": "grpo", "loss.clip": True, "loss.agg": "token-mean",
            "optim.mini_batch": None}
    c = load_config(None, {"model": tiny_dir} | over)  # what the config names stays
    assert (c.signals.advantage.name, c.loss.clip, c.loss.agg, c.optim.mini_batch) == ("grpo", True, "token-mean", None)


def test_exgrpo_takes_two_optimizer_steps_a_step_as_its_script(tiny_dir, tmp_path):
    """Issue 47: the authors' run_exgrpo.sh trains data.train_batch_size=128 prompts in
    actor.ppo_mini_batch_size=64 mini-batches (x rollout.n in mix_fsdp_worker.py), split in order
    (mix_actor.py ``batch.split(ppo_mini_batch_size)``), ppo_epochs 1: two optimizer steps a training
    step; gfcr took one. Two prompts x K = 4: mini-batches of 4 rows, the first prompt's group, then
    the second's; a config naming optim.mini_batch keeps it."""
    t = _run(tiny_dir, tmp_path, n_train=2, **{"replay.buffer": "exgrpo", "generate.prompts_per_step": 2})
    assert t.cfg.optim.mini_batch == 4
    Script(t, {0: [[[1, 0, 0, 0], [1, 1, 0, 0]]]})
    row = t.step(0)
    assert row["n_optimizer_steps"] == 2.0
    t.close()
    assert load_config(None, {"model": tiny_dir, "replay.buffer": "exgrpo", "generate.topology.params.k": 3,
                              "generate.prompts_per_step": 3}).optim.mini_batch == 5  # 9 rows: 5 + 4
    assert load_config(None, {"model": tiny_dir}).optim.mini_batch is None  # other methods: one step, as before


def test_starpo_s_keeps_the_highest_std_groups_in_the_loop(tiny_dir, tmp_path):
    """StarPO-S (RAGEN's _filter_rollout): 4 groups, ratio 0.5 → int(2) groups by unbiased reward std:
    [1,0,1,0] (0.577) and [0,0,0,1] (0.5; ties with [1,0,0,0] go to the earlier group); the all-equal
    group is dropped. Both kept groups keep their own GRPO advantages."""
    from gfcr.control.policies import starpo_s_keep

    assert starpo_s_keep([[1, 0, 1, 0], [1, 1, 1, 1], [0, 0, 0, 1], [1, 0, 0, 0]], 0.5) == [0, 2]
    assert starpo_s_keep([[1, 0, 1, 0], [1, 1, 1, 1]], 0.5, "std_rev") == [1]
    assert starpo_s_keep([[1, 0], [1, 1], [0, 0]], 0.25) == []  # int(0.75) = 0, as RAGEN's topk(0)
    t = _run(tiny_dir, tmp_path, n_train=4, **{"control.group": {"name": "starpo_s", "params": {"ratio": 0.5}},
                                               "generate.prompts_per_step": 4})
    sc = Script(t, {0: [[[1, 0, 1, 0], [1, 1, 1, 1], [0, 0, 0, 1], [1, 0, 0, 0]]]})
    row = t.step(0)
    (b,) = sc.batches
    assert len(b["ids"]) == 8 and row["starpo_kept_groups"] == 2.0
    np.testing.assert_allclose(adv(b), [0.866, -0.866, 0.866, -0.866, -0.5, -0.5, -0.5, 1.5], atol=1e-3)
    kept = {r.rollout_id: r.meta["trained"] for r in t.store.rollouts()}
    assert sum(kept.values()) == 8 and len(kept) == 16
    t.close()


def test_a_pairwise_judge_reaches_the_update(tiny_dir, tmp_path, monkeypatch):
    """signals.advantage judge: an all-correct group [1, 1, 1, 1] has no GRPO signal; a pairwise judge
    (here: the higher sample index wins) orders it: win rates [0, 1/3, 2/3, 1] → GRPO of 0.5·s."""
    import gfcr.filters.pairwise as pw

    monkeypatch.setattr(pw, "_index_judge", lambda p, a, b: float(a > b), raising=False)
    t = _run(tiny_dir, tmp_path, **{"signals.advantage.name": "judge", "signals.advantage.params": {
        "mode": "pairwise", "judge": "gfcr.filters.pairwise:_index_judge", "weight": 0.5}})
    sc = Script(t, {0: [[[1, 1, 1, 1]]]})
    for i in range(4):  # completions "a0" < "a1" < ... so the judge prefers the later sample
        sc.answers[f"{t.train_prompts[0].prompt_id}-0-0-{i}"] = str(i)
    real = sc.generate

    def gen(*a):
        gs = real(*a)
        for g in gs:
            for r in g:
                r.messages[-1].content = f"a{r.sample_index}"
        return gs

    t.collector.generate_groups = gen
    t.step(0)
    (b,) = sc.batches
    s = np.array([0, 1 / 3, 2 / 3, 1.0])
    np.testing.assert_allclose(adv(b), (s - s.mean()) / (s.std(ddof=1) * 0.5 + 1e-6) * 0.5, atol=1e-4)
    stored = {r.sample_index: r.signals["judge_pairwise"] for r in t.store.rollouts()}
    assert stored == pytest.approx({0: 0.0, 1: 1 / 3, 2: 2 / 3, 3: 1.0})
    t.close()
