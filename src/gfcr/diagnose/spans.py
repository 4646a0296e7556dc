"""The assistant text's supervised / excluded segments, shared by the report and the viewer.

ROSS audits store excluded spans as character offsets ``[start, end)`` into the *assistant text*
(:func:`gfcr.records.assistant_text`: the contents of the assistant messages joined by ``"\\n"``,
the same text ``Rollout.completion`` gives and the judge audits). :func:`segments` cuts that text into consecutive pieces, each marked
``excluded`` (with its category) or ``supervised``/``plain``, so a page can colour them without
ever building HTML from the text itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Segment:
    """A piece of the assistant text: ``kind`` is ``excluded``, ``supervised`` or ``plain``."""

    text: str
    kind: str
    category: str | None = None
    start: int = 0
    end: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"text": self.text, "kind": self.kind, "category": self.category, "start": self.start, "end": self.end}


def segments(text: str, spans: Sequence[dict[str, Any]], audited: bool) -> list[Segment]:
    """Cut ``text`` at the excluded ``spans`` (dicts with ``start``, ``end``, ``category``).

    Spans are clipped to the text, sorted, and overlaps resolved in favour of the earlier span.
    Text outside every span is ``supervised`` when the rollout was audited (the judge kept it),
    ``plain`` otherwise. Empty pieces are dropped. Example: ``segments("abcdef", [{"start": 2,
    "end": 4, "category": "other"}], True)`` gives ``ab`` supervised, ``cd`` excluded (other),
    ``ef`` supervised; the pieces always concatenate back to ``text``.
    """
    n = len(text)
    clean = []
    for s in spans:
        a, b = max(0, min(int(s["start"]), n)), max(0, min(int(s["end"]), n))
        if b > a:
            clean.append((a, b, s.get("category") or "other"))
    clean.sort()
    out: list[Segment] = []
    other = "supervised" if audited else "plain"
    pos = 0
    for a, b, cat in clean:
        a = max(a, pos)
        if b <= a:
            continue
        if a > pos:
            out.append(Segment(text[pos:a], other, None, pos, a))
        out.append(Segment(text[a:b], "excluded", cat, a, b))
        pos = b
    if pos < n:
        out.append(Segment(text[pos:], other, None, pos, n))
    return out
