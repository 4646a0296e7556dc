"""bench/ross_moveon.py end to end on a real (tiny-model) ``gfcr train`` run folder."""

import argparse
import importlib.util
import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).parents[1] / "bench"
sys.path.insert(0, str(BENCH))  # the bench imports ross_testbed's worked-solution rows
spec = importlib.util.spec_from_file_location("ross_moveon", BENCH / "ross_moveon.py")
mo = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mo)


def mo_chains(n):
    from gfcr.tasks.arith import make_arith

    return make_arith(n=n, level=5, seed=0, split="train").prompts()


def test_sign_test_counts_pairs_and_is_two_sided():
    r = mo.sign_test([1.0, 1.0, 0.5, 0.0, 1.0], [0.0, 1.0, 0.0, 0.0, 0.0])
    assert (r["a_higher"], r["b_higher"], r["n"]) == (3, 0, 5)
    assert r["diff"] == pytest.approx((3.5 - 1.0) / 5)
    assert r["p"] == pytest.approx(0.25)  # 3 of 3 one way: 2 * 0.5 ** 3
    assert mo.sign_test([0.0], [0.0])["p"] == 1.0  # no untied pair: nothing to test


def test_the_study_runs_on_a_tiny_run_and_keeps_the_upstream_run_untouched(tiny_run, tmp_path):
    from gfcr.store import RolloutStore

    run = Path(tiny_run.run_dir)
    before = RolloutStore.open(run / "store").scan(columns=["rollout_id"]).num_rows
    up = mo.upstream_facts(run)
    assert up["last"].endswith("step_000001") and (up["temperature"], up["max_tokens"]) == (0.9, 4)

    state = tmp_path / "state"
    state.mkdir()
    args = argparse.Namespace(k=2, n_move=4, move_epochs=1, move_lr=1e-4, sft_seeds="0,1", epochs_sft=1, n_eval=3,
                              n_chains=2, chain_tokens=4, seed=0, rl_steps=1, format_pattern="^[^x]", judge="keep-all",
                              move_from=None, n_mix=3)
    early = mo.stage_sweep_early(args, state, up)
    hist = RolloutStore.open(state / "history")
    n_train = len(mo.train_prompts(hist))
    assert n_train == 6 and early["rollouts"] == 2 * n_train
    assert hist.scan(columns=["rollout_id"]).num_rows == before + 2 * n_train  # the run's rollouts, then the sweep
    assert RolloutStore.open(run / "store").scan(columns=["rollout_id"]).num_rows == before  # only read
    assert sum(early["per_prompt"].values()) == early["verified"] > 0

    move = mo.stage_moveon(args, state, up)
    assert move["rows"] == 4 and Path(move["dir"], "config.json").exists() and move["init"] == up["last"]
    fin = mo.stage_sweep_final(args, state, up, early, move)
    lost = fin["lost"]
    e, f = early["per_prompt"], fin["per_prompt"]
    assert lost["early_solved_final_not"] == sum(e[i] > 0 and f[i] == 0 for i in e)
    assert lost["rate_early_minus_final"]["n"] == n_train

    arms = mo.stage_arms(args, state, move)
    assert set(arms) == {"ross_history-s0", "ross_own-s0", "ross_history-s1", "ross_own-s1"}
    distinct = len({(r.prompt_id, r.completion) for r in hist.rollouts() if r.verified})
    assert arms["ross_history-s0"]["select"]["rollouts"] == distinct  # identical completions of a prompt once
    own = RolloutStore.open(state / "own").rollouts()
    assert arms["ross_own-s0"]["select"]["rollouts"] == len({(r.prompt_id, r.completion) for r in own if r.verified})
    assert arms["ross_own-s1"]["dir"] != arms["ross_own-s0"]["dir"]
    matched = mo.stage_matched(args, state, move, arms)
    n_own = arms["ross_own-s0"]["select"]["rollouts"]
    assert matched["rollouts"] == min(n_own, matched["of"])
    assert matched["ross_history_matched-s1"]["select"]["rollouts"] == matched["rollouts"]
    mixed = mo.stage_mixed(args, state, move)
    assert mixed["chains"] == {"rollouts": 3, "with_planted_mistake": 0}
    assert mixed["ross_mixed-s0"]["select"]["rollouts"] == distinct + 3  # the history's, then 3 of phase B's chains
    chains = [r for r in RolloutStore.open(state / "history-mixed").rollouts() if r.policy_version == "synthetic"]
    assert [r.prompt_id for r in chains] == [p.prompt_id for p in mo_chains(4)[:3]] and all(r.verified for r in chains)
    assert hist.scan(columns=["rollout_id"]).num_rows == before + 2 * n_train  # the history itself is not touched
    rl = mo.stage_rl(args, state, up, move)
    assert rl["dir"].endswith("step_000000") and rl["rollouts"] == 2 * 2  # 1 step x 2 prompts x K = 2, the run's own
    ev = mo.stage_eval(args, state, up, move, arms, {}, rl, matched, mixed)
    assert ev["n"] == {"train_sums": 6, "heldout_sums": 3, "heldout_chains": 2}
    assert set(ev["pass@1"]) == {f"{m}/{s}" for m in ["early", "final", "continued_rl", *arms, "ross_mixed-s0",
                                                             "ross_mixed-s1", "ross_history_matched-s0",
                                                             "ross_history_matched-s1"] for s in ev["n"]}
    assert {"ross_history - continued_rl", "ross_history_matched - ross_own",
            "ross_mixed - ross_history"} <= set(ev["paired"]["heldout_sums"])
    p = ev["paired"]["train_sums"]["ross_history - ross_own"]
    assert p["n"] == 6 and 0 <= p["a"] <= 1
    saved = json.loads((state / "eval.partial.json").read_text())
    assert len(saved["per_prompt"]["early/train_sums"]) == 6  # kept per row, so a cut run resumes

    # a second study on the same upstream run reuses phase A; phase B can start from the first's final model
    (state / "sweep_early.json").write_text(json.dumps(early))  # as main() writes it
    again = tmp_path / "again"
    again.mkdir()
    copied = mo.reuse_early(state, again)
    assert copied[:2] == ["sweep_early.json", "history"] and "eval early/heldout_sums" in copied
    assert json.loads((again / "sweep_early.json").read_text()) == json.loads((state / "sweep_early.json").read_text())
    part = json.loads((again / "eval.partial.json").read_text())
    assert set(part["per_prompt"]) == {f"early/{s}" for s in ev["n"]}
    assert part["timing"]["early/train_sums"]["reused_from"] == str(state)
    assert mo.reuse_early(state, again) == []  # nothing is copied over what is there
    move2 = mo.stage_moveon(argparse.Namespace(**{**vars(args), "move_from": move["dir"]}), again, up)
    assert move2["init"] == move["dir"]

    # an own store with no verified rollout has nothing to relearn: the arm is the final model, scored once
    empty = tmp_path / "empty"
    st = RolloutStore.open(empty, create=True)
    st.upsert_prompts(mo.train_prompts(hist))
    st.append([r for r in hist.rollouts() if not r.verified][:2])
    arm = mo.ross_arm(args, again, empty, "ross_own", 0, move2)
    assert arm == {"dir": move2["dir"], "select": {"rollouts": 0}, "empty": True}
    ev2 = mo.stage_eval(args, again, up, move2, {"ross_history-s0": arms["ross_history-s0"], "ross_own-s0": arm}, {})
    assert ev2["timing"]["ross_own-s0/heldout_sums"] == {"same_as": "final"}
    assert ev2["pass@1"]["ross_own-s0/heldout_sums"] == ev2["pass@1"]["final/heldout_sums"]


def test_a_folder_without_checkpoints_is_refused_in_one_line(tmp_path):
    (tmp_path / "config.yaml").write_text("model: default\n")
    with pytest.raises(SystemExit, match="no checkpoints"):
        mo.upstream_facts(tmp_path)
