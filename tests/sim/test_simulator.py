"""The model-free simulator: config checks, determinism, metrics and the CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest
from pydantic import ValidationError

from gfcr.sim.simulator import SimConfig, StrategyConfig, World, run_strategy, simulate, solve_rate_at

TINY = dict(n_prompts=200, train_prompts=16, budget_tokens=4e5, seed=3)


def test_config_rejects_unknown_keys_and_selectors():
    with pytest.raises(ValidationError, match="n_prompt"):
        SimConfig.model_validate({"n_prompt": 10})
    with pytest.raises(ValidationError, match=r"strategies\[\].selector 'magic' does not exist; choose one of"):
        StrategyConfig(name="x", selector="magic")
    with pytest.raises(ValidationError, match="unique"):
        SimConfig(strategies=[StrategyConfig(name="a"), StrategyConfig(name="a")])


def test_solve_rate_interpolation():
    assert solve_rate_at([(0, 0.2), (10, 0.4)], 5) == pytest.approx(0.3)
    assert solve_rate_at([(0, 0.2), (10, 0.4)], 50) == pytest.approx(0.4)


def test_world_learning_and_forgetting():
    cfg = SimConfig(**TINY, lr=1.0, transfer=0.0, forget=0.5)
    w = World(cfg)
    before = w.logit.copy()
    w.update(np.array([0]), np.array([0.5]))  # trained: +1.0 * 4 * 0.25 = +1
    assert w.logit[0] == pytest.approx(before[0] + 1.0)
    w.logit[1] = before[1] + 2.0
    w.update(np.array([0]), np.array([0.5]))  # prompt 1 untrained: drifts halfway back
    assert w.logit[1] == pytest.approx(before[1] + 1.0)


def test_same_seed_same_result_and_budget_respected():
    cfg = SimConfig(**TINY, strategies=[StrategyConfig(name="u")])
    a = run_strategy(cfg, cfg.strategies[0])
    b = run_strategy(cfg, cfg.strategies[0])
    assert a["curve"] == b["curve"] and a["generated_tokens"] >= cfg.budget_tokens
    assert a["effective_samples"] > 0 and 0 < a["zero_variance_share"] < 1
    assert a["tokens_per_effective_sample"] == pytest.approx(a["generated_tokens"] / a["effective_samples"])


def test_dynamic_sampling_trains_only_on_effective_groups():
    cfg = SimConfig(**TINY, strategies=[StrategyConfig(name="dapo", control="dynamic_sampling")])
    r = run_strategy(cfg, cfg.strategies[0])
    # every trained group is effective: effective samples = steps * train_prompts * G unless a step hit the cap
    assert r["effective_samples"] <= r["steps"] * cfg.train_prompts * cfg.group_size
    assert r["effective_samples"] >= (r["steps"] - 1) * cfg.train_prompts * cfg.group_size


def test_dynamic_sampling_refill_rounds_never_redraw_within_a_step():
    """Issue 47: DAPO's recipe refills from the epoch's next prompts; the simulator's refill rounds
    redrew prompts already drawn that step. 40 prompts, 8 a round, up to 10 rounds: the pool runs out
    after 5 rounds, and no prompt of a step is generated twice."""
    from gfcr.sim.simulator import _Run

    strat = StrategyConfig(name="dapo", control="dynamic_sampling", gen_factor=1.0, max_num_gen_batches=10)
    run = _Run(SimConfig(n_prompts=40, train_prompts=8, budget_tokens=4e5, seed=3, strategies=[strat]), strat)
    drawn: list[int] = []
    real = run.world.generate

    def spy(idx, k, rng, **kw):
        drawn.extend(idx.tolist())
        return real(idx, k, rng, **kw)

    run.world.generate = spy
    for _ in range(6):
        drawn.clear()
        run.step_once()
        run.step += 1
        assert len(drawn) == len(set(drawn)) and len(drawn) <= 40, drawn


def test_simulate_writes_json_and_plot(tmp_path):
    cfg = SimConfig(**TINY, strategies=[StrategyConfig(name="uniform"), StrategyConfig(name="dapo", control="dynamic_sampling"),
                                        StrategyConfig(name="greso", selector="greso", control="dynamic_sampling", adaptive_gen=True),
                                        StrategyConfig(name="vade", selector="vade"), StrategyConfig(name="ar3po", control="ar3po")])
    rep = simulate(cfg, tmp_path / "out")
    data = json.loads((tmp_path / "out" / "results.json").read_text())
    assert [r["name"] for r in data["results"]] == ["uniform", "dapo", "greso", "vade", "ar3po"]
    assert data["ratios"]["uniform"]["tpe_vs_uniform"] == pytest.approx(1.0)
    assert (tmp_path / "out" / "learning_curves.png").stat().st_size > 1000
    assert rep["results"][0]["initial_solve_rate"] == rep["results"][3]["initial_solve_rate"]  # same world
    with pytest.raises(FileExistsError):
        simulate(cfg, tmp_path / "out")


def test_cli_simulate(tmp_path):
    from typer.testing import CliRunner

    from gfcr.cli import app

    cfgp = tmp_path / "c.yaml"
    cfgp.write_text("n_prompts: 100\ntrain_prompts: 8\nbudget_tokens: 1.0e5\nstrategies:\n  - {name: uniform}\n  - {name: vcrl, selector: vcrl}\n")
    res = CliRunner().invoke(app, ["simulate", str(cfgp), "--out", str(tmp_path / "o"), "--no-plot"])
    assert res.exit_code == 0, res.output
    assert "| vcrl |" in res.output and (tmp_path / "o" / "results.json").exists()
    bad = tmp_path / "bad.yaml"
    bad.write_text("n_prompts: 100\nbogus: 1\n")
    res = CliRunner().invoke(app, ["simulate", str(bad)])
    assert res.exit_code == 2 and "bogus" in res.output


def test_weighted_update_hand_example():
    cfg = SimConfig(**TINY, lr=1.0, transfer=0.16, forget=0.0)  # train_prompts 16
    w = World(cfg)
    same_cat = next(j for j in range(1, cfg.n_prompts) if w.category[j] == w.category[0])
    before = w.logit.copy()
    w.update(np.array([0]), np.array([0.5]), np.array([0.5]))
    # own step 1 * 0.5 * 4 * 0.25 = 0.5; category share 0.5 / 16 -> transfer 0.16 * 0.03125 = 0.005
    assert w.logit[0] == pytest.approx(before[0] + 0.5 + 0.005)
    assert w.logit[same_cat] == pytest.approx(before[same_cat] + 0.005)


def _run(control, **kw):
    cfg_kw = {k: kw.pop(k) for k in list(kw) if k in SimConfig.model_fields}
    cfg = SimConfig(**{**TINY, **cfg_kw})
    return cfg, run_strategy(cfg, StrategyConfig(name=control, control=control, **kw))


def test_adaptive_k_spends_the_same_responses_and_reduces_to_uniform():
    cfg, u = _run("none")
    _, same = _run("adaptive_k", k_min=cfg.group_size, k_max=cfg.group_size)
    assert same["curve"] == u["curve"]  # K fixed at G: exactly the uniform run
    _, a = _run("adaptive_k", k_min=2, k_max=16)
    assert a["generated_responses"] == a["steps"] * cfg.train_prompts * cfg.group_size
    assert a["curve"] != u["curve"] and a["effective_samples"] > 0


def test_repo_replays_only_from_a_warm_cache_and_without_weight_matches_uniform():
    # forget=0: a zero-weight replay group then changes nothing, so the curve is the uniform one; the
    # budget lets a uniform draw meet its prompts a third time (when RePO's 16-entry cache replays)
    _, u = _run("none", forget=0.0, budget_tokens=1.2e6)
    _, r0 = _run("repo", forget=0.0, budget_tokens=1.2e6, replay_decay=0.0)
    assert r0["curve"] == u["curve"] and r0["replayed_samples"] > 0
    _, r1 = _run("repo", forget=0.0, budget_tokens=1.2e6)
    assert r1["curve"] != u["curve"] and r1["generated_tokens"] == u["generated_tokens"]
    assert r1["tokens_per_effective_sample"] == u["tokens_per_effective_sample"]  # replay costs no generation
    # a cache that never warms (min fill above what a run reaches) replays nothing
    _, cold = _run("repo", forget=0.0, budget_tokens=1.2e6,
                   buffer={"name": "repo", "params": {"max_cache_size": 4096, "min_cache_to_replay": 4096}})
    assert cold["replayed_samples"] == 0 and cold["curve"] == u["curve"]


def test_exgrpo_mixes_experience_questions():
    cfg, u = _run("none")
    _, none_mixed = _run("exgrpo", buffer={"name": "exgrpo", "params": {"mix_ratio": 0.0}})
    # no mixing: no replay and full groups; the curve is not uniform's, since retired (all-correct)
    # questions leave the pool as they do in gfcr train (buffer.exclude; the old simulator ignored it)
    assert none_mixed["replayed_samples"] == 0
    assert none_mixed["generated_responses"] == none_mixed["steps"] * cfg.train_prompts * cfg.group_size
    from gfcr.sim.simulator import _Run

    strat = StrategyConfig(name="e", control="exgrpo", buffer={"name": "exgrpo", "params": {"mix_ratio": 0.0}})
    run = _Run(cfg, strat)
    for _ in range(6):
        retired = set(run.buffer.retired)
        col, _, _ = run.step_once()
        assert not {g[0].prompt_id for g in col.generated} & retired
        run.step += 1
    assert run.buffer.retired, "the example must retire a question"
    _, e = _run("exgrpo")
    full = e["steps"] * cfg.train_prompts * cfg.group_size
    # each experience question generates K-1 fresh responses: fewer than B*G responses in total
    assert e["replayed_samples"] > 0 and e["generated_responses"] < full
    assert e["generated_responses"] >= full - e["steps"] * round(0.5 * cfg.train_prompts)


def test_replay_strategy_config_errors():
    with pytest.raises(ValidationError, match="k_max"):
        StrategyConfig(name="a", control="adaptive_k", k_min=8, k_max=4)
    with pytest.raises(ValidationError, match="unknown control"):
        StrategyConfig(name="a", control="gfpo")
    with pytest.raises(ValidationError, match="strategies\\[\\].buffer.params: unknown key 'bogus' for buffer 'repo'"):
        StrategyConfig(name="r", control="repo", buffer={"name": "repo", "params": {"bogus": 1}})  # refused at load


@pytest.mark.parametrize("buffer", ["repo", "exgrpo", "ar3po"])
def test_simulator_and_loop_assemble_the_same_batch(tiny_dir, tmp_path, buffer):
    """The same groups, history and seed give the same batch in `gfcr simulate` and `gfcr train`:
    both call ReplayBuffer.reserve/mix (rollout ids, advantages, weights, loss forms, groups)."""
    from gfcr.records import Rollout
    from gfcr.sim.simulator import _Run
    from gfcr.train.config import load_config
    from gfcr.train.loop import TrainingRun, prepare_run
    from gfcr.train.sampling import step_rng

    params = {"repo": {"num_replays": 2, "max_cache_size": 4, "min_cache_to_replay": 2, "strategy": "random"},
              "exgrpo": {"start_solved_ratio": 0.2, "mix_ratio": 0.5, "group_size": 4}, "ar3po": {}}[buffer]
    cfg = load_config(None, {"model": tiny_dir, "output_dir": str(tmp_path), "seed": 7, "tensorboard": False,
                             "tasks": [{"name": "arith", "n_train": 4, "n_eval": 0, "params": {"level": 1}}],
                             "generate.topology.params.k": 4, "replay.buffer": {"name": buffer, "params": params}})
    d, _ = prepare_run(cfg)
    t = TrainingRun(cfg, d, False, progress=False)
    t.setup()
    pids = [p.prompt_id for p in t.train_prompts]
    sim = _Run(SimConfig(n_prompts=10, train_prompts=2, group_size=4, seed=7,
                         strategies=[StrategyConfig(name=buffer, control=buffer, buffer={"name": buffer, "params": params})]),
               StrategyConfig(name=buffer, control=buffer, buffer={"name": buffer, "params": params}))
    sim.index = {p: i for i, p in enumerate(pids)}

    def group(step, p, wins, k=4):
        return [Rollout(run_id=t.run_id, prompt_id=p, group_id=f"{p}@{step}", sample_index=i, step=step,
                        token_ids=[1, 2 + i, 3], token_role=[0, 1, 1], logprobs=[0.0, -0.5, -0.5],
                        reward=float(i < wins), verified=i < wins, rollout_id=f"{p}-{step}-{i}", policy_version=f"s{step}")
                for i in range(k)]

    history = [group(0, pids[0], 1), group(0, pids[1], 0), group(0, pids[2], 2)]
    for b in (t.buffer, sim.buffer):
        b.add([r for g in history for r in g])
        b.add([r for g in [group(1, pids[0], 2), group(1, pids[1], 1)] for r in g])
    step = 2
    t.policy_version = f"s{step}"
    sim.step = step
    res_loop = t.buffer.reserve(2, step, step_rng(7, step, "reserve"))
    res_sim = sim.buffer.reserve(2, step, step_rng(7, step, "reserve"))
    assert res_loop == res_sim
    k = {p: 4 - res_loop.get(p, 0) for p in pids[:3]}
    groups = [group(step, pids[0], 0, k[pids[0]]), group(step, pids[1], 0, k[pids[1]]), group(step, pids[2], 2, k[pids[2]])]
    a = t._batch(groups, step)
    b = sim.assemble(groups)
    norm = [(it.rollout.rollout_id, round(float(np.mean(it.advantage)), 6), it.weight, it.shaping, it.group, it.replayed)
            for it in a]
    assert norm == [(it.rollout.rollout_id, round(float(np.mean(it.advantage)), 6), it.weight, it.shaping, it.group,
                     it.replayed) for it in b]
    assert any(it.replayed for it in a), "the example must exercise replay"
    t.close()


def test_long_tail_partial_rollouts_cut_the_wait_for_the_longest():
    from gfcr.sim.long_tail import long_tail
    from gfcr.sim.simulator import SimConfig

    cfg = SimConfig(n_prompts=50, train_prompts=8, group_size=4, len_max=2048)
    out = long_tail(cfg, [None, 256], steps=10)
    full, part = out["full"], out["partial_256"]
    assert full["generated"] > 0 and part["step_wall_max"] <= 256 < full["step_wall_max"]
    assert part["idle_share"] < full["idle_share"] and part["lag_mean"] > 0 == full["lag_mean"]
    assert full["carried"] == 0 and full["completed"] == 10 * 8 * 4
