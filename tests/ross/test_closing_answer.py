"""Issue 47: the ``arith-steps`` judge keeps the statement of the verified final answer that closes
the solution. Version 5 excluded it in 80 of 108 excluded spans of a demo store: its answer-line
pattern missed "The answer is: N" and the words of "The answer to your question is: N", and every
line after the first answer-bearing one was "redundant exploration". The rollouts below are shaped
like the demo model's (the first two are its own, quoted in the issue)."""

from __future__ import annotations

import pytest

from gfcr.ross.judges import ArithSteps, answer_line, answer_line_value

from .conftest import judge_text

Q = "What is 78 + 29?"


def _run(tok, text, gold):
    return judge_text(tok, Q, text, gold)


def test_demo_rollout_keeps_its_closing_answer_line(tok):
    text = "78 + 29 = 107\n\nThe final answer is: 107"
    a, obj, kept = _run(tok, text, "107")
    assert a.status == "kept" and obj["exclude"] == [] and kept == text
    assert a.meta["eos_supervised"] is True  # the stop right after the closing statement is taught


def test_demo_rollout_keeps_a_correct_restatement_and_the_closing_line(tok):
    text = ("To add 64 and 24, add the tens and then the ones.\n\n64 + 24 = 88\n\nSo, 64 + 24 = 88.\n\n"
            "The answer to your question is: 88")
    a, obj, kept = _run(tok, text, "88")
    assert a.status == "kept", obj
    assert kept.endswith("So, 64 + 24 = 88.\n\nThe answer to your question is: 88")  # v5 excluded both
    assert a.meta["eos_supervised"] is True


@pytest.mark.parametrize("closing", [
    "Answer: 107", "The answer is 107.", "**Answer:** 107", "The answer is: 107", "The final answer is: $107$",
    "The answer to the question is: **107**", "\\boxed{107}", "So the answer for this sum is 107.",
])
def test_closing_answer_forms_are_kept_and_close_the_solution(tok, closing):
    text = f"Let me add. 78 + 29 = 107\nCheck: 107 - 29 = 78.\n{closing}\nHope this helps!\n"
    a, obj, kept = _run(tok, text, "107")
    assert a.status == "kept"
    # the check before the closing line is a correct line, kept; the chatter after it is not
    assert kept == f"Let me add. 78 + 29 = 107\nCheck: 107 - 29 = 78.\n{closing}\n", obj
    assert obj["exclude"] == [{"unit": 4, "category": "redundant_exploration"}]
    assert a.meta["eos_supervised"] is True


def test_wrong_intermediate_then_corrected_is_still_excluded(tok):
    text = "78 + 29 = 97\nWait, that is not right.\n78 + 29 = 107\n\nThe answer is: 107"
    a, obj, kept = _run(tok, text, "107")
    cats = {e["unit"]: e["category"] for e in obj["exclude"]}
    assert cats == {1: "corrected_mistake", 2: "corrected_mistake"}
    assert kept == "78 + 29 = 107\n\nThe answer is: 107" and a.meta["eos_supervised"] is True


def test_uncorrected_false_claim_is_excluded_and_the_closing_line_kept(tok):
    text = "We know 2 * 2 = 5.\n78 + 29 = 107\n\nAnswer: 107"
    a, obj, kept = _run(tok, text, "107")
    assert {"unit": 1, "category": "incorrect_claim"} in obj["exclude"]
    assert kept == "78 + 29 = 107\n\nAnswer: 107"


def test_earlier_answer_lines_go_the_closing_one_stays(tok):
    # a claim-free restatement before the closing line may go; a wrong answer line is a mistake
    text = "78 + 29 = 107\nThe answer is 107.\nAnswer: 97\nCheck: 107 - 29 = 78.\nThe answer is: 107"
    a, obj, kept = _run(tok, text, "107")
    cats = {e["unit"]: e["category"] for e in obj["exclude"]}
    assert cats == {2: "redundant_exploration", 3: "corrected_mistake"}
    assert kept == "78 + 29 = 107\nCheck: 107 - 29 = 78.\nThe answer is: 107"


def test_answer_line_pattern():
    assert answer_line("88").search("The answer to your question is: 88")
    assert answer_line("107").search("the final answer is: 107")
    assert not answer_line("10").search("The answer is: 107")  # no prefix match
    assert not answer_line("9").search("The final answer is N, which is 9.")
    assert not answer_line("5").search("The answer to step 1 is: 5")  # an intermediate, not the answer
    assert answer_line_value("**Answer:** 1,250") == "1,250" and answer_line_value("12 + 7 = 19") is None


def test_version_bumped():
    # audits by version 5 excluded the closing line, version 6 kept false doubts, version 7 excluded a
    # closing result stated without an answer phrase: never mix them
    assert ArithSteps.version == "8"


def test_an_intermediate_answer_phrase_is_not_a_wrong_answer_line(tok):
    # "the answer to the first step" names an intermediate: a correct line, kept
    text = "The answer to the first step is 30.\n30 + 48 = 78\n78 + 29 = 107\nThe answer is: 107"
    a, obj, kept = _run(tok, text, "107")
    assert obj["exclude"] == [] and kept == text
    assert answer_line_value("The answer to the first step is 30.") is None


# Version 8: the ROSS study's store (1,011 kept rollouts, judge v7) still had 26 whose closing statement
# was excluded as chatter because it stated the result without an answer phrase. Five of them, verbatim:
@pytest.mark.parametrize("text, gold", [
    ("53 + 75 = 128\n\nResult: 128", "128"),
    ("35 + 21 = 56\n56 is the final result.", "56"),
    ("55 + 20 = 75\n\nThe completed calculation is: 75", "75"),
    ("57 + 71 = 128\n\nFinish the line with the final number, 128.", "128"),
    ("You calculate: 22 + 11 = 33\nYou have: 22 + 11 = 33\nYou have: 33 is your answer", "33"),
    ('30 + 85 = 115\n\nThe answer is "115".', "115"),  # a quoted value (the answer-line pattern took no quotes)
])
def test_a_result_stated_in_words_closes_the_solution_and_is_kept(tok, text, gold):
    a, obj, kept = _run(tok, text, gold)
    assert a.status == "kept" and obj["exclude"] == [], obj  # version 7 excluded the last line
    assert kept == text and a.meta["eos_supervised"] is True


def test_chatter_that_only_mentions_the_answer_is_still_excluded(tok):
    # the number is not the line's result: the correct claim before it closes the solution (version 5)
    text = "51 + 89 = 140\nI added the numbers 140 to the original equation."
    a, obj, kept = _run(tok, text, "140")
    assert obj["exclude"] == [{"unit": 2, "category": "redundant_exploration"}]
    assert kept.strip() == "51 + 89 = 140" and a.meta["eos_supervised"] is True


def test_a_result_line_with_a_false_claim_does_not_close_the_solution(tok):
    text = "78 + 29 = 107\nSo 78 + 20 = 107"  # ends on the answer, but through a false claim
    a, obj, kept = _run(tok, text, "107")
    assert a.status == "kept" and kept.strip() == "78 + 29 = 107", obj


def test_states_result():
    from gfcr.ross.judges import states_result

    yes = ["Result: 128", "**128**", "The total comes to $128$.", "So we get 128!", "128 is your final answer"]
    no = ["I added the numbers 128 to the original equation.", "Result: 1280", "Result: 12.8", "128 apples and more"]
    assert [states_result(t, "128") for t in yes] == [True] * len(yes)
    assert [states_result(t, "128") for t in no] == [False] * len(no)
