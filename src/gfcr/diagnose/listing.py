"""The viewer list's search, sort and extra filters, over a filtered scan of the rollouts.

The list's plain pages (run and step filters, the default order) are planned on the per-step index
(:mod:`gfcr.diagnose.paging`). Anything else is one pushed-down scan of the rows the store-level
filters keep (run, steps, verdict, prompt id, task, reward bounds, finish), then, in Arrow:

* ``q`` — full-text search: a row matches when its turns (prompt or completion) hold every word of
  ``q`` as a whole word, case-insensitively (:mod:`gfcr.store.textindex` defines it; with the store's
  text index the viewer asks Lance and the rows arrive here already matched, without it
  :func:`word_match` tests each row the other filters keep); a ``q`` without letters or digits is a
  substring test (:func:`text_match`);
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
from gfcr.store.textindex import query_words

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


def word_match(messages: pa.ChunkedArray | pa.Array, q: str) -> np.ndarray:
    """Which rows hold every word of ``q`` (:func:`gfcr.store.textindex.query_words`) as a whole word in
    the text of their turns, case-insensitively (``[N]`` bool): the text index's match, by a scan. A ``q``
    without words falls back to :func:`text_match` (a substring test).

    Example: rows [[user "What is 3+4?", assistant "7"], [user "The zebra"], [user "zebras"]],
    q "ZEBRA" → [False, True, False]; q "3 + 4" → [True, False, False].
    """
    words = query_words(q)
    if not words:
        return text_match(messages, q)
    arr = messages.combine_chunks() if isinstance(messages, pa.ChunkedArray) else messages
    n = len(arr)
    out = np.ones(n, bool)
    if n == 0:
        return out
    content = pc.struct_field(pc.list_flatten(arr), "content")
    parent = pc.list_parent_indices(arr).to_numpy(zero_copy_only=False)
    for w in words:  # letters and digits only: nothing to escape
        hit = pc.fill_null(pc.match_substring_regex(content, rf"(^|[^\pL\pN]){w}($|[^\pL\pN])", ignore_case=True),
                           False).to_numpy(zero_copy_only=False)
        row = np.zeros(n, bool)
        row[parent[hit]] = True
        out &= row
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
           order: str = "asc", ordered: bool = True) -> pa.Table:
    """The rows of a scan (``rollout_id``, the sort keys, ``messages`` when ``q``, ``token_role``
    when a length bound or ``sort="gen"``) that pass the filters, in the asked order; adds
    ``gen_tokens`` when it computed it. ``sort`` None keeps the default order (:data:`SORT_KEYS`);
    ``ordered=False`` leaves the rows in scan order (a histogram needs no order)."""
    keep = np.ones(t.num_rows, bool)
    if q:
        keep &= word_match(t.column("messages"), q)
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
    if not ordered:
        return t
    keys = list(SORT_KEYS)
    if sort is not None:
        col = SORT_COLUMNS[sort]
        keys = [(col, "descending" if order == "desc" else "ascending")] + [k for k in keys if k[0] != col]
    return t.take(pc.sort_indices(t, sort_keys=keys))  # nulls last


HIST_FIELDS = ("reward", "gen")


def histogram_bars(values: np.ndarray, bins: int = 20, integer: bool = False) -> dict:
    """Equal-width bars over the finite ``values`` (``[N]``): per bar its edges ``lo``/``hi``, ``count``,
    and the smallest and largest value in it (``min``/``max``, None when empty). Bars are disjoint
    (``[lo, hi)``, the last one closed), so the inclusive filter ``min <= v <= max`` lists exactly the
    bar's values: that is what a click on a bar sets. ``integer``: bars of whole numbers
    (``[lo, hi]``, ``hi = lo + width - 1``). Non-finite values are counted in ``missing``.

    Example: values [0, 0, 1, 0.5], bins 2 → bars [0, 0.5) count 2 (min 0, max 0) and [0.5, 1]
    count 2 (min 0.5, max 1); values [3, 4, 9] integer, bins 3 → width 3: [3, 5] 2, [6, 8] 0, [9, 11] 1.
    """
    v = np.asarray(values, dtype=np.float64)
    ok = np.isfinite(v)
    v = v[ok]
    out: dict = {"n": int(len(v)), "missing": int((~ok).sum()), "integer": integer, "bars": []}
    if not len(v):
        return out
    lo, hi = float(v.min()), float(v.max())
    if integer:
        width = max(1, int(np.ceil((hi - lo + 1) / bins)))
        idx = ((v - lo) // width).astype(np.int64)
        nb = int(idx.max()) + 1
        edges = [(lo + i * width, lo + (i + 1) * width - 1) for i in range(nb)]
    else:
        nb = bins if hi > lo else 1
        width = (hi - lo) / nb if hi > lo else 1.0
        idx = np.minimum(((v - lo) / width).astype(np.int64), nb - 1)
        edges = [(lo + i * width, hi if i == nb - 1 else lo + (i + 1) * width) for i in range(nb)]
    counts = np.bincount(idx, minlength=nb)
    mins = np.full(nb, np.inf)
    maxs = np.full(nb, -np.inf)
    np.minimum.at(mins, idx, v)
    np.maximum.at(maxs, idx, v)
    num = int if integer else float
    out["bars"] = [{"lo": num(a), "hi": num(b), "count": int(c), "min": num(mn) if c else None,
                    "max": num(mx) if c else None} for (a, b), c, mn, mx in zip(edges, counts, mins, maxs, strict=True)]
    return out


__all__ = ["HIST_FIELDS", "histogram_bars", "AUDIT_STATES", "SORT_COLUMNS", "audit_mask", "gen_counts", "refine", "text_match", "word_match"]
