"""Issue 47: ``arith-steps`` version 7 excludes a *false doubt*, doubt words that follow no false claim.

The chains testbed's warm start wrote "Wait, that's wrong." or "Oops, that's wrong:" in 61 of 300
generations, mostly after a *correct* line, then restated the same line; version 6 kept the doubt line
(only the verbatim repeat went). The paper's taxonomy calls such a detour redundant exploration. A
real corrected mistake is judged as before."""

from __future__ import annotations

import random

from gfcr.tasks.chains import worked_solution

from .conftest import judge_text

Q = "What is 32 + 36 + 5?"


def _run(tok, text, gold):
    return judge_text(tok, Q, text, gold)


def test_a_doubt_line_after_a_correct_step_is_redundant_exploration(tok):
    text = "32 + 36 = 68.\nWait, that's wrong.\n32 + 36 = 68.\n68 + 5 = 73.\nAnswer: 73"
    a, obj, kept = _run(tok, text, "73")
    assert a.status == "kept"
    assert obj["exclude"] == [{"unit": 2, "category": "redundant_exploration"},
                              {"unit": 3, "category": "redundant_exploration"}]
    assert kept == "32 + 36 = 68.\n68 + 5 = 73.\nAnswer: 73"


def test_doubt_words_opening_a_restated_correct_step_exclude_the_whole_line(tok):
    text = "32 + 36 = 68.\nOops, that's wrong: 32 + 36 = 68.\n68 + 5 = 73.\nAnswer: 73"
    a, obj, kept = _run(tok, text, "73")
    assert obj["exclude"] == [{"unit": 2, "category": "redundant_exploration"}]
    assert kept == "32 + 36 = 68.\n68 + 5 = 73.\nAnswer: 73"


def test_doubt_words_opening_a_new_step_are_excluded_alone(tok):
    text = "32 + 36 = 68.\nHmm, 68 + 5 = 73.\nAnswer: 73"
    a, obj, kept = _run(tok, text, "73")
    assert obj["exclude"] == [{"unit": 2, "quote": "Hmm, ", "category": "redundant_exploration"}]
    assert kept == "32 + 36 = 68.\n68 + 5 = 73.\nAnswer: 73"


def test_a_real_corrected_mistake_is_judged_as_before(tok):
    text = "32 + 36 = 67.\nWait, that's wrong.\n32 + 36 = 68.\n68 + 5 = 73.\nAnswer: 73"
    a, obj, kept = _run(tok, text, "73")
    assert obj["exclude"] == [{"unit": 1, "category": "corrected_mistake"},
                              {"unit": 2, "category": "corrected_mistake"}]
    assert kept == "32 + 36 = 68.\n68 + 5 = 73.\nAnswer: 73"


def test_a_statement_opening_with_no_is_not_a_doubt(tok):
    text = "No carrying is needed here.\n32 + 36 = 68.\n68 + 5 = 73.\nAnswer: 73"
    a, obj, kept = _run(tok, text, "73")
    assert obj["exclude"] == [] and kept == text


def test_the_testbed_model_s_false_doubts_leave_the_planted_exclusions_exact(tok):
    """A planted solution with a false doubt inserted after a correct step: the judge's exclusions are
    the planted spans plus exactly the inserted doubt."""
    sol = worked_solution("12 + 7 - 5", random.Random(0))
    assert sol.text == "12 + 7 = 19.\n19 - 5 = 14.\nAnswer: 14"
    lines = sol.text.split("\n")
    text = "\n".join([lines[0], "Wait, that's wrong.", *lines[1:]])
    a, obj, kept = _run(tok, text, "14")
    assert obj["exclude"] == [{"unit": 2, "category": "redundant_exploration"}]
    assert kept == sol.text
