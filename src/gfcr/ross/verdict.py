"""Parse and strictly validate a judge's JSON verdict into kept characters.

The judge answers one JSON object (a fenced ```json block is accepted)::

    {"verdict": "usable" | "discard",
     "reason": "why (required for discard)",
     "keep": [1, 2, [4, 6]],                 # select-keep mode only: units (or inclusive ranges) kept
     "exclude": [{"unit": 3, "category": "corrected_mistake"},
                 {"units": [7, 9], "category": "redundant_exploration"},
                 {"unit": 5, "quote": "exact text inside unit 5", "category": "incorrect_claim"}]}

Modes: ``select-keep`` (math/code: keep lists the units forming a correct, complete solution; a
unit neither kept nor excluded is excluded as ``other``) and ``locate-exclude`` (agent
trajectories: everything not excluded is kept). Checks (any failure raises
:class:`VerdictError`, whose message is fed back to the judge on retry): the schema (no unknown
keys, types), unit numbers within ``1..n``, categories from the fixed taxonomy, every quote an
exact substring of its unit (or of the whole text when no unit is named; repeated occurrences
are all excluded unless ``occurrence`` picks one), something non-blank kept, and, when a
verified final answer is given, the kept text still holds it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gfcr.records import EXCLUSION_CATEGORIES, Span
from gfcr.ross.units import Unit

MODES = ("select-keep", "locate-exclude")
_TOP_KEYS = {"verdict", "reason", "keep", "exclude"}
_EXCL_KEYS = {"unit", "units", "quote", "occurrence", "category", "why"}


class VerdictError(ValueError):
    """The judge's output is unusable; the message says what to fix."""


@dataclass
class Decision:
    """A validated verdict. ``kept_chars``: ``[len(text)]`` bool (all False when discarded)."""

    status: str  # "kept" | "discarded"
    reason: str | None
    kept_chars: np.ndarray
    excluded: list[Span] = field(default_factory=list)


def parse_json_object(raw: str) -> dict[str, Any]:
    """The first JSON object in ``raw`` (fenced or bare); :class:`VerdictError` if none parses."""
    if not isinstance(raw, str) or not raw.strip():
        raise VerdictError("empty output: answer with one JSON object")
    m = re.search(r"```(?:json)?\s*(\{.*?\})\s*```", raw, re.DOTALL)
    candidates = [m.group(1)] if m else []
    a, b = raw.find("{"), raw.rfind("}")
    if a >= 0 and b > a:
        candidates.append(raw[a : b + 1])
    for c in candidates:
        try:
            obj = json.loads(c)
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict):
            return obj
    raise VerdictError("output is not a JSON object: answer with exactly one JSON object and nothing else")


def _unit_no(x: Any, n: int, where: str) -> int:
    if isinstance(x, bool) or not isinstance(x, int):
        raise VerdictError(f"{where}: unit numbers must be integers, got {x!r}")
    if not 1 <= x <= n:
        raise VerdictError(f"{where}: unit {x} does not exist (units are numbered 1..{n})")
    return x


def _unit_list(spec: Any, n: int, where: str) -> list[int]:
    """An int, or ``[a, b]`` inclusive range → unit numbers."""
    if isinstance(spec, list):
        if len(spec) != 2:
            raise VerdictError(f"{where}: a unit range is [first, last], got {spec!r}")
        a, b = _unit_no(spec[0], n, where), _unit_no(spec[1], n, where)
        if b < a:
            raise VerdictError(f"{where}: range [{a}, {b}] is reversed")
        return list(range(a, b + 1))
    return [_unit_no(spec, n, where)]


def answer_positions(text: str, answer: str) -> list[tuple[int, int]]:
    """Char ranges where ``answer`` occurs in ``text``, not as part of a longer number/word."""
    ans = answer.strip()
    if not ans:
        return []
    pat = re.compile(r"(?<![\w.])" + re.escape(ans) + r"(?![\w]|\.\d)")
    return [(m.start(), m.end()) for m in pat.finditer(text)]


def validate_verdict(
    obj: dict[str, Any], text: str, units: list[Unit], mode: str = "select-keep", answer: str | None = None
) -> Decision:
    """Check ``obj`` against ``text``/``units`` and return the :class:`Decision` (see module doc)."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    extra = set(obj) - _TOP_KEYS
    if extra:
        raise VerdictError(f"unknown key(s) {sorted(extra)}; allowed: {sorted(_TOP_KEYS)}")
    verdict = obj.get("verdict")
    if verdict not in ("usable", "discard"):
        raise VerdictError(f"'verdict' must be \"usable\" or \"discard\", got {verdict!r}")
    reason = obj.get("reason")
    if reason is not None and not isinstance(reason, str):
        raise VerdictError("'reason' must be a string")
    if verdict == "discard":
        if not reason or not reason.strip():
            raise VerdictError("a discard verdict needs a non-empty 'reason'")
        return Decision("discarded", f"judge: {reason.strip()}", np.zeros(len(text), bool))
    n = len(units)
    if n == 0:
        raise VerdictError("the text has no units to keep")
    keep_spec, excl_spec = obj.get("keep"), obj.get("exclude", [])
    if not isinstance(excl_spec, list):
        raise VerdictError("'exclude' must be a list")
    kept_units: set[int]
    if mode == "select-keep":
        if not isinstance(keep_spec, list) or not keep_spec:
            raise VerdictError("'keep' must be a non-empty list of unit numbers (or [first, last] ranges)")
        kept_units = {u for s in keep_spec for u in _unit_list(s, n, "keep")}
    else:
        if keep_spec is not None:
            raise VerdictError("locate-exclude mode: give only 'exclude', not 'keep'")
        kept_units = set(range(1, n + 1))
    kept = np.zeros(len(text), bool)
    for u in units:
        if u.number in kept_units:
            kept[u.start : u.end] = True
    excluded: list[Span] = []
    whole_excluded: set[int] = set()
    for i, e in enumerate(excl_spec):
        where = f"exclude[{i}]"
        if not isinstance(e, dict):
            raise VerdictError(f"{where}: each exclusion is an object with 'unit' or 'units' and 'category'")
        extra = set(e) - _EXCL_KEYS
        if extra:
            raise VerdictError(f"{where}: unknown key(s) {sorted(extra)}")
        cat = e.get("category")
        if cat not in EXCLUSION_CATEGORIES:
            raise VerdictError(f"{where}: category must be one of {list(EXCLUSION_CATEGORIES)}, got {cat!r}")
        if "unit" in e and "units" in e:
            raise VerdictError(f"{where}: give 'unit' or 'units', not both")
        scope = _unit_list(e["units"], n, where) if "units" in e else _unit_list(e["unit"], n, where) if "unit" in e else []
        quote = e.get("quote")
        if quote is None:
            if not scope:
                raise VerdictError(f"{where}: name a 'unit', 'units' or an exact 'quote'")
            if "occurrence" in e:
                raise VerdictError(f"{where}: 'occurrence' only goes with a 'quote'")
            for u in scope:
                if mode == "select-keep" and u in kept_units:
                    raise VerdictError(f"{where}: unit {u} is both kept and excluded")
                un = units[u - 1]
                kept[un.start : un.end] = False
                whole_excluded.add(u)
                excluded.append(Span(un.start, un.end, cat, u, None))
            continue
        if not isinstance(quote, str) or not quote.strip():
            raise VerdictError(f"{where}: 'quote' must be a non-blank exact substring of the text")
        if len(scope) > 1:
            raise VerdictError(f"{where}: a quote goes with a single 'unit'")
        lo, hi = (units[scope[0] - 1].start, units[scope[0] - 1].end) if scope else (0, len(text))
        hits, pos = [], text.find(quote, lo, hi)
        while pos >= 0 and pos + len(quote) <= hi:
            hits.append(pos)
            pos = text.find(quote, pos + 1, hi)
        if not hits:
            place = f"unit {scope[0]}" if scope else "the text"
            raise VerdictError(f"{where}: quote {quote[:80]!r} does not occur in {place}; quote the original exactly")
        occ = e.get("occurrence")
        if occ is not None:
            if isinstance(occ, bool) or not isinstance(occ, int) or not 1 <= occ <= len(hits):
                raise VerdictError(f"{where}: occurrence must be 1..{len(hits)}, got {occ!r}")
            hits = [hits[occ - 1]]
        for h in hits:
            kept[h : h + len(quote)] = False
            unit_of = next(u.number for u in units if u.start <= h < u.end)
            excluded.append(Span(h, h + len(quote), cat, unit_of, quote))
    if mode == "select-keep":
        for u in units:
            if u.number not in kept_units and u.number not in whole_excluded:
                excluded.append(Span(u.start, u.end, "other", u.number, None))
    if not any(text[i].strip() for i in np.flatnonzero(kept)):
        raise VerdictError("nothing non-blank is kept; discard the rollout instead if nothing is worth learning")
    if answer is not None and str(answer).strip():
        pos = answer_positions(text, str(answer))
        if not any(kept[a:b].all() for a, b in pos):
            raise VerdictError(
                f"the kept text no longer contains the verified final answer {str(answer).strip()!r}; "
                "keep the unit that states it"
            )
    excluded.sort(key=lambda s: (s.start, s.end))
    return Decision("kept", None, kept, excluded)
