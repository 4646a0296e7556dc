"""Arrow string columns built without a Python object per row, for the columnar import
(:mod:`gfcr.formats.columnar`): ids hashed straight from an array's buffers, the JSON text
of a column as ``json.dumps`` writes each value, floats as ``repr`` writes them, each row's message
contents gathered, character counts. Each function is pure and gives exactly what the row path's
per-row Python gives (``tests/store/test_import_columnar.py`` compares the two paths' rows field by field).
"""

from __future__ import annotations

import json
from hashlib import sha1
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

json_str = json.encoder.encode_basestring_ascii  # json.dumps of a str (ensure_ascii, as the row path writes)


def _js(v: Any) -> str:
    """``json.dumps(v)`` for the values a checked extra column holds (text, bool, null)."""
    if v is None:
        return "null"
    if v is True:
        return "true"
    if v is False:
        return "false"
    return json_str(v) if isinstance(v, str) else json.dumps(v)


_HEX = np.frombuffer(b"0123456789abcdef", np.uint8)
#: a character JSON (``ensure_ascii``) writes as itself, ``"`` and ``\\`` aside: printable ASCII
_NEEDS_ESCAPE = r'[^ !#-\[\]-~]'


def _offsets(a: pa.Array) -> np.ndarray:
    """The (n + 1,) value offsets of a string array ``a`` (its own slice of the buffer)."""
    wide = pa.types.is_large_string(a.type)
    o = np.frombuffer(a.buffers()[1], np.int64 if wide else np.int32)
    return o[a.offset : a.offset + len(a) + 1]


def _strings(chars: np.ndarray) -> pa.Array:
    """An (n, w) uint8 array of ASCII characters → n strings of width w, no Python per row."""
    n, w = chars.shape
    off = pa.py_buffer((np.arange(n + 1, dtype=np.int64) * w).astype(np.int32 if n * w < 2**31 else np.int64))
    return pa.Array.from_buffers(pa.string() if n * w < 2**31 else pa.large_string(), n,
                                 [None, off, pa.py_buffer(np.ascontiguousarray(chars).tobytes())])


def _digests(c: pa.Array) -> bytes:
    """The 20-byte SHA-1 of each string of ``c``, concatenated: one hashlib call per row on the
    Arrow buffer (no Python string built)."""
    o = _offsets(c).tolist()
    buf = c.buffers()[2]
    mv = memoryview(buf) if buf is not None else memoryview(b"")
    return b"".join([sha1(mv[a:b]).digest() for a, b in zip(o[:-1], o[1:], strict=False)])


def _hex_ids(digests: bytes, n: int, prefix: str) -> pa.Array:
    """n concatenated SHA-1 digests → ``prefix + hexdigest()[:24]`` each, the hex done in numpy."""
    d = np.frombuffer(digests, np.uint8).reshape(n, 20)[:, :12]
    p = np.frombuffer(prefix.encode(), np.uint8)
    chars = np.empty((n, len(p) + 24), np.uint8)
    chars[:, : len(p)] = p
    chars[:, len(p) :: 2] = _HEX[d >> 4]
    chars[:, len(p) + 1 :: 2] = _HEX[d & 15]
    return _strings(chars)


def sha1_ids(texts: pa.Array | pa.ChunkedArray, prefix: str) -> pa.Array:
    """``prefix + sha1(text.encode()).hexdigest()[:24]`` for each string: :func:`hid`'s id, one
    hashlib call per row on the Arrow buffer (no Python string built) and the hex done in numpy.

    Shapes: n strings (no nulls) → n strings of ``len(prefix) + 24``. Example: ``["a"]``, ``"p-"`` →
    ``["p-86f7e437faa5a7fce15d1ddc"]`` (``_common.hid("a")`` is ``86f7e437faa5a7fce15d1ddc``)."""
    chunks = texts.chunks if isinstance(texts, pa.ChunkedArray) else [texts]
    return _hex_ids(b"".join(_digests(c) for c in chunks if len(c)), sum(len(c) for c in chunks), prefix)


def sha1_joined(head: str, cols: list[pa.Array], sep: str, prefix: str, rows: int = 2048) -> pa.Array:
    """:func:`sha1_ids` of ``sep.join([head, *row])`` for each row of the string columns ``cols``
    (one length, no nulls), joined and hashed ``rows`` rows at a time: each joined slice is hashed
    while it is still in the cache, and the join's memory is reused (the 100k rows of
    ``bench/import_bench.py``, 150 MB joined: 17 ms against 21 ms a file of 10k rows, CPU).

    Example: ``sha1_joined("r", [["1"], ["q"]], "|", "p-")`` is ``sha1_ids(["r|1|q"], "p-")``."""
    n = len(cols[0]) if cols else 0
    parts = [_digests(pc.binary_join_element_wise(head, *[c.slice(s, rows) for c in cols], sep))
             for s in range(0, n, rows)]
    return _hex_ids(b"".join(parts), n, prefix)


def char_lengths(a: pa.Array) -> pa.Array:
    """Characters (code points) of each string, as ``len(str)`` counts them, int64: the byte
    lengths when the array's text is all ASCII (one numpy pass, 0.6 ms for 10k rows of 1.4 KB
    against 7 ms for ``utf8_length``), else Arrow's ``utf8_length``. Example: ``["ab", "ü"]`` →
    ``[2, 1]``."""
    o = _offsets(a)
    buf = a.buffers()[2]
    ascii_only = buf is None or o[-1] == o[0] or np.frombuffer(buf, np.uint8)[int(o[0]) : int(o[-1])].max() < 0x80
    if not a.null_count and ascii_only:
        return pa.array(np.diff(o).astype(np.int64))
    return pc.utf8_length(a).cast(pa.int64())


def turns_then(turns: pa.Array, t_off: np.ndarray, codes: pa.Array, tail: pa.Array,
               src: np.ndarray) -> pa.Array:
    """Each row's message contents in order: the turns of its prompt, then its own ``tail`` string.

    Shapes: ``turns`` (T,) the prompts' turns, flat, prompt u's at ``t_off[u]:t_off[u + 1]``
    (``t_off`` (U + 1,)); ``codes`` (n,) each row's prompt; ``tail`` (n,); ``src`` (M,) the index of
    each message in ``concat(turns, tail)`` (what a ``take`` would gather). → (M,) strings.
    Each prompt's turns are one contiguous run of ``turns``' buffer, so a row's turns are taken as
    one string, joined to its tail in row order by Arrow, and cut at the turn lengths: two sequential
    copies where a ``take`` of ``src`` makes one random one (10.4 against 22.6 ms, 10k rows of 1.4 KB).
    Example: turns ``["s", "q"]``, ``t_off`` [0, 2], codes [0, 0], tail ``["a", "b"]`` →
    ``["s", "q", "a", "s", "q", "b"]``."""
    to = _offsets(turns)
    blocks = to[t_off].astype(np.int64)
    ln = np.r_[np.diff(to), np.diff(_offsets(tail))].astype(np.int64)[src]
    off = np.r_[0, np.cumsum(ln)]
    if off[-1] >= 2**31 or pa.types.is_large_string(turns.type) or pa.types.is_large_string(tail.type):
        return pa.concat_arrays([turns, tail]).take(pa.array(src))  # past 32-bit offsets: Arrow's own take
    data = turns.buffers()[2] or pa.py_buffer(b"")
    per = pa.Array.from_buffers(pa.string(), len(t_off) - 1, [None, pa.py_buffer(blocks.astype(np.int32)), data])
    joined = pc.binary_join_element_wise(per.take(codes), tail, "")
    jd = joined.buffers()[2] or pa.py_buffer(b"")
    start = int(_offsets(joined)[0])
    return pa.Array.from_buffers(pa.string(), len(src), [None, pa.py_buffer(off.astype(np.int32)),
                                                         jd.slice(start) if start else jd])


def json_text(col: pa.Array | pa.ChunkedArray) -> pa.Array:
    """``json.dumps(v)`` of each value of a text, bool, integer or null column, vectorised: text
    that JSON writes as is (printable ASCII without ``"`` or ``\\``) is quoted by Arrow, only the
    rest goes through Python's encoder; null → ``null``. Example: ``["a", None, "ü"]`` →
    ``['"a"', 'null', '"\\u00fc"']``; ``[True]`` → ``["true"]``; ``[3]`` → ``["3"]``."""
    col = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    t = col.type
    if pa.types.is_null(t):
        out = pa.nulls(len(col), pa.string())
    elif pa.types.is_boolean(t):
        out = pc.if_else(col, "true", "false")
    elif pa.types.is_integer(t):
        out = pc.cast(col, pa.string())
    elif pa.types.is_string(t) or pa.types.is_large_string(t):
        out = pc.binary_join_element_wise('"', col.cast(pa.string()), '"', "")
        if _clean(col):  # the common case, one numpy pass over the bytes: no regex per row
            return pc.fill_null(out, "null") if col.null_count else out
        dirty = pc.fill_null(pc.match_substring_regex(col, _NEEDS_ESCAPE), False)
        if pc.any(dirty).as_py():
            fixed = [json_str(v) for v in col.filter(dirty).to_pylist()]
            out = pc.replace_with_mask(out, dirty, pa.array(fixed, pa.string()))
    else:
        return pa.array([_js(v) for v in col.to_pylist()], pa.string())
    return pc.fill_null(out, "null") if col.null_count else out


#: the bytes JSON (``ensure_ascii``) writes as themselves: printable ASCII but ``"`` and ``\\``
_CLEAN = np.zeros(256, bool)
_CLEAN[0x20:0x7F] = True
_CLEAN[[ord('"'), ord("\\")]] = False


def _clean(col: pa.Array) -> bool:
    """Whether every string of ``col`` is JSON-quoted as is (:data:`_NEEDS_ESCAPE` matches none), by
    one look-up of its bytes (a null slot's bytes, if any, count too: a false "no" only sends the
    column to the per-row check)."""
    o = _offsets(col)
    buf = col.buffers()[2]
    return buf is None or o[-1] == o[0] or bool(_CLEAN[np.frombuffer(buf, np.uint8)[int(o[0]) : int(o[-1])]].all())


def float_reprs(x: np.ndarray) -> pa.Array:
    """``repr(float(v))`` of each value (as ``json.dumps`` writes a finite float), one Python call per
    distinct value (by its bits, so ``-0.0`` stays itself). Example: ``[1.0, -1.0, 1.0]`` →
    ``["1.0", "-1.0", "1.0"]``."""
    bits, inv = np.unique(np.ascontiguousarray(x, np.float64).view(np.int64), return_inverse=True)
    return pa.array([repr(v) for v in bits.view(np.float64).tolist()], pa.string()).take(pa.array(inv.ravel()))


__all__ = ["char_lengths", "float_reprs", "json_str", "json_text", "sha1_ids", "sha1_joined",
           "turns_then"]
