"""The arith-steps judge checks every arithmetic claim: hand-written correct and false claims."""

from __future__ import annotations

import json

import pytest

from gfcr.ross.audit import judge_rollout
from gfcr.ross.claims import corrected_mistakes, evaluate_expr, find_claims
from gfcr.ross.judges import ArithSteps

from .conftest import make_prompt, make_rollout

# (text, [(claimed expression, stated value, correct)])
CLAIMS = [
    ("12 + 7 = 19", [("12 + 7", 19, True)]),
    ("12 + 7 = 18", [("12 + 7", 18, False)]),
    ("3 * 4 = 12, 12 - 5 = 8", [("3 * 4", 12, True), ("12 - 5", 8, False)]),
    ("9 x 2 = 18 and 7 / 2 = 3.5", [("9 * 2", 18, True), ("7 / 2", 3.5, True)]),
    ("2 + 3 * 4 = 14", [("2 + 3 * 4", 14, True)]),
    ("2 + 3 * 4 = 20", [("2 + 3 * 4", 20, False)]),
    ("1,000 + 24 = 1,024", [("1000 + 24", 1024, True)]),
    ("3 + 6 = 9 + 4 = 13", [("3 + 6", 9, True), ("9 + 4", 13, True)]),          # running total
    ("3 + 6 = 10 + 4 = 14", [("3 + 6", 10, False), ("10 + 4", 14, True)]),
    ("2 * 6 = 3 * 4", [("2 * 6", 12, True)]),
    ("23 + 45 gives 68", [("23 + 45", 68, True)]),
    ("23 + 45 gives 67", [("23 + 45", 67, False)]),
    ("The sum of 23 and 45 is 68.", [("23 + 45", 68, True)]),
    ("multiply 11 by 9, which results in 99", [("11 * 9", 99, True)]),
    ("multiply 11 by 9, which results in 90", [("11 * 9", 90, False)]),
    ("subtract 3 from 10 to get 7", [("10 - 3", 7, True)]),
    ("the difference between 10 and 3 is 6", [("10 - 3", 6, False)]),
    ("12 divided by 4 is 3", [("12 / 4", 3, True)]),
    ("3 plus 4 equals 8", [("3 + 4", 8, False)]),
    ("Adding 34 and 58, we get 92.", [("34 + 58", 92, True)]),
    ("the product of 6 and 7 is 42", [("6 * 7", 42, True)]),
    # the demo's truncated rollout: "(3 + 6) added to 9 gives 11" is false; the unfinished claim is none
    ("add 3 + 6 to 9, which gives 11. Then multiply 11 by 9, which results in", [("3 + 6 + 9", 11, False)]),
    ("Answer: 19", []),
    ("Step 2: we have 19 apples.", []),
]


@pytest.mark.parametrize("text,expected", CLAIMS)
def test_find_claims(text, expected):
    got = [(c.expr, c.stated, c.correct) for c in find_claims(text)]
    assert got == [(e, float(v), ok) for e, v, ok in expected]


def test_claim_span_is_exact_text():
    text = "so 5 + 5 = 10 and 2 * 2 = 5. Answer: 10"
    assert [text[c.start:c.end] for c in find_claims(text)] == ["5 + 5 = 10", "2 * 2 = 5"]


def test_evaluate_expr_precedence_and_division_by_zero():
    assert evaluate_expr("2 + 3 × 4 - 6 / 3") == 12.0
    assert evaluate_expr("-4 + 10") == 6.0
    assert evaluate_expr("5 / 0") is None


def _verdict(tok, text, gold):
    r = make_rollout(tok, "Compute it. End with 'Answer: N'.", text, gold=gold)
    dec, err, raws, _, _ = judge_rollout(r, make_prompt("q", gold), ArithSteps())
    assert err is None
    return dec, json.loads(raws[-1])


def test_false_verbal_claim_is_excluded_as_incorrect_claim(tok):
    text = "We multiply 11 by 9, which results in 90.\nSo the total is 9 * 11 = 99.\nAnswer: 99\n"
    dec, obj = _verdict(tok, text, "99")
    assert {"unit": 1, "category": "incorrect_claim"} in obj["exclude"]
    kept = "".join(c for c, k in zip(text, dec.kept_chars, strict=True) if k)
    assert "90" not in kept and "Answer: 99" in kept


def test_false_claim_later_corrected_is_corrected_mistake(tok):
    text = "23 + 45 gives 67.\nHmm, let me recount.\nThe sum of 23 and 45 is 68.\nAnswer: 68\n"
    _, obj = _verdict(tok, text, "68")
    cats = {e["unit"]: e["category"] for e in obj["exclude"]}
    assert cats == {1: "corrected_mistake", 2: "corrected_mistake"} and obj["keep"] == [3, 4]


def test_all_correct_claims_keep_everything(tok):
    text = "First, 23 + 45 = 68.\nThen 68 * 2 = 136.\nAnswer: 136\n"
    dec, obj = _verdict(tok, text, "136")
    assert obj["exclude"] == [] and obj["keep"] == [1, 2, 3] and dec.kept_chars.all()


def test_false_claim_in_answer_unit_is_quoted(tok):
    text = "3 plus 4 equals 8, I mean 3 + 4 = 7. Answer: 7"
    dec, obj = _verdict(tok, text, "7")
    # the claim and the filler up to its fix (version 4; version 3 kept ", I mean ")
    assert {"unit": 1, "quote": "3 plus 4 equals 8, I mean ", "category": "corrected_mistake"} in obj["exclude"]
    kept = "".join(c for c, k in zip(text, dec.kept_chars, strict=True) if k)
    assert kept == "3 + 4 = 7. Answer: 7"


def test_uncorrected_false_claim_without_a_correct_derivation_is_discarded(tok):
    # verified only because a lenient last-number reading found the gold "13"
    r = make_rollout(tok, "Compute 7 + 6.", "7 + 6 = 12 [1 + 2] is how many times 12 is divisible by 13.", gold="13")
    dec, err, raws, _, _ = judge_rollout(r, make_prompt("q", "13"), ArithSteps())
    assert dec.status == "discarded" and "discard rule" in dec.reason
    # the same false claim next to a correct derivation of the answer is excluded, not discarded
    r = make_rollout(tok, "q", "2 * 2 = 5 on the side.\n7 + 6 = 13.\nAnswer: 13", gold="13")
    dec, err, raws, _, _ = judge_rollout(r, make_prompt("q", "13"), ArithSteps())
    assert dec.status == "kept" and {"unit": 1, "category": "incorrect_claim"} in json.loads(raws[-1])["exclude"]


@pytest.mark.parametrize("text,gold,kept", [
    # the fixture rollout of the audit tests: main kept "Oops. 9 + 7 = 16."
    ("9 + 7 = 17.\nOops. 9 + 7 = 16.\nAnswer: 16\nDone!\n", "16", "9 + 7 = 16.\nAnswer: 16\n"),
    ("9 + 7 = 17.\nWait, that's wrong: 9 + 7 = 16.\nAnswer: 16", "16", "9 + 7 = 16.\nAnswer: 16"),
    ("9 + 7 = 17.\nOops.\n9 + 7 = 16.\nAnswer: 16", "16", "9 + 7 = 16.\nAnswer: 16"),  # a bare line: unit excluded
    ("9 + 7 = 17, oops, 9 + 7 = 16.\nAnswer: 16", "16", "9 + 7 = 16.\nAnswer: 16"),  # same unit: the filler too
    ("6 * 7 = 48.\nOops. Answer: 6 * 7 = 42", "42", "Answer: 6 * 7 = 42"),  # the fix in the answer unit
])
def test_filler_after_a_corrected_mistake_is_not_supervised(tok, text, gold, kept):
    """Issue 28: a bare "Oops." (or similar filler) before the fix stayed in the supervised text."""
    dec, obj = _verdict(tok, text, gold)
    got = "".join(c for c, k in zip(text, dec.kept_chars, strict=True) if k)
    assert got == kept, obj
    assert all(e["category"] in ("corrected_mistake", "redundant_exploration") for e in obj["exclude"])


def test_fix_unit_without_filler_is_kept_whole(tok):
    text = "9 + 7 = 17.\nSo 9 + 7 = 16 in total.\nAnswer: 16"
    dec, obj = _verdict(tok, text, "16")
    assert "".join(c for c, k in zip(text, dec.kept_chars, strict=True) if k) == "So 9 + 7 = 16 in total.\nAnswer: 16"


@pytest.mark.parametrize("text,n", [
    ("38 + 25 = 53.\nWait, I forgot the carry.\n38 + 25 = 63.\nAnswer: 63", 1),
    ("Oops, forgot the borrow: 63 - 7 = 56.", 0),  # a correct line alone: nothing to correct
    ("63 - 7 = 66.\nOops, forgot the borrow: 63 - 7 = 56.\n56 + 9 = 65.\nAnswer: 65", 1),
    ("38 + 25 = 53.\nAnswer: 53", 0),  # false and never fixed: not a *corrected* mistake
    ("38 + 25 = 53.\n38 + 25 = 54.\n38 + 25 = 63.", 2),  # two false claims, one later fix
    ("38 + 25 = 63.\n38 + 25 = 53.", 0),  # the correct claim comes first: the false one stands
])
def test_corrected_mistakes_counts_false_claims_fixed_later(text, n):
    assert corrected_mistakes(text) == n
    assert corrected_mistakes(text, find_claims(text)) == n  # the caller's parsed claims: the same count
    assert corrected_mistakes(text, []) == 0  # the claims given are the ones counted (the text is not parsed)


def test_corrected_mistakes_finds_every_planted_slip():
    """The testbed's imitation measure counts exactly the mistakes its worked solutions plant."""
    import random

    from gfcr.tasks.arith import make_arith
    from gfcr.tasks.chains import worked_solution

    prompts = make_arith(n=150, level=5, seed=0, split="test").prompts()
    planted = 0
    for mode in ("random", "carry"):
        for i, p in enumerate(prompts):
            ws = worked_solution(p.meta["expression"], random.Random(i), 1.0, 0.2, mistake=mode)
            assert corrected_mistakes(ws.text) == ws.n_mistakes, ws.text
            planted += ws.n_mistakes
    assert planted > 150
