"""What the store's rows record about where they came from, read with one SQL query each.

:func:`recorded_model`: the model most rollouts were sampled from (``sampling.model``, which every
engine writes): the tokenizer that made the stored tokens, for the viewer, the health checks and
ROSS's audit, which need no model of their own.
"""

from __future__ import annotations

from typing import Any


def recorded_model(store: Any) -> str | None:
    """The model most of the store's rollouts were sampled from (``sampling.model``; ties: the first
    by name), or None (none recorded, or a ``sampling`` column that is not JSON).

    Example: 3 rows sampled from ``m-a`` and 2 from ``m-b`` -> ``"m-a"``."""
    try:
        rows = store.sql(
            "SELECT json_extract_string(sampling, '$.model') AS m, count(*) AS n FROM rollouts "
            "WHERE json_valid(sampling) AND json_extract_string(sampling, '$.model') IS NOT NULL "
            "GROUP BY m ORDER BY n DESC, m LIMIT 1"
        ).to_pylist()
    except Exception:  # noqa: BLE001 - an odd sampling column means "not recorded", never a failed command
        return None
    return rows[0]["m"] if rows else None
