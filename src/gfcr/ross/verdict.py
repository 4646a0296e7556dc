"""Parse and strictly validate a judge's JSON verdict into kept characters.

The judge answers one JSON object (a fenced ```json block is accepted)::

    {"verdict": "usable" | "discard",
     "reason": "why (required for discard)",
     "keep": [1, 2, [4, 6]],                 # select-keep mode only: units (or inclusive ranges) kept
     "exclude": [{"unit": 3, "category": "corrected_mistake"},
                 {"units": [7, 9], "category": "redundant_exploration"},
                 {"unit": 5, "quote": "exact text inside unit 5", "category": "incorrect_claim"}]}

Modes: ``select-keep`` (math/code: keep lists the units forming a correct, complete solution;
every other unit must be excluded with its category: a unit neither kept nor excluded is an
error fed back to the judge, never silently ``other``) and ``locate-exclude`` (agent
trajectories: everything not excluded is kept). A quote never crosses from one assistant turn
into the next (``bounds``). Checks (any failure raises
:class:`VerdictError`, whose message is fed back to the judge on retry): the schema (no unknown
keys, types), unit numbers within ``1..n``, categories from the fixed taxonomy, every quote an
exact substring of its unit (or of the whole text when no unit is named; repeated occurrences
are all excluded unless ``occurrence`` picks one), something non-blank kept, and, when a
verified final answer is given, the kept text still holds it.
"""

from __future__ import annotations

import bisect
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


#: the most fenced blocks tried before the bare-object candidates (keeps parsing linear)
_MAX_FENCES = 8


def parse_json_object(raw: str) -> dict[str, Any]:
    """The JSON object in ``raw``: a fenced block (```json …```), else the span from the first
    ``{`` to the last ``}``, else the first object that decodes from the first ``{`` on (text may
    follow it). :class:`VerdictError` if none parses.

    Linear in ``len(raw)``: a bounded number of ``json.loads`` calls, each over part of ``raw``
    (a 64 KB output parses in milliseconds; the previous regex backtracked quadratically)."""
    if not isinstance(raw, str) or not raw.strip():
        raise VerdictError("empty output: answer with one JSON object")
    candidates: list[str] = []
    pos = 0
    while len(candidates) < _MAX_FENCES:
        a = raw.find("```", pos)
        if a < 0:
            break
        b = raw.find("```", a + 3)
        if b < 0:
            break
        body = raw[a + 3 : b]
        if body[:4].lower() == "json":
            body = body[4:]
        body = body.strip()
        if body.startswith("{"):
            candidates.append(body)
        pos = b + 3
    a, b = raw.find("{"), raw.rfind("}")
    if a >= 0 and b > a:
        candidates.append(raw[a : b + 1])
    for c in candidates:
        try:
            obj = json.loads(c)
        except (json.JSONDecodeError, RecursionError):  # deep nesting must not crash the audit
            continue
        if isinstance(obj, dict):
            return obj
    if a >= 0:
        try:
            obj, _ = json.JSONDecoder().raw_decode(raw, a)
            if isinstance(obj, dict):
                return obj
        except (json.JSONDecodeError, RecursionError):
            pass
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


def _within_one(bounds: list[tuple[int, int]] | None, a: int, b: int) -> bool:
    """``[a, b)`` lies inside one of ``bounds`` (always True without bounds)."""
    if not bounds:
        return True
    i = bisect.bisect_right([x for x, _ in bounds], a) - 1
    return i >= 0 and b <= bounds[i][1]


def answer_positions(text: str, answer: str) -> list[tuple[int, int]]:
    """Char ranges where ``answer`` occurs in ``text``, not as part of a longer number/word."""
    ans = answer.strip()
    if not ans:
        return []
    pat = re.compile(r"(?<![\w.])" + re.escape(ans) + r"(?![\w]|\.\d)")
    return [(m.start(), m.end()) for m in pat.finditer(text)]


def validate_verdict(
    obj: dict[str, Any], text: str, units: list[Unit], mode: str = "select-keep", answer: str | None = None,
    bounds: list[tuple[int, int]] | None = None,
) -> Decision:
    """Check ``obj`` against ``text``/``units`` and return the :class:`Decision` (see module doc).

    ``bounds``: the assistant messages' char ranges in ``text``; a quote may not cross from one
    into the next (a tool or environment turn lies between them, and it is never supervisable).
    The rules are checked in the module doc's order: the top level here, each exclusion in
    :func:`_exclusion`, coverage and the answer in :func:`_check_kept`."""
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
    if not units:
        raise VerdictError("the text has no units to keep")
    excl_spec = obj.get("exclude", [])
    if not isinstance(excl_spec, list):
        raise VerdictError("'exclude' must be a list")
    kept_units = _kept_units(obj.get("keep"), len(units), mode)
    kept = np.zeros(len(text), bool)
    for u in units:
        if u.number in kept_units:
            kept[u.start : u.end] = True
    excluded: list[Span] = []
    for i, e in enumerate(excl_spec):
        for sp in _exclusion(e, f"exclude[{i}]", text, units, mode, kept_units, bounds):
            kept[sp.start : sp.end] = False
            excluded.append(sp)
    whole_excluded = {sp.unit for sp in excluded if sp.quote is None}
    _check_kept(text, units, kept, mode, kept_units, whole_excluded, answer)
    excluded.sort(key=lambda s: (s.start, s.end))
    return Decision("kept", None, kept, excluded)


def _kept_units(keep_spec: Any, n: int, mode: str) -> set[int]:
    """The unit numbers ``keep`` names (select-keep), or every unit (locate-exclude, no ``keep``)."""
    if mode == "select-keep":
        if not isinstance(keep_spec, list) or not keep_spec:
            raise VerdictError("'keep' must be a non-empty list of unit numbers (or [first, last] ranges)")
        return {u for s in keep_spec for u in _unit_list(s, n, "keep")}
    if keep_spec is not None:
        raise VerdictError("locate-exclude mode: give only 'exclude', not 'keep'")
    return set(range(1, n + 1))


def _exclusion(e: Any, where: str, text: str, units: list[Unit], mode: str, kept_units: set[int],
               bounds: list[tuple[int, int]] | None) -> list[Span]:
    """The spans one ``exclude`` entry removes: whole units, or each occurrence of its quote."""
    n = len(units)
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
        out = []
        for u in scope:
            if mode == "select-keep" and u in kept_units:
                raise VerdictError(f"{where}: unit {u} is both kept and excluded")
            un = units[u - 1]
            out.append(Span(un.start, un.end, cat, u, None))
        return out
    if not isinstance(quote, str) or not quote.strip():
        raise VerdictError(f"{where}: 'quote' must be a non-blank exact substring of the text")
    if len(scope) > 1:
        raise VerdictError(f"{where}: a quote goes with a single 'unit'")
    hits = _quote_hits(e, where, text, quote, units[scope[0] - 1] if scope else None, bounds)
    unit_starts = [u.start for u in units]
    return [Span(h, h + len(quote), cat, units[bisect.bisect_right(unit_starts, h) - 1].number, quote) for h in hits]


def _quote_hits(e: dict[str, Any], where: str, text: str, quote: str, unit: Unit | None,
                bounds: list[tuple[int, int]] | None) -> list[int]:
    """Start offsets of ``quote`` in ``unit`` (or the whole text), inside one assistant turn; only
    the ``occurrence``-th when the entry names one."""
    lo, hi = (unit.start, unit.end) if unit is not None else (0, len(text))
    hits, pos = [], text.find(quote, lo, hi)
    while pos >= 0 and pos + len(quote) <= hi:
        if _within_one(bounds, pos, pos + len(quote)):
            hits.append(pos)
        pos = text.find(quote, pos + 1, hi)
    if not hits and bounds and text.find(quote, lo, hi) >= 0:
        raise VerdictError(f"{where}: quote {quote[:80]!r} spans two assistant turns (a tool or environment turn "
                           "lies between them); quote inside one turn")
    if not hits:
        place = f"unit {unit.number}" if unit is not None else "the text"
        raise VerdictError(f"{where}: quote {quote[:80]!r} does not occur in {place}; quote the original exactly")
    occ = e.get("occurrence")
    if occ is not None:
        if isinstance(occ, bool) or not isinstance(occ, int) or not 1 <= occ <= len(hits):
            raise VerdictError(f"{where}: occurrence must be 1..{len(hits)}, got {occ!r}")
        hits = [hits[occ - 1]]
    return hits


def _check_kept(text: str, units: list[Unit], kept: np.ndarray, mode: str, kept_units: set[int],
                whole_excluded: set[int], answer: str | None) -> None:
    """Every unit kept or excluded (select-keep), something non-blank kept, the verified answer kept."""
    if mode == "select-keep":
        missing = [u.number for u in units if u.number not in kept_units and u.number not in whole_excluded]
        if missing:
            shown = ", ".join(map(str, missing[:20])) + (" …" if len(missing) > 20 else "")
            raise VerdictError(f"unit(s) {shown} are neither kept nor excluded: keep each, or exclude it with its "
                               f"category ({', '.join(EXCLUSION_CATEGORIES)}; 'other' only if none fits)")
    if not any(text[i].strip() for i in np.flatnonzero(kept)):
        raise VerdictError("nothing non-blank is kept; discard the rollout instead if nothing is worth learning")
    if answer is not None and str(answer).strip():
        pos = answer_positions(text, str(answer))
        if not any(kept[a:b].all() for a, b in pos):
            raise VerdictError(
                f"the kept text no longer contains the verified final answer {str(answer).strip()!r}; "
                "keep the unit that states it"
            )
