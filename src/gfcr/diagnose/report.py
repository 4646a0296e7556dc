"""A self-contained HTML report of a store (or one run): metrics over steps, findings, ROSS tables,
and sample rollouts per bucket with supervised / excluded spans highlighted.

The file has no scripts and no external references (plots are inline SVG, styles inline), so it
opens offline and can be mailed around. All rollout text is untrusted model output: every string
taken from the store goes through :func:`html.escape`.
"""

from __future__ import annotations

import html
import json
import math
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from gfcr.diagnose.audits import judges_line, latest_audits, resolve_judge, ter_by_step
from gfcr.diagnose.charts import line_chart, stacked_bar_chart
from gfcr.diagnose.detectors import DetectorConfig, Finding, detect
from gfcr.diagnose.metrics import MetricsConfig, by_run, step_metrics
from gfcr.diagnose.spans import segments
from gfcr.records import assistant_text

CATEGORY_COLOURS = {
    "corrected_mistake": "#f4a3a3",
    "redundant_exploration": "#f9d58b",
    "abandoned_attempt": "#c9b3f0",
    "incorrect_claim": "#f08080",
    "other": "#cccccc",
}

#: metric column → legend label
LABELS = {
    "reward_mean": "mean reward", "verified_rate": "verified (pass) rate",
    "zero_var_share": "no reward spread", "all_correct_share": "all passed", "all_wrong_share": "none passed",
    "waste_share": "tokens in zero-advantage groups",
    "tail_time_share": "time after 90% finished", "tail_token_share": "tokens after 90% finished",
    "len_mean": "mean", "len_p95": "95th percentile", "len_max": "longest",
    "trunc_rate": "truncated (max_tokens)", "abort_rate": "stopped early (abort)",
    "entropy_mean": "entropy signal", "nll_mean": "−log-prob of sampled tokens",
    "hack_rate": "failed, rewarded like a pass", "adv_disagreement": "advantage against verdict",
    "low_std_share": "mixed groups with tiny std",
    "n_kept_groups": "kept (trained on)", "n_dropped_groups": "dropped by group control",
    "staleness_mean": "mean lag", "staleness_max": "max lag",
    "iw_mean": "mean", "iw_min": "min", "iw_max": "max",
    "ter_mean": "TER (excluded share of generated tokens)", "kept_share": "audits kept",
}
SHARE = (0.0, 1.0)
#: (chart title, metric columns, y-axis label, y range, kind)
CHARTS: list[tuple[str, list[str], str, tuple[float | None, float | None], str]] = [
    ("Reward and pass rate", ["reward_mean", "verified_rate"], "reward / rate", (None, None), "line"),
    ("Group outcomes", ["zero_var_share", "all_correct_share", "all_wrong_share"], "share of groups", SHARE, "line"),
    ("Compute waste", ["waste_share"], "share of tokens", SHARE, "line"),
    ("Long tail: after most of the batch finished", ["tail_time_share", "tail_token_share"], "share", SHARE, "line"),
    ("Generated length", ["len_mean", "len_p95", "len_max"], "tokens", (0.0, None), "line"),
    ("Truncated and stopped early", ["trunc_rate", "abort_rate"], "share of rollouts", SHARE, "line"),
    ("Token entropy", ["entropy_mean", "nll_mean"], "nats / token", (0.0, None), "line"),
    ("Reward against the verdict", ["hack_rate", "adv_disagreement", "low_std_share"], "share", SHARE, "line"),
    ("Group control decisions", ["n_kept_groups", "n_dropped_groups"], "groups", (0.0, None), "bars"),
    ("Replay staleness", ["staleness_mean", "staleness_max"], "policy versions", (0.0, None), "line"),
    ("Replay importance weights", ["iw_mean", "iw_min", "iw_max"], "weight", (0.0, None), "line"),
]

CSS = """
*{box-sizing:border-box}
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0 auto;padding:20px 24px;color:#222;max-width:1280px}
h1{font-size:22px}h2{font-size:18px;border-bottom:1px solid #ddd;padding-bottom:4px;margin-top:32px}
table{border-collapse:collapse;font-size:13px;margin:8px 0}td,th{border:1px solid #ddd;padding:3px 6px;text-align:left;vertical-align:top}
th{background:#f5f5f5}.charts{display:flex;flex-wrap:wrap;gap:12px;align-items:flex-start}.chart{border:1px solid #eee;background:#fff;max-width:100%;height:auto}
.scroll{overflow:auto;max-width:100%;max-height:480px;border:1px solid #ddd}.scroll table{margin:0}
.scroll th{position:sticky;top:0}#metrics td{text-align:right;white-space:nowrap}#metrics td:first-child{text-align:left}
.finding{border-left:4px solid #f0ad4e;padding:6px 10px;margin:8px 0;background:#fffaf0}
.finding.critical{border-color:#d9534f;background:#fff5f5}.muted{color:#777}
.card{border:1px solid #ddd;border-radius:4px;padding:8px 12px;margin:10px 0}
pre{white-space:pre-wrap;word-break:break-word;font-size:12px;background:#fafafa;padding:6px;margin:4px 0}
.seg-supervised{background:#d7f5dd}.seg-excluded{text-decoration:line-through;text-decoration-color:#900}
.legend span{display:inline-block;padding:1px 6px;margin-right:6px;font-size:12px}
"""


def _e(x: Any) -> str:
    return html.escape(str(x), quote=True)


def _fmt(v: Any) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "–"
    if isinstance(v, float):
        return f"{v:.3g}"
    return str(v)


def _merge_equal(series: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Series with equal values at every step drawn once, their labels joined with " = " (a reward
    that is the verdict drew two identical lines, one hidden under the other).

    Example: {"mean reward": [1, 0], "pass rate": [1, 0], "x": [2, 2]} →
    {"mean reward = pass rate": [1, 0], "x": [2, 2]}.
    """
    out: dict[str, np.ndarray] = {}
    for label, v in series.items():
        same = next((k for k, w in out.items() if len(w) == len(v) and np.allclose(w, v, equal_nan=True)), None)
        if same is None:
            out[label] = v
        else:
            out[f"{same} = {label}"] = out.pop(same)
    return out


def _charts(metrics: pa.Table) -> str:
    runs = by_run(metrics)
    out = []
    for title, cols, ylab, yrange, kind in CHARTS:
        for run, s in runs.items():
            series = _merge_equal({LABELS.get(c, c): s[c] for c in cols if np.isfinite(s[c]).any()})
            if not series or (kind == "bars" and not any(np.nansum(v) > 0 for v in series.values())):
                continue
            t = title if len(runs) == 1 else f"{title} — {run}"
            if kind == "bars":
                out.append(stacked_bar_chart(t, s["step"], series, ylab))
            else:
                out.append(line_chart(t, s["step"], series, ylab, yrange))
    return '<div class="charts">' + "".join(out) + "</div>" if out else '<p class="muted">No steps to plot.</p>'


def _findings_html(findings: list[Finding]) -> str:
    if not findings:
        return '<p id="no-findings">No detector fired: no pathology crossed its threshold.</p>'
    items = []
    for f in findings:
        ev = ", ".join(f"{_e(k)} = {_fmt(v)}" for k, v in f.evidence.items())
        lev = "".join(f"<li>{_e(x)}</li>" for x in f.levers)
        rows = ""
        if f.rows:
            cols = list(f.rows[0])
            rows = ('<details class="evidence"><summary>evidence: the steps judged</summary><div class="scroll"><table>'
                    + "<tr>" + "".join(f"<th>{_e(c)}</th>" for c in cols) + "</tr>"
                    + "".join("<tr>" + "".join(f"<td>{_e(_fmt(r[c]))}</td>" for c in cols) + "</tr>" for r in f.rows)
                    + "</table></div></details>")
        items.append(
            f'<div class="finding {_e(f.severity)}" data-detector="{_e(f.detector)}"><b>{_e(f.title)}</b> '
            f'<span class="muted">run {_e(f.run_id)} · {_e(f.severity)}</span><br>{_e(f.message)}<br>'
            f'<span class="muted">{ev}</span>{rows}<b>Module:</b> {_e(f.module)}<br><b>Levers to try:</b><ul>{lev}</ul></div>'
        )
    return "".join(items)


def _health_html(health: Any) -> str:
    """The health checks' section: per check, the count and the rollouts with their evidence."""
    from gfcr.diagnose.health import CHECKS, TITLES

    if health is None:
        return '<p class="muted" id="no-health">Health checks not run.</p>'
    head = "<tr><th>check</th><th>rollouts</th><th>checked</th><th>note</th></tr>"
    rows = "".join(
        f'<tr data-check="{_e(c)}"><td>{_e(TITLES[c])}</td><td>{health.counts[c]}</td><td>{health.checked[c]}</td>'
        f"<td>{_e(health.skipped.get(c, ''))}</td></tr>" for c in CHECKS)
    out = [f'<table id="health-counts">{head}{rows}</table>']
    for c in CHECKS:
        items = [i for i in health.issues if i.check == c]
        if not items:
            continue
        li = "".join(f'<li data-rollout="{_e(i.rollout_id)}"><code>{_e(i.rollout_id)}</code> run {_e(i.run_id)} step '
                     f'{i.step}: {_e(i.message)}<br><span class="muted">{_e(json.dumps(i.evidence, sort_keys=True)[:400])}'
                     "</span></li>" for i in items)
        more = health.counts[c] - len(items)
        extra = f'<p class="muted">and {more} more</p>' if more > 0 else ""
        out.append(f'<div class="finding warning" data-check="{_e(c)}"><b>{_e(TITLES[c])}</b> '
                   f'<span class="muted">{health.counts[c]} rollout(s)</span><ul>{li}</ul>{extra}</div>')
    if health.clean:
        out.append('<p id="health-clean">No health issue in the checked rollouts.</p>')
    return "".join(out)


def _metrics_table(metrics: pa.Table) -> str:
    cols = ["run_id", "step", "n_rollouts", "reward_mean", "verified_rate", "zero_var_share", "waste_share",
            "len_mean", "len_p95", "len_max", "tail_time_share", "trunc_rate", "entropy_mean", "nll_mean",
            "hack_rate", "adv_disagreement", "n_kept_groups", "n_dropped_groups", "n_replayed",
            "staleness_mean", "iw_mean", "n_audited", "ter_mean"]
    head = "".join(f"<th>{_e(c)}</th>" for c in cols)
    rows = "".join("<tr>" + "".join(f"<td>{_e(_fmt(r[c]))}</td>" for c in cols) + "</tr>" for r in metrics.to_pylist())
    return f'<div class="scroll" id="metrics-box"><table id="metrics"><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table></div>'


def _ross_chart(store: Any, run: str | None, judge: str | None) -> str:
    """TER per step of ``judge``'s audits, token-pooled as ``gfcr ross analyze`` computes it
    (:func:`gfcr.diagnose.audits.ter_by_step`), with the share of audits kept; one chart per run."""
    rows = ter_by_step(store, judge, run)
    runs = sorted({r["run_id"] for r in rows})
    out = []
    for rn in runs:
        rr = [r for r in rows if r["run_id"] == rn]
        nan = float("nan")
        series = {"TER (excluded share of generated tokens)": np.array([nan if r["ter"] is None else r["ter"] for r in rr]),
                  "audits kept": np.array([r["kept_share"] for r in rr], float)}
        t = f"ROSS audits ({judge}): TER over steps" + ("" if len(runs) == 1 else f" — {rn}")
        out.append(line_chart(t, np.array([r["step"] for r in rr]), series, "share", SHARE))
    cells = "".join(f'<tr data-run="{_e(r["run_id"])}" data-step="{r["step"]}"><td>{_e(r["run_id"])}</td><td>{r["step"]}</td>'
                    f'<td>{r["n_audited"]}</td><td>{_fmt(r["kept_share"])}</td><td>{r["generated_tokens"]}</td>'
                    f'<td>{r["excluded_tokens"]}</td><td class="ter">{_fmt(r["ter"])}</td></tr>' for r in rows)
    table = (f'<table id="ross-ter" data-judge="{_e(judge)}"><tr><th>run</th><th>step</th><th>audits</th><th>kept</th>'
             f"<th>generated tokens (kept)</th><th>excluded tokens</th><th>TER</th></tr>{cells}</table>") if rows else ""
    return '<div class="charts">' + "".join(out) + "</div>" + table


def _ross_tables(store: Any, run: str | None, judge: str | None = None, counts: dict[str, int] | None = None) -> str:
    ids_filter = ""
    if run is not None:
        ids_filter = "WHERE a.rollout_id IN (SELECT rollout_id FROM rollouts WHERE run_id = " + \
            "'" + run.replace("'", "''") + "')"
    status = store.sql(
        f"""SELECT a.judge, a.judge_version, a.status, count(*) AS n, avg(a.ter) AS ter_mean,
                   median(a.ter) AS ter_median
            FROM audits a {ids_filter} GROUP BY ALL ORDER BY a.judge, a.judge_version, a.status"""
    ).to_pylist()
    if not status:
        return '<p id="no-audits" class="muted">No ROSS audits in this store (run <code>gfcr ross audit</code> to add them).</p>'
    head = "<tr><th>judge</th><th>version</th><th>status</th><th>audits</th><th>TER mean</th><th>TER median</th></tr>"
    rows = "".join(
        f"<tr><td>{_e(r['judge'])}</td><td>{_e(r['judge_version'])}</td><td>{_e(r['status'])}</td><td>{r['n']}</td>"
        f"<td>{_fmt(r['ter_mean'])}</td><td>{_fmt(r['ter_median'])}</td></tr>" for r in status
    )
    cats = store.sql(
        f"""SELECT a.judge, s.category AS category, count(*) AS spans,
                   sum(s."end" - s.start) AS chars
            FROM audits a, unnest(a.excluded) AS u(s) {ids_filter} GROUP BY ALL ORDER BY a.judge, spans DESC"""
    ).to_pylist()
    crow = "".join(
        f"<tr><td>{_e(r['judge'])}</td><td><span style=\"background:{CATEGORY_COLOURS.get(r['category'], '#ccc')}\">"
        f"{_e(r['category'])}</span></td><td>{r['spans']}</td><td>{r['chars']}</td></tr>" for r in cats
    ) or '<tr><td colspan="4" class="muted">no excluded spans</td></tr>'
    reasons = store.sql(
        f"""SELECT a.judge, a.reason, count(*) AS n FROM audits a {ids_filter}
            {'AND' if ids_filter else 'WHERE'} a.status <> 'kept' GROUP BY ALL ORDER BY n DESC LIMIT 10"""
    ).to_pylist()
    rrow = "".join(f"<tr><td>{_e(r['judge'])}</td><td>{_e(r['reason'])}</td><td>{r['n']}</td></tr>" for r in reasons)
    out = (f'<p id="ross-judge" data-judge="{_e(judge)}">The TER chart, the sample rollouts, the most-masked bucket and '
           f"the metrics' audit columns show <b>{_e(judges_line(judge, counts or {}))}</b>. Pick another with "
           "<code>gfcr report --judge NAME</code>.</p>" + _ross_chart(store, run, judge))
    out += f'<h3>Audits per judge</h3><table id="ross-status">{head}{rows}</table>'
    out += f'<h3>Exclusion categories</h3><table id="ross-categories"><tr><th>judge</th><th>category</th><th>spans</th><th>chars</th></tr>{crow}</table>'
    if rrow:
        out += f'<h3>Discard reasons</h3><table id="ross-reasons"><tr><th>judge</th><th>reason</th><th>audits</th></tr>{rrow}</table>'
    return out


def _pick(store: Any, run: str | None, n: int, judge: str | None = None) -> dict[str, list[str]]:
    """Rollout ids per bucket: best, worst, truncated, most-masked — top-n queries (DuckDB over the
    store), never the whole id list in Python."""
    where = "" if run is None else "WHERE run_id = '" + run.replace("'", "''") + "'"
    and_ = "AND" if where else "WHERE"
    n = int(n)

    def ids(q: str) -> list[str]:
        return store.sql(q).column("rollout_id").to_pylist()

    best = ids(f"SELECT rollout_id FROM rollouts {where} ORDER BY reward DESC, rollout_id LIMIT {n}")
    if not best:
        return {}
    out = {"best": best,
           "worst": ids(f"SELECT rollout_id FROM rollouts {where} ORDER BY reward ASC, rollout_id DESC LIMIT {n}"),
           "truncated": ids(f"SELECT rollout_id FROM rollouts {where} {and_} finish_reason = 'length' "
                            f"ORDER BY step, rollout_id LIMIT {n}")}
    if store.count("audits"):
        out["most-masked"] = _most_masked(store, run, n, judge)
    return out


def _most_masked(store: Any, run: str | None, n: int, judge: str | None) -> list[str]:
    """The ``n`` rollouts ``judge`` masked most (highest TER of its audits), ties by id."""
    if judge is None:
        return []
    scope = "" if run is None else "AND rollout_id IN (SELECT rollout_id FROM rollouts WHERE run_id = '" + \
        run.replace("'", "''") + "')"
    return store.sql(
        f"SELECT rollout_id, max(ter) AS t FROM audits WHERE ter > 0 AND judge = '{judge.replace(chr(39), chr(39) * 2)}' "
        f"{scope} GROUP BY rollout_id ORDER BY t DESC, rollout_id LIMIT {int(n)}").column("rollout_id").to_pylist()


def render_text_segments(text: str, audit: dict[str, Any] | None) -> str:
    """HTML of the assistant text: excluded spans struck through and coloured by category, kept
    text green when audited. The text is escaped piece by piece."""
    spans = audit["excluded"] if audit and audit["status"] == "kept" else []
    audited = bool(audit and audit["status"] == "kept")
    out = []
    for s in segments(text, spans, audited):
        if s.kind == "excluded":
            out.append(f'<span class="seg-excluded" data-category="{_e(s.category)}" '
                       f'style="background:{CATEGORY_COLOURS.get(s.category or "other", "#ccc")}" '
                       f'title="excluded: {_e(s.category)}">{_e(s.text)}</span>')
        elif s.kind == "supervised":
            out.append(f'<span class="seg-supervised" title="supervised">{_e(s.text)}</span>')
        else:
            out.append(_e(s.text))
    return "".join(out)


def _rollout_card(row: dict[str, Any], audit: dict[str, Any] | None, judge: str | None = None) -> str:
    role = row["token_role"]
    n_gen = sum(role)
    head = (f"<b>{_e(row['rollout_id'][:12])}</b> · run {_e(row['run_id'])} · step {row['step']} · "
            f"prompt {_e(row['prompt_id'])} · reward {_fmt(float(row['reward']))} · verified {_e(row['verified'])} · "
            f"finish {_e(row['finish_reason'])} · tokens {len(role) - n_gen} context / {n_gen} generated")
    ctx = "".join(f"<div><span class=\"muted\">{_e(m['role'])}</span><pre>{_e(m['content'])}</pre></div>"
                  for m in row["messages"] if m["role"] != "assistant")
    text = assistant_text(row["messages"])
    audit_line = f'<span class="muted">not audited{" by " + _e(judge) if judge else ""}</span>'
    if audit:
        audit_line = (f"audit {_e(audit['judge'])}@{_e(audit['judge_version'])}: <b>{_e(audit['status'])}</b>"
                      + (f" — {_e(audit['reason'])}" if audit.get("reason") else "")
                      + (f" · TER {_fmt(audit['ter'])}" if audit.get("ter") is not None else ""))
    try:
        ver = json.dumps(json.loads(row["verifier"]), indent=1, sort_keys=True)
    except (TypeError, json.JSONDecodeError):
        ver = str(row["verifier"])
    return (f'<div class="card" data-rollout="{_e(row["rollout_id"])}">{head}<br>{audit_line}{ctx}'
            f'<div><span class="muted">assistant</span><pre class="assistant">{render_text_segments(text, audit)}</pre></div>'
            f'<details><summary>verifier evidence</summary><pre>{_e(ver)}</pre></details></div>')


def _samples(store: Any, run: str | None, n: int, judge: str | None = None) -> str:
    buckets = _pick(store, run, n, judge)
    if not buckets:
        return '<p class="muted">No rollouts.</p>'
    all_ids = list(dict.fromkeys(i for ids in buckets.values() for i in ids))
    rows = {r["rollout_id"]: r for r in store.get(all_ids, columns=[
        "rollout_id", "run_id", "step", "prompt_id", "reward", "verified", "finish_reason", "messages",
        "token_role", "verifier"]).to_pylist()}
    audits = latest_audits(store, all_ids, judge)
    legend = "".join(f'<span style="background:{c}">{_e(k)}</span>' for k, c in CATEGORY_COLOURS.items())
    out = [f'<p class="legend"><span class="seg-supervised">supervised</span>{legend}</p>']
    for name, ids in buckets.items():
        cards = "".join(_rollout_card(rows[i], audits.get(i), judge) for i in ids) or '<p class="muted">none</p>'
        out.append(f'<h3 id="bucket-{_e(name)}">{_e(name)}</h3>{cards}')
    return "".join(out)


def build_report(store: Any, run: str | None = None, metrics_config: MetricsConfig | None = None,
                 detector_config: DetectorConfig | None = None, samples_per_bucket: int = 3,
                 metrics: pa.Table | None = None, findings: list[Finding] | None = None, health: Any = None,
                 judge: str | None = None) -> str:
    """The report as one HTML string (see the module docstring). ``metrics``, ``findings`` and
    ``health`` (a :class:`gfcr.diagnose.health.HealthReport`) are computed here when not given, so a
    caller that also prints them computes them once. ``judge``: whose ROSS audits the report shows
    (default ``metrics_config.judge``, else :func:`gfcr.diagnose.audits.resolve_judge`'s choice)."""
    judge, counts = resolve_judge(store, judge or (metrics_config.judge if metrics_config else None))
    metrics_config = (metrics_config or MetricsConfig()).model_copy(update={"judge": judge})
    if metrics is None:
        metrics = step_metrics(store, run=run, config=metrics_config)
    if findings is None:
        findings = detect(metrics, detector_config)
    if health is None:
        from gfcr.diagnose.health import run_health_checks

        health = run_health_checks(store, run=run)
    title = f"gfcr report — {run}" if run else "gfcr report"
    n_roll = int(pc.sum(metrics.column("n_rollouts")).as_py() or 0) if metrics.num_rows else 0
    runs = sorted(set(metrics.column("run_id").to_pylist()))
    now = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    body = [
        f"<h1>{_e(title)}</h1>",
        f'<p class="muted">store {_e(store.path)} · {len(runs)} run(s): {_e(", ".join(runs))} · '
        f"{metrics.num_rows} step(s) · {n_roll} rollouts · generated {now}</p>",
        '<h2 id="findings">Findings</h2>', _findings_html(findings),
        '<h2 id="health">Rollout health</h2>', _health_html(health),
        '<h2 id="plots">Metrics over steps</h2>', _charts(metrics),
        '<h2 id="ross">ROSS audits</h2>', _ross_tables(store, run, judge, counts),
        '<h2 id="samples">Sample rollouts</h2>', _samples(store, run, samples_per_bucket, judge),
        '<h2 id="table">Metrics table</h2>',
        f'<p class="muted">n_audited and ter_mean (the mean of per-rollout TER) read {_e(judges_line(judge, counts))}.</p>'
        if judge else "", _metrics_table(metrics),
    ]
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{_e(title)}</title>'
            f"<style>{CSS}</style></head><body>{''.join(body)}</body></html>")


def store_runs(store: Any) -> list[str]:
    """The runs of the store (the distinct values of its ``run_id`` column)."""
    t = store.scan(columns=["run_id"])
    return sorted(pc.unique(t.column("run_id")).to_pylist()) if t.num_rows else []


def write_report(store: Any, out: str | Path, run: str | None = None, overwrite: bool = False, **kw: Any) -> Path:
    """Write :func:`build_report` to ``out`` and return its path. An existing file is kept unless
    ``overwrite``; the file is written to a temporary name first, so a failure leaves nothing half-written."""
    path = Path(out)
    if path.exists() and not overwrite:
        raise FileExistsError(f"{path} exists; choose another --out or pass --force to replace it")
    runs = store_runs(store)
    if run is not None and run not in runs:
        raise ValueError(f"no rollouts for run {run!r} in {store.path}; runs in the store: {runs}")
    text = build_report(store, run=run, **kw)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
    return path


__all__ = ["build_report", "write_report", "render_text_segments", "store_runs"]
