"""Verdicts that do not lie: truncated generations are never verified by default, and a task's
stated answer format is read strictly (the lenient fallback is opt-in and recorded)."""

from __future__ import annotations

import numpy as np
import pytest

from gfcr.evaluate import evaluate_model
from gfcr.filters import get_verifier, verify_rollout
from gfcr.filters.verifiers import read_answer, stated_answer_format
from gfcr.records import Message, Prompt, Rollout
from gfcr.tasks.arith import make_arith

# The rollout `make demo` stored as verified: truncated mid-sentence, wrong, and passed by the
# last-number fallback, which took "9," from the restated problem.
DEMO_BAD = ("To find the sum, we add 3 + 6 to 9, which gives 11. Then we need to multiply 11 by 9, "
            "which results in")


def _arith_prompt() -> Prompt:
    p = Prompt(prompt_id="arith-x", task="arith", answer="9",
               messages=[Message("user", "Compute 3 + 6. Work it out step by step, writing each intermediate result, "
                                         "then finish with a final line of the form 'Answer: N'.")],
               meta={"answer_format": "answer_line"})
    return p


def _rollout(text: str, finish: str = "stop") -> Rollout:
    return Rollout(run_id="r", prompt_id="arith-x", task="arith", token_ids=[1, 2, 3], token_role=[0, 1, 1],
                   logprobs=[0.0, 0.0, 0.0], finish_reason=finish,
                   messages=[Message("user", "Compute 3 + 6."), Message("assistant", text)])


def test_demo_bad_rollout_is_not_verified():
    out = verify_rollout(_rollout(DEMO_BAD, "length"), get_verifier("numeric"), _arith_prompt())
    assert out.verified is False and out.reward == 0.0
    assert "truncated" in out.verifier["evidence"]["reason"]
    # even when truncation is allowed, the stated format ('Answer: N') is absent: still not verified
    out2 = verify_rollout(_rollout(DEMO_BAD, "length"), get_verifier("numeric", allow_truncated=True), _arith_prompt())
    assert out2.verified is False and out2.verifier["evidence"]["extracted"] is None
    # what used to happen: lenient last-number reading of a truncated text, now opt-in and recorded
    lax = get_verifier("numeric", allow_truncated=True, lenient_fallback=True)
    out3 = verify_rollout(_rollout(DEMO_BAD, "length"), lax, _arith_prompt())
    assert out3.verified is True and out3.verifier["evidence"]["lenient_fallback"] is True
    assert out3.verifier["evidence"]["extraction"] == "last_number"


@pytest.mark.parametrize("name", ["numeric", "exact", "math"])
def test_truncated_never_verified_unless_configured(name):
    text = "3 + 6 = 9\nAnswer: 9"
    v = get_verifier(name)
    assert v.verify(text, answer="9", answer_format="answer_line", finish_reason="stop").passed is True
    cut = v.verify(text, answer="9", answer_format="answer_line", finish_reason="length")
    assert cut.passed is False and cut.evidence["finish_reason"] == "length"
    assert get_verifier(name, allow_truncated=True).verify(text, answer="9", finish_reason="length").passed is True
    # the rollout's own finish_reason is read when no explicit one is given
    assert v.verify(text, answer="9", rollout=_rollout(text, "abort")).passed is False


def test_multi_turn_out_of_turns_is_not_truncation():
    r = _rollout("Answer: 9", "length")
    r.meta["max_turns_reached"] = True
    assert get_verifier("numeric").verify("Answer: 9", answer="9", rollout=r).passed is True


def test_stated_format_read_strictly():
    v = get_verifier("numeric")
    p = _arith_prompt()
    assert verify_rollout(_rollout("3 + 6 = 9"), v, p).verified is False           # no Answer line
    assert verify_rollout(_rollout("3 + 6 = 9\nAnswer: 9"), v, p).verified is True
    assert verify_rollout(_rollout("Answer: 9\nWait, 3 + 6 = 8"), v, p).verified is True  # the line, not the last number
    assert verify_rollout(_rollout("**Answer:** 9."), v, p).verified is True
    assert verify_rollout(_rollout("Answer: 9 apples"), v, p).verified is True
    assert verify_rollout(_rollout("Answer: 3 + 6 = 9"), v, p).verified is False
    # mid-sentence "the answer is: 9" is not the stated line
    assert verify_rollout(_rollout("I think the answer is: 9"), v, p).verified is False
    ev = verify_rollout(_rollout("Answer: 9"), v, p).verifier["evidence"]
    assert ev["answer_format"] == "answer_line" and ev["lenient_fallback"] is False
    # a task stating no format keeps the lenient order (unchanged behaviour)
    free = Prompt(prompt_id="arith-x", task="t", answer="9", messages=[Message("user", "3+6?")])
    assert verify_rollout(_rollout("so 9"), v, free).verified is True


def test_boxed_format():
    assert read_answer("x = 2, \\boxed{7} and 8", "boxed") == ("7", "boxed")
    assert read_answer("Answer: 8", "boxed") == (None, "none")
    m = get_verifier("math")
    assert m.verify("so 7", answer="7", answer_format="boxed").passed is False
    assert m.verify("so \\boxed{7}", answer="7", answer_format="boxed").passed is True


def test_task_sources_state_their_format():
    p = make_arith(n=2, level=2).prompts()[0]
    assert p.meta["answer_format"] == "answer_line" and stated_answer_format(p) == "answer_line"
    # a prompt stored before the meta key existed: read from the instruction
    old = Prompt(prompt_id="o", task="arith", messages=p.messages, answer=p.answer)
    assert stated_answer_format(old) == "answer_line"
    boxed = Prompt(prompt_id="b", task="math", messages=[Message("user", "Put the result in \\boxed{}.")])
    assert stated_answer_format(boxed) == "boxed"
    assert stated_answer_format(Prompt(prompt_id="n", task="t", messages=[Message("user", "2+2?")])) is None


class _CutEngine:
    """Fake engine: every sample says 'Answer: <gold>' but the first sample of each prompt is cut."""

    name = "fake"

    def __init__(self, gold: dict[str, str]):
        self.gold = gold

    def generate(self, reqs):
        from gfcr.generate.engines.base import GenResult

        out = []
        for r in reqs:
            g = self.gold[r.request_id]
            out.append([GenResult(token_ids=np.zeros(3, np.int32), logprobs=np.zeros(3, np.float32),
                                  finish_reason="length" if i == 0 else "stop", text=f"Answer: {g}")
                        for i in range(r.params.n)])
        return out


def test_evaluate_model_counts_truncated_as_wrong():
    ps = make_arith(n=3, level=1, split="test").prompts()
    eng = _CutEngine({p.prompt_id: p.answer for p in ps})
    res = evaluate_model(eng, ps, k=4, greedy=True)
    assert res.metrics["avg@4"].value == pytest.approx(0.75)
    assert res.metrics["greedy_pass@1"].value == 0.0 and res.info["truncated"] == 3 + 3
    res2 = evaluate_model(eng, ps, k=4, greedy=True, allow_truncated=True)
    assert res2.metrics["avg@4"].value == 1.0


def test_resolve_verifier_builds_the_named_verifier_with_its_params():
    """The arith task states 'Answer: N': strict reading fails '... is 7', the lenient fallback passes it."""
    from gfcr.evaluate import resolve_verifier

    p = make_arith(n=1, level=1, split="train", seed=0).prompts()[0]
    text = f"The sum is {p.answer}."
    assert resolve_verifier("numeric")(p, text) is False
    assert resolve_verifier("numeric", {"lenient_fallback": True})(p, text) is True
    with pytest.raises(ValueError, match="lenient_fallbak"):
        resolve_verifier("numeric", {"lenient_fallbak": True})
    with pytest.raises(ValueError, match="not to a callable"):
        resolve_verifier(lambda p, c: True, {"lenient_fallback": True})


@pytest.mark.parametrize(("text", "want"), [
    ("So, 82 + 82 = 164, which is the final answer to the calculation.", ("164", "last_number")),
    ("we add 3 + 6 to 9, which gives", ("9", "last_number")),
    ("a total of 1,234 apples", ("1,234", "last_number")),
    ("Answer: 12,", ("12", "answer_line")),
    ("it is -3.5, ok", ("-3.5", "last_number")),
])
def test_extracted_number_never_ends_in_a_separator(text, want):
    # the ROSS study stored "164," as the extracted answer of a correct rollout (the last-number
    # pattern let a comma end a number), and the audit refused every verdict keeping "= 164."
    from gfcr.filters.answers import extract_answer

    assert extract_answer(text) == want


def test_ross_answer_check_accepts_a_unit_with_the_bare_number():
    from gfcr.ross.audit import verified_answer

    text = "To compute 82 + 82, we add: 82 + 82 = 164.\nSo, 82 + 82 = 164, which is the final answer."
    r = _rollout(text)
    r = verify_rollout(r, get_verifier("numeric", lenient_fallback=True),
                       Prompt(prompt_id="arith-x", task="arith", answer="164", messages=r.messages[:1]))
    assert r.verified and verified_answer(r, None) == "164"


@pytest.mark.parametrize(("text", "want"), [
    ("Sum: 5 + (3 + 1) = 8\nNow, the answer is: Answer: 6", "6"),  # as the demo's model wrote it
    ("The answer is: Answer: 64.", "64"),
    ("Final answer: **Answer:** 64", "64"),
    ("Answer: answer: 64", "64"),
    ("Answer: 64", "64"),
    ("Answer: answers vary", "answers vary"),  # a word that only starts like the marker stays
])
def test_a_repeated_answer_marker_is_not_part_of_the_answer(text, want):
    # the demo stored "Answer: 45" as the extracted answer of "The answer is: Answer: 45": the
    # same line with the right number would have been judged wrong
    from gfcr.evaluate import resolve_verifier
    from gfcr.filters.answers import extract_answer

    assert extract_answer(text) == (want, "answer_line")
    p = Prompt(prompt_id="arith-y", task="arith", answer=want, messages=[Message("user", "q")])
    if want[0].isdigit():
        assert resolve_verifier("numeric")(p, text) is True
