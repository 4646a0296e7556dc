"""The columnar verl import (Arrow in, one append per file) writes exactly the rows the row path
writes, refuses what the row path refuses (nothing written), and skips unchanged files unread."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from gfcr.formats import ImportFormatError, import_rollouts
from gfcr.store import RolloutStore

FIX = Path(__file__).resolve().parents[1] / "contracts" / "fixtures"


def _rows(store):
    t = store.scan().drop_columns(["created_at"]).sort_by("rollout_id")
    return t.to_pylist()


def _both(tmp_path, paths, **kw):
    a = RolloutStore.open(tmp_path / "rows", create=True)
    b = RolloutStore.open(tmp_path / "cols", create=True)
    ra = import_rollouts(a, "verl", paths, run_id="v", columnar=False, **kw)
    rb = import_rollouts(b, "verl", paths, run_id="v", **kw)
    return a, b, ra, rb


def _synthetic(d: Path, n: int = 300) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    with open(d / "5.jsonl", "w") as fh:
        for i in range(n):
            fh.write(json.dumps({"input": f"q{i % 7}", "output": f"a{i}", "gts": str(i % 7), "score": [-1.0, 0.0, 1][i % 3],
                                 "step": 5, "acc": [-1.0, 0.0, 1][i % 3], "pred": f"p{i} ü \"x\"\\", "len": i,
                                 "ok": i % 2 == 0, "request_id": f"r{i}"}) + "\n")
    return d


@pytest.mark.parametrize("which", ["fixture", "synthetic", "reread"])
def test_columnar_rows_equal_the_row_path(tmp_path, which):
    path = FIX / "verl" if which != "synthetic" else _synthetic(tmp_path / "dump")
    # reread: no Arrow table kept between the check and the write (each file read again)
    a, b, ra, rb = _both(tmp_path, [str(path)], **({"hold_bytes": 0} if which == "reread" else {}))
    assert set(rb.how.values()) == {"columnar"}
    assert ra.written == rb.written > 0
    assert _rows(a) == _rows(b)
    pa_ = sorted((p.prompt_id, p.answer, [m.to_dict() for m in p.messages]) for p in a.prompts())
    assert pa_ == sorted((p.prompt_id, p.answer, [m.to_dict() for m in p.messages]) for p in b.prompts())
    assert b.count(where="verified") == a.count(where="verified")


def test_unchanged_file_is_skipped_unread_and_a_touched_one_by_hash(tmp_path, monkeypatch):
    d = _synthetic(tmp_path / "dump")
    store = RolloutStore.open(tmp_path / "s", create=True)
    first = import_rollouts(store, "verl", [str(d)], run_id="v")
    assert first.written == 300
    reads = []
    orig = Path.read_bytes
    monkeypatch.setattr(Path, "read_bytes",  # reads of the dump only (the store reads its own manifest)
                        lambda self: (reads.append(self) if d in self.parents else None) or orig(self))
    again = import_rollouts(store, "verl", [str(d)], run_id="v")
    assert again.written == 0 and again.how == {str(d / "5.jsonl"): "unchanged"} and reads == []
    os.utime(d / "5.jsonl", ns=(1, 1))  # same bytes, new mtime: hashed, still skipped
    touched = import_rollouts(store, "verl", [str(d)], run_id="v")
    assert touched.written == 0 and len(reads) == 1 and touched.how[str(d / "5.jsonl")] == "unchanged"
    with open(d / "5.jsonl", "a") as fh:  # grown: re-read, only the new row written
        fh.write(json.dumps({"input": "q0", "output": "new", "gts": "0", "score": 1.0, "step": 6, "acc": 1.0,
                             "pred": "x", "len": 1, "ok": True, "request_id": "r"}) + "\n")
    grown = import_rollouts(store, "verl", [str(d)], run_id="v")
    assert grown.written == 1 and grown.skipped == 300 and store.count() == 301
    other = import_rollouts(store, "verl", [str(d)], run_id="w")  # another run is not "unchanged"
    assert other.written == 301


def test_bad_file_refused_by_the_row_path_and_nothing_written(tmp_path):
    d = _synthetic(tmp_path / "dump")
    (d / "6.jsonl").write_text(json.dumps({"input": "q", "output": "a", "score": "high", "step": 6}) + "\n")
    store = RolloutStore.open(tmp_path / "s", create=True)
    with pytest.raises(ImportFormatError, match=r"6.jsonl: line 1: field 'score'"):
        import_rollouts(store, "verl", [str(d)], run_id="v")
    assert store.count() == 0 and store.count("prompts") == 0


def test_files_the_arrow_mapping_cannot_match_go_through_the_row_path(tmp_path):
    d = tmp_path / "dump"
    d.mkdir()
    rows = [{"input": "q", "output": "a", "score": 1.0, "step": 1, "acc": True},
            {"input": "q", "output": "b", "score": 0.0, "step": 1}]  # acc absent here: null, not False
    (d / "1.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")  # a blank line, too
    a, b, ra, rb = _both(tmp_path, [str(d)])
    assert rb.how[str(d / "1.jsonl")].startswith("rows:")
    assert _rows(a) == _rows(b) and [r["verified"] for r in _rows(b)] in ([True, None], [None, True])


def _varied(d: Path) -> Path:
    """Three step files sharing prompts, with text JSON must escape, scores of every float form and
    integer request ids / numeric gts: the values the vectorised JSON and id code must get exact."""
    d.mkdir(parents=True, exist_ok=True)
    scores = [0.1, -0.0, 1e-7, 3, 2.5e20, -1.0, 0.0]
    for step in (1, 2, 3):
        with open(d / f"{step}.jsonl", "w") as fh:
            for i in range(40):
                fh.write(json.dumps({"input": f"q{i % 5} é ✓ \u2028 \t\"quoted\"", "output": f"a{i}\x7f\\n{step}",
                                     "gts": [i % 5, str(i % 5), 1.5][step - 1], "score": scores[i % 7], "step": step,
                                     "acc": i % 2 == 0, "pred": ["plain", "tab\there", "ü", "\x01"][i % 4],
                                     "request_id": i if step == 2 else f"r{i}"}) + "\n")
    return d


@pytest.mark.parametrize("hold", [0, 256 << 20])
def test_columnar_equals_rows_on_escapes_float_forms_and_shared_prompts(tmp_path, hold):
    # hold 0: every file its own write batch; the default: the three files in one append
    a, b, ra, rb = _both(tmp_path, [str(_varied(tmp_path / "dump"))], hold_bytes=hold)
    assert set(rb.how.values()) == {"columnar"} and ra.written == rb.written == 120
    assert _rows(a) == _rows(b)
    pa_ = sorted((p.prompt_id, p.answer, [m.to_dict() for m in p.messages]) for p in a.prompts())
    assert pa_ == sorted((p.prompt_id, p.answer, [m.to_dict() for m in p.messages]) for p in b.prompts())
    assert len(pa_) == 5
    again = import_rollouts(b, "verl", [str(tmp_path / "dump")], run_id="v")
    assert again.written == 0 and again.skipped == 120 and b.count() == 120


def test_turns_then_gathers_each_rows_prompt_turns_then_its_tail():
    import numpy as np
    import pyarrow as pa

    from gfcr.formats.arrow_text import turns_then

    rng = np.random.default_rng(0)
    words = ["", "q", "ü∂", "long " * 30, "a\"b"]
    for _ in range(20):  # random prompts of 0-3 turns, rows drawn from them, slices of both arrays
        per = [[str(rng.choice(words)) + str(i) for i in range(rng.integers(0, 4))] for _ in range(rng.integers(1, 6))]
        flat = ["pad"] + [x for turns in per for x in turns]
        turns = pa.array(flat).slice(1)
        t_off = np.r_[0, np.cumsum([len(x) for x in per])].astype(np.int32)
        n = int(rng.integers(0, 9))
        codes = rng.integers(0, len(per), n)
        tail = pa.array(["x"] + [str(rng.choice(words)) for _ in range(n)]).slice(1)
        want = [m for j, c in enumerate(codes) for m in [*per[c], tail[j].as_py()]]
        src = np.array([i for j, c in enumerate(codes)
                        for i in [*range(int(t_off[c]), int(t_off[c + 1])), len(flat) - 1 + j]], np.int64)
        got = turns_then(turns, t_off, pa.array(codes, pa.int64()), tail, src)
        assert got.to_pylist() == want
        got.validate(full=True)


def test_char_lengths_count_code_points_as_len_does():
    import pyarrow as pa

    from gfcr.formats.arrow_text import char_lengths

    for xs in (["ab", "", "xyz"], ["ab", "ü∂x", "", "🙂"]):
        a = pa.array(["pre"] + xs).slice(1)  # a slice: its own bytes only
        assert char_lengths(a).to_pylist() == [len(x) for x in xs]
    assert char_lengths(pa.array(["é", "ab"]).slice(1)).to_pylist() == [2]  # the non-ASCII byte is outside the slice


def test_sha1_joined_is_the_sha1_of_the_joined_row_at_any_slice_size():
    import pyarrow as pa

    from gfcr.formats._common import hid
    from gfcr.formats.arrow_text import sha1_joined

    a, b = pa.array(["1", "2", "3", "4", "5"]), pa.array(["q", "", "ü", "x" * 3000, "z"])
    want = ["p-" + hid("r", x, y) for x, y in zip(a.to_pylist(), b.to_pylist(), strict=True)]
    for rows in (1, 2, 5, 2048):
        assert sha1_joined("r", [a, b], "\x1f", "p-", rows).to_pylist() == want
    assert sha1_joined("r", [a.slice(0, 0), b.slice(0, 0)], "\x1f", "p-").to_pylist() == []


def test_the_import_runs_on_arrows_jemalloc_pool_and_restores_the_default(tmp_path, monkeypatch):
    import pyarrow as pa

    from gfcr.formats import columnar

    try:
        pa.jemalloc_memory_pool()
    except NotImplementedError:
        pytest.skip("this pyarrow wheel has no jemalloc")
    monkeypatch.delenv("ARROW_DEFAULT_MEMORY_POOL", raising=False)
    d = _synthetic(tmp_path / "dump")
    seen, orig = [], columnar._import_files
    monkeypatch.setattr(columnar, "_import_files", lambda *a, **k: seen.append(pa.default_memory_pool().backend_name) or orig(*a, **k))
    before = pa.default_memory_pool().backend_name
    store = RolloutStore.open(tmp_path / "s", create=True)
    assert import_rollouts(store, "verl", [str(d)], run_id="v").written == 300
    assert seen == ["jemalloc"] and pa.default_memory_pool().backend_name == before
    # a failed import restores it too; a pool the user chose is left alone
    with pytest.raises(ImportFormatError):
        (d / "6.jsonl").write_text("{not json\n")
        import_rollouts(store, "verl", [str(d)], run_id="w")
    assert pa.default_memory_pool().backend_name == before
    monkeypatch.setenv("ARROW_DEFAULT_MEMORY_POOL", "system")
    (d / "6.jsonl").unlink()
    import_rollouts(RolloutStore.open(tmp_path / "t", create=True), "verl", [str(d)], run_id="v")
    assert seen[-1] == before


@pytest.mark.parametrize("chunk", [1, 3, 7, 1 << 20])
def test_newline_count_by_chunks_equals_bytes_count(chunk):
    from gfcr.formats.columnar import _newlines

    for data in (b"", b"\n", b"a\nb", b"\n" * 5, b"x" * 6 + b"\n", bytes(range(256)) * 40 + b"\n\n"):
        assert _newlines(data, chunk=chunk) == data.count(b"\n"), (data[:12], chunk)


def _split_by_regex(text):
    """verl.split_prompt as written before issue 48 part 5 (its regexes): the reference."""
    import re

    from gfcr.formats.verl import _TEMPLATED

    chatml = re.compile(r"<\|im_start\|>(\w+)\n(.*?)<\|im_end\|>\n?", re.S)
    llama3 = re.compile(r"<\|start_header_id\|>(\w+)<\|end_header_id\|>\n\n(.*?)<\|eot_id\|>", re.S)
    for name, rx, head, gen in (("chatml", chatml, "", "<|im_start|>assistant\n"),
                                ("llama3", llama3, "<|begin_of_text|>", "<|start_header_id|>assistant<|end_header_id|>\n\n")):
        body = text.removeprefix(head)
        turns, pos = [], 0
        for m in rx.finditer(body):
            if m.start() != pos:
                break
            turns.append((m.group(1), m.group(2)))
            pos = m.end()
        if turns and body[pos:] in ("", gen, gen.rstrip("\n")):
            return turns, name
    return [("user", text)], ("templated" if _TEMPLATED.search(text) else "text")


def test_split_prompt_cuts_as_the_template_regexes_do():
    import random

    from gfcr.formats.verl import split_prompt

    pieces = ["<|im_start|>", "<|im_end|>", "\n", "\n\n", "user", "system", "as sistant", "ü", "é_1", "x", " ", "",
              "<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "assistant", "<|im_start|>assistant\n",
              "<|start_header_id|>assistant<|end_header_id|>\n\n", "<|im_start|>user\nq<|im_end|>\n", "[INST]"]
    rng = random.Random(7)
    texts = ["".join(rng.choice(pieces) for _ in range(rng.randint(0, 14))) for _ in range(20000)]
    texts += ["<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n2+3?<|im_end|>\n<|im_start|>assistant\n",
              "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>", "<|im_start|>ü\nx<|im_end|>"]
    cut = [t for t in texts if split_prompt(t)[1] in ("chatml", "llama3")]
    assert len(cut) > 100  # the fuzz reaches the templates, not only the fallbacks
    for t in texts:
        assert split_prompt(t) == _split_by_regex(t), t


def test_json_text_writes_each_string_as_json_dumps_does():
    import json
    import random

    import pyarrow as pa

    from gfcr.formats.arrow_text import json_text

    rng = random.Random(3)
    chars = [chr(c) for c in range(0, 0x80)] + ["ü", "\u2028", "🙂"]
    for k in range(300):  # clean columns (printable ASCII but quote and backslash) and dirty ones, with nulls
        pool = [c for c in chars if 0x20 <= ord(c) < 0x7F and c not in '"\\'] if k % 2 else chars
        xs = [None if rng.random() < 0.1 else "".join(rng.choice(pool) for _ in range(rng.randint(0, 6)))
              for _ in range(rng.randint(1, 8))]
        a = pa.array(["\\\"pad"] + xs).slice(1)  # a slice whose buffer starts with bytes to escape
        assert json_text(a).to_pylist() == [json.dumps(x) for x in xs]
