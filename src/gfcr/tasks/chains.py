"""Worked solutions of ``arith`` chains with planted corrected mistakes and detours (ROSS's testbed).

ROSS (arXiv 2609.35954) gains where a successful trajectory holds steps worth *not* imitating: a
wrong intermediate claim that is later noticed and fixed, or a detour. Two-digit sums solved by a
135M model hold almost none (2 of 108 excluded spans were false claims, issue 47), and the base model
cannot solve three-term chains at all (1 of 400 verified). A warm-start checkpoint trained on these
worked solutions, with a planted share of corrected mistakes (the *dose*), supplies successes of the
shape ROSS exploits, and every planted span is known, so a judge's exclusions can be scored exactly.

A solution of ``a op b op c …`` (``+``/``-`` only, folded left to right) is one line per step,
``"{v} {op} {b} = {r}.\\n"``, then the closing ``"Answer: {value}"``. Per step, independently:

- with probability ``mistake_rate``, a **corrected mistake**: a wrong result first
  (``r ± d``, ``d`` from 1, 2, 10), then the fix in one of two forms: a doubt line of its own
  (``"Wait, that's wrong.\\n"``) before the correct step line, or a doubt opening the correct
  line (``"Oops, that's wrong: {v} {op} {b} = {r}.\\n"``). Planted exclusion: the wrong line and
  the doubt (line or opening words), category ``corrected_mistake``;
- with probability ``detour_rate`` (after a step whose last line is the plain step line), a
  **detour**: that line written again, word for word (a line that opens with doubt words and is
  then repeated without them is a re-check, which the judge keeps). Planted exclusion: the repeat, ``redundant_exploration``.

The next step continues from the correct value, so the closing answer is always right.

``mistake`` picks where and how the wrong results fall. ``"random"`` (above): at any step, off by a
random amount, so nothing in the input says when a slip comes (a warm start on it learned to doubt
after correct lines, issue 47). ``"carry"``: *systematic* slips, the ones a person makes: a step is
eligible only when it has a **carry** (``+``, both values ≥ 0, units digits summing to ≥ 10) or a
**borrow** (``-``, ``v ≥ b ≥ 0``, units digit of ``v`` below that of ``b``) (:func:`carries`); there,
with probability ``mistake_rate``, the wrong result is the one without it (``r - 10`` for a forgotten
carry, ``r + 10`` for a forgotten borrow), and the doubt names the reason, in the same two forms
(``"Wait, I forgot the carry.\n"`` on its own line, or ``"Oops, forgot the carry: "`` opening the
corrected line; "borrow" likewise). Other steps never slip. Planted spans and detours as above.

Worked example (``mistake="carry"``, ``"38 + 25 - 7"``: both steps eligible, both slipped, the first
fixed by a doubt opening the line, the second by a doubt line)::

    38 + 25 = 53.                            <- planted: corrected_mistake
    Oops, forgot the carry: 38 + 25 = 63.    <- "Oops, forgot the carry: " planted
    63 - 7 = 66.                             <- planted: corrected_mistake
    Wait, I forgot the borrow.               <- planted: corrected_mistake
    63 - 7 = 56.
    Answer: 56

Worked example (``"12 + 7 - 5"``, a mistake on step 2 in the doubt-line form, no detour)::

    12 + 7 = 19.
    19 - 5 = 15.          <- planted: corrected_mistake
    Wait, that's wrong.   <- planted: corrected_mistake
    19 - 5 = 14.
    Answer: 14

Departure: the paper's trajectories come from an upstream RL run; these are written by rule (the
warm start that lets a small model's own RL rollouts carry such steps), so the study measures
ROSS on the model's *imitation* of this shape, not on mistakes it discovered itself.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from gfcr.tasks.arith import evaluate

#: the wrong-result offsets a planted mistake draws from (signed at random)
MISTAKE_OFFSETS: tuple[int, ...] = (1, 2, 10)
#: the two forms of a fix: a doubt line of its own, or doubt words opening the corrected line
DOUBT_LINE = "Wait, that's wrong.\n"
DOUBT_LEAD = "Oops, that's wrong: "
#: the modes of :func:`worked_solution` (``mistake``)
MISTAKE_MODES: tuple[str, ...] = ("random", "carry")
#: ``mistake="carry"``: the doubt forms naming the forgotten carry (``+``) or borrow (``-``)
SLIP_DOUBT_LINE = {"+": "Wait, I forgot the carry.\n", "-": "Wait, I forgot the borrow.\n"}
SLIP_DOUBT_LEAD = {"+": "Oops, forgot the carry: ", "-": "Oops, forgot the borrow: "}


@dataclass(frozen=True)
class PlantedSpan:
    """A planted char range ``[start, end)`` of a solution that a judge should exclude."""

    start: int
    end: int
    category: str  # "corrected_mistake" | "redundant_exploration"


@dataclass(frozen=True)
class WorkedSolution:
    """A worked solution's text, its planted exclusions and their counts."""

    text: str
    planted: tuple[PlantedSpan, ...]
    n_mistakes: int
    n_detours: int

    def excluded_mask(self) -> list[bool]:
        """Per character of ``text``: True where a planted span lies."""
        mask = [False] * len(self.text)
        for sp in self.planted:
            mask[sp.start : sp.end] = [True] * (sp.end - sp.start)
        return mask


def steps_of(expr: str) -> list[tuple[int, str, int, int]]:
    """The left-to-right steps of a ``+``/``-`` chain: ``(value so far, op, operand, result)``.

    >>> steps_of("12 + 7 - 5")
    [(12, '+', 7, 19), (19, '-', 5, 14)]
    """
    toks = expr.split()
    if len(toks) < 3 or len(toks) % 2 == 0 or any(t not in "+-" for t in toks[1::2]):
        raise ValueError(f"not a +/- chain of two or more operands: {expr!r}")
    v, out = int(toks[0]), []
    for op, b in zip(toks[1::2], toks[2::2], strict=True):
        r = v + int(b) if op == "+" else v - int(b)
        out.append((v, op, int(b), r))
        v = r
    return out


def carries(v: int, op: str, b: int) -> bool:
    """Whether the step ``v op b`` has a carry (``+``) or a borrow (``-``) in the units column: the
    steps where ``mistake="carry"`` may plant a slip. Negative values never count.

    >>> carries(38, "+", 25), carries(31, "+", 25), carries(63, "-", 7), carries(67, "-", 3)
    (True, False, True, False)
    >>> carries(-12, "+", 9), carries(5, "-", 9)
    (False, False)
    """
    if op == "+":
        return v >= 0 and b >= 0 and v % 10 + b % 10 >= 10
    if op == "-":
        return v >= b >= 0 and v % 10 < b % 10
    raise ValueError(f"op must be '+' or '-', got {op!r}")


def worked_solution(expr: str, rng: random.Random, mistake_rate: float = 0.0,
                    detour_rate: float = 0.0, mistake: str = "random") -> WorkedSolution:
    """A worked solution of ``expr`` with planted mistakes/detours (see module doc), drawn with ``rng``.

    ``mistake``: ``"random"`` (any step, off by ±1/2/10) or ``"carry"`` (only steps with a carry or
    borrow, the result without it, a doubt naming the reason). ``"random"`` draws from ``rng`` exactly
    as before the mode existed, so the same ``rng`` gives the same text.
    """
    if mistake not in MISTAKE_MODES:
        raise ValueError(f"mistake must be one of {MISTAKE_MODES}, got {mistake!r}")
    if not (0.0 <= mistake_rate <= 1.0 and 0.0 <= detour_rate <= 1.0):
        raise ValueError(f"rates must lie in [0, 1], got mistake_rate={mistake_rate}, detour_rate={detour_rate}")
    parts: list[str] = []
    planted: list[PlantedSpan] = []
    pos = 0
    n_mistakes = n_detours = 0

    def put(s: str, category: str | None = None) -> None:
        nonlocal pos
        parts.append(s)
        if category is not None:
            planted.append(PlantedSpan(pos, pos + len(s), category))
        pos += len(s)

    for v, op, b, r in steps_of(expr):
        line = f"{v} {op} {b} = {r}.\n"
        if mistake == "random" and rng.random() < mistake_rate:
            n_mistakes += 1
            wrong = r + rng.choice(MISTAKE_OFFSETS) * rng.choice((-1, 1))
            put(f"{v} {op} {b} = {wrong}.\n", "corrected_mistake")
            lead = rng.random() >= 0.5
            put(DOUBT_LEAD if lead else DOUBT_LINE, "corrected_mistake")
            put(line)
        elif mistake == "carry" and carries(v, op, b) and rng.random() < mistake_rate:
            n_mistakes += 1
            put(f"{v} {op} {b} = {r - 10 if op == '+' else r + 10}.\n", "corrected_mistake")
            lead = rng.random() >= 0.5
            put(SLIP_DOUBT_LEAD[op] if lead else SLIP_DOUBT_LINE[op], "corrected_mistake")
            put(line)
        else:
            lead = False
            put(line)
        if not lead and rng.random() < detour_rate:
            n_detours += 1
            put(line, "redundant_exploration")
    value = evaluate(expr)
    put(f"Answer: {value}")
    return WorkedSolution("".join(parts), tuple(planted), n_mistakes, n_detours)
