"""The viewer list finds things (issue 45, part 2): text search over prompts and completions,
sort on any column, length / task / audit-status filters, all through the JSON API."""

from __future__ import annotations

import pyarrow as pa
import pytest
from diag_helpers import audit, rollout
from fastapi.testclient import TestClient

from gfcr.diagnose.listing import gen_counts, text_match
from gfcr.diagnose.viewer import create_app
from gfcr.records import Message
from gfcr.store import RolloutStore


def test_gen_counts_and_text_match_hand_worked():
    roles = pa.array([[0, 1, 1], [0], []], pa.list_(pa.uint8()))
    assert gen_counts(roles).tolist() == [2, 0, 0]
    from gfcr.records.schema import MESSAGE_TYPE

    msgs = pa.array([[{"role": "user", "content": "What is 3+4?"}, {"role": "assistant", "content": "7"}],
                     [{"role": "user", "content": "2*5?"}, {"role": "assistant", "content": "ten"}], []],
                    pa.list_(MESSAGE_TYPE))
    assert text_match(msgs, "TEN").tolist() == [False, True, False]
    assert text_match(msgs, "3+4").tolist() == [True, False, False]
    assert text_match(msgs, "zebra").tolist() == [False, False, False]


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    store = RolloutStore.open(tmp_path_factory.mktemp("v") / "st", create=True)
    rows = []
    for i in range(12):
        r = rollout("A" if i < 8 else "B", i % 3, f"p{i}", reward=i / 10, gen_len=5 + i, verified=i % 2 == 0,
                    text="The Zebra crossed." if i in (3, 9) else f"answer {i}", sample_index=0, rollout_id=f"r{i:02d}")
        r.task = "code" if i in (1, 2) else "arith"
        if i == 5:
            r.messages = [Message("user", "Find the ZEBRA"), Message("assistant", "no")]
        rows.append(r)
    store.append(rows)
    store.upsert_audits([audit(rows[0], [], status="kept"), audit(rows[4], [], status="discarded")])
    return TestClient(create_app(store.path))


def _ids(c, **params):
    d = c.get("/api/rollouts", params=params).json()
    return d["total"], [r["rollout_id"] for r in d["items"]]


def test_search_finds_prompts_and_completions_case_insensitively(client):
    assert _ids(client, q="zebra") == (3, ["r03", "r05", "r09"])
    assert _ids(client, q="zebra", run="A") == (2, ["r03", "r05"])
    assert _ids(client, q="Zebra crossed", limit=1, offset=1) == (2, ["r09"])
    assert _ids(client, q="nothing like this") == (0, [])


def test_sort_on_columns_both_ways(client):
    total, ids = _ids(client, sort="reward", order="desc", limit=3)
    assert total == 12 and ids == ["r11", "r10", "r09"]
    assert _ids(client, sort="gen", order="asc", limit=2)[1] == ["r00", "r01"]
    items = client.get("/api/rollouts", params={"sort": "gen", "order": "desc", "limit": 2}).json()["items"]
    assert [r["gen_tokens"] for r in items] == [16, 15]
    assert _ids(client, sort="reward", run="B")[1] == ["r08", "r09", "r10", "r11"]
    assert client.get("/api/rollouts", params={"sort": "nope"}).status_code == 400
    assert client.get("/api/rollouts", params={"order": "up"}).status_code == 400


def test_length_task_and_audit_filters(client):
    assert _ids(client, gen_min=14, gen_max=15) == (2, ["r09", "r10"])
    assert _ids(client, task="code") == (2, ["r01", "r02"])
    assert _ids(client, audit="kept") == (1, ["r00"])
    assert _ids(client, audit="discarded") == (1, ["r04"])
    assert _ids(client, audit="none")[0] == 10
    assert client.get("/api/rollouts", params={"audit": "maybe"}).status_code == 400
    assert client.get("/api/rollouts", params={"audit": "kept", "judge": "llm"}).status_code == 400
