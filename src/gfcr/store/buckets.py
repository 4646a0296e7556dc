"""The report's sample buckets of a large batch, vectorised: what ``aggregates._tops`` asks DuckDB
for, per (run, step), computed with numpy sorts on the rewards and Arrow's top-k on the ids.

Per step, the first :data:`TOP` rows of ``best`` (reward descending, then ``rollout_id``
ascending), ``worst`` (reward ascending, then ``rollout_id`` descending), ``truncated``
(``finish_reason = 'length'``, by ``rollout_id``), with a missing reward last in both (DuckDB's
default), the distinct tasks (sorted, a missing one last) and the models its rows were sampled
from (``sampling.model``, counted, sorted). The same values as the DuckDB query and as
:func:`gfcr.store.smallstats.tops` (``tests/diagnose/test_buckets.py`` compares the three).

How, for ``best`` in a step of ``m`` rows: one ``np.lexsort`` of all rows by (step, missing,
−reward) orders the rewards; the reward at place ``k = min(TOP, m)`` is the threshold. The ``j``
rows with a better reward are all in (``j < k``), and the rest are the ``k − j`` smallest ids among
the rows that tie with the threshold (``pyarrow.compute.bottom_k_unstable``); the ``k`` rows are
then put in order by (reward, id). No string sort of the whole batch, which is
what the query costs (0.11 CPU s of a 100k-row import's aggregates).

Shapes: ``table`` ``[N rows]`` with ``run_id``, ``step``, ``rollout_id``, ``reward``,
``finish_reason``, ``task``, ``sampling``; ``inv`` ``[N]`` each row's index into ``keys``.
Example: rewards [1, 1, 0] with ids [b, a, c] at one step → best [a, b, c] (a and b tie at 1:
by id), worst [c, b, a].

Returns None for what it does not decide (a NaN reward, a missing id, ``sampling`` text Python's
JSON parser refuses or a model that is not a string): the caller then runs DuckDB's query. Its
loop is per step: the caller sends a batch of many steps to DuckDB
(``aggregates.NUMPY_STEPS``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from gfcr.store.smallstats import TOP, _model, encode


def _bounds(inv: np.ndarray, k: int) -> np.ndarray:
    """``[k + 1]``: where each step's rows start in an order sorted by step."""
    return np.r_[0, np.cumsum(np.bincount(inv, minlength=k))]


def _order(val: np.ndarray, missing: np.ndarray, inv: np.ndarray) -> np.ndarray:
    """Row indices sorted by (step, missing last, ``val``)."""
    return np.lexsort((val, missing, inv))


def _bucket(order: np.ndarray, a: int, b: int, val: np.ndarray, missing: np.ndarray, ids: pa.Array,
            ascending_ids: bool) -> list[tuple[int, str]]:
    """The first ``TOP`` (row, id) of one step (``order[a:b]``, sorted by (missing, ``val``)) once
    ties on (missing, ``val``) are broken by id (ascending or descending)."""
    seg = order[a:b]
    k = min(TOP, b - a)
    if k == 0:
        return []
    t = seg[k - 1]
    sv, sm = val[seg], missing[seg]
    same = (sv == val[t]) & (sm == missing[t])
    lo = int(np.argmax(same))  # the first place of the threshold's tie block (the block is contiguous)
    hi = lo + int(np.count_nonzero(same))
    tie = seg[lo:hi]
    need = k - lo
    if len(tie) > need:
        sub = ids.take(pa.array(tie))
        pick = (pc.bottom_k_unstable if ascending_ids else pc.top_k_unstable)(sub, need).to_numpy()
        tie = tie[pick]
    rows = [int(i) for i in seg[:lo]] + [int(i) for i in tie]
    id_of = ids.take(pa.array(rows, pa.int64())).to_pylist()
    # by (missing, val), ties by id: a sort by id, then a stable sort by the reward key
    by_id = sorted(range(len(rows)), key=id_of.__getitem__, reverse=not ascending_ids)
    by_key = sorted(by_id, key=lambda j: (bool(missing[rows[j]]), float(val[rows[j]])))
    return [(rows[j], id_of[j]) for j in by_key]


def tops(table: pa.Table, keys: list[tuple[str, int]], inv: np.ndarray) -> dict[tuple[str, int], dict[str, Any]] | None:
    """``aggregates._tops`` of ``table`` (see the module), or None where it does not decide."""
    if table.column("rollout_id").null_count:
        return None
    rc = table.column("reward")
    reward = np.asarray(pc.fill_null(rc, 0.0).to_numpy(zero_copy_only=False), np.float64)
    missing = np.asarray(pc.is_null(rc).to_numpy(zero_copy_only=False), bool)
    if np.isnan(reward).any():
        return None
    models = _models(table.column("sampling"), inv, len(keys))
    if models is None:
        return None
    ids = table.column("rollout_id").combine_chunks()
    bounds = _bounds(inv, len(keys))
    best_o = _order(-reward, missing, inv)
    worst_o = _order(reward, missing, inv)
    trunc_rows = np.flatnonzero(pc.fill_null(pc.equal(table.column("finish_reason"), "length"), False)
                                .to_numpy(zero_copy_only=False))
    trunc_inv = inv[trunc_rows]
    trunc_o = trunc_rows[np.argsort(trunc_inv, kind="stable")]
    tb = _bounds(trunc_inv, len(keys))
    zeros, flat = np.zeros(len(reward)), np.zeros(len(reward), bool)  # truncated: ordered by id alone
    tasks = _tasks(table.column("task"), inv, len(keys))
    out: dict[tuple[str, int], dict[str, Any]] = {}
    for g, key in enumerate(keys):
        a, b = int(bounds[g]), int(bounds[g + 1])
        o: dict[str, Any] = {"run_id": key[0], "step": key[1]}
        for name, rows in (("best", _bucket(best_o, a, b, -reward, missing, ids, True)),
                           ("worst", _bucket(worst_o, a, b, reward, missing, ids, False)),
                           ("truncated", _bucket(trunc_o, int(tb[g]), int(tb[g + 1]), zeros, flat, ids, True))):
            o[name] = [{"r": None if missing[i] else float(reward[i]), "id": r} for i, r in rows]
        o["tasks"] = tasks[g]
        if models[g]:
            o["models"] = models[g]
        out[key] = o
    return out


def _tasks(col: pa.ChunkedArray | pa.Array, inv: np.ndarray, k: int) -> list[list[str | None]]:
    """Per step, its distinct tasks sorted by code point, a missing task last."""
    names, codes = encode(col)
    pairs = np.unique(inv * (len(names) + 1) + codes)
    out: list[list[str | None]] = [[] for _ in range(k)]
    for p in pairs.tolist():
        g, c = divmod(p, len(names) + 1)
        out[g].append(names[c] if c < len(names) else None)
    return [sorted(t for t in ts if t is not None) + ([None] if None in ts else []) for ts in out]


def _models(col: pa.ChunkedArray | pa.Array, inv: np.ndarray, k: int) -> list[list[dict[str, Any]]] | None:
    """Per step, ``[{"m", "n"}]`` of the rows' ``sampling.model`` (counted, sorted by model; empty
    when no row names one), each distinct ``sampling`` text parsed once; None when one is not
    decided here (:func:`gfcr.store.smallstats._model`)."""
    texts, codes = encode(col)
    cache: dict[str, Any] = {}
    names = [_model(s, cache) for s in texts]
    if any(m is ... for m in names):
        return None
    out: list[list[dict[str, Any]]] = [[] for _ in range(k)]
    named = [i for i, m in enumerate(names) if m is not None]
    if not named:
        return out
    lut = np.full(len(names) + 1, -1, np.int64)
    models = sorted({names[i] for i in named})
    lut[named] = [models.index(names[i]) for i in named]
    m = lut[codes]
    keep = m >= 0
    pairs, n = np.unique(inv[keep] * len(models) + m[keep], return_counts=True)
    for p, c in zip(pairs.tolist(), n.tolist(), strict=True):
        g, j = divmod(p, len(models))
        out[g].append({"m": models[j], "n": c})
    return out
