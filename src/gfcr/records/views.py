"""What readers derive from a record: the assistant text and its character ranges (the one
definition that audit spans, the report and the viewer index into), and training labels from a
token mask.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

import numpy as np


class MessageLike(Protocol):
    """What the views read of a message (:class:`gfcr.records.Message` has it): its role and content."""

    role: str
    content: Any


def assistant_text_ranges(messages: Iterable[MessageLike | dict[str, Any]]) -> tuple[str, list[tuple[int, int]]]:
    """The *assistant text* and each assistant message's char range ``[a, b)`` in it.

    The assistant text is the contents of the assistant messages joined by ``"\\n"``: the text a
    ROSS judge audits, that audit spans index into (``Span.start``/``end``), that the report and
    the viewer colour, and that ``Rollout.completion`` returns. Messages may be ``Message`` objects
    or dicts (rows read from the store). Example: user "q", assistant "ab", tool "r", assistant
    "c" → ``("ab\\nc", [(0, 2), (3, 4)])``.
    """
    parts = []
    for m in messages:
        role = m["role"] if isinstance(m, dict) else m.role
        if role == "assistant":
            parts.append((m["content"] if isinstance(m, dict) else m.content) or "")
    ranges, pos = [], 0
    for p in parts:
        ranges.append((pos, pos + len(p)))
        pos += len(p) + 1
    return "\n".join(parts), ranges


def assistant_text(messages: Iterable[MessageLike | dict[str, Any]]) -> str:
    """The assistant text of :func:`assistant_text_ranges` (without the ranges)."""
    return assistant_text_ranges(messages)[0]


#: label of a token that is not a training target (the ignore index of PyTorch's cross-entropy)
IGNORE_INDEX = -100


def labels_from_mask(input_ids: np.ndarray, loss_mask: np.ndarray) -> np.ndarray:
    """``labels[t] = input_ids[t]`` where ``loss_mask[t] == 1`` else −100. Shapes ``[T]`` → ``[T]``.

    Example: ids [5, 6, 7], mask [0, 1, 0] → [-100, 6, -100].
    """
    if len(input_ids) != len(loss_mask):
        raise ValueError(f"input_ids has {len(input_ids)} tokens but loss_mask has {len(loss_mask)}")
    return np.where(np.asarray(loss_mask).astype(bool), np.asarray(input_ids, np.int64), IGNORE_INDEX)
