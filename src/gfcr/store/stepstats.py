"""Per-step rollout statistics: per-rollout features and the per-(run, step) metrics over them.

The one implementation of gfcr's per-step summary. Its readers derive it from the rows when they
need it: ``gfcr.diagnose`` (:func:`gfcr.diagnose.metrics.step_metrics`, cached per store version;
the report, ``gfcr diagnose``, the detectors) and the training loop's per-step row and progress
bar (:func:`summarize` of the step's own rollouts, ``gfcr.train.metrics``), under the same names.
The store's write path computes none of it.

Long because: it is the one implementation of the per-step summary (features, the SQL, the judge
choice its audit columns read, ``summarize``); split, the summary would again live in several places.

One pass over the rows: per-rollout features are computed with numpy from a column subset
(no token ids, no messages), then aggregated per (run, step) with DuckDB over that Arrow table
(:func:`metrics_of`): an Arrow table with one row per (run, step); the columns are listed in
:data:`METRIC_COLUMNS` and described in ``docs/diagnose.md``.

The keys the metrics read (configurable in :class:`MetricsConfig`):

* ``signals["advantage"]`` — a rollout's advantage; a group counts as *zero-advantage* (its
  generated tokens are wasted compute) when every member's advantage is ~0. Without this
  signal a group of two or more rollouts is zero-advantage when its rewards are all equal.
* ``signals["entropy"]`` — mean token entropy of the generated tokens. The mean negative
  behaviour log-prob of the generated tokens (``nll_mean``, an unbiased estimate of the entropy
  of the sampling distribution) is always computed as well.
* replayed samples — either a row re-used at a later step, stored as a copy with
  ``signals["replayed"] > 0`` at the step it was trained on, its lag in ``signals["staleness"]``
  (policy versions behind) or else ``step - meta["generated_at_step"]``; or the original row
  annotated with ``meta["replayed_at_step"]`` (an int or a list of ints), each such step a
  replay event with lag ``replayed_at_step - step`` and importance weight from the parallel list
  ``meta["replay_importance_weight"]`` when present (what the train loop writes). ``signals["importance_weight"]`` is the
  (mean, truncated) importance weight a replayed row was trained with.

Replayed copies are left out of the generation metrics of the step they are replayed at (reward,
zero-variance, waste, length, entropy): those describe what the policy generated at that step.
"""

from __future__ import annotations

import json
import os
import threading
from contextlib import contextmanager
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import Field

from gfcr.config import StrictModel
from gfcr.records import EXCLUSION_CATEGORIES

FEATURE_COLUMNS = [
    "rollout_id", "run_id", "step", "group_id", "prompt_id", "reward", "verified", "finish_reason",
    "token_role", "logprobs", "signals", "meta", "cost", "verifier",
]

METRIC_COLUMNS = [
    "run_id", "step", "n_rollouts", "n_groups", "n_verdicts", "scored_share", "reward_mean", "reward_std", "verified_rate",
    "zero_var_share", "all_correct_share", "all_wrong_share", "gen_tokens", "wasted_tokens",
    "waste_share", "len_mean", "len_p95", "len_max", "n_truncated", "trunc_rate", "abort_rate", "tail_time_share", "tail_token_share",
    "tail_timed", "entropy_mean", "nll_mean", "hack_rate", "adv_disagreement", "low_std_share", "n_kept_groups",
    "n_dropped_groups", "n_replayed", "replay_share", "staleness_mean",
    "staleness_max", "iw_mean", "iw_min", "iw_max", "n_audited", "kept_share", "ter_mean",
    *[f"excl_{c}" for c in EXCLUSION_CATEGORIES],
]


#: the columns of :data:`METRIC_COLUMNS` that one step's own generated rows decide: what the training
#: loop reports per step (:func:`summarize`). Left out: ``run_id``/``step`` (the row's key), the
#: replay and audit columns (recorded by other steps' rows and by audits) and ``hack_rate`` (on a
#: step nobody passed it is judged against the run's passing median, from other steps)
STEP_COLUMNS = [
    "n_rollouts", "n_groups", "n_verdicts", "scored_share", "reward_mean", "reward_std", "verified_rate",
    "zero_var_share", "all_correct_share", "all_wrong_share", "gen_tokens", "wasted_tokens", "waste_share",
    "len_mean", "len_p95", "len_max", "n_truncated", "trunc_rate", "abort_rate", "tail_time_share",
    "tail_token_share", "tail_timed", "entropy_mean", "nll_mean", "adv_disagreement", "low_std_share",
    "n_kept_groups", "n_dropped_groups",
]


class MetricsConfig(StrictModel):
    """What the metrics read and the few constants they use."""

    advantage_key: str = Field("advantage", description="signals key of a rollout's advantage")
    entropy_key: str = Field("entropy", description="signals key of a rollout's mean token entropy")
    replayed_key: str = Field("replayed", description="signals key (> 0) marking a replayed copy")
    staleness_key: str = Field("staleness", description="signals key: policy versions a replayed row lags behind")
    iw_key: str = Field("importance_weight", description="signals key: importance weight of a replayed row")
    eps: float = Field(1e-6, ge=0, description="rewards/advantages closer than this count as equal/zero")
    pass_reward: float = Field(
        1.0, description="reward of a passing rollout, used to judge failing rewards only in a run where no rollout passed"
    )
    min_group_std: float = Field(
        0.05, ge=0, description="a mixed-verdict group with reward std in (0, this) counts as a low-std (noise-amplifying) group"
    )
    tail_quantile: float = Field(
        0.9, gt=0, lt=1, description="'most of the batch': the share of a step's rollouts that must have finished before the tail starts"
    )
    judge: str | None = Field(None, description="audit judge to read; None = the ROSS judge (choose_judge: not the keep-all control, most audits, then name)")


# ---------------------------------------------------------------------------------------------
# Pure helpers
# ---------------------------------------------------------------------------------------------


def linear_trend(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """Least-squares line through ``(x, y)`` (``[N]`` each, NaNs dropped) → ``(slope, intercept)``.

    Example: x = [0, 1, 2], y = [1, 3, 5] → (2.0, 1.0). Fewer than two points → (0.0, y or nan).
    """
    x = np.asarray(x, float)
    y = np.asarray(y, float)
    ok = np.isfinite(x) & np.isfinite(y)
    x, y = x[ok], y[ok]
    if len(x) < 2 or np.ptp(x) == 0:
        return 0.0, float(y.mean()) if len(y) else float("nan")
    xm, ym = x.mean(), y.mean()
    slope = float(((x - xm) * (y - ym)).sum() / ((x - xm) ** 2).sum())
    return slope, float(ym - slope * xm)


def relative_growth(x: np.ndarray, y: np.ndarray) -> float:
    """Growth of the fitted line from the first to the last ``x``, relative to its start value.

    Example: x = [0, 1, 2, 3], y = [100, 120, 140, 160] → (160 - 100) / 100 = 0.6.
    Returns nan when the fitted start is ≤ 0 or there are fewer than two points.
    """
    x = np.asarray(x, float)
    slope, icpt = linear_trend(x, y)
    if not np.isfinite(icpt) or len(x) < 2:
        return float("nan")
    start = slope * np.nanmin(x) + icpt
    end = slope * np.nanmax(x) + icpt
    return float((end - start) / start) if start > 0 else float("nan")


def ter_from_mask(mask: np.ndarray, token_role: np.ndarray) -> float:
    """Target exclusion rate: share of generated tokens (role 1) with supervision mask 0.

    ``mask``, ``token_role`` ``[T]``. Example: role [0,0,1,1,1,1], mask [0,0,1,0,0,1] → 2/4 = 0.5.
    No generated tokens → nan.
    """
    role = np.asarray(token_role) == 1
    n = int(role.sum())
    if n == 0 or len(mask) != len(role):
        return float("nan")
    return float((np.asarray(mask)[role] == 0).sum() / n)


def scored_mask(verified: pa.ChunkedArray | pa.Array, verifier: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """Per row: was its reward scored by something (a verdict, or a verifier record)? ``[N]`` bool.

    A rollout generated with no verifier carries reward 0.0 (the record's default), no verdict and
    an empty verifier record ``{}``: its reward is no evidence of anything. Every importer and
    verifier writes a non-empty record (at least its ``name``).

    Example: verified [True, None, None], verifier ['{"name": "x"}', '{}', None] → [True, False, False].
    """
    has_verdict = pc.is_valid(verified).to_numpy(zero_copy_only=False)
    v = pc.fill_null(verifier, "")
    rec = pc.and_(pc.greater(pc.utf8_length(v), 2),
                  pc.invert(pc.is_in(v, value_set=pa.array(["null", "{ }"])))).to_numpy(zero_copy_only=False)
    return np.asarray(has_verdict, bool) | np.asarray(rec, bool)


def _json_obj(text: str | None) -> dict[str, Any]:
    """A JSON object from ``text``; anything else (invalid, not an object) → ``{}``."""
    try:
        v = json.loads(text) if text else {}
    except json.JSONDecodeError:
        return {}
    return v if isinstance(v, dict) else {}


def _row_index(list_col: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """Flat values of a list column and, for each value, the index of its row."""
    arr = list_col.combine_chunks() if isinstance(list_col, pa.ChunkedArray) else list_col
    offsets = arr.offsets.to_numpy()
    lengths = np.diff(offsets)
    values = arr.values.slice(offsets[0], offsets[-1] - offsets[0]).to_numpy(zero_copy_only=False)
    return values, np.repeat(np.arange(len(arr)), lengths)


def _list_values(list_col: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """The flat values of a list column (:func:`_row_index` without the row of each value)."""
    arr = list_col.combine_chunks() if isinstance(list_col, pa.ChunkedArray) else list_col
    offsets = arr.offsets.to_numpy()
    return arr.values.slice(offsets[0], offsets[-1] - offsets[0]).to_numpy(zero_copy_only=False)


def _signals(signals: pa.ChunkedArray, keys: list[str]) -> list[np.ndarray]:
    """Per key, per row, the value of that key in a map<string, float64> column (nan when absent;
    a key repeated in one row: its last value). The map's entries are walked once for all keys,
    compared as Arrow strings; only the entries that match find their row (a binary search of the
    offsets). Example: rows [{a: 1, b: 2}, {}, {b: 3}], keys [b, c] → [[2, nan, 3], [nan, nan, nan]]."""
    arr = signals.combine_chunks()
    n = len(arr)
    outs = [np.full(n, np.nan) for _ in keys]
    if n == 0:
        return outs
    offsets = arr.offsets.to_numpy()
    a, b = int(offsets[0]), int(offsets[-1])
    if b == a:
        return outs
    names = arr.keys.slice(a, b - a)
    items = arr.items.slice(a, b - a)
    for key, out in zip(keys, outs, strict=True):
        hit = np.flatnonzero(pc.fill_null(pc.equal(names, key), False).to_numpy(zero_copy_only=False))
        if len(hit):
            rows = np.searchsorted(offsets, hit + a, side="right") - 1
            out[rows] = items.take(pa.array(hit, pa.int64())).to_numpy(zero_copy_only=False).astype(float)
    return outs


# ---------------------------------------------------------------------------------------------
# Features and metrics
# ---------------------------------------------------------------------------------------------


def rollout_features(table: pa.Table, config: MetricsConfig | None = None) -> tuple[pa.Table, pa.Table]:
    """Per-rollout features and replay events from a rollouts table (at least FEATURE_COLUMNS).

    Returns ``(features, replay_events)``: ``features`` has one row per rollout with ``gen_len``,
    ``nll_mean``, ``entropy``, ``advantage``, ``replayed``, ``lag``, ``iw``; ``replay_events``
    has ``run_id, step, lag, iw, src_step`` (the step of the row that recorded it) for every replayed use (copies and ``replayed_at_step`` annotations).
    """
    cfg = config or MetricsConfig()
    n = table.num_rows
    role, rrow = _row_index(table.column("token_role"))
    lp = _list_values(table.column("logprobs"))  # (as long as token_role, row by row)
    gen = role.astype(bool)
    rows_gen = rrow[gen]
    n_gen_tok = np.bincount(rows_gen, minlength=n)
    gen_len = n_gen_tok.astype(np.int64)
    cost_gen = pc.struct_field(table.column("cost"), "gen_tokens").to_numpy(zero_copy_only=False)
    latency = pc.struct_field(table.column("cost"), "latency_s").to_numpy(zero_copy_only=False).astype(float)
    gen_len = np.where(gen_len == 0, np.nan_to_num(cost_gen.astype(float)).astype(np.int64), gen_len)
    nll_sum = np.bincount(rows_gen, weights=-lp[gen].astype(float), minlength=n)
    with np.errstate(invalid="ignore", divide="ignore"):
        nll_mean = np.where(n_gen_tok > 0, nll_sum / np.maximum(n_gen_tok, 1), np.nan)
    adv, ent, rep, lag, iw = _signals(table.column("signals"), [cfg.advantage_key, cfg.entropy_key, cfg.replayed_key,
                                                                 cfg.staleness_key, cfg.iw_key])
    replayed = np.nan_to_num(rep) > 0

    trained, events = _meta_walk(table, replayed, lag, iw)
    scored = scored_mask(table.column("verified"), table.column("verifier"))
    feats = pa.table(
        {
            "rollout_id": table.column("rollout_id"),
            "run_id": table.column("run_id"),
            "step": table.column("step"),
            "group_id": table.column("group_id"),
            "prompt_id": table.column("prompt_id"),
            "reward": table.column("reward"),
            "verified": table.column("verified"),
            "finish_reason": table.column("finish_reason"),
            "gen_len": pa.array(gen_len, pa.int64()),
            "nll_mean": pa.array(nll_mean, pa.float64(), mask=np.isnan(nll_mean)),
            "entropy": pa.array(ent, pa.float64(), mask=np.isnan(ent)),
            "advantage": pa.array(adv, pa.float64(), mask=np.isnan(adv)),
            "replayed": pa.array(replayed, pa.bool_()),
            "lag": pa.array(lag, pa.float64(), mask=np.isnan(lag)),
            "iw": pa.array(iw, pa.float64(), mask=np.isnan(iw)),
            "latency": pa.array(latency, pa.float64(), mask=~np.isfinite(latency)),
            "trained": pa.array(trained, pa.float64(), mask=np.isnan(trained)),
            "scored": pa.array(scored, pa.bool_()),
        }
    )
    return feats, events


def _data_buffers(col: pa.ChunkedArray | pa.Array) -> list[bytes]:
    """The data buffer of each non-empty chunk of string column ``col`` (each string is a slice of
    its chunk's buffer): a key found in none of them is in no row, which spares its per-row search.
    Example: ``["ab", "cd"]`` → ``[b"abcd"]``: ``b"x"`` is in no row; ``b"bc"`` is in the buffer
    (across two rows: the per-row search then finds none)."""
    chunks = col.chunks if isinstance(col, pa.ChunkedArray) else [col]
    return [b.to_pybytes() for c in chunks if len(c) and (b := c.buffers()[2]) is not None]


def _meta_walk(table: pa.Table, replayed: np.ndarray, lag: np.ndarray, iw: np.ndarray) -> tuple[np.ndarray, pa.Table]:
    """What the rows' ``meta`` adds: ``trained`` per row (``meta["trained"]``: did group control keep
    the rollout for the update; nan when not recorded) and the replay events table (``run_id, step,
    lag, iw``): one per replayed row, one per ``replayed_at_step`` annotation. Fills ``lag`` in place
    from ``generated_at_step`` where a replayed row has no staleness signal."""
    n = table.num_rows
    steps = table.column("step").to_numpy()
    meta_col = pc.fill_null(table.column("meta"), "")
    # only rows whose meta names a key read here, or that are replayed copies, reach Python
    hit = replayed.copy()
    blobs = _data_buffers(meta_col)  # read once for the three keys
    for key in ('"trained"', "generated_at_step", "replayed_at_step"):
        if any(key.encode() in b for b in blobs):  # (a key in no row's text: none of the per-row searches)
            hit |= pc.match_substring(meta_col, key).to_numpy(zero_copy_only=False)
    todo = np.flatnonzero(hit)
    sub = table.select(["run_id", "meta"]).take(pa.array(todo, pa.int64()))
    runs_sub = sub.column("run_id").to_pylist()
    metas_sub = sub.column("meta").to_pylist()
    trained = np.full(n, np.nan)
    ev_run: list[str] = []
    ev_src: list[int] = []
    ev_step: list[int] = []
    ev_lag: list[float] = []
    ev_iw: list[float] = []
    runs = dict(zip(todo.tolist(), runs_sub, strict=True))
    for i, m in zip(todo.tolist(), metas_sub, strict=True):
        m = m or ""
        if '"trained"' in m:
            t = _json_obj(m).get("trained")
            if isinstance(t, bool):
                trained[i] = float(t)
        if "generated_at_step" not in m and "replayed_at_step" not in m:
            if replayed[i]:
                ev_run.append(runs[i]), ev_step.append(int(steps[i])), ev_lag.append(lag[i]), ev_iw.append(iw[i])
                ev_src.append(int(steps[i]))
            continue
        meta = _json_obj(m)
        if replayed[i]:
            if np.isnan(lag[i]) and isinstance(meta.get("generated_at_step"), int | float):
                lag[i] = float(steps[i] - meta["generated_at_step"])
            ev_run.append(runs[i]), ev_step.append(int(steps[i])), ev_lag.append(lag[i]), ev_iw.append(iw[i])
            ev_src.append(int(steps[i]))
        at = meta.get("replayed_at_step")
        if at is None:
            continue
        ats = at if isinstance(at, list) else [at]
        ws = meta.get("replay_importance_weight")
        ws = ws if isinstance(ws, list) and len(ws) == len(ats) else [ws if not isinstance(ws, list) else None] * len(ats)
        for t, w in zip(ats, ws, strict=True):
            if isinstance(t, int | float):
                ev_run.append(runs[i]), ev_step.append(int(t)), ev_lag.append(float(t - steps[i]))
                ev_src.append(int(steps[i]))
                ev_iw.append(float(w) if isinstance(w, int | float) and not isinstance(w, bool) else np.nan)
    ev_lag_a = np.asarray(ev_lag, float)
    ev_iw_a = np.asarray(ev_iw, float)
    return trained, pa.table(
        {
            "run_id": pa.array(ev_run, pa.string()),
            "step": pa.array(ev_step, pa.int64()),
            "lag": pa.array(ev_lag_a, pa.float64(), mask=np.isnan(ev_lag_a)),
            "iw": pa.array(ev_iw_a, pa.float64(), mask=np.isnan(ev_iw_a)),
            "src_step": pa.array(ev_src, pa.int64()),
        }
    )


#: judges whose audits are a baseline, not a judgement: ROSS's ``keep-all`` supervises every
#: generated token of every kept rollout (the positive-rollout SFT control)
CONTROL_JUDGES = ("keep-all",)


def choose_judge(counts: dict[str, int]) -> str | None:
    """The judge whose audits a view shows by default: any judge that is not a control
    (:data:`CONTROL_JUDGES`) before a control, then the most audits, then the name (A to Z).

    Example: ``{"keep-all": 6, "arith-steps": 6}`` → ``"arith-steps"``; ``{"keep-all": 9}`` →
    ``"keep-all"``; ``{"b": 3, "a": 3, "keep-all": 10}`` → ``"a"``; ``{}`` → None.
    """
    if not counts:
        return None
    return min(counts, key=lambda j: (j in CONTROL_JUDGES, -counts[j], j))


def audit_features(store: Any, run: str | None, cfg: MetricsConfig) -> pa.Table | None:
    """Per audited rollout of the store (of ``run``): run_id, step, status, ter, and excluded-span
    counts per category; one audit per rollout (the chosen judge's latest). Reads the audits table
    and, by id, the audited rollouts' run and step: its cost follows the audits, not the store."""
    audits = store.audits(judge=cfg.judge) if cfg.judge else store.audits()
    if audits.num_rows == 0:
        return None
    if cfg.judge is None:
        vc = pc.value_counts(audits.column("judge")).to_pylist()
        top = choose_judge({d["values"]: d["counts"] for d in vc})
        audits = audits.filter(pc.equal(audits.column("judge"), top))
    rows = sorted(audits.to_pylist(), key=lambda a: (a["rollout_id"], a["created_at"]))
    latest = {a["rollout_id"]: a for a in rows}
    present = store.existing_ids(list(latest))
    ids = [i for i in latest if i in present]
    if not ids:
        return None
    t = store.get(ids, columns=["rollout_id", "run_id", "step", "token_role"])
    keys = {rid: (r, st, role) for rid, r, st, role in zip(
        t.column("rollout_id").to_pylist(), t.column("run_id").to_pylist(), t.column("step").to_pylist(),
        t.column("token_role").to_pylist(), strict=True)}
    cols: dict[str, list[Any]] = {"run_id": [], "step": [], "status": [], "ter": []}
    for c in EXCLUSION_CATEGORIES:
        cols[f"excl_{c}"] = []
    for rid in ids:
        a = latest[rid]
        r, st, role = keys[rid]
        if run is not None and r != run:
            continue
        ter = a["ter"]
        if ter is None and a["status"] == "kept":
            v = ter_from_mask(np.asarray(a["mask"]), np.asarray(role))
            ter = None if np.isnan(v) else v
        cols["run_id"].append(r)
        cols["step"].append(st)
        cols["status"].append(a["status"])
        cols["ter"].append(ter if a["status"] == "kept" else None)
        cats = [s["category"] for s in a["excluded"]]
        for c in EXCLUSION_CATEGORIES:
            cols[f"excl_{c}"].append(cats.count(c))
    if not cols["run_id"]:
        return None
    return pa.table({"run_id": pa.array(cols["run_id"], pa.string()), "step": pa.array(cols["step"], pa.int64()),
                     "status": pa.array(cols["status"], pa.string()), "ter": pa.array(cols["ter"], pa.float64()),
                     **{k: pa.array(v, pa.int64()) for k, v in cols.items() if k.startswith("excl_")}})


_LOCAL = threading.local()


@contextmanager
def connection(tables: dict[str, pa.Table]):  # noqa: ANN201 - yields a duckdb connection
    """This thread's DuckDB connection with ``tables`` registered as views, unregistered after
    (a connection costs tens of milliseconds to open: the store's append path summarises small
    batches, and opens none per batch)."""
    import duckdb

    con, pid = getattr(_LOCAL, "con", None), getattr(_LOCAL, "pid", None)
    if con is None or pid != os.getpid():  # (a forked child opens its own)
        con, _LOCAL.con, _LOCAL.pid = (c := duckdb.connect()), c, os.getpid()
    for name, t in tables.items():
        con.register(name, t)
    try:
        yield con
    finally:
        for name in tables:
            con.unregister(name)


def metrics_of(feats: pa.Table, events: pa.Table, audit_feats: pa.Table | None, cfg: MetricsConfig) -> pa.Table:
    """The :data:`METRIC_COLUMNS` table from per-rollout features, replay events and audit features
    (:func:`rollout_features`, :func:`audit_features`): one DuckDB query; its parts are built by the
    ``_sql_*`` functions below, in the order they run."""
    with connection({"f": feats, "ev": events, **({"a": audit_feats} if audit_feats is not None else {})}) as con:
        q = ("WITH " + ",\n".join([_sql_groups(cfg), _sql_rollouts(cfg), _sql_replay(),
                                    f"au AS ({_sql_audits(audit_feats is not None)})"])
             + "\n" + _sql_select())
        out = con.sql(q).to_arrow_table()
    return out.select(METRIC_COLUMNS)


def _sql_groups(cfg: MetricsConfig) -> str:
    """``fresh`` (rows not replayed), ``g``/``gc`` (per group: spread, verdicts, advantages, zero
    variance, mixed) and ``gs`` (per step: group shares, wasted tokens, kept/dropped groups)."""
    eps = float(cfg.eps)
    return f"""
        fresh AS (SELECT * FROM f WHERE NOT replayed),
        g AS (
            SELECT run_id, step, group_id, count(*) AS n, max(reward) - min(reward) AS spread,
                   stddev_pop(reward) AS sd, count(verified) AS n_ver,
                   count(*) FILTER (WHERE verified) AS n_pass, count(*) FILTER (WHERE verified = false) AS n_fail,
                   max(reward) AS rmax, sum(gen_len) AS gen, count(advantage) AS n_adv,
                   max(abs(advantage)) AS max_abs_adv,
                   min(advantage) FILTER (WHERE verified) AS pass_adv_min,
                   max(advantage) FILTER (WHERE verified = false) AS fail_adv_max,
                   count(trained) AS n_tr, bool_or(trained > 0.5) AS any_trained
            FROM fresh GROUP BY run_id, step, group_id
        ),
        gc AS (
            SELECT *, (n >= 2 AND spread <= {eps}) AS zero_var,
                   CASE WHEN n_adv = n THEN max_abs_adv <= {eps} ELSE (n >= 2 AND spread <= {eps}) END AS zero_adv,
                   (n_pass > 0 AND n_fail > 0) AS mixed
            FROM g
        ),
        gs AS (
            SELECT run_id, step,
                   count(*) FILTER (WHERE n >= 2) AS n_groups,
                   count(*) FILTER (WHERE zero_var) AS n_zero,
                   count(*) FILTER (WHERE n >= 2 AND ((n_ver = n AND n_fail = 0) OR (n_ver = 0 AND zero_var AND rmax > 0))) AS n_all_correct,
                   count(*) FILTER (WHERE n >= 2 AND ((n_ver = n AND n_pass = 0) OR (n_ver = 0 AND zero_var AND rmax <= 0))) AS n_all_wrong,
                   count(*) FILTER (WHERE n >= 2 AND spread > {eps} AND (mixed OR n_ver = 0)) AS n_var,
                   count(*) FILTER (WHERE n >= 2 AND spread > {eps} AND (mixed OR n_ver = 0)
                                    AND sd < {float(cfg.min_group_std)}) AS n_low_std,
                   coalesce(sum(gen) FILTER (WHERE zero_adv), 0) AS wasted,
                   count(*) FILTER (WHERE n_tr > 0) AS n_tr_groups,
                   count(*) FILTER (WHERE n_tr > 0 AND any_trained) AS n_kept,
                   count(*) FILTER (WHERE n_tr > 0 AND NOT any_trained) AS n_dropped
            FROM gc GROUP BY run_id, step
        )"""


def _sql_rollouts(cfg: MetricsConfig) -> str:
    """``pass_step``/``pass_run`` (the reward of a verified pass), ``fr`` (fresh rows with their
    group's facts), ``r`` (per step: rewards, lengths, latencies, truncation, hacking, advantage
    disagreement) and ``tail`` (tokens past the length quantile)."""
    eps, q_tail = float(cfg.eps), float(cfg.tail_quantile)
    return f"""
        pass_step AS (SELECT run_id, step, median(reward) AS ref FROM fresh WHERE verified GROUP BY run_id, step),
        pass_run AS (SELECT run_id, median(reward) AS ref FROM fresh WHERE verified GROUP BY run_id),
        fr AS (
            SELECT fresh.*, coalesce(ps.ref, pr.ref, {float(cfg.pass_reward)}) AS pass_ref,
                   gc.mixed, gc.pass_adv_min, gc.fail_adv_max
            FROM fresh LEFT JOIN pass_step ps USING (run_id, step) LEFT JOIN pass_run pr USING (run_id)
            LEFT JOIN gc USING (run_id, step, group_id)
        ),
        r AS (
            SELECT run_id, step, count(*) AS n_rollouts, count(verified) AS n_verdicts,
                   avg(CASE WHEN scored THEN 1.0 ELSE 0.0 END) AS scored_share, avg(reward) AS reward_mean,
                   stddev_pop(reward) AS reward_std,
                   avg(CASE WHEN verified THEN 1.0 WHEN NOT verified THEN 0.0 END) AS verified_rate,
                   sum(gen_len) AS gen_tokens, avg(gen_len) AS len_mean,
                   quantile_cont(gen_len, 0.95) AS len_p95, max(gen_len) AS len_max,
                   quantile_cont(gen_len, {q_tail}) AS len_q,
                   count(latency) AS n_lat, count(DISTINCT latency) AS n_lat_distinct,
                   max(latency) AS lat_max, quantile_cont(latency, {q_tail}) AS lat_q,
                   count(*) FILTER (WHERE finish_reason = 'length') AS n_truncated,
                   avg(CASE WHEN finish_reason = 'length' THEN 1.0 ELSE 0.0 END) AS trunc_rate,
                   avg(CASE WHEN finish_reason = 'abort' THEN 1.0 ELSE 0.0 END) AS abort_rate,
                   avg(entropy) AS entropy_mean, avg(nll_mean) AS nll_mean,
                   CASE WHEN count(verified) > 0 THEN
                       count(*) FILTER (WHERE verified = false AND reward >= pass_ref - {eps})::DOUBLE
                       / count(verified) END AS hack_rate,
                   CASE WHEN count(*) FILTER (WHERE mixed AND advantage IS NOT NULL AND verified IS NOT NULL) > 0 THEN
                       count(*) FILTER (WHERE mixed AND ((verified = false AND advantage >= pass_adv_min - {eps})
                                                        OR (verified AND advantage <= fail_adv_max + {eps})))::DOUBLE
                       / count(*) FILTER (WHERE mixed AND advantage IS NOT NULL AND verified IS NOT NULL) END
                       AS adv_disagreement
            FROM fr GROUP BY run_id, step
        ),
        tail AS (
            SELECT fresh.run_id, fresh.step, sum(greatest(fresh.gen_len - r.len_q, 0)) AS tail_tokens
            FROM fresh JOIN r USING (run_id, step) GROUP BY fresh.run_id, fresh.step
        )"""


def _sql_replay() -> str:
    """``allsteps`` (every step seen, fresh or replayed), ``rows_at`` and ``e`` (replay events per step)."""
    return """
        allsteps AS (SELECT DISTINCT run_id, step FROM f UNION SELECT DISTINCT run_id, step FROM ev),
        rows_at AS (SELECT run_id, step, count(*) AS n_rows FROM f GROUP BY run_id, step),
        e AS (
            SELECT run_id, step, count(*) AS n_replayed, avg(lag) AS staleness_mean, max(lag) AS staleness_max,
                   avg(iw) AS iw_mean, min(iw) AS iw_min, max(iw) AS iw_max
            FROM ev GROUP BY run_id, step
        )"""


def _sql_audits(has_audits: bool) -> str:
    """The audit part: per step, audited rollouts, kept share, mean TER, excluded spans per category
    (an empty relation of the same columns when the store has no audits)."""
    if not has_audits:
        nulls = ", ".join(f"NULL::BIGINT AS excl_{c}" for c in EXCLUSION_CATEGORIES)
        return ("SELECT NULL::VARCHAR AS run_id, NULL::BIGINT AS step, NULL::BIGINT AS n_audited, "
                f"NULL::DOUBLE AS kept_share, NULL::DOUBLE AS ter_mean, {nulls} WHERE false")
    sums = ", ".join(f"sum(excl_{c})::BIGINT AS excl_{c}" for c in EXCLUSION_CATEGORIES)
    return f"""SELECT run_id, step, count(*)::BIGINT AS n_audited,
                avg(CASE WHEN status = 'kept' THEN 1.0 ELSE 0.0 END) AS kept_share,
                avg(ter) AS ter_mean, {sums} FROM a GROUP BY run_id, step"""


def _sql_select() -> str:
    """The final select: one row per step of ``allsteps``, the columns of :data:`METRIC_COLUMNS`."""
    # per-sample finish times, not one latency per batch: at least 3 and at least half of them distinct
    timed = "(r.n_lat = r.n_rollouts AND r.n_lat_distinct >= greatest(3, r.n_rollouts / 2) AND r.lat_max > 0)"
    return f"""
        SELECT s.run_id, s.step, coalesce(r.n_rollouts, 0)::BIGINT AS n_rollouts,
               coalesce(gs.n_groups, 0)::BIGINT AS n_groups, coalesce(r.n_verdicts, 0)::BIGINT AS n_verdicts,
               r.scored_share, r.reward_mean, r.reward_std, r.verified_rate,
               gs.n_zero::DOUBLE / nullif(gs.n_groups, 0) AS zero_var_share,
               gs.n_all_correct::DOUBLE / nullif(gs.n_groups, 0) AS all_correct_share,
               gs.n_all_wrong::DOUBLE / nullif(gs.n_groups, 0) AS all_wrong_share,
               coalesce(r.gen_tokens, 0)::BIGINT AS gen_tokens, coalesce(gs.wasted, 0)::BIGINT AS wasted_tokens,
               gs.wasted::DOUBLE / nullif(r.gen_tokens, 0) AS waste_share,
               r.len_mean, r.len_p95, r.len_max::DOUBLE AS len_max, coalesce(r.n_truncated, 0)::BIGINT AS n_truncated,
               r.trunc_rate, r.abort_rate,
               CASE WHEN {timed} THEN (r.lat_max - r.lat_q) / r.lat_max
                    WHEN r.len_max > 0 THEN (r.len_max - r.len_q) / r.len_max END AS tail_time_share,
               tail.tail_tokens::DOUBLE / nullif(r.gen_tokens, 0) AS tail_token_share,
               CASE WHEN r.n_rollouts IS NULL THEN NULL WHEN {timed} THEN 1.0 ELSE 0.0 END AS tail_timed,
               r.entropy_mean, r.nll_mean, r.hack_rate, r.adv_disagreement,
               gs.n_low_std::DOUBLE / nullif(gs.n_var, 0) AS low_std_share,
               CASE WHEN gs.n_tr_groups > 0 THEN gs.n_kept END::BIGINT AS n_kept_groups,
               CASE WHEN gs.n_tr_groups > 0 THEN gs.n_dropped END::BIGINT AS n_dropped_groups,
               coalesce(e.n_replayed, 0)::BIGINT AS n_replayed,
               coalesce(e.n_replayed, 0)::DOUBLE / nullif(greatest(ra.n_rows, coalesce(e.n_replayed, 0)), 0) AS replay_share,
               e.staleness_mean, e.staleness_max, e.iw_mean, e.iw_min, e.iw_max,
               coalesce(au.n_audited, 0)::BIGINT AS n_audited, au.kept_share, au.ter_mean,
               {", ".join(f"au.excl_{c}" for c in EXCLUSION_CATEGORIES)}
        FROM allsteps s
        LEFT JOIN r USING (run_id, step) LEFT JOIN gs USING (run_id, step) LEFT JOIN tail USING (run_id, step)
        LEFT JOIN e USING (run_id, step) LEFT JOIN au USING (run_id, step)
        LEFT JOIN rows_at ra USING (run_id, step)
        ORDER BY s.run_id, s.step"""


_COUNTS = {"n_rollouts", "n_groups", "n_verdicts", "gen_tokens", "wasted_tokens", "n_truncated"}


def summarize(table: pa.Table, config: MetricsConfig | None = None) -> dict[str, Any]:
    """The :data:`STEP_COLUMNS` of one step's rows: :func:`metrics_of` over ``table`` (a rollouts
    table of one (run, step), at least :data:`FEATURE_COLUMNS`), as plain Python values (DuckDB's
    decimal ``tail_timed`` as a float). What the training loop reports per step, so its numbers are
    the report's for the same rows under the same names. No rows: the counts 0, the rest None.

    Example: one step, groups [1, 1] and [0, 1] (verified as rewarded) → ``zero_var_share`` 0.5,
    ``verified_rate`` 0.75, ``reward_mean`` 0.75."""
    cfg = config or MetricsConfig()
    keys = table.select(["run_id", "step"]).group_by(["run_id", "step"]).aggregate([]) if table.num_rows else None
    if keys is not None and keys.num_rows > 1:
        raise ValueError(f"summarize takes the rows of one (run, step); these hold {keys.num_rows}")
    feats, events = rollout_features(table, cfg)
    m = metrics_of(feats, events, None, cfg) if table.num_rows else None
    if m is not None:
        m = m.filter(pc.and_(pc.equal(m.column("run_id"), keys.column("run_id")[0]),
                             pc.equal(m.column("step"), keys.column("step")[0])))
    if m is None or m.num_rows == 0:
        return {c: 0 if c in _COUNTS else None for c in STEP_COLUMNS}
    row = m.select(STEP_COLUMNS).to_pylist()[0]
    return {k: float(v) if v is not None and not isinstance(v, int | float) else v for k, v in row.items()}
