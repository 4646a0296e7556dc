"""Planted corrected mistakes and detours (gfcr.tasks.chains) and the arith-steps judge marking them exactly."""

from __future__ import annotations

import random

import numpy as np
import pytest

from gfcr.ross.judges import ArithSteps, JudgeRequest
from gfcr.ross.units import split_units
from gfcr.ross.verdict import validate_verdict
from gfcr.tasks.arith import make_arith
from gfcr.tasks.chains import DOUBT_LEAD, DOUBT_LINE, steps_of, worked_solution


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


@pytest.mark.parametrize("dose,detour", [(0.3, 0.1), (0.6, 0.3)])
def test_arith_steps_excludes_exactly_the_planted_spans(dose, detour):
    """The testbed's premise: on these successes the rule judge's exclusions are the planted ones,
    character for character (mistake, its doubt, verbatim repeats), and the closing answer is kept."""
    prompts = make_arith(n=150, level=5, seed=7, split="test").prompts()
    n_mistakes = n_detours = 0
    for i, p in enumerate(prompts):
        ws = worked_solution(p.meta["expression"], random.Random(i), dose, detour)
        n_mistakes += ws.n_mistakes
        n_detours += ws.n_detours
        units = split_units(ws.text)
        req = JudgeRequest(f"r{i}", "arith", "", ws.text, units, "select-keep", answer=p.answer)
        d = validate_verdict(ArithSteps().verdict(req), ws.text, units, "select-keep", answer=p.answer)
        assert d.status == "kept"
        assert np.array_equal(~d.kept_chars, np.array(ws.excluded_mask(), bool)), ws.text
        kept = "".join(c for c, k in zip(ws.text, d.kept_chars, strict=True) if k)
        assert kept.endswith(f"Answer: {p.answer}")
    assert n_mistakes > 50 and n_detours > 10  # both kinds were planted
