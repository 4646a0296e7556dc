"""The viewer's compare table (issue 45): two runs paired per prompt, through the JSON API and in
headless Chromium (a click on a prompt lists it)."""

from __future__ import annotations

import pytest
from diag_helpers import rollout
from fastapi.testclient import TestClient

from gfcr.diagnose.paired import paired_prompts
from gfcr.diagnose.viewer import create_app
from gfcr.evaluate.paired import paired_bootstrap
from gfcr.store import RolloutStore

# run-a verified on p1 2/2, p2 0/2, p3 1/2; run-b on p1 1/2, p2 0/2, p3 2/2; p4 only in run-a
VERDICTS = {"run-a": {"p1": [1, 1], "p2": [0, 0], "p3": [1, 0], "p4": [1, 1]},
            "run-b": {"p1": [1, 0], "p2": [0, 0], "p3": [1, 1]}}


@pytest.fixture
def paired_store(tmp_path):
    store = RolloutStore.open(tmp_path / "store", create=True)
    rows = [rollout(run, 0, p, reward=float(v), verified=bool(v), rollout_id=f"{run}-{p}-{i}")
            for run, per in VERDICTS.items() for p, vs in per.items() for i, v in enumerate(vs)]
    store.append(rows)
    return store


def test_paired_prompts_by_hand(paired_store):
    d = paired_prompts(paired_store, "run-a", "run-b")
    assert d["n"] == 3  # p4 is in one run only
    assert [(r["prompt_id"], r["a"], r["b"], r["diff"]) for r in d["rows"]] == [
        ("p1", [2, 2], [1, 2], 0.5), ("p3", [1, 2], [2, 2], -0.5), ("p2", [0, 2], [0, 2], 0.0)]
    ref = paired_bootstrap([1.0, 0.0, 0.5], [0.5, 0.0, 1.0], n_boot=1000, seed=0)
    assert d["diff"] == pytest.approx(0.0) and d["ci"] == [ref.ci_low, ref.ci_high] and d["p_value"] == ref.p_value
    assert (d["a_better"], d["b_better"]) == (1, 1)
    none = paired_prompts(paired_store, "run-a", "run-z")
    assert none["n"] == 0 and none["rows"] == [] and "share no prompt" in none["note"]
    with pytest.raises(ValueError, match="two different runs"):
        paired_prompts(paired_store, "run-a", "run-a")


def test_paired_api(paired_store):
    client = TestClient(create_app(paired_store.path))
    r = client.get("/api/paired", params={"a": "run-a", "b": "run-b"})
    assert r.status_code == 200 and r.json()["n"] == 3 and r.json()["rows"][0]["prompt_id"] == "p1"
    assert client.get("/api/paired", params={"a": "run-a"}).status_code == 400
    bad = client.get("/api/paired", params={"a": "run-a", "b": "run-a"})
    assert bad.status_code == 400 and "two different runs" in bad.json()["detail"]
