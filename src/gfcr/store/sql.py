"""SQL text for the store's filters (Lance and DuckDB read the same quoting): a string literal and an
``IN`` list, defined once.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def quote(s: Any) -> str:
    """A SQL string literal. Example: ``quote("it's")`` → ``'it''s'``."""
    return "'" + str(s).replace("'", "''") + "'"


def in_list(col: str, values: Iterable[Any]) -> str:
    """``col IN ('a', 'b')`` (``false`` for no values). Example: ``in_list("id", ["a", "b'"])`` →
    ``id IN ('a', 'b''')``."""
    vals = [quote(v) for v in values]
    return f"{col} IN ({', '.join(vals)})" if vals else "false"
