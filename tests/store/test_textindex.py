"""The full-text index over the rollouts' turns (issue 45): the index answers exactly what the scan's
definition answers, on local disk and on S3, after appends (rows not yet indexed are searched by
Lance with the index's own tokenizer), after a compaction, and after an incremental update."""

from __future__ import annotations

import subprocess
import sys

import pytest

from gfcr.diagnose.listing import word_match
from gfcr.records import Message
from gfcr.store import RolloutStore
from gfcr.store.textindex import query_words, search, text_index
from gfcr.testing import make_rollout

TEXTS = ["What is 3+4? Think.", "The Zebra crossed the road", "zebras everywhere", "Über café: résumé",
         "common_word and the answer is 42", "x" + "y" * 60 + " long token", "nothing here at all"]
QUERIES = ["zebra", "ZEBRA crossed", "3 + 4", "the", "über", "uber", "common", "word", "42 answer", "x" + "y" * 60,
           "crossed zebras", "missing", "Think", "café résumé"]


def rows(lo: int, hi: int, run: str = "r", step: int = 0):
    out = []
    for i in range(lo, hi):
        r = make_rollout(i, step=step, run=run, n_ctx=4, n_gen=4, seed=i, rollout_id=f"{run}-{i:03d}")
        r.messages = [Message("user", TEXTS[i % len(TEXTS)]), Message("assistant", f"reply {i} " + TEXTS[(i * 3) % len(TEXTS)])]
        out.append(r)
    return out


def scan_answer(store, q, where=None):
    t = store.scan(columns=["rollout_id", "messages"], where=where)
    return sorted(t.column("rollout_id").filter(word_match(t.column("messages"), q)).to_pylist())


def index_answer(store, q, where=None):
    """The index's answer, the same whether the matches are taken by row id or kept from a scan."""
    ds = store.dataset("rollouts")
    got = [search(ds, q, ["rollout_id", "step"], where, take_share=share) for share in (1.0, 0.0)]
    assert got[0] is not None, "the index was not used"
    taken, kept = (sorted(t.column("rollout_id").to_pylist()) for t in got)
    assert taken == kept and got[0].column_names == ["rollout_id", "step"] == got[1].column_names
    return taken


def test_query_words_hand_worked():
    assert query_words("Zebra crossed, zebra!") == ["zebra", "crossed"]
    assert query_words("3+4?") == ["3", "4"]
    assert query_words("common_word Über") == ["common", "word", "über"]
    assert query_words(" + ") == []


def test_index_answers_as_the_scan_after_appends_compaction_and_update(store_uri):
    store = RolloutStore.open(store_uri, create=True)
    store.append(rows(0, 21))
    assert search(store.dataset("rollouts"), "zebra", ["rollout_id"]) is None  # no index: the caller scans
    assert store.index_text()["action"] == "built"
    ix = text_index(store.dataset("rollouts"))
    assert ix["rows_indexed"] == ix["rows"] == 21
    # hand-worked: whole words, any turn, case-insensitive; "zebras" is not "zebra"
    assert index_answer(store, "ZEBRA") == scan_answer(store, "ZEBRA") == ["r-001", "r-005", "r-008", "r-012", "r-015", "r-019"]
    assert index_answer(store, "3 + 4") == ["r-000", "r-007", "r-014"]

    store.append(rows(21, 35, step=1))  # not indexed: Lance searches these rows without the index
    ix = text_index(store.dataset("rollouts"))
    assert ix["rows_indexed"] == 21 and ix["rows"] == 35
    for q in QUERIES:
        assert index_answer(store, q) == scan_answer(store, q), q
    assert "r-022" in index_answer(store, "zebra")  # a row appended after the index was built
    assert index_answer(store, "zebra", "step = 1") == scan_answer(store, "zebra", "step = 1") != []

    store.compact()
    for q in QUERIES:
        assert index_answer(store, q) == scan_answer(store, q), q

    assert store.index_text()["action"] == "updated"
    ix = text_index(store.dataset("rollouts"))
    assert ix["rows_indexed"] == ix["rows"] == 35
    for q in QUERIES:
        assert index_answer(store, q) == scan_answer(store, q), q
    assert RolloutStore.open(store_uri).count() == 35  # the store opens clean: the index commits were recorded


def test_cli_builds_the_index_and_says_so(tmp_path):
    store = RolloutStore.open(tmp_path / "st", create=True)
    cmd = [sys.executable, "-m", "gfcr", "store", "index", str(tmp_path / "st")]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "holds no rollouts" in out.stdout, out.stderr
    store.append(rows(0, 5))
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "text index built: 5 of 5 rollouts indexed" in " ".join(out.stdout.split())
    assert text_index(store.dataset("rollouts"))["rows_indexed"] == 5
    check = subprocess.run([sys.executable, "-m", "gfcr", "store", "check", str(tmp_path / "st")],
                           capture_output=True, text=True, timeout=120)
    assert check.returncode == 0 and "verified" in check.stdout, check.stdout + check.stderr  # the commit was recorded


@pytest.mark.parametrize("q", ["+", "?"])
def test_a_query_without_words_is_not_asked_of_the_index(tmp_path, q):
    store = RolloutStore.open(tmp_path / "st", create=True)
    store.append(rows(0, 7))
    store.index_text()
    assert search(store.dataset("rollouts"), q, ["rollout_id"]) is None
    assert scan_answer(store, q) == ["r-000"]  # a substring test: only "What is 3+4?" holds + and ?


def test_the_viewer_searches_an_s3_store_through_its_index(s3_env):
    from fastapi.testclient import TestClient
    from tests.store.conftest import s3_uri

    from gfcr.diagnose.viewer import create_app

    uri = s3_uri()
    store = RolloutStore.open(uri, create=True)
    store.append(rows(0, 14))
    store.index_text()
    store.append(rows(14, 21, step=1))
    d = TestClient(create_app(uri)).get("/api/rollouts", params={"q": "zebra", "limit": 200}).json()
    assert d["search"] == "index"
    assert sorted(r["rollout_id"] for r in d["items"]) == scan_answer(store, "zebra") == \
        ["r-001", "r-005", "r-008", "r-012", "r-015", "r-019"]
