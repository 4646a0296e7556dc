"""Control in the training loop: control.group adaptive_k (K per prompt from AdaptiveK over each prompt's
Beta(1 + verified, 1 + failed) posterior, rebuilt from the store on resume) and the ShorterBetter
length reward (signals.length_reward)."""

from __future__ import annotations

import json
import zlib
from collections import Counter

import numpy as np
import pytest

from gfcr.control.policies import AdaptiveK
from gfcr.train.config import load_config
from gfcr.train.loop import TrainingRun, prepare_run, train


def _cfg(tiny_dir, tmp_path, steps=3, **over):
    base = {
        "model": tiny_dir, "output_dir": str(tmp_path / "runs"), "steps": steps, "tensorboard": False,
        "tasks": [{"name": "arith", "n_train": 6, "n_eval": 0, "params": {"level": 1}}],
        "generate.topology.params.k": 4, "generate.prompts_per_step": 3, "generate.max_tokens": 3, "signals.entropy": False,
        "control.group": {"name": "adaptive_k", "params": {"k_min": 2, "k_max": 8}},
    }
    base.update(over)
    return load_config(None, base)


def _scripted_verify(self, groups):
    """A deterministic judge: prompts whose id's CRC is even pass on even sample indices."""
    for g in groups:
        for r in g:
            r.verified = zlib.crc32(r.prompt_id.encode()) % 2 == 0 and r.sample_index % 2 == 0
            r.signals["correctness"] = float(r.verified)
            r.verifier = {"name": "scripted", "passed": r.verified}
        self.reward.apply(g)


def test_group_sizes_follow_adaptive_k_by_hand(tiny_dir, tmp_path):
    cfg = _cfg(tiny_dir, tmp_path)
    d, _ = prepare_run(cfg)
    t = TrainingRun(cfg, d, False, progress=False)
    t.setup()
    pids = [p.prompt_id for p in t.train_prompts[:3]]
    t.policy.outcomes = {pids[0]: (3, 3), pids[1]: (0, 9), pids[2]: (9, 0)}
    sizes = t.policy.sizes(pids, cfg.generate.k)
    want = AdaptiveK(2, 8).allocate(np.array([4.0, 1.0, 10.0]), np.array([4.0, 10.0, 1.0]), 12)
    assert [sizes[p] for p in pids] == want.tolist() and sum(sizes.values()) == 12
    assert sizes[pids[0]] > sizes[pids[1]]  # the uncertain prompt gets more samples
    t.close()


def test_loop_allocates_k_from_the_stored_outcomes_and_resume_agrees(tiny_dir, tmp_path, monkeypatch):
    from gfcr.train.collect import StepCollector

    monkeypatch.setattr(StepCollector, "verify", _scripted_verify)
    full = train(_cfg(tiny_dir, tmp_path), run_dir=tmp_path / "full", progress=False)
    from gfcr.store import RolloutStore

    rs = RolloutStore.open(full.store_path).rollouts()
    counts = {s: Counter(r.prompt_id for r in rs if r.step == s) for s in range(3)}
    assert all(sum(c.values()) == 12 for c in counts.values())  # the budget: 3 prompts × K=4
    assert any(len(set(c.values())) > 1 for c in counts.values())  # K differs between prompts
    for s in range(1, 3):  # each step's K is AdaptiveK over the outcomes of the steps before it
        ok = Counter(r.prompt_id for r in rs if r.step < s and r.verified)
        bad = Counter(r.prompt_id for r in rs if r.step < s and not r.verified)
        pids = list(counts[s])
        want = AdaptiveK(2, 8).allocate(np.array([1.0 + ok[p] for p in pids]), np.array([1.0 + bad[p] for p in pids]), 12)
        assert [counts[s][p] for p in pids] == want.tolist()
    m = [json.loads(x) for x in full.metrics_path.read_text().splitlines()]
    assert all(2 <= row["k_min"] <= row["k_max"] <= 8 for row in m)

    cfg = _cfg(tiny_dir, tmp_path)
    train(cfg, run_dir=tmp_path / "cut", progress=False, stop_after=2)
    res = train(cfg, resume=tmp_path / "cut", progress=False)
    rs2 = RolloutStore.open(res.store_path).rollouts()
    assert Counter(r.prompt_id for r in rs2 if r.step == 2) == counts[2]  # rebuilt from the store


def test_adaptive_k_with_a_tree_is_refused_at_load(tiny_dir, tmp_path):
    from gfcr.train.config import ConfigError

    with pytest.raises(ConfigError, match="adaptive_k"):
        _cfg(tiny_dir, tmp_path, **{"generate.topology": {"name": "tree", "params": {"m": 2, "n": 1, "l": 1, "t": 1}}})


def test_shorter_better_shapes_rewards_and_advantages_by_hand(tiny_dir, tmp_path):
    """signals.length_reward: shorter_better on a hand-made group: verified [T, F, T], lengths [10, 4, 6],
    alpha 1, beta 0.1 → SOL 6 → rewards [0.6, -0.2, 1.0] (plus the format bonus), GRPO advantages on them."""
    from gfcr.filters.signals import ADVANTAGES
    from gfcr.testing import make_rollout

    cfg = _cfg(tiny_dir, tmp_path, **{"control.group": None,
                                      "signals.length_reward": {"name": "shorter_better",
                                                                "params": {"alpha": 1.0, "beta": 0.1}},
                                      "verify.format_bonus": 0.5})
    d, _ = prepare_run(cfg)
    t = TrainingRun(cfg, d, False, progress=False)
    t.setup()
    grp = [make_rollout(i, prompt="p", n_ctx=3, n_gen=n) for i, n in enumerate([10, 4, 6])]
    for r, ok, fmt in zip(grp, [True, False, True], [0.0, 0.0, 1.0], strict=True):
        r.verified, r.reward, r.signals = ok, float(ok), {"format": fmt, "correctness": float(ok)}
    t.reward.apply(grp)
    for r, a in zip(grp, t.estimator(grp), strict=True):
        r.signals["advantage"] = a
    assert [r.signals["length_reward"] for r in grp] == pytest.approx([0.6, -0.2, 1.0])
    assert [r.reward for r in grp] == pytest.approx([0.6, -0.2, 1.5])
    want = ADVANTAGES["grpo"]([0.6, -0.2, 1.5])
    assert [r.signals["advantage"] for r in grp] == pytest.approx(list(want))
    t.close()


def test_length_params_without_length_reward_fail_at_load(tiny_dir, tmp_path):
    from gfcr.train.config import ConfigError

    with pytest.raises(ConfigError, match="signals.length_params is set but signals.length_reward is not"):
        _cfg(tiny_dir, tmp_path, **{"signals.length_params": {"beta": 0.1}})  # the old shape, no method named
    with pytest.raises(ConfigError, match="signals.length_reward.params: unknown key .gamma. for length reward "
                                          ".shorter_better.; allowed: alpha, beta"):
        _cfg(tiny_dir, tmp_path, **{"signals.length_reward": {"name": "shorter_better", "params": {"gamma": 1}}})


def test_early_exit_on_repetition_reaches_the_store(tiny_dir, tmp_path):
    from gfcr.control.groups import tail_ngram_count
    from gfcr.store import RolloutStore

    cfg = _cfg(tiny_dir, tmp_path, steps=1, **{"control.group": None,
                                                "generate.max_tokens": 24, "generate.repeat_ngram": 1,
                                                "generate.repeat_max": 2})
    res = train(cfg, run_dir=tmp_path / "ee", progress=False)
    rs = RolloutStore.open(res.store_path).rollouts()
    cut = [r for r in rs if r.finish_reason == "abort"]
    assert cut, "with a 1-gram seen twice as the rule, some of the 12 rollouts must stop early"
    for r in cut:
        gen = r.token_ids[r.token_role == 1].tolist()
        assert r.meta["early_exit"] == "repetition" and tail_ngram_count(gen, 1) == 2 and len(gen) < 24
    assert r.sampling["repeat_ngram"] == 1 and r.sampling["repeat_max"] == 2


def test_repeat_ngram_with_vllm_fails_at_load(tiny_dir, tmp_path):
    from gfcr.train.config import ConfigError

    with pytest.raises(ConfigError, match="repeat_ngram"):
        _cfg(tiny_dir, tmp_path, **{"generate.engine": "vllm", "generate.repeat_ngram": 8})
