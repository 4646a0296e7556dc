"""bench/ross_feedback.py end to end on a real (tiny-model) ``gfcr train`` run folder."""

import argparse
import importlib.util
import sys
from pathlib import Path

BENCH = Path(__file__).parents[1] / "bench"
sys.path.insert(0, str(BENCH))
spec = importlib.util.spec_from_file_location("ross_feedback", BENCH / "ross_feedback.py")
fb = importlib.util.module_from_spec(spec)
spec.loader.exec_module(fb)


class SecondTry:
    """Wrong at the first answer, right at the second, whatever the policy writes (a tiny random model
    solves nothing): every episode is a success after a failed attempt."""

    name = "second-try"

    def reset(self, task):
        self.n = 0

    def step(self, text):
        self.n += 1
        return (None, True, {"success": True, "answer": "7", "attempt": 2}) if self.n == 2 else (
            "Try again.", False, {"success": False, "answer": None, "attempt": 1})


def test_the_study_runs_on_a_tiny_run(tiny_run, tmp_path):
    from gfcr.store import RolloutStore

    run = Path(tiny_run.run_dir)
    up = fb.upstream_facts(run)
    state = tmp_path / "state"
    state.mkdir()
    args = argparse.Namespace(k=2, max_turns=2, strict=False, sft_seeds="0,1", epochs_sft=1, n_eval=3, seed=0,
                              judge="keep-all", env=SecondTry, max_tokens=12, rl_steps=1)
    from transformers import AutoTokenizer

    args.stop_ids = list(range(0, len(AutoTokenizer.from_pretrained(up["last"])), 3))  # turns that end, not cut
    sw = fb.stage_sweep(args, state, up)
    store = RolloutStore.open(state / "episodes")
    rs = store.rollouts()
    passed = [r for r in rs if r.verified]
    assert sw["episodes"] == len(rs) == 2 * 6 and sw["verified"] == len(passed)
    assert sw["verified_by_attempt"] == {"1": 0, "2": len(passed)} == {"1": 0, "2": sw["verified_after_a_failed_attempt"]}
    for r in passed:
        assert [m.role for m in r.messages][-3:] == ["assistant", "user", "assistant"] and fb.attempts(r) == 2
        assert r.verifier == {"name": "retry-env", "evidence": {"parsed": "7"}}
    assert all(r.verified in (False, None) for r in rs if r.rollout_id not in {q.rollout_id for q in passed})
    assert len(passed) >= 2
    arms = fb.stage_arms(args, state, up)
    assert set(arms) == {"s0", "s1", "audit"}
    assert arms["s0"]["select"]["rollouts"] == len({(r.prompt_id, r.completion) for r in passed})
    assert set(arms["s1"]["dirs"]) == {"ross_nomask", "ross"}
    assert all(Path(d, "config.json").exists() for d in arms["s1"]["dirs"].values())
    assert arms["audit"]["kept_with_failed_attempt"] == arms["s0"]["select"]["rollouts"]
    rl = fb.stage_rl(args, state, up)
    assert rl["dir"].endswith("step_000000") and rl["steps"] == 1 and Path(rl["dir"], "config.json").exists()
    ev = fb.stage_eval(args, state, up, arms, {}, rl)
    assert ev["n"] == 3 and set(ev["timing"]) == {"upstream", "ross_nomask-s0", "ross-s0", "ross_nomask-s1", "ross-s1",
                                                  "continued_rl"}
    assert {"ross - continued_rl", "continued_rl - upstream"} <= set(ev["paired"]["first_attempt"])
    assert ev["rates"]["upstream"]["first_attempt"] == 0.0  # the env never passes a first answer
    p = ev["paired"]["within_turns"]["ross - ross_nomask"]
    assert p["n"] == 3 and 0 <= p["a"] <= 1
