"""Multi-turn rewards from the environment: the env's success signal on the rollout, each
``verify.reward_source`` on hand-worked episodes, config checks, and the loop's multi-turn eval."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

from gfcr.filters.verifiers import get_verifier
from gfcr.generate.engines.base import GenResult
from gfcr.generate.envs import answers_match, env_signal, episode_reward, final_answer, judge_final_answer
from gfcr.generate.topologies import MultiTurn
from gfcr.records import Message, Prompt
from gfcr.store import RolloutStore
from gfcr.testing import save_tiny, tiny_tokenizer
from gfcr.train.collect import StepCollector
from gfcr.train.config import ConfigError, load_config
from gfcr.train.loop import reward_composition, train


class TurnScriptEngine:
    """Turn ``t`` of every episode answers ``turns[t]`` (the turn is counted from the assistant
    headers already in the prompt)."""

    name = "turn_script"
    policy_version = "v0"

    def __init__(self, turns: list[str]):
        self.tokenizer = tiny_tokenizer()
        self.turns = turns

    def generate(self, requests):
        out = []
        for req in requests:
            seen = self.tokenizer.decode(req.prompt_ids, skip_special_tokens=False).count("<|im_start|>assistant") - 1
            ids = self.tokenizer(self.turns[seen], add_special_tokens=False)["input_ids"] + [self.tokenizer.eos_token_id]
            out.append([GenResult(token_ids=np.asarray(ids, np.int32), logprobs=np.full(len(ids), -0.1, np.float32),
                                  finish_reason="stop")])
        return out


def _prompt(answer: str | None = "14", pid: str = "p0") -> Prompt:
    return Prompt(prompt_id=pid, task="arith", messages=[Message("user", "What is 2 * (3 + 4)?")], answer=answer)


def _episode(turns: list[str], answer: str | None = "14", env="calculator", max_turns: int = 4):
    (r,) = MultiTurn(env=env, k=1, max_turns=max_turns).generate(TurnScriptEngine(turns), [_prompt(answer)], "run")
    return r


# --- pure functions ----------------------------------------------------------------------------

def test_final_answer_and_matching_by_hand():
    assert final_answer("so <answer> 14 </answer>") == "14"
    assert final_answer("<answer>1</answer> then <ANSWER>2</ANSWER>") == "2"  # the last tag
    assert final_answer("work\nAnswer: 1,024\n") == "1,024"
    assert final_answer("it is 14") is None  # no last-number guess
    assert answers_match("1,024", "1024.0") and answers_match(" Paris ", "paris")
    assert not answers_match("15", "14") and not answers_match("14x", "14")
    assert judge_final_answer("<answer>14</answer>", None) == {}  # no gold: cannot judge
    assert judge_final_answer("<answer>14</answer>", "14") == {"success": True, "answer": "14"}
    assert judge_final_answer("I think 14", "14") == {"success": False, "answer": None}


def test_env_signal_takes_the_latest_report():
    assert env_signal([]) == (None, None)
    assert env_signal([{"calls": 1}, {"calls": 0}]) == (None, None)
    assert env_signal([{"calls": 1}, {"success": True}]) == (1.0, True)
    assert env_signal([{"success": False}]) == (0.0, False)
    assert env_signal([{"reward": 0.2}, {"reward": 0.7}]) == (0.7, None)
    assert env_signal([{"reward": 0.2, "success": True}, {"success": False}]) == (0.2, False)
    with pytest.raises(ValueError, match="'bad'.*finite number"):
        env_signal([{"reward": "high"}], env="bad")
    with pytest.raises(ValueError, match="True or False"):
        env_signal([{"success": 1}], env="bad")
    with pytest.raises(ValueError, match="finite"):
        env_signal([{"reward": float("nan")}])


@pytest.mark.parametrize("source, w, env_r, env_ok, expected", [
    # verifier passed with score 1.0 in every row
    ("verifier", 0.5, 0.0, False, (1.0, True, "verifier")),
    ("env", 0.5, 0.0, False, (0.0, False, "env")),
    ("env", 0.5, 0.4, None, (0.4, None, "env")),
    ("env", 0.5, None, None, (0.0, None, "none")),
    ("env_or_verifier", 0.5, 0.0, False, (0.0, False, "env")),
    ("env_or_verifier", 0.5, None, None, (1.0, True, "verifier")),
    ("weighted", 0.25, 0.0, False, (0.75, False, "env+verifier")),  # 0.25*0 + 0.75*1
    ("weighted", 0.25, 1.0, True, (1.0, True, "env+verifier")),
    ("weighted", 0.6, None, None, (0.4, True, "env+verifier")),  # missing env counts 0; only the verifier judged
])
def test_episode_reward_by_hand(source, w, env_r, env_ok, expected):
    assert episode_reward(source, 1.0, True, env_r, env_ok, w) == pytest.approx(expected)


def test_episode_reward_rejects_bad_arguments():
    with pytest.raises(ValueError, match="unknown reward source"):
        episode_reward("judge", 1.0, True, None, None)
    with pytest.raises(ValueError, match="env_weight"):
        episode_reward("weighted", 1.0, True, None, None, 1.5)


# --- the MultiTurn topology records the env's signal ---------------------------------------------

def test_calculator_episode_records_env_success():
    ok = _episode(["Let me compute <calc>2 * (3 + 4)</calc>", "So <answer>14</answer>"])
    assert ok.finish_reason == "env_done" and ok.meta["turns"] == 2
    assert ok.meta["env_success"] is True and ok.signals["env_reward"] == 1.0
    assert ok.meta["env_info"][-1] == {"calls": 0, "success": True, "answer": "14"}
    wrong = _episode(["<calc>2*3+4</calc>", "Answer: 10"])
    assert wrong.meta["env_success"] is False and wrong.signals["env_reward"] == 0.0
    # the record still round-trips through the store's Arrow schema
    from gfcr.records import rollouts_to_table, table_to_rollouts

    (back,) = table_to_rollouts(rollouts_to_table([ok]))
    assert back.meta["env_success"] is True and back.signals["env_reward"] == 1.0


def test_env_that_cannot_judge_reports_nothing():
    no_gold = _episode(["<calc>1+1</calc>", "<answer>14</answer>"], answer=None)
    assert "env_success" not in no_gold.meta and "env_reward" not in no_gold.signals
    cut = _episode(["<calc>1+1</calc>"] * 3, max_turns=2)  # never ends: max_turns reached, no verdict
    assert cut.finish_reason == "length" and "env_success" not in cut.meta and "env_reward" not in cut.signals


class RewardOnlyEnv:
    """A user env (the 'pkg.module:Class' contract): reports a graded reward, no success."""

    name = "reward_only"

    def reset(self, task):
        self.n = 0
        return None

    def step(self, action_text):
        self.n += 1
        return "again", self.n >= 2, {"reward": 0.25 * self.n}


class BadEnv(RewardOnlyEnv):
    name = "bad_env"

    def step(self, action_text):
        return None, True, {"reward": "great"}


def test_user_env_by_import_path_reports_a_reward_and_a_bad_one_is_refused():
    r = _episode(["first", "second"], env=f"{__name__}:RewardOnlyEnv")
    assert r.signals["env_reward"] == 0.5 and "env_success" not in r.meta
    with pytest.raises(ValueError, match="bad_env.*finite number"):
        _episode(["x"], env=BadEnv)


# --- the collector's verify under each reward source ---------------------------------------------------

def _verify_with(source: str, rollouts, answer="14", topology="multi_turn", bonus=0.0, weight=0.5):
    params = {"env": "calculator"} if topology == "multi_turn" else {}  # env is a multi_turn key only
    cfg = load_config(None, {"generate.topology": {"name": topology, "params": params},
                             "verify.reward_source": source, "verify.env_weight": weight,
                             "verify.format_bonus": bonus})
    fake = SimpleNamespace(cfg=cfg, prompt_by_id={"p0": _prompt(answer)}, verifier=get_verifier("numeric"),
                           format_verifier=get_verifier("format", pattern=cfg.verify.format_pattern),
                           reward=reward_composition(cfg))
    StepCollector.verify(fake, [rollouts])
    return rollouts


def test_each_reward_source_gives_the_hand_worked_reward():
    # the final turn "it is 14" satisfies the lenient numeric verifier (last number) but not the
    # calculator env (no explicit answer): verifier 1, env 0
    turns = ["<calc>2*(3+4)</calc>", "it is 14"]
    (r,) = _verify_with("verifier", [_episode(turns)])
    assert (r.reward, r.verified) == (1.0, True)
    assert r.verifier["reward_source"] == "verifier" and r.verifier["reward_from"] == "verifier"
    assert r.verifier["env_success"] is False and r.signals["verifier_score"] == 1.0

    (r,) = _verify_with("env", [_episode(turns)])
    assert (r.reward, r.verified) == (0.0, False) and r.verifier["reward_from"] == "env"
    assert r.verifier["name"] == "numeric" and r.verifier["passed"] is True  # the verifier's own verdict is kept

    (r,) = _verify_with("env_or_verifier", [_episode(turns)])
    assert (r.reward, r.verified) == (0.0, False) and r.verifier["reward_from"] == "env"

    (r,) = _verify_with("weighted", [_episode(turns)], weight=0.25)
    assert r.reward == pytest.approx(0.75) and r.verified is False

    # an env with no gold cannot judge: env gives 0 (unjudged), env_or_verifier falls back to the verifier
    # (whose own gold is "14" here) and the format bonus is added on top
    (r,) = _verify_with("env", [_episode(["<calc>1</calc>", "Answer: 14"], answer=None)])
    assert (r.reward, r.verified) == (0.0, None) and r.verifier["reward_from"] == "none"
    (r,) = _verify_with("env_or_verifier", [_episode(["<calc>1</calc>", "Answer: 14"], answer=None)], bonus=0.5)
    assert r.reward == pytest.approx(1.5) and r.verified is True and r.verifier["reward_from"] == "verifier"
    assert r.signals["format"] == 1.0


def test_env_reward_source_on_a_single_turn_topology_is_refused_at_config_load():
    with pytest.raises(ConfigError, match="only multi-turn episodes have"):
        _verify_with("env", [_episode(["a", "b"])], topology="group")


@pytest.mark.parametrize("over, match", [
    ({"verify.reward_source": "env_only"}, "reward_source"),
    ({"verify.env_weight": 1.5}, "env_weight"),
])
def test_bad_reward_options_fail_at_config_load(over, match):
    with pytest.raises(ConfigError, match=match):
        load_config(None, over)


# --- the loop: multi_turn reward source recorded, before-eval runs env episodes --------------------

def test_multi_turn_run_records_its_reward_source_and_evaluates_episodes(tmp_path):
    model = save_tiny(str(tmp_path / "model"))
    cfg = load_config(None, {
        "model": model, "output_dir": str(tmp_path / "runs"), "steps": 1, "tensorboard": False,
        "tasks": [{"name": "arith", "n_train": 2, "n_eval": 2, "params": {"level": 1}}],
        "generate.topology": {"name": "multi_turn", "params": {"env": "calculator", "max_turns": 2, "k": 2}},
        "generate.prompts_per_step": 1, "generate.max_tokens": 6,
        "verify.reward_source": "env_or_verifier", "signals.entropy": False,
        "eval.before": True, "eval.k": 2, "eval.max_tokens": 4,
    })
    res = train(cfg, run_dir=tmp_path / "run", progress=False)
    ev = json.loads((res.run_dir / "eval_before.json").read_text())
    assert ev["info"]["env"] == "calculator" and ev["info"]["max_turns"] == 2
    assert ev["info"]["reward_source"] == "env_or_verifier" and ev["n_prompts"] == 2 and ev["n_samples"] == 2
    assert sum(ev["info"]["finish_reasons"].values()) == 2 * 2 + 2
    rs = RolloutStore.open(res.store_path).rollouts()
    assert len(rs) == 2
    for r in rs:
        assert r.verifier["reward_source"] == "env_or_verifier"
        has_env = "env_reward" in r.signals
        assert r.verifier["reward_from"] == ("env" if has_env else "verifier")
        expected = r.signals["env_reward"] if has_env else r.signals["verifier_score"]
        assert r.reward == pytest.approx(expected)  # format_bonus is 0
