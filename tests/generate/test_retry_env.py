"""The ``retry`` env: a grader that lets the policy try again, and what ROSS's rule judge makes of
the successes it yields (a wrong attempt, the feedback, a right one)."""

import numpy as np
import pytest

from gfcr.generate.engines import SamplingParams
from gfcr.generate.envs import RetryEnv, env_signal, make_env
from gfcr.generate.topologies import MultiTurn
from gfcr.records import Message, Prompt, Rollout
from gfcr.tasks.arith import make_arith


def test_the_docstring_example_wrong_then_right():
    env = make_env("retry", lenient=True)
    assert isinstance(env, RetryEnv) and env.reset(Prompt(prompt_id="p", task="arith", messages=[], answer="50")) is None
    first = env.step("17 + 33 = 40.")
    assert first == ("That is not correct. Try again.", False, {"success": False, "answer": "40", "attempt": 1})
    second = env.step("17 + 33 = 50.")
    assert second == (None, True, {"success": True, "answer": "50", "attempt": 2})
    assert env_signal([first[2], second[2]]) == (1.0, True)  # the episode's: the latest report


def test_strict_reads_only_a_stated_answer_and_lenient_falls_back_to_the_last_number():
    gold = Prompt(prompt_id="p", task="arith", messages=[], answer="1024")
    strict, lenient = RetryEnv(), RetryEnv(lenient=True, feedback="No.")
    strict.reset(gold)
    lenient.reset(gold)
    assert strict.step("it is 1024")[2] == {"success": False, "answer": None, "attempt": 1}
    assert strict.step("work\nAnswer: 1,024")[2]["success"] is True
    assert lenient.step("I think 1000 or 1,024")[:2] == (None, True)
    assert lenient.read("no number here") is None and lenient.read("<answer>7</answer> then 9") == "7"
    lenient.reset(gold)
    assert lenient.step("nothing")[0] == "No." and lenient.attempt == 1  # a reset starts the count again


def test_a_task_without_a_gold_answer_is_not_graded():
    env = RetryEnv(lenient=True)
    env.reset(Prompt(prompt_id="p", task="arith", messages=[]))
    assert env.step("42") == (None, True, {"attempt": 1})


def test_episodes_of_a_policy_that_never_answers_right_run_every_turn(engine, tiny):
    prompts = make_arith(n=2, level=1, seed=0).prompts()
    for p in prompts:
        p.answer = "no such answer"
    tok = engine.tokenizer  # a turn cut by max_tokens ends the episode: stop on a common token instead
    params = SamplingParams(max_tokens=16, temperature=1.0, stop_token_ids=list(range(0, len(tok), 3)))
    rs = MultiTurn(env=lambda: RetryEnv(lenient=True), k=2, max_turns=3, params=params, seed=0).generate(
        engine, prompts, run_id="r")
    assert len(rs) == 4
    for r in rs:
        r.validate()
        assert [m.role for m in r.messages[-5:]] == ["assistant", "user", "assistant", "user", "assistant"]
        assert [m.content for m in r.messages if m.role == "user"][-2:] == [RetryEnv.FEEDBACK] * 2
        assert r.meta["env_success"] is False and r.signals["env_reward"] == 0.0
        # the third answer's feedback has no turn left to read it: kept aside, not in the conversation
        assert r.finish_reason == "length" and r.meta["max_turns_reached"] and r.meta["turns"] == 3
        assert r.meta["final_observation"] == RetryEnv.FEEDBACK and "template_mismatch" not in r.meta
        text = tok.apply_chat_template([{"role": m.role, "content": m.content} for m in r.messages], tokenize=False)
        assert tok.decode(r.token_ids.tolist(), skip_special_tokens=False) == text


def episode(turns: list[str], answer: str) -> tuple[Rollout, Prompt]:
    msgs = [Message("user", "What is 17 + 33?")]
    for i, t in enumerate(turns):
        msgs += [Message("assistant", t)] + ([Message("user", RetryEnv.FEEDBACK)] if i < len(turns) - 1 else [])
    p = Prompt(prompt_id="p", task="arith", messages=msgs[:1], answer=answer)
    r = Rollout(run_id="r", prompt_id="p", token_ids=np.zeros(1, np.int32), token_role=np.ones(1, np.int8),
                logprobs=np.zeros(1, np.float32), task="arith", messages=msgs, reward=1.0, verified=True,
                verifier={"name": "numeric", "evidence": {"parsed": answer}})
    return r, p


@pytest.mark.parametrize("turns, excluded, kept", [
    # the failed attempt is a false claim the last turn corrects: out of the loss, the fix kept
    (["17 + 33 = 40.", "17 + 33 = 50."], ["17 + 33 = 40."], ["17 + 33 = 50."]),
    # a bare wrong answer line, then the right one
    (["Answer: 40", "17 + 33 = 50.\nAnswer: 50"], ["Answer: 40"], ["17 + 33 = 50.", "Answer: 50"]),
    # two failed attempts
    (["17 + 33 = 40.", "17 + 33 = 51.", "17 + 33 = 50."], ["17 + 33 = 40.", "17 + 33 = 51."], ["17 + 33 = 50."]),
])
def test_the_rule_judge_excludes_failed_attempts_and_keeps_the_answer_that_passed(turns, excluded, kept):
    from gfcr.ross.audit import judge_request
    from gfcr.ross.judges import ArithSteps
    from gfcr.ross.verdict import validate_verdict

    r, p = episode(turns, "50")
    req, _ = judge_request(r, p, "select-keep")
    d = validate_verdict(ArithSteps().verdict(req), req.text, req.units, "select-keep", answer="50")
    kept_text = "".join(c for c, k in zip(req.text, d.kept_chars, strict=True) if k)
    for s in excluded:
        assert s not in kept_text
    for s in kept:
        assert s in kept_text
    cats = {e["category"] for e in ArithSteps().verdict(req)["exclude"]}
    assert cats == {"corrected_mistake"}
