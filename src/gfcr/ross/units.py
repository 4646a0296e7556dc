"""Numbered units of an assistant text, each with its character range.

The judge never sees raw offsets; it sees numbered units and answers with unit numbers (and
optionally exact quotes inside a unit). Units *partition* the text: unit ``i`` covers
``[start_i, end_i)`` and ``end_i == start_{i+1}``, so a newline or blank line between two kept
units is kept with them. Rules:

- a unit is a line; its trailing newline and any following whitespace-only lines belong to it
  (a whitespace-only line never becomes a unit of its own; leading whitespace joins unit 1);
- a line longer than ``max_chars`` is split after sentence ends (``.``, ``!``, ``?`` and the CJK
  full stops followed by whitespace, or a CJK full stop);
- a tool call (``<tool_call>…</tool_call>`` or ``<tool>…</tool>``) is always a unit of its own,
  even when it spans several lines or sits inside a line (agent trajectories);
- with ``bounds`` (the assistant messages' char ranges), no unit and no tool call crosses from
  one assistant message into the next: in an agent trajectory a tool or environment turn lies
  between them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_TOOL_RE = re.compile(r"<tool_call>.*?</tool_call>|<tool>.*?</tool>", re.DOTALL)
_SENT_RE = re.compile(r"(?<=[.!?])\s+|(?<=[。！？])")


@dataclass(frozen=True)
class Unit:
    """One numbered unit: 1-based ``number``, char range ``[start, end)`` into the text."""

    number: int
    start: int
    end: int
    text: str
    is_tool_call: bool = False


def _line_pieces(text: str, start: int, end: int, max_chars: int) -> list[tuple[int, int]]:
    """Split ``text[start:end]`` (no tool calls inside) into line/sentence pieces."""
    pieces: list[tuple[int, int]] = []
    pos = start
    while pos < end:
        nl = text.find("\n", pos, end)
        line_end = end if nl < 0 else nl + 1
        if line_end - pos > max_chars:
            cut = pos
            for m in _SENT_RE.finditer(text, pos, line_end):
                if m.end() - cut >= 1 and m.end() < line_end:
                    pieces.append((cut, m.end()))
                    cut = m.end()
            pieces.append((cut, line_end))
        else:
            pieces.append((pos, line_end))
        pos = line_end
    return pieces


def split_units(text: str, max_chars: int = 200, bounds: list[tuple[int, int]] | None = None) -> list[Unit]:
    """Number the units of ``text`` (see module docstring). Empty or blank text has no units.

    ``bounds``: char ranges ``[a, b)`` of the assistant messages in ``text`` (as from
    :func:`gfcr.records.assistant_text_ranges`); each is split on its own, the separator after a
    message joining its last unit.

    >>> [u.text for u in split_units("a = 1\\n\\nb = 2\\n")]
    ['a = 1\\n\\n', 'b = 2\\n']
    """
    if max_chars < 1:
        raise ValueError(f"max_chars must be >= 1, got {max_chars}")
    segs = [(0, len(text))]
    if bounds:
        starts = [a for a, _ in bounds]
        segs = [(a, starts[i + 1] if i + 1 < len(starts) else len(text)) for i, a in enumerate(starts)]
        if segs and segs[0][0] > 0:
            segs[0] = (0, segs[0][1])
    raw: list[tuple[int, int, bool]] = []
    for lo, hi in segs:
        pos = lo
        for m in _TOOL_RE.finditer(text, lo, hi):
            raw += [(a, b, False) for a, b in _line_pieces(text, pos, m.start(), max_chars)]
            raw.append((m.start(), m.end(), True))
            pos = m.end()
        raw += [(a, b, False) for a, b in _line_pieces(text, pos, hi, max_chars)]
    # merge whitespace-only pieces into the previous unit (or the next one at the start)
    merged: list[list] = []
    pending_start: int | None = None
    for a, b, tool in raw:
        if not tool and not text[a:b].strip():
            if merged:
                merged[-1][1] = b
            elif pending_start is None:
                pending_start = a
            continue
        if pending_start is not None:
            a, pending_start = pending_start, None
        merged.append([a, b, tool])
    return [Unit(i + 1, a, b, text[a:b], tool) for i, (a, b, tool) in enumerate(merged)]


def render_units(units: list[Unit]) -> str:
    """The numbered listing the judge sees: ``[3] text`` per unit, trailing whitespace dropped."""
    return "\n".join(f"[{u.number}] {u.text.rstrip()}" for u in units)
