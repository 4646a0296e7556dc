"""The columnar import path: a verl ``rollout_data_dir`` JSONL file read as one Arrow table
(``pyarrow.json``), its columns mapped to the rollout schema with Arrow compute and numpy, one
append per file; no :class:`~gfcr.records.Rollout` object is built.

The rows it writes are the ones the row path (:mod:`gfcr.store.importers.verl`) writes, field for
field (same ids, same JSON, ``created_at`` aside): the row path stays the reference, and every
file this path cannot map exactly is handed to it (a blank line, a value of another type than its
column's, a null where the row path tells null from absent, nested values, a non-finite score, a
tokenizer to retokenize with). So a malformed file fails with the row path's one line naming file,
line and field, and nothing is written.

Memory is bounded by one file (its bytes, its Arrow table and the mapped table) beyond a budget of
Arrow tables kept between the check and the write (256 MiB by default, see :func:`import_files`). A file already
imported into the same run is skipped by content: its size, mtime and SHA-256 are recorded in the
store's state table (key ``import-file:verl:{run}:{path}``); an unchanged size and mtime skip it
without reading it, a changed mtime with the same hash skips it after hashing.

Worked example: a 100k-line verl dump (``bench/import_bench.py``) → 100k rows, one commit per
file; a second import of the same folder reads nothing (every file skipped by size and mtime).
"""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Callable
from hashlib import sha1
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from gfcr.records.classes import utcnow
from gfcr.records.schema import COST_TYPE, MESSAGE_TYPE, PROMPT_SCHEMA, ROLLOUT_SCHEMA, TS_TYPE
from gfcr.store.importers._common import hid
from gfcr.store.importers.verl import _STD

#: why a file went to the row path instead (the exact mapping needs what Arrow cannot tell apart)
Fallback = str


def _state_key(run_id: str, f: Path) -> str:
    return f"import-file:verl:{run_id}:{f.resolve()}"


def file_signature(f: Path) -> dict[str, int]:
    st = f.stat()
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns}


_q = json.encoder.encode_basestring_ascii  # json.dumps of a str (ensure_ascii, as the row path writes)


def _js(v: Any) -> str:
    """``json.dumps(v)`` for the values a checked extra column holds (text, bool, null)."""
    if v is None:
        return "null"
    if v is True:
        return "true"
    if v is False:
        return "false"
    return _q(v) if isinstance(v, str) else json.dumps(v)


def _line_numbers(data: bytes, n: int) -> np.ndarray | None:
    """1-based line numbers of the ``n`` rows when the file has no blank line (else None: row path)."""
    nl = data.count(b"\n") - (1 if data.endswith(b"\n") else 0)
    if nl != n - 1 or b"\n\n" in data or b"\r" in data:
        return None
    return np.arange(1, n + 1)


def _is_number(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_floating(t)


def _primitive(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_boolean(t) or _is_number(t) or pa.types.is_null(t)


def check_table(t: pa.Table, verdict_key: str) -> Fallback | None:
    """None when :func:`map_table` maps ``t`` exactly as the row path would; else why not (the file
    then goes to the row path, which also gives the one-line error for a malformed row). Cheap:
    types, null counts and vectorised finiteness only."""
    names = t.column_names
    for c in ("input", "output", "score", "step"):
        if c not in names:
            return f"column {c!r} missing"
        if t.column(c).null_count:
            return f"null {c!r}"
    for c in names:
        if not _primitive(t.schema.field(c).type):
            return f"nested column {c!r}"
    if not (pa.types.is_string(t.schema.field("input").type) and pa.types.is_string(t.schema.field("output").type)):
        return "input/output not text"
    if not _is_number(t.schema.field("score").type) or not pa.types.is_integer(t.schema.field("step").type):
        return "score/step type"
    if not np.all(np.isfinite(t.column("score").cast(pa.float64()).to_numpy())) or pc.min(t.column("step")).as_py() < 0:
        return "score not finite or step < 0"
    for c in names:
        if c not in _STD and t.column(c).null_count:  # the row path tells absent from null; Arrow cannot
            return f"nulls in {c!r}"
        if c not in _STD and _is_number(t.schema.field(c).type) and \
                not np.all(np.isfinite(t.column(c).cast(pa.float64()).to_numpy())):
            return f"non-finite {c!r}"
    if verdict_key in names and not (pa.types.is_boolean(t.schema.field(verdict_key).type)
                                     or _is_number(t.schema.field(verdict_key).type)):
        return "verdict type"
    return None


def map_table(t: pa.Table, f: Path, run_id: str, verdict_key: str, lines: np.ndarray
              ) -> tuple[pa.Table, pa.Table]:
    """verl dump rows (an Arrow table of the JSON lines, :func:`check_table` passed) → (rollout
    table, prompt table), exactly as :func:`gfcr.store.importers.verl.parse` maps them.

    Shapes: ``t`` has n rows with at least ``input``, ``output``, ``score``, ``step``; ``lines`` (n,)
    the file's line numbers. Example: ``{"input": "q", "output": "a", "score": -1, "step": 3, "acc":
    -1}`` → reward −1.0, verified False, step 3, ``policy_version`` ``step-3``, ``signals`` {acc: −1}.

    Long because: one column per rollout-schema field, each built vectorised in the schema's order;
    splitting it would pass a dozen intermediate arrays between functions."""
    n = t.num_rows
    names = t.column_names
    score = t.column("score").cast(pa.float64()).to_numpy()
    step = t.column("step").to_numpy()
    extras = [c for c in names if c not in _STD]
    inp = t.column("input").to_pylist()
    out = t.column("output").to_pylist()
    # verdict: a bool as is, a number > 0 correct (verdict_of), absent -> null
    if verdict_key in names:
        vt = t.schema.field(verdict_key).type
        vcol = t.column(verdict_key)
        if pa.types.is_boolean(vt):
            verified = vcol.combine_chunks()
        else:
            verified = pa.array(vcol.cast(pa.float64()).to_numpy() > 0)
    else:
        verified = pa.nulls(n, pa.bool_())
    # prompts: one id per distinct input (dictionary-encoded), the first row's gts as its answer
    enc = pc.dictionary_encode(t.column("input")).combine_chunks()
    uniq = enc.dictionary.to_pylist()
    codes = enc.indices.to_numpy()
    upid = np.array(["verl-" + hid(u) for u in uniq], dtype=object)
    pid = upid[codes]
    first = np.full(len(uniq), -1)
    first[codes[::-1]] = np.arange(n)[::-1]  # the first row of each input
    gts = t.column("gts").to_pylist() if "gts" in names else [None] * n
    nu = len(uniq)
    answers = [None if (g := gts[first[u]]) is None else (g if isinstance(g, str) else json.dumps(g)) for u in range(nu)]
    pnul = pa.nulls(nu, pa.string())
    prompts = pa.Table.from_arrays([
        pa.array(upid.tolist(), pa.string()), pa.array(["verl"] * nu, pa.string()),
        pa.ListArray.from_arrays(pa.array(np.arange(nu + 1, dtype=np.int32)), pa.StructArray.from_arrays(
            [pa.array(["user"] * nu, pa.string()), enc.dictionary.cast(pa.string()), pnul, pnul], fields=list(MESSAGE_TYPE))),
        pa.array(answers, pa.string()), pnul, pnul, pa.nulls(nu, pa.float64()), pnul, pa.array(["{}"] * nu, pa.string()),
        pa.array(np.full(nu, np.datetime64(utcnow().replace(tzinfo=None), "us")), TS_TYPE),
        pa.array(["{}"] * nu, pa.string())], schema=PROMPT_SCHEMA)
    # sample_index: the running count of (step, prompt) in line order
    key = step.astype(np.int64) * (len(uniq) + 1) + codes
    order = np.argsort(key, kind="stable")
    ks = key[order]
    starts = np.r_[0, np.flatnonzero(ks[1:] != ks[:-1]) + 1]
    run_len = np.diff(np.r_[starts, n])
    cum = np.arange(n) - np.repeat(starts, run_len)
    sample_index = np.empty(n, np.int64)
    sample_index[order] = cum
    # signals (numeric extras) and meta (every other extra, request_id) as the row path's JSON
    num_cols = [c for c in extras if _is_number(t.schema.field(c).type)]
    other_cols = [c for c in extras if c not in num_cols]
    sig_keys = sorted(num_cols)
    sig_vals = [t.column(c).cast(pa.float64()).to_numpy() for c in sig_keys]
    others = {c: t.column(c).to_pylist() for c in other_cols}
    req = t.column("request_id").to_pylist() if "request_id" in names else [None] * n
    fname = f.name
    # the row path's JSON (json.dumps, sort_keys, default separators), written as strings directly
    ekeys = sorted(other_cols)
    ecols = [[_js(v) for v in others[c]] for c in ekeys]
    eprefix = [_q(c) + ": " for c in ekeys]
    extra_s = ["{" + ", ".join(k + v for k, v in zip(eprefix, vals, strict=True)) + "}" for vals in zip(*ecols, strict=True)] \
        if ekeys else ["{}"] * n
    tail = ', "source": "verl"}'
    head = '{"extra": '
    fpart = ', "file": ' + _q(fname) + ', "line": '
    meta = [head + e + fpart + str(ln) + ', "request_id": ' + _js(rq) + tail
            for e, ln, rq in zip(extra_s, lines.tolist(), req, strict=True)]
    vk = ', "verdict_key": ' + _q(verdict_key) + "}"
    verifier = ['{"name": "verl", "score": ' + repr(x) + (vk if v is not None else ', "verdict_key": null}')
                for x, v in zip(score.tolist(), verified.to_pylist(), strict=True)]
    pre = f"{run_id}\x1f{fname}\x1f"  # hid(run_id, file, line, input, output), inlined
    rid = ["verl-" + sha1(f"{pre}{ln}\x1f{a}\x1f{b}".encode()).hexdigest()[:24]
           for ln, a, b in zip(lines.tolist(), inp, out, strict=True)]
    step_s = pc.cast(t.column("step"), pa.string())
    pid_arr = pa.array(pid.tolist(), pa.string())
    # messages: [user input, assistant output] per row, as one flat struct array with offsets
    roles = pa.array(["user", "assistant"] * n, pa.string())
    both = pa.concat_arrays([t.column("input").combine_chunks().cast(pa.string()),
                             t.column("output").combine_chunks().cast(pa.string())])
    inter = np.empty(2 * n, np.int64)
    inter[0::2], inter[1::2] = np.arange(n), np.arange(n, 2 * n)
    contents = both.take(pa.array(inter))
    nul = pa.nulls(2 * n, pa.string())
    msgs = pa.ListArray.from_arrays(pa.array(np.arange(0, 2 * n + 1, 2, dtype=np.int32)),
                                    pa.StructArray.from_arrays([roles, contents, nul, nul], fields=list(MESSAGE_TYPE)))
    empty_off = pa.array(np.zeros(n + 1, np.int32))
    sig_off = pa.array((np.arange(n + 1) * len(sig_keys)).astype(np.int32))
    sig_k = pa.array(np.tile(np.array(sig_keys, dtype=object), n).tolist(), pa.string())
    sig_v = pa.array(np.stack(sig_vals, axis=1).ravel() if sig_keys else np.zeros(0), pa.float64())
    const = lambda v, ty: pa.array([v] * n, ty)  # noqa: E731 - a local shorthand
    cols: dict[str, pa.Array] = {
        "rollout_id": pa.array(rid, pa.string()),
        "run_id": const(run_id, pa.string()),
        "step": pa.array(step.astype(np.int64)),
        "policy_version": pc.binary_join_element_wise("step-", step_s, ""),
        "prompt_id": pid_arr,
        "group_id": pc.binary_join_element_wise(f"{run_id}/", pid_arr, "@", step_s, ""),
        "sample_index": pa.array(sample_index),
        "parent_id": pa.nulls(n, pa.string()),
        "branch_pos": pa.nulls(n, pa.int64()),
        "task": const("verl", pa.string()),
        "messages": msgs,
        "token_ids": pa.ListArray.from_arrays(empty_off, pa.array([], pa.int32())),
        "token_role": pa.ListArray.from_arrays(empty_off, pa.array([], pa.int8())),
        "logprobs": pa.ListArray.from_arrays(empty_off, pa.array([], pa.float32())),
        "finish_reason": pa.nulls(n, pa.string()),
        "reward": pa.array(score),
        "verified": verified,
        "verifier": pa.array(verifier, pa.string()),
        "signals": pa.MapArray.from_arrays(sig_off, sig_k, sig_v),
        "sampling": const("{}", pa.string()),
        "cost": pa.StructArray.from_arrays([pa.array(np.zeros(n, np.int64)), pa.array(np.zeros(n, np.int64)),
                                            pa.array(np.zeros(n))], fields=list(COST_TYPE)),
        "tokens_source": const("none", pa.string()),
        "created_at": pa.array(np.full(n, np.datetime64(utcnow().replace(tzinfo=None), "us")), TS_TYPE),
        "meta": pa.array(meta, pa.string()),
    }
    cols = {k: (v.combine_chunks() if isinstance(v, pa.ChunkedArray) else v) for k, v in cols.items()}
    return pa.Table.from_arrays([cols[f.name].cast(f.type) for f in ROLLOUT_SCHEMA], schema=ROLLOUT_SCHEMA), prompts


def _read(data: bytes) -> tuple[pa.Table | None, np.ndarray | None, Fallback | None]:
    try:
        t = pj.read_json(io.BytesIO(data))  # pyarrow's defaults (1 MiB blocks, threads), as the reference arm
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as e:
        return None, None, f"arrow: {str(e).splitlines()[0][:80]}"
    lines = _line_numbers(data, t.num_rows)
    return t, lines, ("blank lines" if lines is None else None)


def import_files(store: Any, files: list[Path], run_id: str, verdict_key: str,
                 row_parse: Callable[[Path], Any], row_write: Callable[[list[Any]], tuple[int, int]],
                 lock: Callable[[], Any], hold_bytes: int = 256 << 20) -> tuple[int, int, dict[str, str]]:
    """Import verl files the columnar way. Phase 1, per file: skip it if unchanged since its last
    import into ``run_id`` (size and mtime, else SHA-256), read it as Arrow and check it
    (:func:`check_table`); a file that needs the row path is parsed and validated by ``row_parse``
    (which raises the one-line error). Nothing is written until every file has passed. Phase 2,
    per file, in reverse order: map, skip stored ids, append in one commit, record the file's
    signature. The Arrow tables read in phase 1 are kept for phase 2 up to ``hold_bytes`` (256 MiB
    of Arrow data by default; the latest file's always): a dump beyond it is read twice, so memory
    stays bounded by max(``hold_bytes``, one file) plus the one file being mapped. Returns (written, skipped, how each file went: ``unchanged`` |
    ``columnar`` | ``rows: <why>``); an unchanged file counts its recorded rows as skipped."""
    plan: list[tuple[Path, str, dict[str, Any], Any]] = []
    held: dict[Path, tuple[pa.Table, np.ndarray]] = {}
    held_bytes = 0
    for f in files:
        key = _state_key(run_id, f)
        sig = file_signature(f)
        old = store.get_state(key) or {}
        if old.get("size") == sig["size"] and old.get("mtime_ns") == sig["mtime_ns"]:
            plan.append((f, "unchanged", old, None))
            continue
        data = f.read_bytes()
        sig["sha256"] = hashlib.sha256(data).hexdigest()
        if old.get("sha256") == sig["sha256"]:
            plan.append((f, "unchanged", {**old, **sig}, "touch"))
            continue
        t, lines, why = _read(data)
        del data
        if why is None:
            why = check_table(t, verdict_key)
        if why is not None:
            plan.append((f, f"rows: {why}", sig, row_parse(f)))
            continue
        plan.append((f, "columnar", sig, None))
        if held_bytes + t.nbytes > hold_bytes:  # over the budget: keep only the latest file's table
            held.clear()
            held_bytes = 0
        held[f] = (t, lines)
        held_bytes += t.nbytes
    written = skipped = 0
    how: dict[str, str] = {}
    for f, mode, sig, extra in reversed(plan):
        how[str(f)] = mode
        if mode == "unchanged":  # its rows were all stored when it was imported
            skipped += int(sig.get("rows", 0))
            if extra == "touch":
                store.put_state(_state_key(run_id, f), sig)
            continue
        if mode.startswith("rows"):
            w, s = row_write([extra])
            sig["rows"] = len(extra[2])
        else:
            if f in held:
                t, lines = held.pop(f)
            else:
                data = f.read_bytes()
                t, lines, why = _read(data)
                del data
                if why is not None or check_table(t, verdict_key) is not None:
                    raise RuntimeError(f"{f}: changed while being imported; run the import again")
            table, prompts = map_table(t, f, run_id, verdict_key, lines)
            del t
            with lock():
                ids = table.column("rollout_id").to_pylist()
                have = store.existing_ids(ids)
                if have:
                    table = table.filter(pa.array([r not in have for r in ids]))
                if table.num_rows:
                    if have:
                        prompts = prompts.filter(pc.is_in(prompts.column("prompt_id"), table.column("prompt_id")))
                    store.upsert_prompts(prompts)
                    store.append(table, source="verl")
            w, s = table.num_rows, len(have)
            sig["rows"] = w + s
        store.put_state(_state_key(run_id, f), sig)
        written += w
        skipped += s
    return written, skipped, how


__all__ = ["check_table", "file_signature", "import_files", "map_table"]
