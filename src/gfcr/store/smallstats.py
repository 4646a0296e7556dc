"""The per-step aggregates of a batch without DuckDB: what one training step appends (tens to a few
thousand rows), where planning DuckDB's queries costs more than running them, and the metrics of a
large batch of few steps (an imported dump: ``aggregates.NUMPY_STEPS``), where numpy's passes over
the rows cost less than DuckDB's (0.04 against 0.12 CPU s for 100k rows in 10 steps).

:func:`step_metrics` equals :func:`gfcr.store.stepstats.metrics_of` over the batch's features with
no replay events and no audits (what :func:`gfcr.store.aggregates.partials` asks of it), and
:func:`tops` equals the sample-bucket and model queries of ``aggregates._tops``: the same
expressions, evaluated with numpy over the rows instead of SQL. Where SQL's NULL logic matters it
is spelled out: a comparison with a missing value is false, an aggregate of no values is missing.
Floating-point sums may round differently (DuckDB's order of addition is its own), so a float can
differ in the last bits; counts, maxima and quantiles are exact:

* ``quantile_cont(x, q)`` is DuckDB's continuous quantile: over the ``n`` sorted non-null values,
  ``RN = (n - 1) * q``, ``lo = x[floor(RN)]``, ``hi = x[ceil(RN)]``, result
  ``lo * (1 - d) + hi * d`` with ``d = RN - floor(RN)`` (DuckDB's ``CastInterpolation`` for
  doubles, ``src/core_functions/aggregate/holistic/quantile.cpp``), rounded as the compiled wheel
  rounds it: ``hi * d`` rounded, then one fused multiply-add ``fma(lo, 1 - d, hi * d)`` (found by
  comparison with duckdb 2.0.1 on x86-64: 0 differences in 3,000 random cases, against 33 for the
  plain expression), and ``median`` is ``quantile_cont(x, 0.5)``. This is numpy's ``linear``
  method in value but not in rounding, hence the function of our own;
* ``stddev_pop`` of equal values is exactly 0 (DuckDB's running update adds nothing for them);
* ``count(DISTINCT x)`` counts -0.0 and 0.0 once; ``n / 2`` is a float division (DuckDB's ``/``);
* orderings put NULL last whether ascending or descending (DuckDB's default), strings by code
  point (the order of their UTF-8 bytes).

Both return None for a batch they do not handle (a missing run, step, group or id; a NaN reward,
or for the metrics an infinite one, where DuckDB's NaN rules differ from numpy's; a
``sampling.model`` that is not a string; ``sampling`` text that Python's JSON parser refuses):
the caller then runs the DuckDB path, so the result never depends on which path ran.
"""

from __future__ import annotations

import json
import math
from decimal import Decimal
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from gfcr.records import EXCLUSION_CATEGORIES
from gfcr.store.stepstats import METRIC_COLUMNS, MetricsConfig

#: the largest batch the small path handles (past it DuckDB's per-query overhead no longer dominates)
MAX_ROWS = 2048
#: TOP rollouts kept per sample bucket (``aggregates.TOP``, repeated to avoid a cycle; checked by a test)
TOP = 10
_INT_COLUMNS = {"step", "n_rollouts", "n_groups", "n_verdicts", "gen_tokens", "wasted_tokens", "n_truncated",
                "n_kept_groups", "n_dropped_groups", "n_replayed", "n_audited",
                *[f"excl_{c}" for c in EXCLUSION_CATEGORIES]}
#: DuckDB types ``CASE ... THEN 1.0 ELSE 0.0 END`` as a decimal
_DECIMAL = {"tail_timed": pa.decimal128(2, 1)}
SCHEMA = pa.schema([(c, pa.string() if c == "run_id" else pa.int64() if c in _INT_COLUMNS else _DECIMAL.get(c, pa.float64()))
                    for c in METRIC_COLUMNS])


def quantile_cont(sorted_values: np.ndarray, q: float) -> float | None:
    """DuckDB's ``quantile_cont`` of already sorted values (``[n]`` float), None when empty.

    Example: [1, 2, 10], q = 0.95 → RN = 1.9, 2 * 0.1 + 10 * 0.9 = 9.2."""
    n = len(sorted_values)
    if n == 0:
        return None
    rn = float(n - 1) * q
    lo_i, hi_i = math.floor(rn), math.ceil(rn)
    lo, hi = float(sorted_values[lo_i]), float(sorted_values[hi_i])
    if lo_i == hi_i:
        return lo
    d = rn - lo_i
    # lo * (1 - d) + hi * d as the DuckDB wheel computes it: one fused multiply-add, fma(lo, 1 - d, hi * d)
    return _fma(lo, 1.0 - d, hi * d)


def _fma(a: float, b: float, c: float) -> float:
    """``a * b + c`` rounded once (``math.fma`` from Python 3.13): the exact value as a ratio of
    integers (float denominators are powers of two), divided once, which Python rounds correctly."""
    (an, ad), (bn, bd), (cn, cd) = a.as_integer_ratio(), b.as_integer_ratio(), c.as_integer_ratio()
    return (an * bn * cd + cn * ad * bd) / (ad * bd * cd)


def _count(idx: np.ndarray, mask: np.ndarray, k: int) -> np.ndarray:
    return np.bincount(idx[mask], minlength=k)


def _extreme(idx: np.ndarray, vals: np.ndarray, mask: np.ndarray, k: int, fn: Any) -> tuple[np.ndarray, np.ndarray]:
    """Per key, ``fn`` (np.maximum / np.minimum) of the values under ``mask``, and whether any."""
    init = -np.inf if fn is np.maximum else np.inf
    out = np.full(k, init)
    fn.at(out, idx[mask], vals[mask])
    return out, np.bincount(idx[mask], minlength=k) > 0


def _std(idx: np.ndarray, vals: np.ndarray, mask: np.ndarray, k: int) -> np.ndarray:
    """Per key, the population standard deviation of the values under ``mask`` (nan when none)."""
    n = np.bincount(idx[mask], minlength=k)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.bincount(idx[mask], weights=vals[mask], minlength=k) / n
        dev = vals[mask] - mean[idx[mask]]
        sd = np.sqrt(np.bincount(idx[mask], weights=dev * dev, minlength=k) / n)
    hi, _ = _extreme(idx, vals, mask, k, np.maximum)
    lo, _ = _extreme(idx, vals, mask, k, np.minimum)
    return np.where(hi == lo, 0.0, sd)


def _col(t: pa.Table, name: str, fill: Any) -> tuple[np.ndarray, np.ndarray]:
    """A column as ``(values with nulls filled, valid mask)``."""
    c = t.column(name)
    return (np.asarray(pc.fill_null(c, fill).to_numpy(zero_copy_only=False)),
            np.asarray(pc.is_valid(c).to_numpy(zero_copy_only=False), bool))


def _keys_ok(t: pa.Table, names: list[str]) -> bool:
    return all(t.column(c).null_count == 0 for c in names)


def step_keys(t: pa.Table) -> tuple[list[tuple[str, int]], np.ndarray]:
    """The distinct ``(run_id, step)`` of ``t``'s rows, sorted as Python sorts the tuples, and each
    row's index in that list (``[N]`` int64), vectorised: runs dictionary-encoded and ranked by
    name, then one ``np.unique`` of (rank, step) rows. Example: runs [b, a, b], steps [1, 2, 1] →
    ([(a, 2), (b, 1)], [1, 0, 1])."""
    run, step = t.column("run_id"), t.column("step")
    if run.null_count or step.null_count:  # (no order between None and a value: as Python does, it raises)
        keys_all = list(zip(run.to_pylist(), step.to_pylist(), strict=True))
        uniq = sorted(set(keys_all))
        pos = {k: i for i, k in enumerate(uniq)}
        return uniq, np.fromiter((pos[k] for k in keys_all), np.int64, len(keys_all))
    if len(run) == 0:
        return [], np.zeros(0, np.int64)
    names, codes = encode(run)
    r, by_rank = _ranks(names)[codes], sorted(names)
    st = step.to_numpy().astype(np.int64)
    lo = int(st.min())
    span = int(st.max()) - lo + 1
    if len(names) * span < 2**62:  # one int64 per (rank, step), in the same order: a 1-D unique (~10x faster)
        u1, inv = np.unique(r * span + (st - lo), return_inverse=True)
        u = np.stack([u1 // span, u1 % span + lo], axis=1)
    else:
        u, inv = np.unique(np.stack([r, st], axis=1), axis=0, return_inverse=True)
    return [(by_rank[a], b) for a, b in u.tolist()], inv.ravel().astype(np.int64)


def step_metrics(feats: pa.Table, cfg: MetricsConfig,
                 keys: tuple[list[tuple[str, int]], np.ndarray] | None = None) -> pa.Table | None:
    """The :data:`METRIC_COLUMNS` table of a batch's features (:func:`~gfcr.store.stepstats.rollout_features`)
    with no replay events and no audits, sorted by (run, step); None when the batch is not handled.
    ``keys``: :func:`step_keys` of ``feats``, when the caller has it.

    Shapes: ``[N rows]`` → one row per distinct (run_id, step)."""
    if feats.num_rows == 0 or not _keys_ok(feats, ["run_id", "step", "group_id"]):
        return None
    reward, rv = _col(feats, "reward", 0.0)
    if not np.isfinite(reward[rv]).all():  # NaN or infinite: DuckDB's NaN rules decide (see the module)
        return None
    uniq, sidx_all = keys if keys is not None else step_keys(feats)
    run_code = _codes(feats.column("run_id"))
    fi = np.flatnonzero(~np.asarray(feats.column("replayed").to_numpy(zero_copy_only=False), bool))
    # the fresh rows (replayed copies left out; all of them: the table as it is)
    f = feats if len(fi) == feats.num_rows else feats.take(pa.array(fi, pa.int64()))
    ver, vv = _col(f, "verified", False)
    x: dict[str, Any] = {"reward": reward[fi], "rv": rv[fi], "sidx": sidx_all[fi], "vv": vv,
                         "passed": vv & ver.astype(bool), "failed": vv & ~ver.astype(bool),
                         "gen": f.column("gen_len").to_numpy().astype(np.int64), "run": run_code[fi]}
    for name in ("advantage", "trained", "latency", "entropy", "nll_mean"):
        x[name], x[name + "_ok"] = _col(f, name, 0.0)
    finish = f.column("finish_reason")
    for name, value in (("trunc", "length"), ("abort", "abort")):
        x[name] = np.asarray(pc.fill_null(pc.equal(finish, value), False).to_numpy(zero_copy_only=False), bool)
    x["scored"] = np.asarray(f.column("scored").to_numpy(zero_copy_only=False), bool)
    # groups: distinct (run, step, group_id) in tuple order = (step's place, group's place by name)
    gname = _codes(f.column("group_id"), ranked=True)
    span = int(gname.max()) + 1 if len(gname) else 1
    gu, gidx = np.unique(x["sidx"] * span + gname, return_inverse=True)
    gidx = gidx.ravel().astype(np.int64)
    g_step = (gu // span).astype(np.int64)
    gs = _groups(x, gidx, g_step, len(uniq), cfg)
    x["pass_ref"] = _pass_ref(x, len(uniq), cfg)
    # each step's fresh rows as one slice: one stable sort, then views (no pass over all rows per step)
    order = np.argsort(x["sidx"], kind="stable")
    bounds = np.searchsorted(x["sidx"][order], np.arange(len(uniq) + 1))
    xs = {name: v[order] for name, v in x.items() if isinstance(v, np.ndarray) and v.shape == order.shape}
    out: dict[str, list[Any]] = {c: [] for c in METRIC_COLUMNS}
    for i, key in enumerate(uniq):
        a, b = int(bounds[i]), int(bounds[i + 1])
        o = _step_row({name: v[a:b] for name, v in xs.items()}, gs, i, key, cfg)
        for c in METRIC_COLUMNS:
            out[c].append(o[c])
    return pa.table({c: pa.array(out[c], SCHEMA.field(c).type) for c in METRIC_COLUMNS}, schema=SCHEMA)


def _groups(x: dict[str, Any], gidx: np.ndarray, g_step: np.ndarray, k: int, cfg: MetricsConfig) -> dict[str, np.ndarray]:
    """The ``g``/``gc`` part (per group of fresh rows: spread, verdicts, advantages, zero variance,
    mixed) summed per step as ``gs`` does (``[k]`` arrays), and in ``x`` each row's group facts."""
    ng, eps = len(g_step), float(cfg.eps)
    reward, rv, adv, av = x["reward"], x["rv"], x["advantage"], x["advantage_ok"]
    passed, failed = x["passed"], x["failed"]
    n_g = np.bincount(gidx, minlength=ng)
    rmax, r_any = _extreme(gidx, reward, rv, ng, np.maximum)
    rmin, _ = _extreme(gidx, reward, rv, ng, np.minimum)
    spread = rmax - rmin
    sd_g = _std(gidx, reward, rv, ng)
    n_ver, n_pass, n_fail = _count(gidx, x["vv"], ng), _count(gidx, passed, ng), _count(gidx, failed, ng)
    gen_g = np.zeros(ng, np.int64)
    np.add.at(gen_g, gidx, x["gen"])
    n_adv = _count(gidx, av, ng)
    max_abs_adv, _ = _extreme(gidx, np.abs(adv), av, ng, np.maximum)
    pam, pam_ok = _extreme(gidx, adv, av & passed, ng, np.minimum)
    fam, fam_ok = _extreme(gidx, adv, av & failed, ng, np.maximum)
    n_tr = _count(gidx, x["trained_ok"], ng)
    any_tr = _count(gidx, x["trained_ok"] & (x["trained"] > 0.5), ng) > 0
    two = n_g >= 2
    zero_var = two & r_any & (spread <= eps)
    zero_adv = np.where(n_adv == n_g, max_abs_adv <= eps, zero_var)
    mixed = (n_pass > 0) & (n_fail > 0)
    x |= {"mixed": mixed[gidx], "pam": pam[gidx], "pam_ok": pam_ok[gidx], "fam": fam[gidx], "fam_ok": fam_ok[gidx]}
    var = two & r_any & (spread > eps) & (mixed | (n_ver == 0))
    wasted = np.zeros(k, np.int64)
    np.add.at(wasted, g_step[zero_adv], gen_g[zero_adv])
    return {
        "n_groups": _count(g_step, two, k), "n_zero": _count(g_step, zero_var, k),
        "n_all_correct": _count(g_step, two & (((n_ver == n_g) & (n_fail == 0)) | ((n_ver == 0) & zero_var & (rmax > 0))), k),
        "n_all_wrong": _count(g_step, two & (((n_ver == n_g) & (n_pass == 0)) | ((n_ver == 0) & zero_var & (rmax <= 0))), k),
        "n_var": _count(g_step, var, k), "n_low_std": _count(g_step, var & (sd_g < float(cfg.min_group_std)), k),
        "wasted": wasted, "n_tr_groups": _count(g_step, n_tr > 0, k),
        "n_kept": _count(g_step, (n_tr > 0) & any_tr, k), "n_dropped": _count(g_step, (n_tr > 0) & ~any_tr, k),
    }


def _pass_ref(x: dict[str, Any], k: int, cfg: MetricsConfig) -> np.ndarray:
    """Per fresh row, ``coalesce(pass_step.ref, pass_run.ref, pass_reward)``: the median reward of
    the verified passes of its step, else of its run, else the configured one."""
    reward, sidx, run = x["reward"], x["sidx"], x["run"]
    pr_mask = x["passed"] & x["rv"]
    nrun = int(run.max()) + 1 if len(run) else 0
    step_ref, run_ref = _medians(sidx[pr_mask], reward[pr_mask], k), _medians(run[pr_mask], reward[pr_mask], nrun)
    ref = np.where(np.isnan(run_ref[run]), float(cfg.pass_reward), run_ref[run])
    return np.where(np.isnan(step_ref[sidx]), ref, step_ref[sidx])


def _medians(idx: np.ndarray, vals: np.ndarray, k: int) -> np.ndarray:
    """Per key ``0..k-1``, :func:`quantile_cont` ``(·, 0.5)`` of its values (nan when none): one sort."""
    out = np.full(k, np.nan)
    order = np.lexsort((vals, idx))
    v, i = vals[order], idx[order]
    b = np.searchsorted(i, np.arange(k + 1))
    for j in np.flatnonzero(np.diff(b)).tolist():
        out[j] = quantile_cont(v[b[j]:b[j + 1]], 0.5)
    return out


def encode(col: pa.ChunkedArray | pa.Array) -> tuple[list[Any], np.ndarray]:
    """A column's distinct values (first-seen order) and each row's index into them (``[N]`` int64;
    a null row gets ``len(values)``). Example: ``["b", None, "a", "b"]`` → ``(["b", "a"], [0, 2, 1, 0])``."""
    enc = pc.dictionary_encode(col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col)
    names = enc.dictionary.to_pylist()
    return names, np.asarray(pc.fill_null(enc.indices, len(names)).to_numpy(zero_copy_only=False), np.int64)


def _ranks(names: list[Any]) -> np.ndarray:
    """Each value's place among ``names`` sorted (strings by code point, as Python sorts them)."""
    rank = np.empty(len(names), np.int64)
    rank[sorted(range(len(names)), key=names.__getitem__)] = np.arange(len(names))
    return rank


def _codes(col: pa.ChunkedArray | pa.Array, ranked: bool = False) -> np.ndarray:
    """Each row's index into the column's distinct values (no nulls): in first-seen order, or with
    ``ranked`` in the order of the values."""
    names, codes = encode(col)
    return _ranks(names)[codes] if ranked else codes


def _step_row(y: dict[str, Any], gs: dict[str, np.ndarray], i: int, key: tuple[str, int],
              cfg: MetricsConfig) -> dict[str, Any]:
    """The ``r``/``tail`` parts and the final select for step ``i`` (``key``), from ``y``: the
    row-aligned arrays of ``x`` cut to that step's fresh rows."""
    n = len(y["sidx"])
    o: dict[str, Any] = {c: None for c in METRIC_COLUMNS}
    o |= {"run_id": key[0], "step": key[1], "n_rollouts": n, "n_groups": int(gs["n_groups"][i]), "n_verdicts": 0,
          "gen_tokens": 0, "wasted_tokens": int(gs["wasted"][i]), "n_truncated": 0, "n_replayed": 0, "n_audited": 0,
          "replay_share": 0.0}
    if not n:
        return o
    eps, q_tail = float(cfg.eps), float(cfg.tail_quantile)
    reward, rv, adv, av, vv = y["reward"], y["rv"], y["advantage"], y["advantage_ok"], y["vv"]
    g = np.sort(y["gen"])
    gsum, n_v, len_max = int(g.sum()), int(vv.sum()), int(g[-1])
    len_q = quantile_cont(g, q_tail)
    lats = np.sort(y["latency"][y["latency_ok"]])
    lat_max = float(lats[-1]) if len(lats) else None
    lat_q = quantile_cont(lats, q_tail)
    timed = len(lats) == n and len(np.unique(lats)) >= max(3, n / 2) and lat_max is not None and lat_max > 0
    ng = int(gs["n_groups"][i])
    hack = y["failed"] & rv & (reward >= y["pass_ref"] - eps)
    den = int((y["mixed"] & av & vv).sum())
    dis = y["mixed"] & av & ((y["failed"] & y["pam_ok"] & (adv >= y["pam"] - eps))
                             | (y["passed"] & y["fam_ok"] & (adv <= y["fam"] + eps)))
    n_trunc = int(y["trunc"].sum())
    return o | {
        "n_verdicts": n_v, "scored_share": int(y["scored"].sum()) / n,
        "reward_mean": _mean(reward[rv]), "reward_std": _std_of(reward[rv]),
        "verified_rate": int(y["passed"].sum()) / n_v if n_v else None,
        **{f"{name}_share": int(gs[f"n_{name}"][i]) / ng if ng else None
           for name in ("all_correct", "all_wrong")}, "zero_var_share": int(gs["n_zero"][i]) / ng if ng else None,
        "gen_tokens": gsum, "waste_share": int(gs["wasted"][i]) / gsum if gsum else None,
        "len_mean": gsum / n, "len_p95": quantile_cont(g, 0.95), "len_max": float(len_max),
        "n_truncated": n_trunc, "trunc_rate": n_trunc / n, "abort_rate": int(y["abort"].sum()) / n,
        "tail_time_share": (lat_max - lat_q) / lat_max if timed else (len_max - len_q) / len_max if len_max > 0 else None,
        "tail_token_share": float(np.maximum(y["gen"] - len_q, 0.0).sum()) / gsum if gsum else None,
        "tail_timed": Decimal("1.0") if timed else Decimal("0.0"),
        "entropy_mean": _mean(y["entropy"][y["entropy_ok"]]),
        "nll_mean": _mean(y["nll_mean"][y["nll_mean_ok"]]),
        "hack_rate": int(hack.sum()) / n_v if n_v else None,
        "adv_disagreement": int(dis.sum()) / den if den else None,
        "low_std_share": int(gs["n_low_std"][i]) / int(gs["n_var"][i]) if gs["n_var"][i] else None,
        "n_kept_groups": int(gs["n_kept"][i]) if gs["n_tr_groups"][i] else None,
        "n_dropped_groups": int(gs["n_dropped"][i]) if gs["n_tr_groups"][i] else None,
    }


def _mean(x: np.ndarray) -> float | None:
    return float(x.sum()) / len(x) if len(x) else None


def _std_of(x: np.ndarray) -> float | None:
    if not len(x):
        return None
    if x.max() == x.min():
        return 0.0
    d = x - float(x.sum()) / len(x)
    return math.sqrt(float((d * d).sum()) / len(x))


def _first_wins(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object keeping the first of repeated keys (as DuckDB's ``json_extract`` reads them)."""
    out: dict[str, Any] = {}
    for key, v in pairs:
        out.setdefault(key, v)
    return out


def _model(text: str | None, cache: dict[str, Any]) -> Any:
    """``json_extract_string(sampling, '$.model')`` for a string model or none; ``...`` for what this
    path does not decide (unparseable text, a model that is not a string)."""
    if text is None:
        return None
    if text not in cache:
        try:
            v = json.loads(text, object_pairs_hook=_first_wins)
        except ValueError:
            cache[text] = ...
        else:
            m = v.get("model") if isinstance(v, dict) else None
            cache[text] = m if m is None or isinstance(m, str) else ...
    return cache[text]


def tops(table: pa.Table) -> dict[tuple[str, int], dict[str, Any]] | None:
    """Per (run, step) of ``table``: ``best``, ``worst``, ``truncated`` (the first :data:`TOP`
    ``{"r", "id"}`` of each bucket), ``tasks`` (distinct, sorted, a missing task last) and, where
    any row names one, ``models`` (``{"m", "n"}`` sorted by model); None when not handled."""
    if not _keys_ok(table, ["run_id", "step", "rollout_id"]):
        return None
    rewards = table.column("reward").to_pylist()
    if any(r is not None and math.isnan(r) for r in rewards):
        return None
    cache: dict[str, Any] = {}
    models = [_model(s, cache) for s in table.column("sampling").to_pylist()]
    if any(m is ... for m in models):
        return None
    rows: dict[tuple[str, int], list[tuple[Any, ...]]] = {}
    for row in zip(table.column("run_id").to_pylist(), table.column("step").to_pylist(),
                   table.column("rollout_id").to_pylist(), rewards, table.column("finish_reason").to_pylist(),
                   table.column("task").to_pylist(), models, strict=True):
        rows.setdefault((row[0], row[1]), []).append(row[2:])
    out: dict[tuple[str, int], dict[str, Any]] = {}
    for key, rs in rows.items():
        best = sorted(rs, key=lambda x: (x[1] is None, -(x[1] or 0.0), x[0]))
        worst = sorted(sorted(rs, key=lambda x: x[0], reverse=True), key=lambda x: (x[1] is None, x[1] or 0.0))
        trunc = sorted((x for x in rs if x[2] == "length"), key=lambda x: x[0])
        tasks = {x[3] for x in rs}
        counts: dict[str, int] = {}
        for x in rs:
            if x[4] is not None:
                counts[x[4]] = counts.get(x[4], 0) + 1
        o = {"run_id": key[0], "step": key[1],
             **{name: [{"r": x[1], "id": x[0]} for x in b[:TOP]] for name, b in
                (("best", best), ("worst", worst), ("truncated", trunc))},
             "tasks": sorted(t for t in tasks if t is not None) + ([None] if None in tasks else [])}
        if counts:
            o["models"] = [{"m": m, "n": counts[m]} for m in sorted(counts)]
        out[key] = o
    return out
