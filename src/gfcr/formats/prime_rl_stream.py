"""prime-rl's trace stream: ``{output_dir}/monitors/file/traces/`` (prime-rl PRs #3444/#3465).

Layout from the writers (``FileMonitor.log_episodes`` / ``log_annotations``): every episode is
written once, on arrival, as one ``Episode.to_record()`` line, and an index row beside it says
where (``line`` from 1, ``offset`` in bytes, ``chunk``). Two layouts:

* single file (Stars1233/prime-rl @ e3fdaded, ``src/prime_rl/monitors/file/monitor.py``):
  ``stream.jsonl`` + ``stream.index.jsonl``; ``annotations/<producer>.jsonl`` + ``<producer>.index.jsonl``
  (rows ``{trace_id, offset, info}``).
* chunked (PrimeIntellect-ai/prime-rl @ 551bfc39, ``traces/chunks.py``; polyphilz/prime-rl @ 18f8bfa,
  ``monitor.py``): ``stream/NNNNN.jsonl``, a full chunk sealed as seekable zstd ``NNNNN.jsonl.zst``
  (offsets count decompressed bytes); ``annotations/<producer>/NNNNN.jsonl[.zst]``; index rows add ``chunk``.

Annotations are folded the way prime-rl's ``fold_trace_updates`` does it (PrimeIntellect-ai/prime-rl
@ 65a18584, ``src/prime_rl/monitors/file/traces/update.py`` line 67, ``branch_node_paths`` line 43;
the same at Stars1233/prime-rl @ e3fdaded without the ``is_masked`` stream): in write
order, newest winning, each ``info`` deep-merged into the trace's; each branch stream (full length
over the branch's root-to-leaf token prefix, null = unknown) is cut per node and compacted over the
node's ``mask``; a node takes a stream only when it is fully covered and, except ``is_masked``, has no
null at a sampled position; a bad branch index is skipped. Producers are taken in name order, each
in its own write order, as prime-rl's dashboard reads them (``src/prime_rl/dashboard/server.py``,
``annotation_streams`` / ``trace_updates``).

Mapping: the folded record goes through the prime-rl folder importer's mapping
(:func:`gfcr.formats.prime_rl.episode_rollouts`: one rollout per episode, trace and
branch; ids from run, episode, trace and branch, so two runs never collide). Added here, per branch
over its sampled tokens, null where a node holds no value: ``meta.trainer_logprobs``,
``meta.entropies``, ``meta.is_masked``, ``meta.advantages``; ``meta.batch_step`` =
``info.ship.step`` (the step that trained it; null when not shipped), ``meta.annotations`` = updates
folded. Lost: what the index alone holds (its summary scalars are recomputed from the record).

``--follow``: the cursor (bytes of each index read, trace -> episode address) carries over between
polls, so a poll reads only new index rows; a trace that gains annotations after its import is
read again and replaces its stored copy (:func:`copy_rank`: more updates folded wins). ``parse``
advances the cursor it is given in place; ``follow`` drops it when an import fails, so the retry
reads the stream from the start (stored rows are skipped).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from gfcr.formats import prime_rl
from gfcr.formats._common import (
    FOLLOWING,
    ImportFormatError,
    ImportResult,
    check_unicode,
    deep_field,
    find_files,
    opt_num,
)
from gfcr.formats._seekable import SealedReader, ZstdUnavailable
from gfcr.records import Prompt, Rollout

PATTERNS = ("stream.index.jsonl",)
RESUMABLE = True
STREAM_FIELDS = ("advantages", "trainer_logprobs", "entropies", "is_masked")
_LOGPROB_TOL = 1e-6


def copy_rank(meta: dict[str, Any]) -> int:
    """A stored copy is replaced by one that folded more annotations (the log only grows)."""
    n = meta.get("annotations") if isinstance(meta, dict) else None
    return n if isinstance(n, int) else -1


def _producers(traces: Path) -> list[tuple[str, Path, Path]]:
    """``(name, index, data)`` per annotation producer, in name order; ``data`` a file (single
    layout) or a chunk folder (chunked)."""
    d = traces / "annotations"
    out = []
    for idx in sorted(d.glob("*.index.jsonl")) if d.is_dir() else []:
        name = idx.name.removesuffix(".index.jsonl")
        plain = d / f"{name}.jsonl"
        out.append((name, idx, plain if plain.is_file() else d / name))
    return out


def follow_signature(f: Path) -> tuple:
    """What ``--follow`` watches: the stream index and every annotation index (size, mtime)."""
    sig = []
    for p in [f] + [idx for _n, idx, _d in _producers(f.parent)]:
        try:
            st = p.stat()
        except FileNotFoundError:
            continue
        sig.append((p.name, st.st_size, st.st_mtime_ns))
    return tuple(sig)


class _Chunks:
    """Lines at ``(chunk, offset)`` of one stream: ``data`` a file (single layout, chunk 0 only) or a
    chunk folder (plain ``NNNNN.jsonl`` first, then the sealed ``NNNNN.jsonl.zst`` twin)."""

    def __init__(self, data: Path):
        self.data = data
        self.open: dict[int, tuple[Path, Any]] = {}

    def path(self, chunk: int) -> Path:
        if self.data.is_file():
            return self.data
        plain = self.data / f"{chunk:05d}.jsonl"
        return plain if plain.is_file() else plain.with_name(plain.name + ".zst")

    def line(self, chunk: int, offset: int, index: Path, where: str) -> tuple[Path, bytes]:
        if chunk not in self.open:
            p = self.path(chunk)
            if self.data.is_file() and chunk != 0:
                raise ImportFormatError(index, where, "chunk", f"{chunk}: a single-file stream has chunk 0 only")
            if not p.is_file():
                raise ImportFormatError(index, where, "chunk", f"{chunk}: no chunk {p.name} (plain or sealed) in {self.data}")
            try:
                self.open[chunk] = (p, SealedReader(p) if p.suffix == ".zst" else open(p, "rb"))  # noqa: SIM115
            except ZstdUnavailable as e:
                raise ImportFormatError(p, where, "chunk", str(e)) from e
            except ValueError as e:
                raise ImportFormatError(p, where, "chunk", f"not a readable seekable zstd file: {e}") from e
        p, r = self.open[chunk]
        if isinstance(r, SealedReader):
            try:
                return p, r.line_at(offset)
            except Exception as e:  # zstandard.ZstdError and friends: a torn or foreign file
                raise ImportFormatError(p, where, "offset", f"cannot decompress at {offset}: {e}") from e
        r.seek(offset)
        return p, r.readline()

    def close(self) -> None:
        for _p, r in self.open.values():
            r.close()


def _index_rows(index: Path, start: int, row0: int) -> tuple[list[tuple[int, dict[str, Any]]], int, bool]:
    """New rows of an index from byte ``start``: ``([(row, obj)], end byte, torn last line)``. A last
    line without its newline is a row being written (prime-rl's ``read_records``: a torn last line
    ends the stream); it is left for the next read."""
    with open(index, "rb") as fh:
        fh.seek(start)
        data = fh.read()
    end = data.rfind(b"\n") + 1
    rows = []
    for k, raw in enumerate(data[:end].split(b"\n")[:-1], start=row0 + 1):
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ImportFormatError(index, f"row {k}", "-", f"not valid JSON ({e})") from e
        except RecursionError as e:
            raise ImportFormatError(index, f"row {k}", deep_field(raw.decode("utf-8", "replace")),
                                    "JSON nested too deeply") from e
        if not isinstance(obj, dict):
            raise ImportFormatError(index, f"row {k}", "-", f"expected a JSON object, got {type(obj).__name__}")
        rows.append((k, obj))
    return rows, start + end, end < len(data)


def _addr(row: dict[str, Any], index: Path, where: str) -> tuple[int, int]:
    out = []
    for key, default in (("chunk", 0), ("offset", None)):
        v = row.get(key, default)
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ImportFormatError(index, where, key, f"expected a byte position (integer >= 0), got {v!r}")
        out.append(v)
    return out[0], out[1]


def _load_line(chunks: _Chunks, chunk: int, offset: int, index: Path, where: str) -> tuple[Path, dict[str, Any]]:
    p, raw = chunks.line(chunk, offset, index, where)
    if not raw.endswith(b"\n"):
        raise ImportFormatError(p, f"{where} (offset {offset})", "offset",
                                "no whole line there: the index points past the data or into a torn write")
    try:
        obj = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ImportFormatError(p, f"{where} (offset {offset})", "offset",
                                f"not a JSON line there ({e}): the offset does not start a record") from e
    except RecursionError as e:
        raise ImportFormatError(p, f"{where} (offset {offset})", deep_field(raw.decode("utf-8", "replace")),
                                "JSON nested too deeply") from e
    if not isinstance(obj, dict):
        raise ImportFormatError(p, f"{where} (offset {offset})", "-", "expected a JSON object")
    if b"\\u" in raw:
        check_unicode(obj, p, f"{where} (offset {offset})")
    return p, obj


def _check_update(u: dict[str, Any], p: Path, w: str) -> None:
    """An update's shape, and every stream value a number or null (``is_masked``: a bool or null);
    ``trainer_logprobs`` finite and <= 0, as the store keeps log-probs."""
    if not isinstance(u.get("info") or {}, dict):
        raise ImportFormatError(p, w, "info", "expected an object")
    branches = u.get("branches") or []
    if not isinstance(branches, list):
        raise ImportFormatError(p, w, "branches", "expected a list")
    for b, br in enumerate(branches):
        if not isinstance(br, dict):
            raise ImportFormatError(p, w, f"branches[{b}]", "expected an object")
        for fld in STREAM_FIELDS:
            s = br.get(fld)
            if s is None:
                continue
            if not isinstance(s, list):
                raise ImportFormatError(p, w, f"branches[{b}].{fld}", "expected a list")
            for j, v in enumerate(s):
                key = f"branches[{b}].{fld}[{j}]"
                if v is None:
                    continue
                if fld == "is_masked":
                    if not isinstance(v, bool):
                        raise ImportFormatError(p, w, key, f"expected true, false or null, got {v!r}")
                    continue
                x = opt_num(v, p, w, key)
                if fld == "trainer_logprobs" and (x is None or x > _LOGPROB_TOL or not math.isfinite(x)):
                    raise ImportFormatError(p, w, key, f"a log-prob must be finite and <= 0, got {v!r}")


def _check_lengths(u: dict[str, Any], trace: dict[str, Any], p: Path, w: str) -> None:
    """A branch stream covers the branch's token prefix (prime-rl's ``trace/update.py``: "full-length
    across the branch's token prefix"): shorter is a stream still being written (its tail nodes stay
    unannotated, as ``fold_trace_updates`` leaves them); LONGER than the branch's tokens cannot
    belong to this trace, so the update is refused, naming the annotation file, row and stream
    (the update was stored silently, its values cut or dropped)."""
    nodes = trace.get("nodes") or []
    paths = _paths(nodes)
    for b, br in enumerate(u.get("branches") or []):
        bi = br.get("index")
        if isinstance(bi, bool) or not isinstance(bi, int) or not 0 <= bi < len(paths):
            continue
        n = sum(len(nodes[k].get("token_ids") or []) for k in paths[bi] if isinstance(nodes[k], dict))
        for fld in STREAM_FIELDS:
            s = br.get(fld)
            if isinstance(s, list) and len(s) > n:
                raise ImportFormatError(p, w, f"branches[{b}].{fld}", f"{len(s)} values for the {n} tokens of branch "
                                        f"{bi} of trace {trace.get('id')!r}: longer than the branch it annotates")


def fold_updates(trace: dict[str, Any], updates: list[dict[str, Any]]) -> None:
    """prime-rl's ``fold_trace_updates`` semantics (module docstring) on a raw trace record, in place."""
    nodes = trace.get("nodes") or []
    paths = _paths(nodes)
    for u in updates:
        if u.get("info"):
            trace["info"] = _deep_merge(trace.get("info") or {}, u["info"])
        for br in u.get("branches") or []:
            bi = br.get("index")
            if isinstance(bi, bool) or not isinstance(bi, int) or not 0 <= bi < len(paths):
                continue
            for fld in STREAM_FIELDS:
                stream = br.get(fld)
                if not stream:
                    continue
                cursor = 0
                for k in paths[bi]:
                    node = nodes[k]
                    n = len(node.get("token_ids") or [])
                    span = stream[cursor:cursor + n]
                    cursor += n
                    if len(span) < n:
                        break
                    vals = [v for v, m in zip(span, node.get("mask") or [], strict=False) if m]
                    if not vals or (fld == "is_masked" and all(v is None for v in vals)):
                        continue
                    if fld != "is_masked" and any(v is None for v in vals):
                        continue
                    node[fld] = vals


def _deep_merge(old: Any, new: Any) -> Any:
    if isinstance(old, dict) and isinstance(new, dict):
        return {**old, **{k: _deep_merge(old.get(k), v) for k, v in new.items()}}
    return new


def _paths(nodes: list[Any]) -> list[list[int]]:
    """Root-to-leaf node indexes per branch, leaves in node order (prime-rl's ``branch_node_paths``)."""
    good = [n if isinstance(n, dict) else {} for n in nodes]
    parents = {p for n in good if isinstance(p := n.get("parent"), int) and 0 <= p < len(good)}
    out = []
    for leaf in (i for i in range(len(good)) if i not in parents):
        path, seen, k = [], set(), leaf
        while isinstance(k, int) and 0 <= k < len(good) and k not in seen:
            seen.add(k)
            path.append(k)
            k = good[k].get("parent")
        out.append(path[::-1])
    return out


def _branch_streams(trace: dict[str, Any], branch: int) -> dict[str, list[Any] | None]:
    """Per folded field, the branch's values over its sampled tokens (null where a node holds none);
    None when no node of the branch holds that field."""
    nodes = trace.get("nodes") or []
    paths = _paths(nodes)
    out: dict[str, list[Any] | None] = {}
    for fld in STREAM_FIELDS:
        vals: list[Any] = []
        seen = False
        for k in paths[branch] if branch < len(paths) else []:
            n = nodes[k]
            m = sum(bool(x) for x in n.get("mask") or [])
            v = n.get(fld)
            if isinstance(v, list) and len(v) == m:
                vals.extend(v)
                seen = True
            else:
                vals.extend([None] * m)
        out[fld] = vals if seen else None
    return out


def parse(paths: list[str], run_id: str, tokenizer: Any | None = None, evals: str = "separate",
          vocab: int | None = None, cursor: dict[str, Any] | None = None, **_: Any) -> ImportResult:
    files = find_files(paths, PATTERNS)
    rollouts: dict[str, Rollout] = {}
    prompts: dict[str, Prompt] = {}
    notes: list[str] = []
    new_cursor: dict[str, Any] = {}
    for f in files:
        cur = (cursor or {}).get(str(f)) or {"index": (0, 0), "ann": {}, "updates": {}, "episodes": {},
                                              "groups": {}, "samples": {}}
        _parse_stream(f, run_id, evals, vocab, cur, rollouts, prompts, notes)
        new_cursor[str(f)] = cur
    return ImportResult("prime-rl-stream", [str(f) for f in files], list(rollouts.values()), list(prompts.values()),
                        list(dict.fromkeys(notes)), cursor=new_cursor)


def _parse_stream(f: Path, run_id: str, evals: str, vocab: int | None, cur: dict[str, Any],
                  rollouts: dict[str, Rollout], prompts: dict[str, Prompt], notes: list[str]) -> None:
    traces = f.parent
    single = traces / "stream.jsonl"
    data = single if single.is_file() else traces / "stream"
    if not data.exists():
        raise ImportFormatError(f, "index", "-", f"no stream beside it: neither {single.name} nor {data.name}/")
    touched: set[str] = set()
    readers = {name: _Chunks(d) for name, _i, d in _producers(traces)}
    for name, idx, _d in _producers(traces):
        start, row0 = cur["ann"].get(name, (0, 0))
        rows, end, _torn = _index_rows(idx, start, row0)
        for k, row in rows:
            tid = row.get("trace_id")
            if not isinstance(tid, str) or not tid:
                raise ImportFormatError(idx, f"row {k}", "trace_id", f"expected the id of a trace, got {tid!r}")
            chunk, offset = _addr(row, idx, f"row {k}")
            cur["updates"].setdefault(tid, []).append((name, k, chunk, offset))
            touched.add(tid)
        cur["ann"][name] = (end, row0 + len(rows))
    start, row0 = cur["index"]
    rows, end, torn = _index_rows(f, start, row0)
    if torn and not FOLLOWING.get():
        notes.append(f"{f}: the last index row has no newline (a write in progress): not read")
    todo: dict[int, tuple[int, int, str]] = {}
    for k, row in rows:
        chunk, offset = _addr(row, f, f"row {k}")
        todo[k] = (chunk, offset, str(row.get("id")) if row.get("id") is not None else "")
        for tid in row.get("trace_ids") or []:
            cur["episodes"][str(tid)] = (k, chunk, offset, todo[k][2])
    for tid in touched:  # a trace imported on an earlier poll that has gained annotations since
        if tid in cur["episodes"] and cur["episodes"][tid][0] not in todo:
            k, chunk, offset, eid = cur["episodes"][tid]
            todo[k] = (chunk, offset, eid)
    cur["index"] = (end, row0 + len(rows))
    chunks = _Chunks(data)
    try:
        for k in sorted(todo):
            _episode(f, k, todo[k], chunks, readers, run_id, evals, vocab, cur, rollouts, prompts, notes)
    finally:
        chunks.close()
        for r in readers.values():
            r.close()


def _episode(f: Path, k: int, at: tuple[int, int, str], chunks: _Chunks, readers: dict[str, _Chunks], run_id: str,
             evals: str, vocab: int | None, cur: dict[str, Any], rollouts: dict[str, Rollout],
             prompts: dict[str, Prompt], notes: list[str]) -> None:
    chunk, offset, eid = at
    w = f"row {k}"
    p, obj = _load_line(chunks, chunk, offset, f, w)
    if eid and str(obj.get("id")) != eid:
        raise ImportFormatError(f, w, "offset", f"points at episode {obj.get('id')!r}, the row names {eid!r}")
    n_updates: dict[str, int] = {}
    for j, tr in enumerate(obj.get("traces") if isinstance(obj.get("traces"), list) else []):
        if not isinstance(tr, dict):
            continue
        ups = []
        for name, row, c, o in cur["updates"].get(str(tr.get("id")), []):
            ap, u = _load_line(readers[name], c, o, traces_index(f, name), f"row {row}")
            _check_update(u, ap, f"row {row} (offset {o})")
            _check_lengths(u, tr, ap, f"row {row} (offset {o})")
            if u.get("trace_id") != tr.get("id"):
                raise ImportFormatError(traces_index(f, name), f"row {row}", "offset",
                                        f"points at an update of {u.get('trace_id')!r}, not {tr.get('id')!r}")
            ups.append(u)
        fold_updates(tr, ups)
        n_updates[str(j)] = len(ups)
    got = prime_rl.episode_rollouts(obj, p, w, k, run_id, evals, vocab, {})
    if got is None:
        return
    env_id, rps = got
    if not obj["traces"]:
        notes.append("episode(s) without traces (failed before producing one) were not stored")
    for r, prompt in rps:
        j = next(i for i, t in enumerate(obj["traces"]) if t.get("id", i) == r.meta["trace"])
        tr = obj["traces"][j]
        streams = _branch_streams(tr, r.meta["branch"])
        ship = (tr.get("info") or {}).get("ship")
        step = ship.get("step") if isinstance(ship, dict) else None
        r.meta.update({"source": "prime-rl-stream", "file": str(Path(*p.parts[-3:])), "offset": offset, "chunk": chunk,
                       "subset": None, "batch_step": step if isinstance(step, int) and not isinstance(step, bool) else None,
                       "annotations": n_updates.get(str(j), 0),
                       **{fld: streams[fld] for fld in STREAM_FIELDS}})
        r.sample_index = cur["samples"].get(r.rollout_id, -1)
        if r.sample_index < 0:
            r.sample_index = cur["samples"][r.rollout_id] = cur["groups"][r.group_id] = \
                cur["groups"].get(r.group_id, -1) + 1
        rollouts[r.rollout_id] = r
        prime_rl.add_prompt(prompts, r, prompt, env_id)


def traces_index(f: Path, producer: str) -> Path:
    return f.parent / "annotations" / f"{producer}.index.jsonl"
