"""Arrow string columns built without a Python object per row, for the columnar import
(:mod:`gfcr.store.importers.columnar`): ids hashed straight from an array's buffers, the JSON text
of a column as ``json.dumps`` writes each value, floats as ``repr`` writes them, two columns
interleaved. Each function is pure and gives exactly what the row path's per-row Python gives
(``tests/store/test_import_columnar.py`` compares the two paths' rows field by field).
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


def sha1_ids(texts: pa.Array | pa.ChunkedArray, prefix: str) -> pa.Array:
    """``prefix + sha1(text.encode()).hexdigest()[:24]`` for each string: :func:`hid`'s id, one
    hashlib call per row on the Arrow buffer (no Python string built) and the hex done in numpy.

    Shapes: n strings (no nulls) → n strings of ``len(prefix) + 24``. Example: ``["a"]``, ``"p-"`` →
    ``["p-86f7e437faa5a7fce15d1ddc"]`` (``_common.hid("a")`` is ``86f7e437faa5a7fce15d1ddc``)."""
    chunks = texts.chunks if isinstance(texts, pa.ChunkedArray) else [texts]
    digests = []
    for c in chunks:
        if len(c) == 0:
            continue
        o = _offsets(c).tolist()
        buf = c.buffers()[2]
        mv = memoryview(buf) if buf is not None else memoryview(b"")
        digests.append(b"".join([sha1(mv[a:b]).digest() for a, b in zip(o[:-1], o[1:], strict=False)]))
    n = sum(len(c) for c in chunks)
    d = np.frombuffer(b"".join(digests), np.uint8).reshape(n, 20)[:, :12]
    p = np.frombuffer(prefix.encode(), np.uint8)
    chars = np.empty((n, len(p) + 24), np.uint8)
    chars[:, : len(p)] = p
    chars[:, len(p) :: 2] = _HEX[d >> 4]
    chars[:, len(p) + 1 :: 2] = _HEX[d & 15]
    return _strings(chars)


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
        dirty = pc.fill_null(pc.match_substring_regex(col, _NEEDS_ESCAPE), False)
        if pc.any(dirty).as_py():
            fixed = [json_str(v) for v in col.filter(dirty).to_pylist()]
            out = pc.replace_with_mask(out, dirty, pa.array(fixed, pa.string()))
    else:
        return pa.array([_js(v) for v in col.to_pylist()], pa.string())
    return pc.fill_null(out, "null") if col.null_count else out


def float_reprs(x: np.ndarray) -> pa.Array:
    """``repr(float(v))`` of each value (as ``json.dumps`` writes a finite float), one Python call per
    distinct value (by its bits, so ``-0.0`` stays itself). Example: ``[1.0, -1.0, 1.0]`` →
    ``["1.0", "-1.0", "1.0"]``."""
    bits, inv = np.unique(np.ascontiguousarray(x, np.float64).view(np.int64), return_inverse=True)
    return pa.array([repr(v) for v in bits.view(np.float64).tolist()], pa.string()).take(pa.array(inv.ravel()))


def interleave(a: pa.Array, b: pa.Array) -> pa.Array:
    """``[a0, b0, a1, b1, ...]`` of two string arrays of one length: the rows' text joined by Arrow
    (one pass, in row order) and cut again by offsets computed in numpy, where a ``take`` of the
    interleaved indices gathers the same bytes in a slower random pass.

    Example: ``["q1", "q2"]``, ``["a1", "a2"]`` → ``["q1", "a1", "q2", "a2"]``."""
    n = len(a)
    la, lb = np.diff(_offsets(a)), np.diff(_offsets(b))
    off = np.zeros(2 * n + 1, np.int64)
    off[1::2], off[2::2] = la, lb
    np.cumsum(off, out=off)
    joined = pc.binary_join_element_wise(a, b, "")
    if off[-1] >= 2**31:  # past 32-bit offsets
        return pa.chunked_array([a, b]).take(pa.array(np.arange(2 * n).reshape(2, n).T.ravel())).combine_chunks()
    data = joined.buffers()[2]
    start = int(_offsets(joined)[0])
    return pa.Array.from_buffers(pa.string(), 2 * n, [None, pa.py_buffer(off.astype(np.int32)),
                                                      data.slice(start) if start else data])


__all__ = ["float_reprs", "interleave", "json_str", "json_text", "sha1_ids"]
