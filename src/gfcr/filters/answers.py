"""Reading a final answer out of a completion: the stated answer format of a task, the strict and
the lenient readers, numbers, and whether a generation was cut short.

Pure text functions used by the answer verifiers of :mod:`gfcr.filters.verifiers` (which
re-exports them) and by evaluation.
"""

from __future__ import annotations

import re
from typing import Any

_NUMBER = r"-?\d(?:[\d,]*\d)?(?:\.\d+)?(?:/\d+)?|-?\.\d+"  # commas only between digits: "164, which" is 164
_ANSWER_LINE = re.compile(r"(?:final\s+answer|answer)\s*(?:is)?\s*[:=]\s*(.+)", re.IGNORECASE)
#: the strict ``Answer: N`` line: at the start of a line (markdown emphasis/heading marks allowed)
_STRICT_ANSWER_LINE = re.compile(
    r"^[ \t>#*_]*(?:final[ \t]+)?answer[ \t]*[*_]*[ \t]*[:：][ \t]*[*_]*[ \t]*(.*?)[ \t*_]*$", re.IGNORECASE | re.MULTILINE)

_LEADING_NUMBER = re.compile(r"^\$?\s*(" + _NUMBER + r")\s*%?\s*[^\d]*$")

#: answer formats a task can state (``Prompt.meta["answer_format"]``)
ANSWER_FORMATS = ("answer_line", "boxed")
#: finish reasons of a generation that did not end by itself
TRUNCATED_FINISHES = ("length", "abort")


def stated_answer_format(prompt: Any) -> str | None:
    """The answer format a task states: ``"answer_line"`` (a final ``Answer: N`` line), ``"boxed"``
    (``\\boxed{}``) or None.

    Read from ``prompt.meta["answer_format"]`` (every built-in task source writes it); for prompts
    stored without it, from the instruction text (``… of the form 'Answer: N'``, ``\\boxed{``).
    """
    if prompt is None:
        return None
    fmt = (getattr(prompt, "meta", None) or {}).get("answer_format")
    if fmt in ANSWER_FORMATS:
        return fmt
    text = "\n".join(m.content for m in getattr(prompt, "messages", []) if m.role in ("system", "user"))
    if "\\boxed{" in text:
        return "boxed"
    if re.search(r"form\s+['\"`]?\s*answer\s*:", text, re.IGNORECASE):
        return "answer_line"
    return None


def truncation(context: dict[str, Any]) -> str | None:
    """The finish reason of a generation that was cut (``length``, ``abort``), else None.

    Read from ``context["finish_reason"]`` or ``context["rollout"].finish_reason``. A multi-turn
    episode that ran out of turns (``meta["max_turns_reached"]``) ended its last turn itself and
    is not truncated.
    """
    fr = context.get("finish_reason")
    r = context.get("rollout")
    if fr is None and r is not None:
        fr = getattr(r, "finish_reason", None)
        if (getattr(r, "meta", None) or {}).get("max_turns_reached"):
            return None
    return fr if fr in TRUNCATED_FINISHES else None


def read_answer(text: str, fmt: str | None) -> tuple[str | None, str]:
    """The final answer in the stated format ``fmt`` and nothing else.

    ``"answer_line"``: the value of the last line that starts with ``Answer:`` (or ``Final
    answer:``); ``"boxed"``: the last ``\\boxed{}``; None or ``"any"``: :func:`extract_answer`'s
    lenient order. Returns ``(answer, how)``; ``(None, "none")`` when the format is absent.

    >>> read_answer("add 3 + 6 to 9, which gives 11", "answer_line")
    (None, 'none')
    >>> read_answer("3 + 6 = 9\nAnswer: 9", "answer_line")
    ('9', 'answer_line')
    """
    if fmt in (None, "any"):
        return extract_answer(text)
    if fmt == "boxed":
        b = last_boxed(text)
        return (b, "boxed") if b else (None, "none")
    if fmt == "answer_line":
        hits = [m.group(1).strip() for m in _STRICT_ANSWER_LINE.finditer(text)]
        if hits and hits[-1]:
            ans = _line_answer(hits[-1])
            return (ans, "answer_line") if ans else (None, "none")
        return None, "none"
    raise ValueError(f"unknown answer format {fmt!r}; expected one of {ANSWER_FORMATS}, 'any' or None")


#: an answer marker repeated inside the answer ("The answer is: Answer: 64", which SmolLM2 writes)
_REPEATED_MARKER = re.compile(r"^(?:[*_]*(?:final\s+)?answer\s*(?:is)?\s*[*_]*\s*[:=：][*_]*\s*)+", re.IGNORECASE)


def _line_answer(text: str) -> str:
    """The answer an ``Answer:`` line states: a repeated answer marker, trailing ``.``/``,`` and one
    pair of ``$`` dropped. Example: ``" $164$."`` → ``"164"``; ``"164,"`` → ``"164"``; ``"Answer:
    64"`` (of "The answer is: Answer: 64") → ``"64"``."""
    ans = _REPEATED_MARKER.sub("", text.strip()).rstrip(".,").strip()
    if ans.startswith("$") and ans.endswith("$") and len(ans) > 1:
        ans = ans.strip("$").strip()
    return ans


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``) with balanced braces, else None."""
    best = None
    for m in re.finditer(r"\\(?:boxed|fbox)\s*\{", text):
        depth, i = 1, m.end()
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth == 0:
            best = text[m.end() : i - 1].strip()
    return best


def extract_answer(text: str) -> tuple[str | None, str]:
    """The final answer in ``text`` and how it was found.

    Order: the last ``\\boxed{}``; else the last ``Answer:`` / ``Final answer:`` line; else the last
    number. Returns ``(answer, how)`` with ``how`` in ``boxed | answer_line | last_number | none``.

    >>> extract_answer("so x = 2.\\nAnswer: 3/4")
    ('3/4', 'answer_line')
    """
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed, "boxed"
    lines = _ANSWER_LINE.findall(text)
    if lines:
        ans = _line_answer(lines[-1])
        if ans:
            return ans, "answer_line"
    nums = re.findall(_NUMBER, text)
    if nums:
        return nums[-1].rstrip("."), "last_number"
    return None, "none"


def parse_number(s: str) -> float | None:
    """A float from ``'1,000'``, ``'3/4'``, ``'-2.5'``, ``'50%'`` (→ 0.5), else None."""
    t = s.strip().replace(",", "").replace("$", "").replace(" ", "")
    pct = t.endswith("%")
    t = t.rstrip("%")
    try:
        if "/" in t:
            a, b = t.split("/", 1)
            v = float(a) / float(b)
        else:
            v = float(t)
    except (ValueError, ZeroDivisionError):
        return None
    return v / 100 if pct else v


def leading_number(s: str) -> float | None:
    """The number an answer starts with when the rest is words or a unit, else None.

    >>> leading_number("42 apples"), leading_number("$3.50"), leading_number("x = 4")
    (42.0, 3.5, None)
    """
    m = _LEADING_NUMBER.match(s)
    return parse_number(m.group(1)) if m else None
