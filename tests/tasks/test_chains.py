"""Planted corrected mistakes and detours (gfcr.tasks.chains) and the arith-steps judge marking them exactly."""

from __future__ import annotations

import random

import numpy as np
import pytest

from gfcr.ross.judges import ArithSteps, JudgeRequest
from gfcr.ross.units import split_units
from gfcr.ross.verdict import validate_verdict
from gfcr.tasks.arith import make_arith
from gfcr.tasks.chains import (
    DOUBT_LEAD,
    DOUBT_LINE,
    SLIP_DOUBT_LEAD,
    SLIP_DOUBT_LINE,
    carries,
    steps_of,
    worked_solution,
)


def test_steps_fold_left_to_right():
    assert steps_of("12 + 7 - 5") == [(12, "+", 7, 19), (19, "-", 5, 14)]
    assert steps_of("50 - 60 + 3 - 4")[-1] == (-7, "-", 4, -11)
    with pytest.raises(ValueError, match="chain"):
        steps_of("3 * 4")


def test_clean_solution_has_nothing_planted():
    ws = worked_solution("12 + 7 - 5", random.Random(0))
    assert ws.text == "12 + 7 = 19.\n19 - 5 = 14.\nAnswer: 14"
    assert ws.planted == () and ws.n_mistakes == 0 and ws.n_detours == 0


def test_every_step_mistaken_then_fixed():
    ws = worked_solution("12 + 7 - 5", random.Random(3), mistake_rate=1.0)
    assert ws.n_mistakes == 2 and ws.text.endswith("Answer: 14")
    lines = ws.text.splitlines(keepends=True)
    # a wrong result of the first step, then its fix (a doubt line or a doubt lead), before step 2
    assert lines[0].startswith("12 + 7 = ") and lines[0] != "12 + 7 = 19.\n"
    assert lines[1] in (DOUBT_LINE, DOUBT_LEAD + "12 + 7 = 19.\n")
    planted = "".join(ws.text[s.start:s.end] for s in ws.planted)
    assert DOUBT_LINE in planted or DOUBT_LEAD in planted
    assert all(s.category == "corrected_mistake" for s in ws.planted)
    # the kept text is the clean solution
    kept = "".join(c for c, m in zip(ws.text, ws.excluded_mask(), strict=True) if not m)
    assert kept == "12 + 7 = 19.\n19 - 5 = 14.\nAnswer: 14"


def test_rates_are_checked():
    with pytest.raises(ValueError, match="rates"):
        worked_solution("1 + 2", random.Random(0), mistake_rate=1.5)


def test_carries_marks_units_carry_and_borrow_only():
    assert carries(38, "+", 25) and carries(5, "+", 5) and not carries(31, "+", 25)
    assert carries(63, "-", 7) and carries(40, "-", 13) and not carries(67, "-", 3)
    # negative values and a subtraction going below zero never count
    assert not carries(-12, "+", 9) and not carries(12, "+", -9) and not carries(5, "-", 9) and not carries(-3, "-", 7)
    with pytest.raises(ValueError, match="op"):
        carries(3, "*", 4)


def test_carry_mode_slips_on_a_carry_step_at_dose_one():
    """38 + 25 carries, 63 - 7 borrows: at dose 1.0 both slip to the no-carry/no-borrow result
    (63 - 10, 56 + 10), each fixed by a doubt naming the reason; the kept text is the clean solution."""
    forms = set()
    for seed in range(20):
        ws = worked_solution("38 + 25 - 7", random.Random(seed), mistake_rate=1.0, mistake="carry")
        lines = ws.text.splitlines(keepends=True)
        assert ws.n_mistakes == 2 and lines[0] == "38 + 25 = 53.\n", ws.text
        assert lines[1] in (SLIP_DOUBT_LINE["+"], SLIP_DOUBT_LEAD["+"] + "38 + 25 = 63.\n")
        assert "63 - 7 = 66.\n" in lines and ws.text.endswith("Answer: 56")
        assert (SLIP_DOUBT_LINE["-"] in lines) != (SLIP_DOUBT_LEAD["-"] + "63 - 7 = 56.\n" in lines)
        forms.update(ln for ln in lines if "forgot" in ln)
        assert all(s.category == "corrected_mistake" for s in ws.planted)
        kept = "".join(c for c, m in zip(ws.text, ws.excluded_mask(), strict=True) if not m)
        assert kept == "38 + 25 = 63.\n63 - 7 = 56.\nAnswer: 56"
    # both forms (its own line, opening the corrected line) for both reasons were drawn
    assert forms == {"Wait, I forgot the carry.\n", "Oops, forgot the carry: 38 + 25 = 63.\n",
                     "Wait, I forgot the borrow.\n", "Oops, forgot the borrow: 63 - 7 = 56.\n"}


def test_carry_mode_never_slips_without_a_carry_or_borrow():
    # 31 + 25 has no carry, 56 - 3 no borrow, 53 - 60 goes below zero: nothing is planted at dose 1.0
    for seed in range(20):
        ws = worked_solution("31 + 25 - 3", random.Random(seed), mistake_rate=1.0, mistake="carry")
        assert ws.text == "31 + 25 = 56.\n56 - 3 = 53.\nAnswer: 53" and ws.planted == ()
        ws = worked_solution("31 + 22 - 60", random.Random(seed), mistake_rate=1.0, mistake="carry")
        assert ws.n_mistakes == 0 and "-7" in ws.text
    # a mixed chain: only the borrowing step slips (12 + 7 = 19 has no carry; 19 - 5: 9 ≥ 5, none;
    # 14 - 8 borrows: 4 < 8, the no-borrow result 16)
    ws = worked_solution("12 + 7 - 5 - 8", random.Random(1), mistake_rate=1.0, mistake="carry")
    assert ws.n_mistakes == 1 and ws.text.startswith("12 + 7 = 19.\n19 - 5 = 14.\n14 - 8 = 16.\n"), ws.text
    # dose 0: the clean solution, as in the random mode
    assert worked_solution("38 + 25 - 7", random.Random(0), mistake="carry").text == "38 + 25 = 63.\n63 - 7 = 56.\nAnswer: 56"


def test_unknown_mistake_mode_is_named():
    with pytest.raises(ValueError, match="'typo'"):
        worked_solution("1 + 2", random.Random(0), mistake="typo")


@pytest.mark.parametrize("dose,detour,mistake", [(0.3, 0.1, "random"), (0.6, 0.3, "random"),
                                                 (0.3, 0.1, "carry"), (1.0, 0.3, "carry")])
def test_arith_steps_excludes_exactly_the_planted_spans(dose, detour, mistake):
    """The testbed's premise: on these successes the rule judge's exclusions are the planted ones,
    character for character (mistake, its doubt, verbatim repeats), and the closing answer is kept.
    Carry mode: the doubts name the reason ("Wait, I forgot the carry.", "Oops, forgot the borrow: ")."""
    n = 150 if mistake == "random" else 250
    prompts = make_arith(n=n, level=5, seed=7, split="test").prompts()
    n_mistakes = n_detours = 0
    reasons: set[str] = set()
    for i, p in enumerate(prompts):
        ws = worked_solution(p.meta["expression"], random.Random(i), dose, detour, mistake=mistake)
        n_mistakes += ws.n_mistakes
        n_detours += ws.n_detours
        reasons.update(w for w in ("forgot the carry", "forgot the borrow") if w in ws.text)
        units = split_units(ws.text)
        req = JudgeRequest(f"r{i}", "arith", "", ws.text, units, "select-keep", answer=p.answer)
        d = validate_verdict(ArithSteps().verdict(req), ws.text, units, "select-keep", answer=p.answer)
        assert d.status == "kept"
        assert np.array_equal(~d.kept_chars, np.array(ws.excluded_mask(), bool)), ws.text
        kept = "".join(c for c, k in zip(ws.text, d.kept_chars, strict=True) if k)
        assert kept.endswith(f"Answer: {p.answer}")
    assert n_mistakes > (50 if mistake == "random" else 30) and n_detours > 10  # both kinds were planted
    assert reasons == (set() if mistake == "random" else {"forgot the carry", "forgot the borrow"})
