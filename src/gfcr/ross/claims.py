"""Arithmetic claims in free text, recomputed: what the ``arith-steps`` judge checks.

A *claim* is a stated result of an arithmetic expression. Found forms:

- equations and chains: ``12 + 7 = 19``, ``3 * 4 = 12 = 6 + 6``, running totals
  ``3 + 6 = 9 + 4 = 13`` (a step whose first operand is the previous value continues the chain:
  the claims are ``3 + 6 = 9`` and ``9 + 4 = 13``);
- verbal results: ``3 + 6 gives 9``, ``…, which results in 9``, ``is``, ``equals``, ``makes``,
  ``yields``, ``comes to``, ``we get``, ``to get``, ``leaves``;
- word operations before such a verb: ``add 3 and 6`` / ``add 3 to 6`` / ``adding …``,
  ``the sum of 3 and 6``, ``subtract 3 from 9`` (9 − 3), ``the difference between 9 and 3``
  (9 − 3), ``multiply 11 by 9``, ``the product of 11 and 9``, ``divide 12 by 4``, and infix
  ``3 plus 6``, ``9 minus 3``, ``11 times 9``, ``11 multiplied by 9``, ``12 divided by 4``;
  an operand may itself be an expression (``add 3 + 6 to 9, which gives 11`` claims
  ``(3 + 6) + 9 = 11``: false).

Expressions use ``+ - * / x × ÷`` with the usual precedence and no parentheses; numbers may
carry thousands commas. A claim is correct when the recomputed value equals the stated one
(relative 1e-6, plus 0.005 absolute when a division is involved, for rounded decimals). The
parser is pure regex + a small precedence evaluator: nothing is ``eval``-ed.

>>> [(c.expr, c.stated, c.correct) for c in find_claims("add 3 + 6 to 9, which gives 11")]
[('3 + 6 + 9', 11.0, False)]
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_NUM = r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?"
_OP = r"[-+*/x×÷]"
# an operand: an optional unary minus glued to a number
_OPERAND = rf"-?(?:{_NUM})"
_EXPR = rf"{_OPERAND}(?:[ \t]*{_OP}[ \t]*(?:{_NUM}))*"
_TERM_RE = re.compile(rf"(?<![\w.,]){_EXPR}(?![\w]|\.\d)")
_CHAIN_RE = re.compile(rf"(?<![\w.,])({_EXPR})((?:[ \t]*=[ \t]*{_EXPR})+)(?![\w]|\.\d)")
_VERB = (r"(?:,?[ \t]*(?:which|that|this|it|and[ \t]+(?:this|that|it))?[ \t]*"
         r"(?:gives|give|results[ \t]+in|result[ \t]+in|is|equals|makes|yields|comes[ \t]+to|leaves|to[ \t]+get|"
         r"we[ \t]+get|you[ \t]+get|get)[ \t]*(?:us[ \t]+|you[ \t]+)?(?:a[ \t]+(?:total|sum|result|product|"
         r"difference|quotient)[ \t]+of[ \t]+)?)")
_VAL = rf"(?P<val>-?(?:{_NUM}))(?![\w]|\.\d)"
_E = rf"(?:{_EXPR})"
_WORD_FORMS: list[tuple[str, re.Pattern[str]]] = [
    ("+", re.compile(rf"\b(?:add|adding|adds)[ \t]+(?P<a>{_E})[ \t]+(?:and|to|plus)[ \t]+(?P<b>{_E})", re.I)),
    ("+", re.compile(rf"\bsum[ \t]+of[ \t]+(?P<a>{_E})[ \t]+and[ \t]+(?P<b>{_E})", re.I)),
    ("r-", re.compile(rf"\b(?:subtract|subtracting|subtracts|take|taking)[ \t]+(?P<a>{_E})[ \t]+(?:from|away[ \t]+from)"
                      rf"[ \t]+(?P<b>{_E})", re.I)),
    ("-", re.compile(rf"\bdifference[ \t]+(?:between|of)[ \t]+(?P<a>{_E})[ \t]+and[ \t]+(?P<b>{_E})", re.I)),
    ("*", re.compile(rf"\b(?:multiply|multiplying|multiplies)[ \t]+(?P<a>{_E})[ \t]+(?:by|and|with|times)[ \t]+"
                     rf"(?P<b>{_E})", re.I)),
    ("*", re.compile(rf"\bproduct[ \t]+of[ \t]+(?P<a>{_E})[ \t]+and[ \t]+(?P<b>{_E})", re.I)),
    ("/", re.compile(rf"\b(?:divide|dividing|divides)[ \t]+(?P<a>{_E})[ \t]+by[ \t]+(?P<b>{_E})", re.I)),
    ("+", re.compile(rf"(?<![\w.,])(?P<a>{_E})[ \t]+plus[ \t]+(?P<b>{_E})", re.I)),
    ("-", re.compile(rf"(?<![\w.,])(?P<a>{_E})[ \t]+minus[ \t]+(?P<b>{_E})", re.I)),
    ("*", re.compile(rf"(?<![\w.,])(?P<a>{_E})[ \t]+(?:times|multiplied[ \t]+by)[ \t]+(?P<b>{_E})", re.I)),
    ("/", re.compile(rf"(?<![\w.,])(?P<a>{_E})[ \t]+divided[ \t]+by[ \t]+(?P<b>{_E})", re.I)),
]
_VERB_RE = re.compile(_VERB + _VAL, re.I)


@dataclass(frozen=True)
class Claim:
    """``expr`` (canonical, e.g. ``'3 + 6'``) is stated to equal ``stated``; ``[start, end)`` is
    the claim's char range in the text (expression through stated value)."""

    expr: str
    value: float | None  # the recomputed value (None: division by zero)
    stated: float
    start: int
    end: int
    has_division: bool = False

    @property
    def correct(self) -> bool:
        if self.value is None:
            return False
        tol = 1e-6 * max(1.0, abs(self.value)) + (0.005 if self.has_division else 0.0)
        return abs(self.value - self.stated) <= tol

    def key(self) -> str:
        """What the claim is about: the canonical expression (a later correct claim with the same
        key corrects a wrong one)."""
        return self.expr


def _num(s: str) -> float:
    return float(s.replace(",", ""))


def _tokens(expr: str) -> list[str]:
    """``'3 + -4*2'`` → ``['3', '+', '-4', '*', '2']`` (operators normalised to ``+ - * /``)."""
    out: list[str] = []
    for m in re.finditer(rf"(?P<num>{_NUM})|(?P<op>{_OP})", expr):
        if m.group("num"):
            if out and out[-1] == "u-":
                out[-1] = "-" + m.group("num")
            else:
                out.append(m.group("num"))
        else:
            op = {"x": "*", "×": "*", "÷": "/"}.get(m.group("op"), m.group("op"))
            out.append("u-" if op == "-" and (not out or out[-1] in "+-*/") else op)
    return out


def evaluate_expr(expr: str) -> float | None:
    """Value of ``+ - * /`` over numbers, ``*`` and ``/`` first, left to right; None on ÷ 0.

    >>> evaluate_expr("2 + 3 × 4 - 6 / 3")
    12.0
    """
    toks = _tokens(expr)
    if not toks or len(toks) % 2 == 0:
        raise ValueError(f"not an expression: {expr!r}")
    total, sign = 0.0, 1.0
    prod = _num(toks[0])
    for op, tok in zip(toks[1::2], toks[2::2], strict=True):
        v = _num(tok)
        if op == "*":
            prod *= v
        elif op == "/":
            if v == 0:
                return None
            prod /= v
        else:
            total += sign * prod
            sign, prod = (1.0 if op == "+" else -1.0), v
    return total + sign * prod


def canonical(expr: str) -> str:
    """``'3+6'``, ``'3 +  6'`` → ``'3 + 6'`` (commas dropped, ``x``/``×`` → ``*``, ``÷`` → ``/``)."""
    return " ".join(t.replace(",", "") for t in _tokens(expr))


def _is_compound(expr: str) -> bool:
    return len(_tokens(expr)) > 1


def _close(x: float | None, y: float | None) -> bool:
    return x is not None and y is not None and abs(x - y) <= 1e-9 * max(1.0, abs(x), abs(y))


def _claim(expr: str, value: float | None, stated: float, start: int, end: int) -> Claim:
    c = canonical(expr)
    return Claim(c, value, stated, start, end, "/" in c)


def _chain_claims(text: str, start: int, end: int) -> list[Claim]:
    """Claims of ``E0 = E1 = …`` chains. Between consecutive sides: a number states the previous
    expression's value; two expressions of equal value are fine; an expression whose first operand
    is the previous value continues a running total (``3 + 6 = 9 + 4``: claims ``3 + 6 = 9``);
    anything else claims the previous expression equals the next one's first operand."""
    out: list[Claim] = []
    for m in _CHAIN_RE.finditer(text, start, end):
        parts = [(m.start(1), m.group(1))]
        parts += [(m.start(2) + p.start(1), p.group(1)) for p in re.finditer(rf"=[ \t]*({_EXPR})", m.group(2))]
        prev, prev_start = parts[0][1], parts[0][0]
        prev_val = evaluate_expr(prev)
        for pos, nxt in parts[1:]:
            toks = _tokens(nxt)
            nv = evaluate_expr(nxt)
            if len(toks) == 1:  # a stated value
                if _is_compound(prev):
                    out.append(_claim(prev, prev_val, nv, prev_start, pos + len(nxt)))
                prev, prev_start, prev_val = nxt, pos, nv
                continue
            head = _num(toks[0])
            head_end = pos + re.match(rf"-?(?:{_NUM})", nxt).end()
            if _is_compound(prev):
                if _close(prev_val, nv):
                    out.append(_claim(prev, prev_val, nv, prev_start, pos + len(nxt)))
                else:  # running total (correct when head == value) or a wrong step
                    out.append(_claim(prev, prev_val, head, prev_start, head_end))
            elif not (_close(prev_val, nv) or _close(prev_val, head)) and prev_val is not None:
                out.append(Claim(canonical(nxt), nv, prev_val, prev_start, pos + len(nxt), "/" in canonical(nxt)))
            prev, prev_start, prev_val = nxt, pos, nv
    return out


def _operand_value(s: str) -> float | None:
    return evaluate_expr(s)


def _verbal_claims(text: str, start: int, end: int, taken: list[tuple[int, int]]) -> list[Claim]:
    out: list[Claim] = []

    def free(a: int, b: int) -> bool:
        return all(b <= x or a >= y for x, y in taken)

    spans: list[tuple[int, int, str, float | None, bool]] = []  # (start, end_of_lhs, expr, value, has_div)
    for op, pat in _WORD_FORMS:
        for m in pat.finditer(text, start, end):
            a, b = m.group("a"), m.group("b")
            va, vb = _operand_value(a), _operand_value(b)
            if op == "r-":
                expr, val = f"{canonical(b)} - {canonical(a)}", None if va is None or vb is None else vb - va
            elif op == "/":
                expr = f"{canonical(a)} / {canonical(b)}"
                val = None if va is None or vb is None or vb == 0 else va / vb
            elif op == "*" and (_is_compound(a) or _is_compound(b)):
                expr = f"({canonical(a)}) * ({canonical(b)})"
                val = None if va is None or vb is None else va * vb
            else:
                expr = f"{canonical(a)} {op} {canonical(b)}"
                val = None if va is None or vb is None else (va + vb if op == "+" else va - vb if op == "-" else va * vb)
            spans.append((m.start(), m.end(), expr, val, op == "/" or "/" in expr))
    for m in _TERM_RE.finditer(text, start, end):
        if _is_compound(m.group(0)):
            c = canonical(m.group(0))
            spans.append((m.start(), m.end(), c, evaluate_expr(m.group(0)), "/" in c))
    spans.sort(key=lambda s: (s[0], -(s[1] - s[0])))
    used_end = -1
    for s, e, expr, val, div in spans:
        if s < used_end:
            continue  # inside a longer form already used (e.g. the operands of "add 3 + 6 to 9")
        v = _VERB_RE.match(text, e, end)
        if v is None or not free(s, v.end()):
            continue
        out.append(Claim(expr, val, _num(v.group("val")), s, v.end(), div))
        used_end = v.end()
    return out


def find_claims(text: str, start: int = 0, end: int | None = None) -> list[Claim]:
    """Every arithmetic claim in ``text[start:end]`` (see the module docstring), in text order."""
    end = len(text) if end is None else end
    chains = _chain_claims(text, start, end)
    taken = [(m.start(), m.end()) for m in _CHAIN_RE.finditer(text, start, end)]
    return sorted(chains + _verbal_claims(text, start, end, taken), key=lambda c: (c.start, c.end))


def corrected_mistakes(text: str, claims: list[Claim] | None = None) -> int:
    """How many false claims in ``text`` a later correct claim about the same expression fixes: the
    corrected mistakes that ROSS's mask excludes from a verified success (the mechanism testbed's
    imitation measure, docs/ross.md "Mechanism testbed"). ``claims``: :func:`find_claims` of ``text``
    when the caller has them already (not parsed again).

    >>> corrected_mistakes("38 + 25 = 53.\\nWait, I forgot the carry.\\n38 + 25 = 63.\\nAnswer: 63")
    1
    >>> corrected_mistakes("38 + 25 = 53.\\nAnswer: 53")  # false, never fixed
    0
    """
    cs = find_claims(text) if claims is None else claims
    return sum(1 for i, c in enumerate(cs)
               if not c.correct and any(d.correct and d.key() == c.key() for d in cs[i + 1:]))
