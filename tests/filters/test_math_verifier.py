"""Math verifier: extraction, math-verify equivalence in worker processes, threads, timeouts."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from gfcr.filters import extract_answer, get_verifier
from gfcr.filters._mathpool import MathVerifyPool

# (completion, gold, expected passed)
CASES = [
    # fractions
    ("The answer is \\boxed{\\frac{3}{4}}.", "3/4", True),
    ("\\boxed{\\frac{6}{8}}", "\\frac{3}{4}", True),
    ("Answer: 3/4", "0.75", True),
    ("\\boxed{\\dfrac{1}{2}}", "0.5", True),
    ("\\boxed{\\frac{2}{3}}", "0.75", False),
    # decimals
    ("so we get 0.75", "3/4", True),
    ("Answer: 2.50", "2.5", True),
    ("\\boxed{3.14}", "3.15", False),
    ("\\boxed{-0.2}", "-1/5", True),
    # integers, commas, last number
    ("First 12, then 30. So 42", "42", True),
    ("Answer: 1,000", "1000", True),
    ("I think 7 and then 8", "7", False),
    ("Answer: -5", "-5", True),
    ("Answer: 5", "-5", False),
    # LaTeX expressions
    ("\\boxed{\\sqrt{2}/2}", "\\frac{1}{\\sqrt{2}}", True),
    ("\\boxed{2\\pi}", "2\\pi", True),
    ("\\boxed{x^2+2x+1}", "(x+1)^2", True),
    ("\\boxed{x=3}", "3", True),
    ("\\boxed{\\frac{\\pi}{3}}", "\\frac{\\pi}{6}", False),
    ("\\boxed{2^{10}}", "1024", True),
    # intervals and sets
    ("\\boxed{[1, 2)}", "[1,2)", True),
    ("\\boxed{(1, 2)}", "[1,2)", False),
    ("\\boxed{(-\\infty, 0]}", "(-\\infty,0]", True),
    ("\\boxed{\\{1, 2, 3\\}}", "\\{3,2,1\\}", True),
    # units, percent, text around
    ("The length is \\boxed{5\\text{ cm}}", "5", True),
    ("Answer: 5 cm", "5", True),
    ("\\boxed{50\\%}", "0.5", True),
    ("\\boxed{12 \\text{ apples}}", "13", False),
    # nested boxed braces, last boxed wins
    ("first \\boxed{1} then corrected \\boxed{\\frac{1}{2}}", "1/2", True),
    ("first \\boxed{\\frac{1}{2}} then \\boxed{1}", "1/2", False),
    # no answer
    ("I do not know.", "3", False),
    ("", "3", False),
]


@pytest.fixture(scope="module")
def mathv():
    return get_verifier("math", timeout_s=10.0)


@pytest.mark.parametrize("completion,gold,expected", CASES)
def test_math_cases(mathv, completion, gold, expected):
    v = mathv.verify(completion, gold)
    assert v.passed is expected, v.evidence
    assert v.score == float(expected)
    assert v.evidence["gold"] == gold


def test_no_answer_reason_and_no_gold(mathv):
    v = mathv.verify("no digits here", "3")
    assert v.passed is False and v.evidence["reason"] == "no answer found"
    u = mathv.verify("\\boxed{3}", None)
    assert u.passed is None and "gold" in u.evidence["error"]


def test_extract_answer_order():
    assert extract_answer("Answer: 4\n\\boxed{5}") == ("5", "boxed")
    assert extract_answer("x is 2\nFinal answer: $7$") == ("7", "answer_line")
    assert extract_answer("1 then 2 then 3.") == ("3", "last_number")
    assert extract_answer("nothing") == (None, "none")
    assert extract_answer("\\boxed{\\frac{a}{\\sqrt{b}}}")[0] == "\\frac{a}{\\sqrt{b}}"


def test_math_from_threads(mathv):
    """math-verify's signal timeouts fail off the main thread; ours run in worker processes."""
    sub = CASES[:12]
    errors: list[BaseException] = []

    def run(case):
        comp, gold, exp = case
        try:
            return mathv.verify(comp, gold).passed is exp
        except BaseException as e:  # pragma: no cover - recorded and asserted below
            errors.append(e)
            return False

    mathv.prepare(2)
    with ThreadPoolExecutor(4) as ex:
        ok = list(ex.map(run, sub * 2))
    assert not errors and all(ok)
    assert threading.current_thread() is threading.main_thread()


def test_timeout_kills_worker_and_pool_recovers():
    pool = MathVerifyPool(1)
    try:
        assert pool.check("$1$", "$1$", timeout_s=10).equal  # warm-up (start-up grace)
        pid = pool.pids()[0]
        slow = pool.check("$" + "+".join(["x^{99}"] * 400) + "$", "$" + "*".join(["(x+1)"] * 60) + "$", timeout_s=0.001)
        assert slow.status == "timeout" and slow.equal is False and "longer than" in slow.error
        assert pid not in pool.pids()  # the overrunning worker was killed
        again = pool.check("$\\frac{1}{2}$", "$0.5$", timeout_s=10)
        assert again.status == "ok" and again.equal
    finally:
        pool.close()
