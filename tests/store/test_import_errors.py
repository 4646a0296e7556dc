"""Malformed and careless import input: one ImportFormatError naming file, line and field; nothing
written; empty input reported, never a silent 0-row success."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gfcr.formats import ImportFormatError, import_rollouts
from gfcr.testing import make_rollout

_VERL = {"input": "q", "output": "a", "score": 1.0, "step": 1}


def _native(**kw):
    r = make_rollout(0)
    obj = {"rollout_id": "x1", "prompt_id": "p", "run_id": "r", "token_ids": r.token_ids.tolist(),
           "token_role": r.token_role.tolist(), "logprobs": r.logprobs.tolist(), "messages": [{"role": "user", "content": "q"}]}
    obj.update(kw)
    return json.dumps(obj) + "\n"


@pytest.mark.parametrize(
    "fmt, name, content, where, field",
    [
        ("verl", "1.jsonl", json.dumps(_VERL).encode() + b"\n" + b'{"input": "\xff\xfe", "output": "a"}\n', "line 2", "-"),
        ("verl", "1.jsonl", ("[" * 100_000 + "]" * 100_000 + "\n").encode(), "line 1", "-"),
        ("verl", "1.jsonl", (json.dumps({**_VERL, "step": 2**64}) + "\n").encode(), "line 1", "step"),
        ("verl", "1.jsonl", (json.dumps({**_VERL, "step": -1}) + "\n").encode(), "line 1", "step"),
        ("prime-rl", "traces.jsonl", (json.dumps({"id": "e", "traces": [{"nodes": [
            {"message": {"role": "user", "content": "q"}, "token_ids": [1, 2**63 + 7]}]}]}) + "\n").encode(),
         "line 1 traces[0] nodes[0]", "token_ids[1]"),
        ("prime-rl", "traces.jsonl", (json.dumps({"id": "e", "traces": [{"nodes": [{"token_ids": [1]}]}]}) + "\n").encode(),
         "line 1 traces[0] nodes[0]", "message"),
        ("prime-rl", "traces.jsonl", (json.dumps({"id": "e", "run": {"work": {"step": 2**70}}, "traces": []}) + "\n").encode(),
         "line 1", "run.work.step"),
        ("jsonl", "x.jsonl", _native(messages="hello").encode(), "line 1", "messages"),
        ("jsonl", "x.jsonl", _native(token_ids=[1] * 9 + [2**40]).encode(), "line 1", "token_ids"),
        ("jsonl", "x.jsonl", _native(step=2**64).encode(), "line 1", "step"),
        ("open-instruct", "r_rollouts_000000.jsonl", (json.dumps({"step": 1, "sample_idx": 0, "prompt_idx": 0,
            "prompt_tokens": [1], "response_tokens": [2**31], "reward": 1.0}) + "\n").encode(), "line 1", "response_tokens[0]"),
    ],
)
def test_malformed_named_by_file_line_field(store, tmp_path, fmt, name, content, where, field):
    import_rollouts(store, "verl", [_good(tmp_path)], run_id="ok")
    before = store.count(), store.count("prompts"), store.version
    bad = tmp_path / "bad" / name
    bad.parent.mkdir()
    bad.write_bytes(content)
    with pytest.raises(ImportFormatError) as e:
        import_rollouts(store, fmt, [str(bad.parent)], run_id="bad")
    msg = str(e.value)
    assert msg.startswith(f"{bad}: {where}: field '{field}'"), msg
    assert "\n" not in msg and len(msg) < 400
    assert (store.count(), store.count("prompts"), store.version) == before


def _good(tmp_path):
    d = tmp_path / "good"
    d.mkdir(exist_ok=True)
    (d / "1.jsonl").write_text(json.dumps(_VERL) + "\n")
    return str(d)


@pytest.mark.parametrize("fmt, name, content", [
    ("verl", "1.jsonl", b""),
    ("verl", "1.jsonl", b"\n\n  \n"),
    ("prime-rl", "traces.jsonl", b""),
    ("areal", "0.jsonl", b"\n"),
])
def test_empty_input_is_reported(store, tmp_path, fmt, name, content):
    f = tmp_path / name
    f.write_bytes(content)
    with pytest.raises(ImportFormatError, match="empty") as e:
        import_rollouts(store, fmt, [str(f)])
    assert str(f) in str(e.value)
    assert store.count() == 0


def test_empty_trl_parquet_and_no_rollouts_at_all(store, tmp_path):
    d = tmp_path / "completions"
    d.mkdir()
    pq.write_table(pa.table({"step": pa.array([], pa.int64()), "prompt": pa.array([], pa.string()),
                             "completion": pa.array([], pa.string())}), d / "completions_00001.parquet")
    with pytest.raises(ImportFormatError, match="empty: no rows"):
        import_rollouts(store, "trl", [str(d)])
    ep = tmp_path / "p" / "traces.jsonl"
    ep.parent.mkdir()
    ep.write_text(json.dumps({"id": "e", "traces": [], "ok": False}) + "\n")  # only a failed episode
    with pytest.raises(ImportFormatError, match="no rollouts found in 1 file"):
        import_rollouts(store, "prime-rl", [str(ep.parent)])


def test_duplicate_id_names_the_id_and_both_files(store, tmp_path):
    d = tmp_path / "dup"
    d.mkdir()
    (d / "a.jsonl").write_text(_native())
    (d / "b.jsonl").write_text(_native())
    with pytest.raises(ImportFormatError) as e:
        import_rollouts(store, "jsonl", [str(d)])
    msg = str(e.value)
    assert "'x1'" in msg and str(d / "a.jsonl") in msg and str(d / "b.jsonl") in msg
    assert store.count() == 0


def test_cli_bad_import_one_line_exit_2_nothing_left(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    bad = tmp_path / "1.jsonl"
    bad.write_bytes(b'{"input": "\xff"}\n')
    st = tmp_path / "new-store"
    src = str(Path(__file__).resolve().parents[2] / "src")
    p = subprocess.run([sys.executable, "-m", "gfcr.cli", "store", "import", str(st), str(bad), "--from", "verl"],
                       capture_output=True, text=True, env={**__import__("os").environ, "PYTHONPATH": src}, timeout=300)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    lines = [x for x in p.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and "line 1" in lines[0] and "UTF-8" in lines[0]
    assert not st.exists()
