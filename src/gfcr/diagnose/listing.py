"""The viewer list's search, sort and extra filters, over a filtered scan of the rollouts.

The list's plain pages (run and step filters, the default order) are planned on the per-step index
(:mod:`gfcr.diagnose.paging`). Anything else is one pushed-down scan of the rows the store-level
filters keep (run, steps, verdict, prompt id, task, reward bounds, finish), then, in Arrow:

* ``q`` — text search: a row matches when any of its turns (prompt or completion) contains ``q``,
  case-insensitively (:func:`text_match`; a substring test over the flattened turn texts, no index:
  its cost follows the rows the other filters keep);
* ``gen_min`` / ``gen_max`` — generated tokens (the sum of ``token_role``), inclusive;
* ``audit`` — the shown judge's latest audit of the row: ``kept``, ``discarded`` (any other status)
  or ``none``;
* ``sort`` / ``order`` — one of :data:`SORT_COLUMNS`, ascending or descending, ties in the default
  order (run, step, prompt, sample, id).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from gfcr.diagnose.paging import SORT_KEYS

#: sort name (the URL's ``sort=``) → column; ``gen_tokens`` is computed from ``token_role``
SORT_COLUMNS = {"run": "run_id", "step": "step", "prompt": "prompt_id", "sample": "sample_index", "task": "task",
                "reward": "reward", "verified": "verified", "finish": "finish_reason", "gen": "gen_tokens"}
AUDIT_STATES = ("kept", "discarded", "none")


def gen_counts(token_role: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """Generated tokens per row: the sum of each row's ``token_role`` (``[N]`` int64).

    Example: roles [[0, 1, 1], [0], []] → [2, 0, 0].
    """
    lens = pc.list_value_length(token_role).to_numpy(zero_copy_only=False)
    lens = np.nan_to_num(lens.astype(np.float64)).astype(np.int64)
    flat = pc.list_flatten(token_role).to_numpy(zero_copy_only=False).astype(np.int64)
    return np.bincount(np.repeat(np.arange(len(lens)), lens), weights=flat, minlength=len(lens)).astype(np.int64)


def text_match(messages: pa.ChunkedArray | pa.Array, q: str) -> np.ndarray:
    """Which rows have a turn whose text contains ``q`` (case-insensitive; ``[N]`` bool).

    Example: rows [[user "What is 3+4?", assistant "7"], [user "2*5?", assistant "ten"]], q "TEN" →
    [False, True].
    """
    arr = messages.combine_chunks() if isinstance(messages, pa.ChunkedArray) else messages
    n = len(arr)
    if n == 0:
        return np.zeros(0, bool)
    content = pc.struct_field(pc.list_flatten(arr), "content")
    hit = pc.fill_null(pc.match_substring(content, q, ignore_case=True), False).to_numpy(zero_copy_only=False)
    parent = pc.list_parent_indices(arr).to_numpy(zero_copy_only=False)
    out = np.zeros(n, bool)
    out[parent[hit]] = True
    return out


def audit_mask(ids: list[str], audits: dict[str, str], state: str) -> np.ndarray:
    """Rows whose audit status (``audits``: rollout id → status of the shown judge's latest audit)
    is ``state``: ``kept``, ``discarded`` (any status but kept) or ``none`` (not audited)."""
    st = [audits.get(i) for i in ids]
    if state == "kept":
        return np.array([s == "kept" for s in st], bool)
    if state == "discarded":
        return np.array([s is not None and s != "kept" for s in st], bool)
    return np.array([s is None for s in st], bool)


def refine(t: pa.Table, q: str | None = None, gen_min: int | None = None, gen_max: int | None = None,
           audits: dict[str, str] | None = None, audit: str | None = None, sort: str | None = None,
           order: str = "asc") -> pa.Table:
    """The rows of a scan (``rollout_id``, the sort keys, ``messages`` when ``q``, ``token_role``
    when a length bound or ``sort="gen"``) that pass the filters, in the asked order; adds
    ``gen_tokens`` when it computed it. ``sort`` None keeps the default order (:data:`SORT_KEYS`)."""
    keep = np.ones(t.num_rows, bool)
    if q:
        keep &= text_match(t.column("messages"), q)
    if gen_min is not None or gen_max is not None or sort == "gen":
        gen = gen_counts(t.column("token_role"))
        t = t.append_column("gen_tokens", pa.array(gen, pa.int64()))
        if gen_min is not None:
            keep &= gen >= gen_min
        if gen_max is not None:
            keep &= gen <= gen_max
    if audit is not None:
        keep &= audit_mask(t.column("rollout_id").to_pylist(), audits or {}, audit)
    t = t.filter(pa.array(keep, pa.bool_()))
    keys = list(SORT_KEYS)
    if sort is not None:
        col = SORT_COLUMNS[sort]
        keys = [(col, "descending" if order == "desc" else "ascending")] + [k for k in keys if k[0] != col]
    return t.take(pc.sort_indices(t, sort_keys=keys))  # nulls last


__all__ = ["AUDIT_STATES", "SORT_COLUMNS", "audit_mask", "gen_counts", "refine", "text_match"]
