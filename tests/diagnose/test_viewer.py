"""Viewer JSON API: filters, paging, 404s, no path traversal, read-only, security headers."""

from __future__ import annotations

import numpy as np
import pytest
from diag_helpers import audit, group, rollout
from fastapi.testclient import TestClient

from gfcr.diagnose.viewer import create_app, role_runs
from gfcr.store import RolloutStore, StoreError

EVIL = "<script>alert(1)</script> wrong turn. Answer: 4"


@pytest.fixture(scope="module")
def viewer(tmp_path_factory):
    store = RolloutStore.open(tmp_path_factory.mktemp("v") / "store", create=True)
    rows = []
    for step in range(3):
        rows += group("A", step, "p1", [1.0, 0.0, 1.0], [True, False, True])
        rows += group("A", step, "p2", [0.0, 0.0], [False, False], finish="length")
    rows += group("B", 0, "p1", [0.5], [None])
    evil = rollout("B", 1, "p3", 1.0, verified=True, text=EVIL, rollout_id="evil-1")
    rows.append(evil)
    store.append(rows)
    store.upsert_audits([audit(evil, [(EVIL.index("wrong"), EVIL.index("Answer"), "abandoned_attempt")], ter=0.3)])
    before = store.version
    client = TestClient(create_app(store.path))
    yield client, store, rows
    assert store.version == before  # nothing the tests did wrote to the store


def test_role_runs_hand_worked():
    assert role_runs([0, 0, 1, 1, 1, 0]) == [{"role": 0, "start": 0, "end": 2}, {"role": 1, "start": 2, "end": 5},
                                              {"role": 0, "start": 5, "end": 6}]


def test_summary(viewer):
    client, _, _ = viewer
    s = client.get("/api/summary").json()
    assert {r["run_id"]: r["rollouts"] for r in s["runs"]} == {"A": 15, "B": 2}
    assert s["judges"] == [{"judge": "rule", "n": 1, "control": False}] and s["default_judge"] == "rule"


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ({}, 17),
        ({"run": "A"}, 15),
        ({"run": "A", "step_min": 1}, 10),
        ({"run": "A", "step_min": 1, "step_max": 1}, 5),
        ({"reward_min": 0.5}, 8),
        ({"reward_min": 0.25, "reward_max": 0.75}, 1),
        ({"verified": "true"}, 7),
        ({"verified": "false"}, 9),
        ({"prompt": "p2"}, 6),
        ({"finish": "length"}, 6),
        ({"run": "A", "prompt": "p1", "verified": "false"}, 3),
        ({"prompt": "nope' OR '1'='1"}, 0),
        ({"run": "nope' OR '1'='1"}, 0),
    ],
)
def test_filters(viewer, params, expected):
    client, _, _ = viewer
    r = client.get("/api/rollouts", params=params)
    assert r.status_code == 200, r.text
    assert r.json()["total"] == expected


def test_paging_is_stable_and_complete(viewer):
    client, _, rows = viewer
    seen = []
    for offset in range(0, 17, 5):
        page = client.get("/api/rollouts", params={"offset": offset, "limit": 5}).json()
        assert page["total"] == 17 and len(page["items"]) == min(5, 17 - offset)
        seen += [i["rollout_id"] for i in page["items"]]
    assert sorted(seen) == sorted(r.rollout_id for r in rows) and len(set(seen)) == 17
    keys = [(i["run_id"], i["step"]) for i in client.get("/api/rollouts", params={"limit": 200}).json()["items"]]
    assert keys == sorted(keys)
    assert {i["gen_tokens"] for i in client.get("/api/rollouts", params={"limit": 200}).json()["items"]} == {10}
    assert client.get("/api/rollouts", params={"offset": 100}).json()["items"] == []


@pytest.mark.parametrize("params", [{"limit": 0}, {"limit": 201}, {"offset": -1}, {"finish": "bogus"},
                                    {"reward_min": "abc"}, {"step_min": -2}, {"verified": "maybe"}])
def test_bad_params_are_rejected(viewer, params):
    client, _, _ = viewer
    assert client.get("/api/rollouts", params=params).status_code == 400


def test_detail_with_audit_segments(viewer):
    client, _, _ = viewer
    d = client.get("/api/rollouts/evil-1").json()
    assert d["assistant_text"] == EVIL and d["n_context"] == 4 and d["n_generated"] == 10
    assert d["verifier"]["name"] == "exact"
    assert [t["role"] for t in d["tokens"]] == [0] * 4 + [1] * 10 and d["decoded"] is False
    (a,) = d["audits"]
    kinds = [(s["kind"], s["category"], s["text"]) for s in a["segments"]]
    assert kinds == [("supervised", None, "<script>alert(1)</script> "),
                     ("excluded", "abandoned_attempt", "wrong turn. "),
                     ("supervised", None, "Answer: 4")]
    assert a["supervised_tokens"] == 10


def test_unknown_ids_and_paths_are_404(viewer):
    client, _, _ = viewer
    assert client.get("/api/rollouts/does-not-exist").status_code == 404
    assert client.get("/api/rollouts/x' OR '1'='1").status_code == 404
    assert client.get("/static/nope.js").status_code == 404
    for path in ["/static/../viewer.py", "/static/..%2fviewer.py", "/static/%2e%2e/%2e%2e/config.py",
                 "/static/..%2F..%2F..%2Fpyproject.toml", "/../../etc/passwd", "/static//etc/passwd",
                 "/static/..\\viewer.py"]:
        r = client.get(path)
        assert r.status_code == 404, path
        assert "import" not in r.text and "root:" not in r.text


def test_static_and_headers_and_read_only(viewer):
    client, _, _ = viewer
    r = client.get("/")
    assert r.status_code == 200 and "gfcr viewer" in r.text
    assert "script-src 'self'" in r.headers["content-security-policy"]
    assert r.headers["x-content-type-options"] == "nosniff"
    assert client.get("/static/app.js").headers["content-type"].startswith("text/javascript")
    assert "innerHTML" not in client.get("/static/app.js").text
    for method in ("post", "put", "delete", "patch"):
        assert getattr(client, method)("/api/rollouts/evil-1").status_code == 405


def test_refuses_a_path_that_is_not_a_store(tmp_path):
    with pytest.raises(StoreError, match="no gfcr store"):
        create_app(tmp_path / "missing")


def test_list_has_prompt_text_and_detail_has_siblings(viewer):
    client, _, rows = viewer
    items = client.get("/api/rollouts", params={"run": "A", "step_max": 0}).json()["items"]
    assert {i["prompt_text"] for i in items} == {"What is p1?", "What is p2?"}
    target = next(r for r in rows if r.run_id == "A" and r.step == 1 and r.prompt_id == "p1" and r.sample_index == 1)
    d = client.get(f"/api/rollouts/{target.rollout_id}").json()
    assert [(s["sample_index"], s["reward"], s["verified"]) for s in d["siblings"]] == [(0, 1.0, True), (1, 0.0, False),
                                                                                         (2, 1.0, True)]
    assert target.rollout_id in {s["rollout_id"] for s in d["siblings"]}
    s = client.get("/api/summary").json()
    assert s["tokenizer"]["source"] == "none" and "records no model" in s["tokenizer"]["note"]
    assert d["decoded"] is False and d["tokenizer"]["source"] == "none"


def test_tokens_decoded_with_the_stores_model(tmp_path):
    from gfcr.diagnose.viewer import prompt_text
    from gfcr.generate.engines.base import SamplingParams
    from gfcr.store.provenance import recorded_model as store_model
    from gfcr.testing import tiny_tokenizer

    tok = tiny_tokenizer()
    tok.save_pretrained(str(tmp_path / "tok"))
    ids = tok("Answer: 19", add_special_tokens=False)["input_ids"]

    class Engine:  # what the engines expose: the record names the model its tokenizer loads from
        name, model_name = "hf", str(tmp_path / "tok")

    rec = SamplingParams(temperature=0.5).to_record(Engine())
    assert rec["engine"] == "hf" and rec["model"] == str(tmp_path / "tok")
    store = RolloutStore.open(tmp_path / "s", create=True)
    r = rollout("A", 0, "p", 1.0, gen_len=len(ids), prompt_len=0)
    r.token_ids = np.asarray(ids, np.int32)
    r.sampling = rec
    store.append([r])
    assert store_model(store) == str(tmp_path / "tok")
    client = TestClient(create_app(store.path))
    d = client.get(f"/api/rollouts/{r.rollout_id}").json()
    assert d["decoded"] is True and "".join(t["text"] for t in d["tokens"]) == "Answer: 19"
    assert client.get("/api/summary").json()["tokenizer"]["source"] == "store"
    # a recorded model that is not on this machine: ids, and the reason
    r2 = rollout("A", 0, "p", 1.0)
    r2.sampling = {"engine": "hf", "model": str(tmp_path / "gone")}
    store2 = RolloutStore.open(tmp_path / "s2", create=True)
    store2.append([r2])
    info = TestClient(create_app(store2.path)).get("/api/summary").json()["tokenizer"]
    assert info["source"] == "none" and "gone" in info["note"] and "--tokenizer" in info["note"]
    assert prompt_text([{"role": "system", "content": "sys"}, {"role": "user", "content": " a\n b "}]) == "a b"
