"""The viewer's paged list (issue 27, item 4): a per-step index plans each page; pages equal the
full sort on every offset, also when a step's rows are scattered; an append is seen."""

from __future__ import annotations

import pyarrow.compute as pc
import pytest
from diag_helpers import group
from fastapi.testclient import TestClient

from gfcr.diagnose.paging import SORT_KEYS, plan_page, read_page, select_steps, step_index
from gfcr.diagnose.viewer import LIST_COLUMNS, create_app


def test_plan_page_hand_worked():
    assert plan_page([3, 2, 4], 2, 4) == [(0, 2, 1), (1, 0, 2), (2, 0, 1)]
    assert plan_page([3, 2, 4], 0, 3) == [(0, 0, 3)]
    assert plan_page([3, 2, 4], 3, 2) == [(1, 0, 2)]
    assert plan_page([3, 2, 4], 9, 5) == [] and plan_page([], 0, 5) == []


@pytest.fixture
def scattered(store):
    """Steps appended out of order and a step split across appends far apart (run A step 0)."""
    store.append(group("A", 0, "p1", [1.0, 0.0, 1.0]) + group("B", 0, "p1", [0.0]))
    for t in (2, 1, 3):
        store.append(group("A", t, "p2", [0.0, 1.0]) + group("A", t, "p0", [1.0]))
    for t in range(4, 12):
        store.append(group("A", t, "p3", [0.5] * 4))
    store.append(group("A", 0, "p0", [0.5, 0.5]))  # step 0 again, 40 rows after its first rows
    return store


def test_step_index_hand_worked(scattered):
    idx = step_index(scattered.dataset("rollouts")).to_pylist()
    assert [(r["run_id"], r["step"], r["n"]) for r in idx][:3] == [("A", 0, 5), ("A", 1, 3), ("A", 2, 3)]
    a0 = idx[0]
    assert (a0["lo"], a0["hi"]) == (0, scattered.count() - 1)  # first and last rows of the store
    assert sum(r["n"] for r in idx) == scattered.count()


def test_every_page_equals_the_full_sort(scattered):
    ds = scattered.dataset("rollouts")
    full = scattered.scan(columns=LIST_COLUMNS)
    full = full.take(pc.sort_indices(full, sort_keys=SORT_KEYS)).column("rollout_id").to_pylist()
    index = step_index(ds)
    sel = select_steps(index, None, None, None)
    for limit in (1, 3, 7):
        for offset in range(0, len(full) + 2):
            got = read_page(ds, sel, offset, limit, LIST_COLUMNS).column("rollout_id").to_pylist()
            assert got == full[offset:offset + limit], (offset, limit)
    a = select_steps(index, "A", 1, 5)
    assert int(pc.sum(a.column("n")).as_py()) == scattered.count(where="run_id = 'A' AND step >= 1 AND step <= 5")


def test_viewer_list_sees_appends_and_keeps_order(scattered):
    client = TestClient(create_app(scattered.path))
    first = client.get("/api/rollouts", params={"limit": 200}).json()
    assert first["total"] == scattered.count()
    keys = [(i["run_id"], i["step"], i["prompt_id"], i["sample_index"], i["rollout_id"]) for i in first["items"]]
    assert keys == sorted(keys)
    scattered.append(group("C", 0, "p9", [1.0, 1.0]))
    after = client.get("/api/rollouts", params={"run": "C"}).json()
    assert after["total"] == 2 and {i["run_id"] for i in after["items"]} == {"C"}
    s = client.get("/api/summary").json()
    assert {r["run_id"]: r["rollouts"] for r in s["runs"]}["C"] == 2
