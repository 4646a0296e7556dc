"""Every view of a ROSS audit names its judge, and by default shows the ROSS judge, never the
``keep-all`` control (issue 45, item 1): a store of the demo's shape (4 steps, 8 ``arith-steps``
audits with exclusions on steps 0-1, 8 ``keep-all`` audits of the same rollouts — a tie, as the demo's 6-6); the
report and the viewer agree with the ROSS analysis (:func:`gfcr.ross.analyze.ter_by_step`)."""

from __future__ import annotations

import re

import numpy as np
import pytest
from diag_helpers import rollout
from fastapi.testclient import TestClient

from gfcr.diagnose.audits import resolve_judge, ter_by_step
from gfcr.diagnose.metrics import MetricsConfig, step_metrics
from gfcr.diagnose.report import build_report
from gfcr.diagnose.viewer import create_app
from gfcr.records import Audit, Span
from gfcr.ross.analyze import ter_by_step as ross_ter_by_step
from gfcr.store import RolloutStore
from gfcr.store.stepstats import choose_judge

TEXT = "Let me see: 3 + 4 = 8? No, that is wrong; 3 + 4 = 7. Answer: 7"


@pytest.fixture
def demo_store(tmp_path):
    """Rollouts over 4 steps; on steps 0-1 the arith-steps judge excludes characters 11-45 of the
    passing rollouts (a varying share of their tokens), on steps 2-3 nothing; keep-all keeps all."""
    store = RolloutStore.open(tmp_path / "s", create=True)
    rows, audits = [], []
    for step in range(4):
        for i in range(3):
            r = rollout("demo", step, f"p{i}", 1.0 if i < 2 else 0.0, gen_len=12 + 4 * i + step, verified=i < 2,
                        text=TEXT, sample_index=i, rollout_id=f"r{step}{i}")
            rows.append(r)
            if i == 2:
                continue
            role = np.asarray(r.token_role)
            full = (role == 1).astype(np.uint8)
            judged = full.copy()
            spans = []
            if step < 2:
                gen = np.nonzero(role == 1)[0]
                judged[gen[1: 1 + 3 + 2 * i + step]] = 0
                spans = [Span(11, 45, "corrected_mistake")]
            ter = float((judged[role == 1] == 0).mean())
            audits.append(Audit(rollout_id=r.rollout_id, judge="arith-steps", judge_version="1", status="kept",
                                mask=judged, excluded=spans, ter=ter))
            audits.append(Audit(rollout_id=r.rollout_id, judge="keep-all", judge_version="1", status="kept",
                                mask=full, excluded=[], ter=0.0))
    store.append(rows)
    store.upsert_audits(audits)
    return store


def test_choose_judge_prefers_a_judge_over_the_control():
    assert choose_judge({"keep-all": 6, "arith-steps": 6}) == "arith-steps"
    assert choose_judge({"keep-all": 60, "arith-steps": 6}) == "arith-steps"
    assert choose_judge({"keep-all": 9}) == "keep-all"
    assert choose_judge({"b": 3, "a": 3, "keep-all": 10}) == "a"
    assert choose_judge({"b": 4, "a": 3}) == "b"
    assert choose_judge({}) is None


def test_metrics_and_analysis_read_the_ross_judge(demo_store):
    ross = {r["step"]: r["ter"] for r in ross_ter_by_step(demo_store, "arith-steps")}
    assert ross[0] > 0.1 and ross[1] > 0.1 and ross[2] == ross[3] == 0.0
    mine = {r["step"]: r["ter"] for r in ter_by_step(demo_store, "arith-steps")}
    assert mine == pytest.approx(ross, abs=1e-12)
    ter = step_metrics(demo_store, config=MetricsConfig()).column("ter_mean").to_pylist()
    assert ter[0] > 0.1 and ter[1] > 0.1, ter  # the keep-all control would give 0 at every step
    with pytest.raises(ValueError, match="no audits by judge 'llm'.*arith-steps \\(8\\), keep-all \\(8\\)"):
        resolve_judge(demo_store, "llm")


def _report_ter(html: str) -> dict[int, float]:
    return {int(s): float(t) for s, t in re.findall(r'data-step="(\d+)">.*?<td class="ter">([0-9.e-]+)</td>', html)}


def test_report_shows_the_ross_judge_and_agrees_with_the_analysis(demo_store):
    html = build_report(demo_store, health=None)
    ross = {r["step"]: r["ter"] for r in ross_ter_by_step(demo_store, "arith-steps")}
    got = _report_ter(html)
    assert got.keys() == ross.keys() and all(abs(got[s] - ross[s]) < 5e-3 for s in ross), (got, ross)  # 3 digits
    assert 'data-judge="arith-steps"' in html and "ROSS audits (arith-steps): TER over steps" in html
    assert "keep-all (8, the control)" in html
    masked = html.split('id="bucket-most-masked"')[1].split("<h3")[0]
    assert masked.count('class="card"') == 3 and "audit arith-steps@1: <b>kept</b>" in masked
    assert "keep-all@1" not in masked
    # the user picks the control: every view says so
    html_c = build_report(demo_store, health=None, judge="keep-all")
    assert 'data-judge="keep-all"' in html_c and set(_report_ter(html_c).values()) == {0.0}
    best = html_c.split('id="bucket-best"')[1].split("<h3")[0]
    assert "audit keep-all@1" in best and "arith-steps@1" not in best


def test_report_cli_judge_option(demo_store, tmp_path):
    from typer.testing import CliRunner

    from gfcr.cli import app

    res = CliRunner().invoke(app, ["report", str(demo_store.path), "--out", str(tmp_path / "r.html"), "--judge", "llm"])
    assert res.exit_code == 2 and "no audits by judge 'llm'" in res.output
    res = CliRunner().invoke(app, ["report", str(demo_store.path), "--out", str(tmp_path / "r.html"), "--judge", "keep-all"])
    assert res.exit_code == 0, res.output
    assert 'data-judge="keep-all"' in (tmp_path / "r.html").read_text()


def test_viewer_shows_the_ross_judge_and_agrees_with_the_analysis(demo_store):
    c = TestClient(create_app(demo_store.path))
    s = c.get("/api/summary").json()
    assert s["default_judge"] == "arith-steps"
    assert {j["judge"]: j["control"] for j in s["judges"]} == {"arith-steps": False, "keep-all": True}
    ross = {r["step"]: r["ter"] for r in ross_ter_by_step(demo_store, "arith-steps")}
    got = c.get("/api/ross").json()
    assert got["judge"] == "arith-steps"
    assert {r["step"]: r["ter"] for r in got["ter_by_step"]} == pytest.approx(ross, abs=1e-12)
    d = c.get("/api/rollouts/r01").json()
    assert d["judge"] == "arith-steps" and d["audit"]["judge"] == "arith-steps"
    want = demo_store.audits(judge="arith-steps", rollout_ids=["r01"]).column("mask").to_pylist()[0]
    assert d["overlays"]["ross_mask"] == want and 0 in want[4:]
    assert d["overlays"]["notes"]["ross_mask"] == "audit arith-steps@1"
    assert [s for s in d["audit"]["segments"] if s["kind"] == "excluded"][0]["start"] == 11
    k = c.get("/api/rollouts/r01?judge=keep-all").json()
    assert k["judge"] == "keep-all" and k["overlays"]["notes"]["ross_mask"] == "audit keep-all@1"
    assert 0 not in k["overlays"]["ross_mask"][4:]
    assert c.get("/api/rollouts/r01?judge=llm").status_code == 400
    n = c.get("/api/rollouts/r02").json()  # a failing rollout: no audit by the judge
    assert n["audit"] is None and n["overlays"]["notes"]["ross_mask"] == "no ROSS audit by the shown judge"
