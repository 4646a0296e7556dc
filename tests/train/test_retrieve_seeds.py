"""``retrieve:`` of gfcr train: retrieved solved cases reach the training prompts (tiny random model)."""

from __future__ import annotations

import pytest

from gfcr.records import Rollout
from gfcr.train.config import ConfigError, load_config
from gfcr.train.loop import TrainError, train


def _cfg(tiny_dir, tmp_path, **over):
    base = {
        "model": tiny_dir, "output_dir": str(tmp_path / "runs"), "steps": 1, "tensorboard": False,
        "tasks": [{"name": "arith", "n_train": 4, "n_eval": 0, "params": {"level": 1}}],
        "generate.topology.params.k": 2, "generate.prompts_per_step": 2, "generate.max_tokens": 3, "signals.entropy": False,
    }
    base.update(over)
    return load_config(None, base)


def _source(tmp_path):
    """A store of two solved sums (and one wrong one, never a seed) under another run id."""
    from gfcr.store import RolloutStore

    def case(pid, q, a, ok=True):
        return Rollout(run_id="src", prompt_id=pid, token_ids=[1, 2], token_role=[0, 1], logprobs=[0.0, -0.2],
                       messages=[{"role": "user", "content": q}, {"role": "assistant", "content": a}],
                       reward=float(ok), verified=ok, step=0, rollout_id=f"{pid}-0")

    store = RolloutStore.open(tmp_path / "src", create=True)
    store.append([case("s1", "What is 12 + 7?", "12 + 7 = 19. Answer: 19"),
                  case("s2", "What is 15 + 9?", "15 + 9 = 24. Answer: 24"),
                  case("s3", "What is 15 + 8?", "15 + 8 = 99. Answer: 99", ok=False)])
    return store


def _stored(res):
    from gfcr.store import RolloutStore

    return RolloutStore.open(res.store_path).rollouts()


def test_retrieve_seeds_reach_the_stored_rollouts_only_when_on(tiny_dir, tmp_path):
    from transformers import AutoTokenizer

    src = _source(tmp_path)
    tok = AutoTokenizer.from_pretrained(tiny_dir)
    on = _stored(train(_cfg(tiny_dir, tmp_path, retrieve={"store": str(src.path), "k": 2}),
                       run_dir=tmp_path / "on", progress=False))
    off = _stored(train(_cfg(tiny_dir, tmp_path), run_dir=tmp_path / "off", progress=False))
    assert len(on) == len(off) == 4
    answers = {"s1-0": "12 + 7 = 19. Answer: 19", "s2-0": "15 + 9 = 24. Answer: 24"}
    question = {r.prompt_id: r.messages[0].content for r in off}
    for r in on:
        assert sorted(r.meta["retrieved"]) == ["s1-0", "s2-0"]  # the two solved cases, never the wrong one
        assert [m.role for m in r.messages] == ["user", "assistant"] * 3
        ctx = tok.decode(r.token_ids[r.token_role == 0])
        assert all(a in ctx for a in answers.values())  # the seeds are the context the policy sampled from
        assert r.messages[-2].content == question[r.prompt_id]  # the question itself comes last
    for r in off:
        assert "retrieved" not in r.meta and [m.role for m in r.messages] == ["user", "assistant"]
        assert not any(a in tok.decode(r.token_ids[r.token_role == 0]) for a in answers.values())
    # the same prompts were drawn with and without seeds (selection does not depend on them)
    assert sorted(r.prompt_id for r in on) == sorted(r.prompt_id for r in off)


def test_retrieve_from_the_runs_own_store_seeds_later_steps_with_earlier_solutions(tiny_dir, tmp_path):
    # a verifier that passes everything: every step-0 rollout is solved, so step 1 has seeds
    cfg = _cfg(tiny_dir, tmp_path, steps=2, retrieve={"k": 1},
               verify={"verifier": {"name": "format", "params": {"pattern": "."}}})
    rs = _stored(train(cfg, run_dir=tmp_path / "own", progress=False))
    step0 = {r.rollout_id: r for r in rs if r.step == 0}
    step1 = [r for r in rs if r.step == 1]
    assert all(r.meta["retrieved"] == [] for r in step0.values())  # nothing solved before step 0
    assert step1 and all(len(r.meta["retrieved"]) == 1 for r in step1)
    for r in step1:
        (sid,) = r.meta["retrieved"]
        seed = step0[sid]  # a solution of this run's step 0 ...
        assert seed.prompt_id != r.prompt_id  # ... of another prompt (a prompt is never its own seed)
        assert r.messages[1].content == seed.messages[-1].content


def test_retrieve_from_the_runs_own_store_repeats_with_the_seed(tiny_dir, tmp_path):
    """Two runs of one config draw the same seeds: each prompt's solutions tie (one prompt text), and
    the runs' rollout ids differ, so a tie broken by id would seed them differently (every
    completion passes the pattern ".", so each neighbour prompt holds 4 solved rollouts at one distance)."""
    cfg = _cfg(tiny_dir, tmp_path, steps=2, retrieve={"k": 1},
               **{"generate.prompts_per_step": 3, "generate.topology.params.k": 4},
               verify={"verifier": {"name": "format", "params": {"pattern": "."}}})

    def seeds_of(run: str) -> list:
        rs = _stored(train(cfg, run_dir=tmp_path / run, progress=False))
        key = {r.rollout_id: (r.step, r.prompt_id, r.sample_index) for r in rs}
        return sorted(((r.step, r.prompt_id, r.sample_index), [key[i] for i in r.meta["retrieved"]], r.completion)
                      for r in rs)

    a, b = seeds_of("a"), seeds_of("b")
    seeded = [seeds for _, seeds, _ in a if seeds]
    assert seeded and all(s[2] == 0 for seeds in seeded for s in seeds)  # of 4 tied solutions, the first drawn
    assert a == b


def test_retrieve_is_checked_at_load_and_before_the_run_starts(tiny_dir, tmp_path):
    assert _cfg(tiny_dir, tmp_path).retrieve is None  # default off
    with pytest.raises(ConfigError, match="retrieve"):
        _cfg(tiny_dir, tmp_path, retrieve={"k": 0})
    with pytest.raises(ConfigError, match="retrieve"):
        _cfg(tiny_dir, tmp_path, retrieve={"kk": 2})
    with pytest.raises(TrainError, match="retrieve.store .* not a local store folder"):
        train(_cfg(tiny_dir, tmp_path, retrieve={"store": str(tmp_path / "nope")}), run_dir=tmp_path / "r",
              progress=False)
    assert not (tmp_path / "r").exists()
