"""The HTML report: self-contained, renders with and without audits, escapes rollout text."""

from __future__ import annotations

import math
import re

import pytest
from diag_helpers import audit, rollout, simulate_run
from typer.testing import CliRunner

from gfcr.cli import app
from gfcr.diagnose.charts import line_chart, nice_step, nice_ticks, stacked_bar_chart, tick_label, wrap
from gfcr.diagnose.report import CATEGORY_COLOURS, build_report, write_report
from gfcr.diagnose.spans import segments
from gfcr.records import EXCLUSION_CATEGORIES
from gfcr.store import RolloutStore

EVIL = '<script>alert("x")</script> First 2+2=5. Wait, 2+2=4. <img src=x onerror=alert(1)> Answer: 4'


def _external_refs(page: str) -> list[str]:
    return re.findall(r"""(?:src|href|url)\s*[=(]\s*["']?\s*(?:https?:)?//""", page, re.I) + re.findall(r"https?://", page)


@pytest.fixture()
def store(tmp_path):
    s = RolloutStore.open(tmp_path / "store", create=True)
    rows = simulate_run("length_inflation") + simulate_run("healthy")
    evil = rollout("healthy", 5, "p9", 0.0, finish="length", text=EVIL, verified=False)
    rows.append(evil)
    s.append(rows)
    return s, rows, evil


def test_segments_partition_text_and_resolve_overlaps():
    segs = segments("abcdef", [{"start": 2, "end": 4, "category": "other"}], audited=True)
    assert [(s.text, s.kind) for s in segs] == [("ab", "supervised"), ("cd", "excluded"), ("ef", "supervised")]
    segs = segments("abcdef", [{"start": 3, "end": 99, "category": "x"}, {"start": 1, "end": 4, "category": "y"}], False)
    assert "".join(s.text for s in segs) == "abcdef"
    assert [(s.text, s.kind, s.category) for s in segs] == [("a", "plain", None), ("bcd", "excluded", "y"),
                                                            ("ef", "excluded", "x")]


def _is_round(v: float, step: float) -> bool:
    k = v / step
    return abs(k - round(k)) < 1e-9 and any(abs(step / 10 ** math.floor(math.log10(step)) - m) < 1e-9
                                             for m in (1, 2, 2.5, 5))


def test_ticks_are_round_and_cover_the_data():
    assert nice_ticks(0, 0.392) == pytest.approx([0, 0.1, 0.2, 0.3, 0.4])
    assert nice_ticks(0, 1) == pytest.approx([0, 0.2, 0.4, 0.6, 0.8, 1.0])
    assert nice_ticks(0, 37, integer=True) == [0, 10, 20, 30, 40]
    assert nice_ticks(0, 3, integer=True) == [0, 1, 2, 3]  # counts never tick at 0.5
    assert nice_step(1.0) == 0.2 and nice_step(37) == 10
    for lo, hi in [(0, 0.0625), (-0.3, 1.1), (0.281, 0.392), (3, 3), (0, 2500), (-7e-4, 0)]:
        t = nice_ticks(lo, hi)
        step = t[1] - t[0]
        assert t[0] <= lo and t[-1] >= hi and 3 <= len(t) <= 12, (lo, hi, t)
        assert all(_is_round(v, step) for v in t), (lo, hi, t)
    assert [tick_label(v, 0.25) for v in nice_ticks(0, 1, 4)] == ["0", "0.25", "0.50", "0.75", "1.00"]
    assert tick_label(0.30000000000000004, 0.1) == "0.3" and tick_label(20.0, 10) == "20"


def test_titles_wrap_to_the_chart():
    lines = wrap("Truncated (max_tokens) / stopped early (abort, e.g. repetition) over the whole run", 380)
    assert len(lines) >= 2 and all(len(x) * 7.2 <= 380 for x in lines)


def test_line_chart_labels_ticks_markers_and_styles():
    svg = line_chart("<b>t</b>", [0, 1, 2, 3], {"a<": [1.0, 2.0, float("nan"), 3.0], "b": [1.0, 2.0, 2.5, 3.0]},
                     "tokens")
    assert "<b>" not in svg and "&lt;b&gt;" in svg and "a&lt;" in svg
    xt = re.findall(r'class="tick xtick"[^>]*>([^<]*)<', svg)
    yt = [float(v) for v in re.findall(r'class="tick ytick"[^>]*>([^<]*)<', svg)]
    assert xt == ["0", "1", "2", "3"]  # every step labelled
    assert yt == [0, 1, 2, 3]
    assert ">step<" in svg and ">tokens<" in svg  # axis labels
    # series a: a line over steps 0-1 and a lone marker at 3; b: one dashed line; distinct markers
    a = re.search(r'data-series="a&lt;">(.*?)</g>', svg).group(1)
    b = re.search(r'data-series="b">(.*?)</g>', svg).group(1)
    assert a.count("<polyline") == 1 and a.count("<circle") == 3
    assert b.count("<polyline") == 1 and b.count("<rect") == 4 and 'stroke-dasharray="6 3"' in b
    assert "step 3: 3" in a  # point tooltips
    assert line_chart("empty", [0, 1], {"a": [float("nan")] * 2}, "x") == ""


def test_many_steps_get_round_integer_ticks():
    steps = list(range(0, 40))
    svg = line_chart("t", steps, {"a": [float(i) for i in steps]}, "y")
    xt = [int(v) for v in re.findall(r'class="tick xtick"[^>]*>([^<]*)<', svg)]
    assert 3 <= len(xt) <= 12 and xt[0] == 0 and all(v % 5 == 0 for v in xt)


def test_stacked_bars():
    svg = stacked_bar_chart("kept", [0, 1, 2], {"kept": [3, 2, 4], "dropped": [1, 2, float("nan")]}, "groups")
    yt = [float(v) for v in re.findall(r'class="tick ytick"[^>]*>([^<]*)<', svg)]
    assert yt[0] == 0 and yt[-1] >= 4 and all(v == int(v) for v in yt)
    assert svg.count("<rect") == 5 + 2  # five bars and two legend swatches
    assert stacked_bar_chart("none", [0, 1], {"a": [0, 0]}, "g") == ""


def test_report_without_audits(store):
    s, _, _ = store
    page = build_report(s)
    assert page.startswith("<!DOCTYPE html>") and "<script" not in page.lower()
    assert _external_refs(page) == []
    assert 'id="no-audits"' in page
    assert 'data-detector="length_inflation"' in page and "ShorterBetter" in page
    assert page.count("<svg") >= 8
    for bucket in ("best", "worst", "truncated"):
        assert f'id="bucket-{bucket}"' in page
    assert 'id="bucket-most-masked"' not in page  # needs audits
    # the malicious completion is shown, escaped
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in page
    assert "<img" not in page.lower()


def test_report_with_audits_highlights_spans(store):
    s, rows, evil = store
    start = EVIL.index("First")
    end = EVIL.index("Wait")
    s.upsert_audits([audit(evil, [(start, end, "corrected_mistake")], ter=0.4),
                     audit(next(r for r in rows if r.run_id == "healthy"), [], status="discarded")])
    page = build_report(s, run="healthy")
    assert 'id="ross-status"' in page and 'id="ross-categories"' in page and 'id="no-audits"' not in page
    assert 'id="bucket-most-masked"' in page
    masked = page[page.index('id="bucket-most-masked"'):page.index('id="table"')]
    assert evil.rollout_id in masked
    m = re.search(r'<span class="seg-excluded" data-category="corrected_mistake"[^>]*>([^<]*)</span>', page)
    assert m and m.group(1) == "First 2+2=5. "
    assert '<span class="seg-supervised" title="supervised">&lt;script&gt;' in page
    assert "wrong final answer" in page  # discard reason table
    assert _external_refs(page) == [] and "<script" not in page.lower()
    # --run restricts the report to one run
    assert 'data-detector="length_inflation"' not in page


def test_category_colours_cover_the_taxonomy():
    assert set(CATEGORY_COLOURS) == set(EXCLUSION_CATEGORIES)


def test_write_report_refuses_overwrite_and_unknown_run(store, tmp_path):
    s, _, _ = store
    out = write_report(s, tmp_path / "r.html")
    assert out.read_text().startswith("<!DOCTYPE html>")
    with pytest.raises(FileExistsError, match="--force"):
        write_report(s, out)
    with pytest.raises(ValueError, match="runs in the store"):
        write_report(s, tmp_path / "x.html", run="nope")
    assert not (tmp_path / "x.html").exists()


def test_cli_report(store, tmp_path):
    s, _, _ = store
    out = tmp_path / "cli.html"
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("detectors:\n  length_inflation:\n    enabled: false\n")
    res = CliRunner().invoke(app, ["report", str(s.path), "--out", str(out), "--config", str(cfg)])
    assert res.exit_code == 0, res.output
    assert str(out.resolve()) in res.output and out.exists()
    assert 'data-detector="length_inflation"' not in out.read_text()
    bad = tmp_path / "bad.yaml"
    bad.write_text("detectors:\n  length_inflaton: {}\n")
    res = CliRunner().invoke(app, ["report", str(s.path), "--out", str(tmp_path / "b.html"), "--config", str(bad)])
    assert res.exit_code != 0 and not (tmp_path / "b.html").exists()
    res = CliRunner().invoke(app, ["report", str(tmp_path / "nostore"), "--out", str(tmp_path / "c.html")])
    assert res.exit_code == 2 and "no gfcr store" in res.output


def test_demo_stage_writes_report_and_prints_path(store, tmp_path):
    from gfcr.demo import Demo, stage_report

    s, _, _ = store
    printed: list[str] = []
    d = Demo(cfg=None, full=False, store_path=s.path, run_dir=tmp_path / "run")
    stage_report(d, printed.append)
    path = d.outputs["report"]
    assert path.exists() and path.read_text().startswith("<!DOCTYPE html>")
    assert str(path.resolve()) in printed[-1]


def test_cli_report_computes_the_metrics_once(tmp_path, monkeypatch):
    """`gfcr report` used to compute step_metrics twice (once for the page, once for the printout)."""
    import gfcr.diagnose.metrics as M
    import gfcr.diagnose.report as R

    store = RolloutStore.open(tmp_path / "s", create=True)
    store.append(simulate_run("length_inflation"))
    calls = []
    real = M.step_metrics

    def counting(*a, **kw):
        calls.append(1)
        return real(*a, **kw)

    monkeypatch.setattr(M, "step_metrics", counting)
    monkeypatch.setattr(R, "step_metrics", counting)
    res = CliRunner().invoke(app, ["report", str(store.path), "--out", str(tmp_path / "r.html")])
    assert res.exit_code == 0, res.output
    assert "Length inflation" in res.output and len(calls) == 1
