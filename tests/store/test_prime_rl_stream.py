"""prime-rl's trace stream (``--from prime-rl-stream``) on fixtures written by prime-rl's own writer
(tests/contracts/gen_prime_rl_stream.py): every value is checked against what prime-rl meant, the
folded annotations against ``expected.json`` (prime-rl's own ``fold_trace_updates``)."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from gfcr.formats import ImportFormatError, follow, import_rollouts
from gfcr.formats import prime_rl_stream as prs
from gfcr.formats._seekable import seek_table

FIX = Path(__file__).resolve().parents[1] / "contracts" / "fixtures"
STREAM = FIX / "prime_rl_stream"
TRACES = Path("monitors/file/traces")


def _expected(layout: str) -> dict:
    return json.loads((STREAM / layout / "expected.json").read_text())


def _over_sampled(exp_trace: dict, branch: int, field: str) -> list | None:
    """What prime-rl's fold left on a branch's nodes, over its sampled tokens (null where a node has none)."""
    out, seen = [], False
    for k in exp_trace["paths"][branch]:
        node = exp_trace["nodes"][k]
        n = len(node["logprobs"] or [])
        if node[field] is not None:
            out.extend(node[field])
            seen = True
        else:
            out.extend([None] * n)
    return out if seen else None


def _by_key(rs) -> dict:
    return {(r.meta["trace"], r.meta["branch"]): r for r in rs}


@pytest.mark.parametrize("layout", ["single", "chunked"])
def test_fields_are_what_prime_rl_meant(store, layout):
    exp = _expected(layout)
    res = import_rollouts(store, "prime-rl-stream", [str(STREAM / layout)], run_id="p")
    assert res.written == 5 and "without traces" in " ".join(res.notes)  # 4 train rollouts + 1 eval, failed episode noted
    got = _by_key(store.rollouts(run="p") + store.rollouts(run="p-eval"))
    assert {t for t, _b in got} == set(exp)
    # the same records through the folder importer (verifiers' own to_record): identical tokens, rewards, steps
    folder = _by_key(import_rollouts(store, "prime-rl", [str(FIX / "prime_rl")], run_id="q").rollouts)
    for (tid, b), r in got.items():
        e, f = exp[tid], folder[(tid, b)]
        assert r.token_ids.tolist() == f.token_ids.tolist() and r.token_role.tolist() == f.token_role.tolist()
        assert r.logprobs.tolist() == f.logprobs.tolist() and r.reward == f.reward and r.step == f.step == 3
        assert r.policy_version == f.policy_version and r.finish_reason == f.finish_reason
        for fld in ("trainer_logprobs", "entropies", "advantages"):  # folded as prime-rl folds them
            assert r.meta[fld] == _over_sampled(e, b, fld), (tid, b, fld)
        assert r.meta["is_masked"] == _over_sampled(e, b, "is_masked")
        adv = (e["info"] or {}).get("advantage")
        if adv is not None:
            assert r.signals["advantage"] == pytest.approx(adv)
        ship = (e["info"] or {}).get("ship")
        assert r.meta["batch_step"] == (ship["step"] if ship else None)  # null when never shipped, not invented
    a = next(r for (t, _b), r in got.items() if exp[t]["info"].get("advantage") == 0.3)
    assert a.signals["advantage"] == 0.3 and a.meta["annotations"] == 3  # the later orchestrator stamp wins
    b = next(r for (t, _b), r in got.items() if exp[t]["info"].get("advantage") == -0.2)
    assert b.meta["trainer_logprobs"][-2:] == [None, None]  # a stream cut short: the tail node keeps none
    ev = store.rollouts(run="p-eval")
    assert len(ev) == 1 and ev[0].meta["trainer_logprobs"] is None and ev[0].meta["annotations"] == 0
    if layout == "chunked":
        files = {r.meta["file"] for r in got.values()}
        assert any(f.endswith(".jsonl.zst") for f in files) and any(f.endswith(".jsonl") for f in files)
        assert any(r.meta["is_masked"] for r in got.values())
        with open(STREAM / layout / TRACES / "stream" / "00000.jsonl.zst", "rb") as fh:
            assert len(seek_table(fh)) > 1  # the record spans frames: the reader joined them
    else:
        assert all(r.meta["is_masked"] is None for r in got.values())  # that writer had no is_masked stream


def test_sealed_chunk_without_zstandard_is_one_clear_line(store, monkeypatch):
    monkeypatch.setitem(sys.modules, "zstandard", None)  # import zstandard -> ImportError
    with pytest.raises(ImportFormatError) as ei:
        import_rollouts(store, "prime-rl-stream", [str(STREAM / "chunked")], run_id="p")
    msg = str(ei.value)
    assert "\n" not in msg and "00000.jsonl.zst" in msg and "pip install 'gfcr[zstd]'" in msg
    assert store.count() == 0


def test_zstd_chunk_without_seek_table_is_read_whole(store, tmp_path):
    """A chunk recompressed as plain zstd (``zstd -dcf`` reads both) still imports, same rollouts."""
    zstandard = pytest.importorskip("zstandard")
    d = _copy(tmp_path, "chunked")
    z = d / TRACES / "stream" / "00000.jsonl.zst"
    raw = zstandard.ZstdDecompressor().stream_reader(z.read_bytes(), read_across_frames=True).read()
    z.write_bytes(zstandard.ZstdCompressor().compress(raw))
    with open(z, "rb") as fh:
        assert seek_table(fh) is None
    got = import_rollouts(store, "prime-rl-stream", [str(d)], run_id="p").rollouts
    ref = import_rollouts(store, "prime-rl-stream", [str(STREAM / "chunked")], run_id="q").rollouts
    assert [r.token_ids.tolist() for r in got] == [r.token_ids.tolist() for r in ref] and len(got) == 5


def _copy(tmp_path: Path, layout: str = "single") -> Path:
    dst = tmp_path / layout
    shutil.copytree(STREAM / layout, dst)
    return dst


def test_bad_row_refused_nothing_written(store, tmp_path):
    d = _copy(tmp_path)
    ann = d / TRACES / "annotations" / "trainer.jsonl"
    lines = ann.read_text().splitlines()
    u = json.loads(lines[0])
    j = next(i for i, v in enumerate(u["branches"][0]["trainer_logprobs"]) if v is not None)
    u["branches"][0]["trainer_logprobs"][j] = 0.5  # a positive log-prob
    new = json.dumps(u, separators=(",", ":"))
    # keep every later offset right: pad to the same length
    new = new + " " * (len(lines[0]) - len(new)) if len(new) <= len(lines[0]) else pytest.fail("longer")
    ann.write_text("\n".join([new, *lines[1:]]) + "\n")
    with pytest.raises(ImportFormatError) as ei:
        import_rollouts(store, "prime-rl-stream", [str(d)], run_id="p")
    msg = str(ei.value)
    assert "trainer.jsonl" in msg and "row 1" in msg and f"branches[0].trainer_logprobs[{j}]" in msg and "\n" not in msg
    assert store.count() == 0
    # an index row whose offset does not start the episode it names
    shutil.rmtree(d)
    d = _copy(tmp_path)
    idx = d / TRACES / "stream.index.jsonl"
    rows = [json.loads(x) for x in idx.read_text().splitlines()]
    rows[1]["offset"] += 1
    idx.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(ImportFormatError, match=r"stream\.jsonl: row 2 \(offset \d+\): field 'offset'"):
        import_rollouts(store, "prime-rl-stream", [str(d)], run_id="p")
    assert store.count() == 0


def test_follow_resumes_from_offsets_without_doubling(store, tmp_path, monkeypatch):
    d = _copy(tmp_path)
    t = d / TRACES
    full = {p: p.read_bytes() for p in [t / "stream.index.jsonl", t / "annotations" / "trainer.index.jsonl"]}
    # mid-run: two episodes indexed, the trainer's annotations not yet there
    idx = full[t / "stream.index.jsonl"].splitlines(keepends=True)
    (t / "stream.index.jsonl").write_bytes(b"".join(idx[:2]) + idx[2][:10])  # + a row being written
    (t / "annotations" / "trainer.index.jsonl").write_bytes(b"")
    reads = []
    orig = prs._episode
    monkeypatch.setattr(prs, "_episode", lambda f, k, *a, **kw: (reads.append(k), orig(f, k, *a, **kw))[1])
    polls = []

    def stop():
        if not polls:  # after the first poll: the rest of the run lands
            for p, data in full.items():
                p.write_bytes(data)
        polls.append(1)
        return False

    res = follow(store, "prime-rl-stream", [str(d)], interval=0.01, settle=0, max_polls=3, stop=stop, run_id="p")
    assert sorted(reads[:2]) == [1, 2]  # first poll: the two whole rows only
    # later polls: the new rows, and rows 1 and 2 again only because their traces gained annotations
    assert sorted(reads[2:]) == [1, 2, 3, 4, 5]
    rs = store.rollouts(run="p") + store.rollouts(run="p-eval")
    assert len(rs) == 5 == res.written and len({r.rollout_id for r in rs}) == 5
    first = {r.meta["trace"]: r for r in rs if r.meta["line"] == 1}
    (a,) = first.values()
    assert a.meta["annotations"] == 3 and a.meta["trainer_logprobs"] is not None  # the stored copy was replaced
    assert sorted(r.sample_index for r in rs if r.group_id == "p/prime-g1") == [0, 1]


def test_run_id_separates_two_runs(store):
    for run in ("a", "b"):
        import_rollouts(store, "prime-rl-stream", [str(STREAM / "single")], run_id=run)
    a, b = store.rollouts(run="a"), store.rollouts(run="b")
    assert len(a) == len(b) == 4 and store.count() == 10
    assert not {r.rollout_id for r in a} & {r.rollout_id for r in b}
    assert {r.group_id.split("/")[0] for r in a} == {"a"} and {r.group_id.split("/")[0] for r in b} == {"b"}
    again = import_rollouts(store, "prime-rl-stream", [str(STREAM / "chunked")], run_id="a")
    assert again.written == 0 and again.skipped == 5  # the same episodes, another layout: stored once


def test_follow_retry_after_a_bad_poll_loses_no_row(store, tmp_path, monkeypatch):
    """A poll that fails mid-stream (an update still bad) must not leave the read position past the
    rows it could not import: once the file is good, the next poll stores them."""
    d = _copy(tmp_path)
    t = d / TRACES
    idx_p, ann_p = t / "stream.index.jsonl", t / "annotations" / "trainer.jsonl"
    full_idx, good_ann = idx_p.read_bytes(), ann_p.read_bytes()
    lines = good_ann.decode().splitlines()
    u = json.loads(lines[2])  # the update of the third episode's trace
    j = next(i for i, v in enumerate(u["branches"][0]["trainer_logprobs"]) if v is not None)
    u["branches"][0]["trainer_logprobs"][j] = 1.0
    bad = json.dumps(u, separators=(",", ":"))
    bad_ann = "\n".join([*lines[:2], bad + " " * (len(lines[2]) - len(bad)), *lines[3:]]) + "\n"
    idx_p.write_bytes(b"".join(full_idx.splitlines(keepends=True)[:2]))
    ann_p.write_text(bad_ann)
    polls, done = [], []
    orig = prs._parse_stream
    monkeypatch.setattr(prs, "_parse_stream", lambda *a: (polls.append(1), orig(*a))[1])

    def stop():  # called after each poll (and while waiting): acts once per poll count
        if len(polls) == 1 and not done:
            idx_p.write_bytes(full_idx)  # the rest lands, its trainer update bad
            done.append(1)
        elif len(polls) == 2 and len(done) == 1:
            ann_p.write_bytes(good_ann)  # then fixed
            done.append(2)
        return False

    follow(store, "prime-rl-stream", [str(d)], interval=0.01, settle=60, max_polls=3, stop=stop, run_id="p")
    rs = store.rollouts(run="p") + store.rollouts(run="p-eval")
    assert len(polls) == 3 and len(rs) == 5 and all(r.meta["annotations"] >= 1 for r in rs if r.group_id != "p-eval/prime-ev1")
