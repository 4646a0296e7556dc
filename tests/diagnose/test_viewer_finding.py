"""The viewer's search through the store's text index, its histograms (a bar is a filter) and its
lineage route (issue 45), through the JSON API."""

from __future__ import annotations

import pytest
from diag_helpers import rollout
from fastapi.testclient import TestClient

from gfcr.diagnose.viewer import create_app
from gfcr.records import Message
from gfcr.store import RolloutStore
from gfcr.testing import make_rollout


def _rows(lo, hi, run="A"):
    out = []
    for i in range(lo, hi):
        text = "The Zebra crossed." if i % 5 == 3 else f"answer {i}"
        r = rollout(run, i % 3, f"p{i}", reward=round((i % 10) / 10, 1), gen_len=5 + i % 7, text=text,
                    sample_index=0, rollout_id=f"{run}{i:03d}")
        if i % 11 == 5:
            r.messages = [Message("user", "Find the ZEBRA"), Message("assistant", "zebras? no")]
        out.append(r)
    return out


def _get(c, path, **params):
    r = c.get(path, params=params)
    assert r.status_code == 200, r.text
    return r.json()


def _ids(c, **params):
    d = _get(c, "/api/rollouts", limit=200, **params)
    return d["total"], [r["rollout_id"] for r in d["items"]], d["search"]


@pytest.fixture()
def store(tmp_path):
    st = RolloutStore.open(tmp_path / "st", create=True)
    st.append(_rows(0, 40))
    return st


def test_search_uses_the_text_index_and_answers_as_the_scan(store):
    c = TestClient(create_app(store.path))
    queries = [dict(q="zebra"), dict(q="ZEBRA crossed", run="A"), dict(q="zebra", step_min=1, step_max=1),
               dict(q="zebra", sort="reward", order="desc"), dict(q="answer 7"), dict(q="zebra", gen_min=8),
               dict(q="zebra", reward_min=0.3, reward_max=0.5)]
    before = [_ids(c, **q) for q in queries]
    assert all(s == "scan" for _, _, s in before)
    assert before[0][0] == 8 + 4 - 1  # i % 5 == 3 (8 rows) and i % 11 == 5 (5, 16, 27, 38; 38 is both)
    store.index_text()
    after = [_ids(c, **q) for q in queries]  # the viewer sees the new version at the next request
    assert all(s == "index" for _, _, s in after)
    assert [a[:2] for a in after] == [b[:2] for b in before]
    store.append(_rows(40, 60))  # appended after the index: still found (Lance searches them unindexed)
    total, ids, how = _ids(c, q="zebra")
    assert how == "index" and "A043" in ids and total == 11 + 4 + 1  # 43, 48, 53, 58 and 49 (i % 11 == 5)
    assert _ids(c, q="+")[2] == "scan"  # no word: a substring test, by a scan


def test_a_histogram_bar_lists_exactly_its_rollouts(store):
    c = TestClient(create_app(store.path))
    for field, lo, hi in (("reward", "reward_min", "reward_max"), ("gen", "gen_min", "gen_max")):
        for filters in ({}, {"run": "A", "step_min": 1}, {"q": "zebra"}):
            h = _get(c, "/api/histogram", field=field, bins=4, **filters)
            assert sum(b["count"] for b in h["bars"]) == h["n"] == _ids(c, **filters)[0]
            for b in h["bars"]:
                if b["count"]:  # the click's filter: the bar's smallest and largest value, inclusive
                    assert _ids(c, **filters, **{lo: b["min"], hi: b["max"]})[0] == b["count"], (field, filters, b)
    h = _get(c, "/api/histogram", field="gen", bins=20)
    assert h["integer"] and [b["lo"] for b in h["bars"]] == list(range(5, 12))  # gen_len 5..11, width 1
    assert [b["count"] for b in h["bars"]] == [6, 6, 6, 6, 6, 5, 5]
    assert c.get("/api/histogram", params={"field": "cost"}).status_code == 400


def test_lineage_route(tmp_path):
    st = RolloutStore.open(tmp_path / "st", create=True)
    st.append([
        make_rollout(0, step=0, rollout_id="a", meta={"trained": True, "replayed_at_step": [1, 3]}),
        make_rollout(1, step=0, rollout_id="b", meta={"trained": False}),
        make_rollout(2, step=1, rollout_id="c", meta={"trained": True}),
        make_rollout(3, step=1, rollout_id="copy", signals={"replayed": 1.0}, meta={}),
        make_rollout(4, step=1, rollout_id="imported", meta={}),
    ])
    c = TestClient(create_app(st.path))
    d = _get(c, "/api/lineage", run="run-a", step=1)
    assert [u["rollout_id"] for u in d["used"]] == ["a", "c", "copy"]
    assert d["used"][0]["trained_at"] == [0, 1] and d["used"][0]["fresh"] and d["used"][0]["replayed"] == [1]
    assert d["per_step"] == [{"step": 0, "fresh": 1, "replayed": 0}, {"step": 1, "fresh": 1, "replayed": 2}]
    assert (d["n_used"], d["fresh_uses"], d["replayed_uses"], d["unknown"], d["truncated"]) == (3, 2, 2, 1, False)
    assert _get(c, "/api/lineage", run="run-a", step=1, limit=1)["truncated"] is True
    r = c.get("/api/lineage", params={"run": "run-z", "step": 1})
    assert r.status_code == 400 and "no run 'run-z'" in r.json()["detail"]
    assert c.get("/api/lineage", params={"run": "run-a"}).status_code == 400
