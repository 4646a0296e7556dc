"""Kept character ranges → the stored tokens (never re-tokenizing).

The stored ``token_ids`` are decoded with per-token byte offsets; a generated token is
supervised only if every byte it contributes lies inside kept text. Context tokens (prompt,
tool output, observations: ``token_role == 0``) are never supervised. If the decoded text of the
generated tokens differs from the stored assistant text, the rollout cannot be aligned and is
discarded with that reason (:class:`AlignError`).

Offsets: for byte-level BPE tokenizers (GPT-2 family: SmolLM2, Qwen, Llama 3) each token's
bytes are read exactly from its vocabulary string, so a token holding half of a multi-byte
character gets that half's byte range. For other tokenizers the offsets come from decoding
growing prefixes of the ids (slower, exact at character boundaries). Special tokens (eos)
decode to nothing; a zero-width token is supervised only if the characters on both sides of
its position are kept (so an eos after a kept ending is supervised, one after excluded chatter
is not).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from gfcr.records import GENERATED, Message, assistant_text_ranges


class AlignError(ValueError):
    """A rollout whose stored tokens cannot be matched to its stored text; the message says why."""


@lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """Inverse of GPT-2's ``bytes_to_unicode`` table (char of a byte-level token → byte)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs, strict=True)}


def _is_byte_level(tokenizer: Any) -> bool:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    dec = getattr(backend, "decoder", None)
    return dec is not None and type(dec).__name__ == "ByteLevel"


@dataclass
class ByteTable:
    """Every vocabulary id's bytes, flat: id ``i`` is ``flat[off[i] : off[i] + length[i]]``
    (special ids have length 0; added tokens their UTF-8 text). Shapes: ``off``, ``length``: ``[V]``."""

    flat: np.ndarray  # uint8
    off: np.ndarray  # int64
    length: np.ndarray  # int64


_TABLES: dict[int, tuple[Any, ByteTable | None]] = {}


def byte_table(tokenizer: Any) -> ByteTable | None:
    """The byte table of a byte-level BPE tokenizer (cached per tokenizer object), else None."""
    hit = _TABLES.get(id(tokenizer))
    if hit is not None and hit[0] is tokenizer:
        return hit[1]
    table = _build_byte_table(tokenizer) if _is_byte_level(tokenizer) else None
    _TABLES[id(tokenizer)] = (tokenizer, table)
    return table


def _build_byte_table(tokenizer: Any) -> ByteTable | None:
    dec = _byte_decoder()
    vocab = tokenizer.get_vocab()
    n = max(max(vocab.values(), default=-1) + 1, len(tokenizer))
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    added = {int(k): str(v) for k, v in (getattr(tokenizer, "added_tokens_decoder", {}) or {}).items()}
    chunks: list[bytes] = [b""] * n
    for tok, i in vocab.items():
        if i in special:
            continue
        if i in added:
            chunks[i] = added[i].encode("utf-8")
        elif all(c in dec for c in tok):
            chunks[i] = bytes(dec[c] for c in tok)
        else:
            return None  # not a pure byte-level vocabulary: use the generic decoder
    for i, t in added.items():
        if i < n and i not in special:
            chunks[i] = t.encode("utf-8")
    length = np.fromiter((len(c) for c in chunks), np.int64, count=n)
    off = np.zeros(n, np.int64)
    np.cumsum(length[:-1], out=off[1:])
    return ByteTable(np.frombuffer(b"".join(chunks), np.uint8), off, length)


def utf8_widths(text: str) -> np.ndarray:
    """UTF-8 byte width of each character of ``text`` ``[len(text)]`` (vectorised)."""
    cp = np.frombuffer(text.encode("utf-32-le"), np.uint32)
    return 1 + (cp >= 0x80).astype(np.int64) + (cp >= 0x800) + (cp >= 0x10000)


def decode_bytes(raw: bytes) -> tuple[str, np.ndarray]:
    """``raw`` decoded as UTF-8 with U+FFFD for each invalid sequence (exactly what
    ``bytes.decode(errors="replace")`` and the tokenizers' decoders give) and the number of raw
    bytes behind each character ``[len(text)]``: an invalid sequence's U+FFFD stands for the
    1–3 bytes it replaced, not for the 3 bytes U+FFFD itself takes."""
    try:
        text = raw.decode("utf-8")
        return text, utf8_widths(text)
    except UnicodeDecodeError:
        pass
    parts: list[str] = []
    widths: list[np.ndarray] = []
    pos = 0
    while pos < len(raw):
        try:
            seg = raw[pos:].decode("utf-8")
            parts.append(seg)
            widths.append(utf8_widths(seg))
            break
        except UnicodeDecodeError as e:
            seg = raw[pos : pos + e.start].decode("utf-8")
            parts += [seg, "\ufffd"]
            widths += [utf8_widths(seg), np.array([e.end - e.start], np.int64)]
            pos += e.end
    return "".join(parts), (np.concatenate(widths) if widths else np.zeros(0, np.int64))


@dataclass
class DecodedTokens:
    """``text`` decoded from ids; token ``i`` contributes raw bytes ``[byte_start[i], byte_end[i])``
    of the generation, and character ``j`` of ``text`` stands for ``char_bytes[j]`` of them (its
    UTF-8 width, or the length of the invalid sequence a U+FFFD replaced). Shapes: ``byte_start``,
    ``byte_end``: ``[n_tokens]``; ``char_bytes``: ``[len(text)]``."""

    text: str
    byte_start: np.ndarray
    byte_end: np.ndarray
    char_bytes: np.ndarray | None = None

    def widths(self) -> np.ndarray:
        return self.char_bytes if self.char_bytes is not None else utf8_widths(self.text)


def decode_with_offsets(tokenizer: Any, ids: Sequence[int] | np.ndarray) -> DecodedTokens:
    """Decode ``ids`` (skipping special tokens) and give each token its raw byte range.

    Byte-level BPE: one gather from the cached :func:`byte_table` (no Python loop over tokens);
    the result is checked against ``tokenizer.decode`` and a mismatch falls back to the generic
    growing-prefix decoder (exact at character boundaries, slower)."""
    arr = np.asarray(ids, dtype=np.int64).reshape(-1)
    table = byte_table(tokenizer)
    if table is not None and (arr.size == 0 or (arr.min() >= 0 and arr.max() < table.length.size)):
        lens = table.length[arr]
        ends = np.cumsum(lens)
        starts = ends - lens
        total = int(ends[-1]) if arr.size else 0
        # gather: byte j of token i is flat[off[i] + j]
        idx = np.repeat(table.off[arr] - starts, lens) + np.arange(total, dtype=np.int64)
        raw = table.flat[idx].tobytes()
        text, widths = decode_bytes(raw)
        if text == _tokenizer_decode(tokenizer, arr.tolist()):
            return DecodedTokens(text, starts, ends, widths)
    return _decode_generic(tokenizer, arr.tolist())


def _tokenizer_decode(tokenizer: Any, ids: list[int]) -> str:
    """The tokenizer's own decoding of ``ids`` (special tokens skipped, no clean-up). A fast
    tokenizer's Rust backend is called directly: the Python wrapper's per-id type checks cost more
    than the decoding itself on long rollouts."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        return backend.decode(ids, skip_special_tokens=True)
    return tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)


def _decode_generic(tokenizer: Any, ids: list[int]) -> DecodedTokens:
    """Growing-prefix decoding: a token's range ends where its prefix text stops growing."""
    full = tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)
    fb = full.encode("utf-8")
    starts = np.zeros(len(ids), np.int64)
    ends = np.zeros(len(ids), np.int64)
    prev = 0
    for i in range(len(ids)):
        pref = tokenizer.decode(ids[: i + 1], skip_special_tokens=True, clean_up_tokenization_spaces=False)
        pb = pref.rstrip("\ufffd").encode("utf-8")
        k = len(pb)
        while k > prev and not fb.startswith(pb[:k]):
            k -= 1
        starts[i], ends[i] = prev, max(prev, k)
        prev = ends[i]
    return DecodedTokens(full, starts, ends)


def char_mask_to_byte_mask(text: str, kept_chars: np.ndarray, widths: np.ndarray | None = None) -> np.ndarray:
    """Per-char kept flags ``[len(text)]`` → per-byte flags ``[sum(widths)]`` (``widths``: bytes per
    char, default the UTF-8 width)."""
    w = utf8_widths(text) if widths is None else widths
    if len(w) and int(w.sum()) == len(w):  # all single-byte characters: nothing to expand
        return np.asarray(kept_chars, bool)
    return np.repeat(np.asarray(kept_chars, bool), w)


def token_supervision(byte_start: np.ndarray, byte_end: np.ndarray, kept_bytes: np.ndarray) -> np.ndarray:
    """1 for tokens whose bytes all lie in kept text, else 0 (vectorised).

    Shapes: ``byte_start``, ``byte_end``: ``[T]``; ``kept_bytes``: ``[B]`` bool → ``[T]`` uint8.
    A zero-width token at byte ``p`` counts as inside kept text iff the bytes at ``p - 1`` and
    ``p`` (those that exist) are kept and the text is not empty.

    Example: kept_bytes = [1, 1, 0, 1]; tokens [0, 2) → 1, [1, 3) → 0, [3, 4) → 1, [4, 4) → 1.
    """
    n = len(kept_bytes)
    a = np.asarray(byte_start, np.int64)
    b = np.asarray(byte_end, np.int64)
    if n == 0:
        return np.zeros(len(a), np.uint8)
    # prefix sums: number of kept bytes in [x, y) = cs[y] - cs[x]
    cs = np.concatenate([[0], np.cumsum(kept_bytes.astype(np.int64))])
    wide = (cs[b] - cs[a]) == (b - a)
    lo, hi = np.maximum(a - 1, 0), np.minimum(a + 1, n)
    narrow = (cs[hi] - cs[lo]) == (hi - lo)
    return np.where(b > a, wide, narrow).astype(np.uint8)


def generated_runs(token_role: np.ndarray) -> list[tuple[int, int]]:
    """Contiguous runs ``[a, b)`` of generated tokens (``token_role == 1``), in order."""
    gen = np.asarray(token_role) == GENERATED
    if not gen.any():
        return []
    edges = np.flatnonzero(np.diff(np.concatenate([[0], gen.astype(np.int8), [0]])))
    return [(int(a), int(b)) for a, b in zip(edges[0::2], edges[1::2], strict=True)]


def align_mask(
    tokenizer: Any,
    token_ids: np.ndarray,
    token_role: np.ndarray,
    messages: Sequence[Message],
    kept_chars: np.ndarray,
    final_eos: bool = False,
) -> np.ndarray:
    """Per-token supervision mask ``[T]`` (uint8) from per-char kept flags over the assistant text
    (:func:`gfcr.records.assistant_text_ranges`).

    ``final_eos``: also supervise the zero-width tokens (eos, end of turn) that close the last
    generated run, whatever text precedes them (the ``after-answer`` end-of-sequence rule of
    :func:`gfcr.ross.audit.make_audit`); otherwise they follow the neighbours rule of
    :func:`token_supervision`.

    Generated run ``k`` must decode to assistant message ``k`` (exactly, or with only
    whitespace around it that the engine stripped, which then follows the decision on the
    stored character next to it); otherwise :class:`AlignError`.
    """
    text, ranges = assistant_text_ranges(messages)
    if len(kept_chars) != len(text):
        raise AlignError(f"kept flags cover {len(kept_chars)} chars, assistant text has {len(text)}")
    runs = generated_runs(token_role)
    if len(runs) != len(ranges):
        raise AlignError(f"{len(runs)} generated token run(s) but {len(ranges)} assistant message(s)")
    mask = np.zeros(len(token_ids), np.uint8)
    for k, ((a, b), (ca, cb)) in enumerate(zip(runs, ranges, strict=True)):
        stored = text[ca:cb]
        dec = decode_with_offsets(tokenizer, token_ids[a:b])
        if dec.text == stored:
            off = 0
        else:
            off = dec.text.find(stored) if stored.strip() else -1
            if off < 0 or dec.text[:off].strip() or dec.text[off + len(stored):].strip():
                raise AlignError(
                    f"decoded tokens of assistant turn {k + 1} differ from the stored text "
                    f"(decoded {dec.text[:60]!r}…, stored {stored[:60]!r}…)"
                )
        if off == 0 and len(dec.text) == len(stored):
            local = np.asarray(kept_chars[ca:cb], bool)
        else:
            local = np.zeros(len(dec.text), bool)
            local[off : off + len(stored)] = kept_chars[ca:cb]
            if len(stored) and off:  # whitespace the engine stripped follows its neighbour's decision
                local[:off] = kept_chars[ca]
            if len(stored) and off + len(stored) < len(local):
                local[off + len(stored) :] = kept_chars[cb - 1]
        kept_bytes = char_mask_to_byte_mask(dec.text, local, dec.char_bytes)
        mask[a:b] = token_supervision(dec.byte_start, dec.byte_end, kept_bytes)
        if final_eos and k == len(runs) - 1:
            total = int(dec.byte_end[-1]) if b > a else 0
            t = b - 1
            while t >= a and dec.byte_start[t - a] == dec.byte_end[t - a] == total:
                mask[t] = 1
                t -= 1
    return mask  # only generated runs were written: context tokens stay 0
