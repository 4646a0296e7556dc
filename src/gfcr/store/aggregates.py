"""Per-step aggregates kept with the store: what the report and the viewer's summary need, per
(run, step), so that they do not scan every row.

One row per (run, step) of the rows stored at that step (``aggregates.parquet`` in the store
directory), computed from exactly those rows:

* the step's metrics (:func:`gfcr.store.stepstats.metrics_of` over the step's rows alone: counts,
  sums, length quantiles, group shares, truncation and verdict counts, zero-variance groups...);
* what a step's metrics need from other steps, in mergeable form: the passing and failing
  rewards as value counts (the run's passing median for ``hack_rate`` on steps that no rollout
  passed), and the replay events its rows record, summed per target step (count, sum, min, max
  of lag and importance weight);
* the rollout health checks that need no tokenizer (:func:`gfcr.store.checks.screen_batch`:
  exact counts, the first ``max_issues`` issues of each check);
* the first 10 rollouts of each sample bucket of the report (best, worst, truncated) and the
  step's tasks.

Audits live in their own table and are joined at read time (their cost follows the audits).

**Kept with the rows.** The file's metadata names the rollouts-table version it summarises. An
append commits its rows (one Lance commit), then rewrites the file for the new version under a
lock: the appended steps new to the store from the batch itself, a step that already had rows
from a filtered read of that step. A write that fails before the Lance commit leaves both as
they were; one that fails after it (or a commit that another writer's commit interleaved, or a
process killed in between) leaves the file naming an older version: **stale**, which every read
detects (one footer read) and answers by rebuilding from the rows, never with the old numbers.
A store from before this file (or a checkout of an earlier version) has none and is rebuilt
(or, read-only, computed in memory) the same way. ``gfcr store check`` reports the state.
"""

from __future__ import annotations

import json
import os
import threading
import warnings
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from gfcr.store import buckets, smallstats
from gfcr.store.checks import CHECKS, HealthConfig, HealthIssue, Tally, screen_batch
from gfcr.store.checks import COLUMNS as CHECK_COLUMNS
from gfcr.store.integrity import file_lock
from gfcr.store.stepstats import (
    FEATURE_COLUMNS,
    METRIC_COLUMNS,
    MetricsConfig,
    audit_features,
    connection,
    metrics_of,
    rollout_features,
)

FILE = "aggregates.parquet"
FORMAT = 2
META_KEY = b"gfcr.aggregates"
#: rollouts kept per step for each sample bucket of the report
TOP = 10
#: distinct rewards kept per step as value counts; past it the step's counts are dropped and a
#: read falls back to scanning the run's rows (exact either way)
MAX_DISTINCT = 4096
COLUMNS = list(dict.fromkeys([*FEATURE_COLUMNS, *CHECK_COLUMNS, "task", "sampling"]))
_EV = pa.struct([("step", pa.int64()), ("n", pa.int64()), ("lag_n", pa.int64()), ("lag_sum", pa.float64()),
                 ("lag_max", pa.float64()), ("iw_n", pa.int64()), ("iw_sum", pa.float64()), ("iw_min", pa.float64()),
                 ("iw_max", pa.float64())])
_VC = pa.list_(pa.struct([("r", pa.float64()), ("n", pa.int64())]))
_TOPS = pa.list_(pa.struct([("r", pa.float64()), ("id", pa.string())]))
_MODELS = pa.list_(pa.struct([("m", pa.string()), ("n", pa.int64())]))
#: batches of at most this many rows are summarised without DuckDB (:mod:`gfcr.store.smallstats`,
#: the same numbers); 0 sends every batch through DuckDB
SMALL_ROWS = smallstats.MAX_ROWS
#: a larger batch of at most this many steps is summarised with numpy too (metrics:
#: :func:`gfcr.store.smallstats.step_metrics`; sample buckets: :func:`gfcr.store.buckets.tops`),
#: whose loop is per step. CPU s for 100k imported rows (idle 2-core machine, two runs): in 10
#: steps 0.07-0.10 against DuckDB's 0.24-0.36, in 100 steps 0.09-0.10 against 0.22-0.26, in 1000
#: steps 0.44-0.46 against 0.31-0.36. 0 sends every batch past :data:`SMALL_ROWS` through DuckDB
NUMPY_STEPS = 256
#: MetricsConfig fields that only the read uses (the aggregates hold what they need)
READ_TIME_FIELDS = {"pass_reward", "judge"}


def config_ok(cfg: MetricsConfig) -> bool:
    """Can metrics under ``cfg`` be read from the aggregates (built with the default config)?"""
    return cfg.model_dump(exclude=READ_TIME_FIELDS) == MetricsConfig().model_dump(exclude=READ_TIME_FIELDS)


# --- computing the per-step rows -----------------------------------------------------------------
def _value_counts(feats: pa.Table, mask: np.ndarray) -> dict[tuple[str, int], list[dict[str, Any]] | None]:
    sub = feats.filter(pa.array(mask, pa.bool_())).select(["run_id", "step", "reward"])
    if sub.num_rows == 0:
        return {}
    g = sub.group_by(["run_id", "step", "reward"]).aggregate([([], "count_all")])
    out: dict[tuple[str, int], list[dict[str, Any]] | None] = {}
    for run, step, r, n in zip(*(g.column(c).to_pylist() for c in ("run_id", "step", "reward", "count_all")), strict=True):
        key = (run, step)
        cur = out.setdefault(key, [])
        if cur is not None:
            cur.append({"r": r, "n": n})
            if len(cur) > MAX_DISTINCT:
                out[key] = None
    return out


def _events(events: pa.Table) -> dict[tuple[str, int], list[dict[str, Any]]]:
    """Replay events per source (run, step), summed per target step."""
    out: dict[tuple[str, int], list[dict[str, Any]]] = {}
    if events.num_rows == 0:
        return out
    g = events.group_by(["run_id", "src_step", "step"]).aggregate(
        [([], "count_all"), ("lag", "count"), ("lag", "sum"), ("lag", "max"), ("iw", "count"), ("iw", "sum"),
         ("iw", "min"), ("iw", "max")])
    for r in g.to_pylist():
        out.setdefault((r["run_id"], r["src_step"]), []).append(
            {"step": r["step"], "n": r["count_all"], "lag_n": r["lag_count"], "lag_sum": r["lag_sum"],
             "lag_max": r["lag_max"], "iw_n": r["iw_count"], "iw_sum": r["iw_sum"], "iw_min": r["iw_min"],
             "iw_max": r["iw_max"]})
    return out


def _tops(table: pa.Table) -> dict[tuple[str, int], dict[str, Any]]:
    """Per (run, step): the sample buckets' first :data:`TOP` rows, the step's tasks and the models
    its rows were sampled from (``sampling.model``, counted)."""
    with connection({"t": table.select(["run_id", "step", "rollout_id", "reward", "finish_reason", "task"]),
                     "s": table.select(["run_id", "step", "sampling"])}) as con:
        rows = con.sql(f"""
            SELECT run_id, step,
                   list({{'r': reward, 'id': rollout_id}} ORDER BY reward DESC, rollout_id)[1:{TOP}] AS best,
                   list({{'r': reward, 'id': rollout_id}} ORDER BY reward ASC, rollout_id DESC)[1:{TOP}] AS worst,
                   coalesce(list({{'r': reward, 'id': rollout_id}} ORDER BY rollout_id)
                       FILTER (WHERE finish_reason = 'length'), [])[1:{TOP}] AS truncated,
                   list(DISTINCT task ORDER BY task) AS tasks
            FROM t GROUP BY run_id, step""").to_arrow_table().to_pylist()
        models = con.sql("""
            SELECT run_id, step, list({'m': m, 'n': n} ORDER BY m) AS models FROM (
                SELECT run_id, step, json_extract_string(sampling, '$.model') AS m, count(*) AS n FROM s
                WHERE json_valid(sampling) AND json_extract_string(sampling, '$.model') IS NOT NULL
                GROUP BY ALL) GROUP BY run_id, step""").to_arrow_table().to_pylist()
    out = {(r["run_id"], r["step"]): r for r in rows}
    for r in models:
        out[(r["run_id"], r["step"])]["models"] = r["models"]
    return out


def _jsonable(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_jsonable(v) for v in x]
    if isinstance(x, np.generic | np.ndarray):
        return _jsonable(x.tolist())
    if isinstance(x, float) and not np.isfinite(x):
        return None
    return x


def _health(table: pa.Table, keys: list[tuple[str, int]], inv: np.ndarray) -> list[str]:
    """Per key, the health tally (JSON) of that step's rows."""
    cols = table.select([c for c in CHECK_COLUMNS])
    order = np.argsort(inv, kind="stable")
    bounds = np.searchsorted(inv[order], np.arange(len(keys) + 1))
    out = []
    for i in range(len(keys)):
        a, b = int(bounds[i]), int(bounds[i + 1])
        # a step's rows in one run (an imported file, a training step): a slice, sharing the rows'
        # buffers; else a take, which copies them
        t = cols.slice(int(order[a]), b - a) if order[b - 1] - order[a] == b - a - 1 else \
            cols.take(pa.array(order[a:b], pa.int64()))
        tally = Tally(HealthConfig())
        screen_batch(t, tally)
        out.append(json.dumps(_jsonable({"counts": tally.counts, "checked": tally.checked, "pairs": tally.n_pairs,
                                         "issues": [vars(x) for x in tally.issues]}), allow_nan=False))
    return out


def partials(table: pa.Table) -> pa.Table:
    """The aggregate rows of ``table``: every row of each (run, step) it holds (:data:`COLUMNS`).

    Shapes: ``[N rows]`` → one row per distinct (run_id, step), sorted.
    Example: 3 rows at (a, 0) and 2 at (a, 1) → 2 rows, ``n_rows`` [3, 2]."""
    cfg = MetricsConfig()
    feats, events = rollout_features(table, cfg)
    small = table.num_rows <= SMALL_ROWS
    uniq, inv = smallstats.step_keys(feats)
    vec = small or len(uniq) <= NUMPY_STEPS
    m = smallstats.step_metrics(feats, cfg, (uniq, inv)) if vec else None
    if m is None:
        m = metrics_of(feats, events.slice(0, 0), None, cfg)
    if m.num_rows == 0:
        return empty()
    fresh = ~feats.column("replayed").to_numpy(zero_copy_only=False)
    ver = feats.column("verified")
    passed = fresh & pc.fill_null(ver, False).to_numpy(zero_copy_only=False)
    failed = fresh & pc.fill_null(pc.invert(ver), False).to_numpy(zero_copy_only=False)
    pass_vc, fail_vc = _value_counts(feats, passed), _value_counts(feats, failed)
    n_pass = np.bincount(inv[passed], minlength=len(uniq))
    n_rows = np.bincount(inv, minlength=len(uniq))
    tops = smallstats.tops(table) if small else buckets.tops(table, uniq, inv) if vec else None
    ev, tops, health = _events(events), _tops(table) if tops is None else tops, _health(table, uniq, inv)
    mk = {(r, s): i for i, (r, s) in enumerate(zip(m.column("run_id").to_pylist(), m.column("step").to_pylist(), strict=True))}
    m = m.take(pa.array([mk[k] for k in uniq], pa.int64()))
    cols = {
        "n_rows": pa.array(n_rows, pa.int64()), "n_pass": pa.array(n_pass, pa.int64()),
        "pass_vc": pa.array([pass_vc.get(k, []) for k in uniq], _VC),
        "fail_vc": pa.array([fail_vc.get(k, []) if n_pass[i] == 0 else [] for i, k in enumerate(uniq)], _VC),
        "vc_exact": pa.array([pass_vc.get(k, []) is not None and fail_vc.get(k, []) is not None for k in uniq]),
        "events": pa.array([ev.get(k, []) for k in uniq], pa.list_(_EV)),
        "best": pa.array([tops[k]["best"] for k in uniq], _TOPS),
        "worst": pa.array([tops[k]["worst"] for k in uniq], _TOPS),
        "truncated": pa.array([tops[k]["truncated"] for k in uniq], _TOPS),
        "tasks": pa.array([tops[k]["tasks"] for k in uniq], pa.list_(pa.string())),
        "models": pa.array([tops[k].get("models", []) for k in uniq], _MODELS),
        "health": pa.array(health, pa.string()),
    }
    for name, arr in cols.items():
        m = m.append_column(name, arr)
    return m


_EMPTY: list[pa.Schema] = []


def empty() -> pa.Table:
    """An aggregate table with no steps (the schema of :func:`partials`)."""
    if not _EMPTY:
        from gfcr.records import Message, Rollout, rollouts_to_table

        one = Rollout(run_id="r", prompt_id="p", group_id="g", step=0, sample_index=0,
                      token_ids=np.array([1, 2], np.int32), token_role=np.array([0, 1], np.uint8),
                      logprobs=np.array([0.0, -1.0], np.float32),
                      messages=[Message("user", "q"), Message("assistant", "a")], reward=1.0, verified=True)
        _EMPTY.append(partials(rollouts_to_table([one])).schema)
    return _EMPTY[0].empty_table()


# --- the file ------------------------------------------------------------------------------------
def _file(path: Path) -> Path:
    return Path(path) / FILE


def _locked(path: Path):  # noqa: ANN202
    return file_lock(Path(path) / ".aggregates.lock")


def read_tag(path: Path) -> dict[str, Any] | None:
    """The file's tag ``{"format", "rollouts_version", "rows"}`` (one footer read), or None when
    there is no file or it does not read."""
    try:
        md = pq.read_schema(_file(path)).metadata or {}
        tag = json.loads(md[META_KEY])
        return tag if isinstance(tag, dict) and tag.get("format") == FORMAT else None
    except (OSError, KeyError, ValueError, pa.ArrowException):
        return None


def _read(path: Path) -> tuple[pa.Table | None, dict[str, Any] | None]:
    tag = read_tag(path)
    if tag is None:
        return None, None
    try:
        return pq.read_table(_file(path)), tag
    except (OSError, pa.ArrowException):
        return None, None


def write(path: Path, table: pa.Table, version: int) -> None:
    """Write the aggregates of rollouts version ``version`` atomically (a temporary file renamed)."""
    tag = {"format": FORMAT, "rollouts_version": int(version), "rows": int(pc.sum(table.column("n_rows")).as_py() or 0)}
    table = table.replace_schema_metadata({META_KEY: json.dumps(tag).encode()})
    tmp = Path(path) / f"{FILE}.{os.getpid()}.{threading.get_ident()}.tmp"
    try:
        pq.write_table(table, tmp)
        os.replace(tmp, _file(path))
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def state(store: Any) -> tuple[str, str]:
    """``(state, detail)``: ``fresh`` (the file summarises the current rollouts version), ``stale``
    (it names an older one: the next read rebuilds it), ``missing`` (none: a store from before the
    aggregates, or one whose file was removed)."""
    v = store.dataset("rollouts").version
    tag = read_tag(store.path)
    if tag is None:
        how = "unreadable" if _file(store.path).exists() else "no"
        return "missing", f"{how} {FILE}: per-step aggregates are rebuilt from the rows on the next report"
    if int(tag["rollouts_version"]) != v:
        return "stale", (f"{FILE} summarises rollouts version {tag['rollouts_version']}, the table is at {v}: "
                         "rebuilt from the rows on the next report")
    return "fresh", f"{FILE} summarises rollouts version {v} ({tag['rows']} rows)"


def _chunks(ds: Any, max_rows: int) -> list[str]:
    """Filters that cover every (run, step) of ``ds``, whole steps, about ``max_rows`` rows each."""
    idx = pa.Table.from_batches(list(ds.to_batches(columns=["run_id", "step"]))) if ds.count_rows() else None
    if idx is None:
        return []
    g = idx.group_by(["run_id", "step"]).aggregate([([], "count_all")])
    g = g.take(pc.sort_indices(g, sort_keys=[("run_id", "ascending"), ("step", "ascending")]))
    out: list[str] = []
    cur: list[Any] = []  # [run, first step, last step, rows]
    for run, step, n in zip(g.column("run_id").to_pylist(), g.column("step").to_pylist(),
                            g.column("count_all").to_pylist(), strict=True):
        if cur and cur[0] == run and cur[3] + n <= max_rows:
            cur[2], cur[3] = step, cur[3] + n
            continue
        if cur:
            out.append(_range_filter(*cur[:3]))
        cur = [run, step, step, n]
    out.append(_range_filter(*cur[:3]))
    return out


def _q(s: str) -> str:
    return "'" + str(s).replace("'", "''") + "'"


def _range_filter(run: str, a: int, b: int) -> str:
    return f"run_id = {_q(run)} AND step >= {int(a)} AND step <= {int(b)}"


def compute(ds: Any, max_rows: int = 500_000) -> pa.Table:
    """The aggregates of a Lance dataset version, from its rows (whole steps, ``max_rows`` a read)."""
    parts = [partials(ds.to_table(columns=COLUMNS, filter=f)) for f in _chunks(ds, max_rows)]
    parts = [p for p in parts if p.num_rows]
    return pa.concat_tables(parts).combine_chunks() if parts else empty()


def load(store: Any) -> pa.Table | None:
    """The store's aggregates for its current (or pinned) rollouts version: the file when fresh,
    else rebuilt from the rows (written back unless the store is a read-only checkout). None for
    objects that are not a :class:`~gfcr.store.RolloutStore`."""
    if not hasattr(store, "dataset") or not hasattr(store, "path"):
        return None
    ds = store.dataset("rollouts")
    t, tag = _read(store.path)
    if t is not None and int(tag["rollouts_version"]) == ds.version:
        return t
    t = compute(ds)
    if not store.read_only:
        try:
            with _locked(store.path):
                cur = read_tag(store.path)
                if cur is None or int(cur["rollouts_version"]) <= ds.version:
                    write(store.path, t, ds.version)
        except OSError as e:
            warnings.warn(f"per-step aggregates rebuilt but not written ({e})", RuntimeWarning, stacklevel=2)
    return t


# --- keeping them with the rows ------------------------------------------------------------------
def _keys(table: pa.Table) -> set[tuple[str, int]]:
    g = table.select(["run_id", "step"]).group_by(["run_id", "step"]).aggregate([])
    return set(zip(g.column("run_id").to_pylist(), g.column("step").to_pylist(), strict=True))


def _drop(agg: pa.Table, keys: set[tuple[str, int]]) -> pa.Table:
    have = list(zip(agg.column("run_id").to_pylist(), agg.column("step").to_pylist(), strict=True))
    return agg.filter(pa.array([k not in keys for k in have], pa.bool_()))


def _sorted(t: pa.Table) -> pa.Table:
    return t.take(pc.sort_indices(t, sort_keys=[("run_id", "ascending"), ("step", "ascending")]))


#: Lance operations that leave the rows as they were (a compaction reserves fragment ids, then rewrites)
SAME_ROWS = {"Rewrite", "CreateIndex", "Project"}


def same_rows(after: Any, before: int) -> bool:
    """Did every commit after version ``before`` up to ``after`` (a dataset) leave the rows as they
    were? Read from each version's transaction: a rewrite (compaction), an index, a schema change
    (``Project``); the unnamed operation Lance exposes for a fragment-id reservation counts only
    when a rewrite follows it. Anything else (an append, an update, a delete, a restore) → False."""
    ops = []
    for v in range(before + 1, after.version + 1):
        t = after.read_transaction(v)
        ops.append(type(t.operation).__name__ if t is not None else None)
    return all(op in SAME_ROWS or (op == "BaseOperation" and i + 1 < len(ops) and ops[i + 1] == "Rewrite")
               for i, op in enumerate(ops))


def committed(path: Path, before: int, after: Any, batch: pa.Table | None = None,
              keys: set[tuple[str, int]] | None = None, ready: Future | None = None) -> None:
    """Bring the aggregates from rollouts version ``before`` to ``after`` (a dataset), after one
    commit: ``batch`` (appended rows) or ``keys`` (the steps an update rewrote), only when the file
    summarises ``before`` and that commit is the only one between (``after.version == before + 1``);
    neither = the same rows (a compaction, an index, a schema change), when every commit between
    left the rows as they were (:func:`same_rows`). Otherwise the file stays stale, and the next
    read rebuilds. ``ready``: :func:`gfcr.store.aggprep.prepare`'s future of ``partials(batch)``, used when every step
    of the batch is new. Never raises: the rows are committed whatever happens here."""
    try:
        with _locked(path):
            agg, tag = _read(path)
            if agg is None or int(tag["rollouts_version"]) != before or after.version <= before:
                return
            if batch is None and not keys:
                if not same_rows(after, before):
                    return
            elif after.version != before + 1:
                return
            if batch is not None or keys:
                new = _keys(batch) if batch is not None else set(keys or ())
                have = set(zip(agg.column("run_id").to_pylist(), agg.column("step").to_pylist(), strict=True))
                fresh = new - have if batch is not None else set()
                parts = [_drop(agg, new)]
                if fresh == new:  # every step new to the store: the batch as it is (no copy of its rows)
                    parts.append(ready.result() if ready is not None else partials(batch.select(COLUMNS)))
                elif fresh:
                    mask = [k in fresh for k in zip(batch.column("run_id").to_pylist(), batch.column("step").to_pylist(),
                                                     strict=True)]
                    parts.append(partials(batch.select(COLUMNS).filter(pa.array(mask, pa.bool_()))))
                old = sorted(new - fresh)
                if old:
                    flt = " OR ".join(f"(run_id = {_q(r)} AND step = {int(s)})" for r, s in old)
                    parts.append(partials(after.to_table(columns=COLUMNS, filter=flt)))
                agg = _sorted(pa.concat_tables([p.cast(parts[0].schema) for p in parts if p.num_rows] or [parts[0]]))
            write(path, agg, after.version)
    except Exception as e:  # noqa: BLE001 - the commit stands; the file stays stale and is rebuilt on read
        warnings.warn(f"rollouts version {after.version} is committed but its per-step aggregates were not updated "
                      f"({type(e).__name__}: {e}); they are rebuilt from the rows on the next read",
                      RuntimeWarning, stacklevel=3)


# --- reading them --------------------------------------------------------------------------------
def _of_run(parts: pa.Table, run: str | None) -> pa.Table:
    return parts if run is None else parts.filter(pc.equal(parts.column("run_id"), run))


def _median(vc: list[dict[str, Any]]) -> float | None:
    """The median of the values a value-count list holds (the mean of the two middle ones when
    their count is even, as DuckDB's ``median``). Example: [{r: 0.5, n: 1}, {r: 1.0, n: 3}] → 1.0."""
    if not vc:
        return None
    vals = sorted((d["r"], d["n"]) for d in vc)
    total = sum(n for _, n in vals)
    lo, hi = (total - 1) // 2, total // 2
    out, seen = [], 0
    for r, n in vals:
        for want in (lo, hi):
            if seen <= want < seen + n:
                out.append(r)
        seen += n
    return (out[0] + out[-1]) / 2


def _replay(events: list[list[dict[str, Any]]], runs: list[str]) -> dict[tuple[str, int], dict[str, Any]]:
    out: dict[tuple[str, int], dict[str, Any]] = {}
    for run, evs in zip(runs, events, strict=True):
        for e in evs:
            o = out.setdefault((run, e["step"]), {"n": 0, "lag_n": 0, "lag_sum": 0.0, "lag_max": None, "iw_n": 0,
                                                  "iw_sum": 0.0, "iw_min": None, "iw_max": None})
            o["n"] += e["n"]
            for k in ("lag", "iw"):
                if e[f"{k}_n"]:
                    o[f"{k}_n"] += e[f"{k}_n"]
                    o[f"{k}_sum"] += e[f"{k}_sum"]
                    o[f"{k}_max"] = e[f"{k}_max"] if o[f"{k}_max"] is None else max(o[f"{k}_max"], e[f"{k}_max"])
            if e["iw_n"]:
                o["iw_min"] = e["iw_min"] if o["iw_min"] is None else min(o["iw_min"], e["iw_min"])
    return out


def _audits(feats: pa.Table | None) -> dict[tuple[str, int], dict[str, Any]]:
    out: dict[tuple[str, int], dict[str, Any]] = {}
    if feats is None:
        return out
    for a in feats.to_pylist():
        o = out.setdefault((a["run_id"], a["step"]), {"n": 0, "kept": 0, "ters": [], "excl": {}})
        o["n"] += 1
        o["kept"] += a["status"] == "kept"
        if a["ter"] is not None:
            o["ters"].append(a["ter"])
        for k, v in a.items():
            if k.startswith("excl_"):
                o["excl"][k] = o["excl"].get(k, 0) + v
    return out


def metrics(store: Any, parts: pa.Table, run: str | None, cfg: MetricsConfig) -> pa.Table:
    """The :data:`METRIC_COLUMNS` table of ``run`` (None: every run) from the aggregates, equal to
    :func:`gfcr.store.stepstats.metrics_of` over a scan of the rows: the steps' own metrics, the
    replay columns summed over the events every step recorded, ``hack_rate`` on steps with no pass
    against the run's passing median (from the value counts), the audits joined now."""
    parts = _of_run(parts, run)
    schema = parts.select(METRIC_COLUMNS).schema
    if not all(parts.column("vc_exact").to_pylist()):  # too many distinct rewards somewhere: scan
        feats, events = rollout_features(store.scan(run=run, columns=FEATURE_COLUMNS), cfg)
        return metrics_of(feats, events, audit_features(store, run, cfg), cfg)
    rows = {(r["run_id"], r["step"]): r for r in parts.select(METRIC_COLUMNS).to_pylist()}
    extra = parts.select(["run_id", "step", "n_rows", "n_pass", "pass_vc", "fail_vc"]).to_pylist()
    runs = parts.column("run_id").to_pylist()
    replay = _replay(parts.column("events").to_pylist(), runs)
    audits = _audits(audit_features(store, run, cfg))
    pass_run: dict[str, list[dict[str, Any]]] = {}
    for x in extra:
        pass_run.setdefault(x["run_id"], []).extend(x["pass_vc"])
    ref = {r: _median(vc) for r, vc in pass_run.items()}
    n_rows = {(x["run_id"], x["step"]): x["n_rows"] for x in extra}
    for x in extra:
        row = rows[(x["run_id"], x["step"])]
        if x["n_pass"] == 0 and row["n_verdicts"]:
            pr = ref.get(x["run_id"])
            pr = cfg.pass_reward if pr is None else pr
            row["hack_rate"] = sum(d["n"] for d in x["fail_vc"] if d["r"] >= pr - cfg.eps) / row["n_verdicts"]
    zero = {"n_rollouts": 0, "n_groups": 0, "n_verdicts": 0, "gen_tokens": 0, "wasted_tokens": 0, "n_truncated": 0}
    for key in set(replay) - set(rows):
        rows[key] = {c: zero.get(c) for c in METRIC_COLUMNS} | {"run_id": key[0], "step": key[1]}
    for key, row in rows.items():
        e = replay.get(key)
        n = e["n"] if e else 0
        row["n_replayed"] = n
        nr = max(v for v in (n_rows.get(key), n) if v is not None)
        row["replay_share"] = n / nr if nr else None
        row["staleness_mean"] = e["lag_sum"] / e["lag_n"] if e and e["lag_n"] else None
        row["staleness_max"] = e["lag_max"] if e else None
        row["iw_mean"] = e["iw_sum"] / e["iw_n"] if e and e["iw_n"] else None
        row["iw_min"], row["iw_max"] = (e["iw_min"], e["iw_max"]) if e else (None, None)
        a = audits.get(key)
        row["n_audited"] = a["n"] if a else 0
        row["kept_share"] = a["kept"] / a["n"] if a else None
        row["ter_mean"] = sum(a["ters"]) / len(a["ters"]) if a and a["ters"] else None
        for c in [c for c in METRIC_COLUMNS if c.startswith("excl_")]:
            row[c] = a["excl"].get(c, 0) if a else None
    out = [rows[k] for k in sorted(rows)]
    return pa.Table.from_pylist(out, schema=schema)


def health_tally(parts: pa.Table, run: str | None, cfg: HealthConfig) -> Tally:
    """The health checks' tally over the aggregates of ``run``: exact counts, and per check the
    first ``max_issues`` issues in (run, step) order."""
    tally = Tally(cfg)
    for h in _of_run(parts, run).column("health").to_pylist():
        d = json.loads(h)
        for c in CHECKS:
            tally.counts[c] += d["counts"][c]
            tally.checked[c] += d["checked"][c]
        tally.n_pairs += d["pairs"]
        for i in d["issues"]:
            if tally.kept[i["check"]] < cfg.max_issues:
                tally.kept[i["check"]] += 1
                tally.issues.append(HealthIssue(**i))
    return tally


def samples(parts: pa.Table, run: str | None, n: int) -> dict[str, list[str]] | None:
    """The report's sample buckets (best, worst, truncated: ``n`` ids each) from the aggregates, in
    the report's order; None when ``n`` exceeds what they keep (:data:`TOP`)."""
    if n > TOP:
        return None
    p = _of_run(parts, run)
    best = [x for v in p.column("best").to_pylist() for x in v]
    worst = [x for v in p.column("worst").to_pylist() for x in v]
    trunc = [(s, x["id"]) for s, v in zip(p.column("step").to_pylist(), p.column("truncated").to_pylist(), strict=True)
             for x in v]
    if not best:
        return {}
    return {"best": [x["id"] for x in sorted(best, key=lambda x: (-x["r"], x["id"]))[:n]],
            "worst": [x["id"] for x in sorted(sorted(worst, key=lambda x: x["id"], reverse=True),
                                                key=lambda x: x["r"])[:n]],
            "truncated": [i for _, i in sorted(trunc)[:n]]}


def summary(parts: pa.Table) -> tuple[list[dict[str, Any]], list[str]]:
    """The viewer's summary from the aggregates: per run its first and last step and rollouts, and
    the tasks of the store."""
    runs: dict[str, dict[str, Any]] = {}
    for r, s, n in zip(parts.column("run_id").to_pylist(), parts.column("step").to_pylist(),
                       parts.column("n_rows").to_pylist(), strict=True):
        o = runs.setdefault(r, {"run_id": r, "step_min": s, "step_max": s, "rollouts": 0})
        o["step_min"], o["step_max"], o["rollouts"] = min(o["step_min"], s), max(o["step_max"], s), o["rollouts"] + n
    seen = {t for ts in parts.column("tasks").to_pylist() for t in ts}
    tasks = sorted(t for t in seen if t is not None) + ([None] if None in seen else [])
    return [runs[r] for r in sorted(runs)], tasks


def model(parts: pa.Table) -> str | None:
    """The model most of the store's rollouts were sampled from (ties: the first by name), or None."""
    counts: dict[str, int] = {}
    for ms in parts.column("models").to_pylist():
        for d in ms:
            counts[d["m"]] = counts.get(d["m"], 0) + d["n"]
    return min(counts, key=lambda m: (-counts[m], m)) if counts else None
