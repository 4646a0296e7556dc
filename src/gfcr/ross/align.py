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
class DecodedTokens:
    """``text`` decoded from ids; token ``i`` contributes bytes ``[byte_start[i], byte_end[i])``
    of ``text.encode("utf-8")``. Shapes: ``byte_start``, ``byte_end``: ``[n_tokens]``."""

    text: str
    byte_start: np.ndarray
    byte_end: np.ndarray


def decode_with_offsets(tokenizer: Any, ids: Sequence[int]) -> DecodedTokens:
    """Decode ``ids`` (skipping special tokens) and give each token its byte range."""
    ids = [int(i) for i in ids]
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    if _is_byte_level(tokenizer):
        table = _byte_decoder()
        added = {int(k): v for k, v in (getattr(tokenizer, "added_tokens_decoder", {}) or {}).items()}
        chunks: list[bytes] = []
        for tid, tok in zip(ids, tokenizer.convert_ids_to_tokens(ids), strict=True):
            if tid in special:
                chunks.append(b"")
            elif tid in added:
                chunks.append(str(added[tid]).encode("utf-8"))
            elif tok is not None and all(c in table for c in tok):
                chunks.append(bytes(table[c] for c in tok))
            else:
                chunks = []
                break
        if len(chunks) == len(ids):
            raw = b"".join(chunks)
            text = raw.decode("utf-8", errors="replace")
            if text == tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False):
                ends = np.cumsum([len(c) for c in chunks], dtype=np.int64) if chunks else np.zeros(0, np.int64)
                starts = ends - np.array([len(c) for c in chunks], dtype=np.int64)
                return DecodedTokens(text, starts, ends)
    # generic path: decode growing prefixes; a token's range ends where its prefix text stops growing
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


def char_mask_to_byte_mask(text: str, kept_chars: np.ndarray) -> np.ndarray:
    """Per-char kept flags ``[len(text)]`` → per-byte flags ``[len(text.encode())]``."""
    widths = np.fromiter((len(c.encode("utf-8")) for c in text), dtype=np.int64, count=len(text))
    return np.repeat(kept_chars.astype(bool), widths)


def token_supervision(byte_start: np.ndarray, byte_end: np.ndarray, kept_bytes: np.ndarray) -> np.ndarray:
    """1 for tokens whose bytes all lie in kept text, else 0.

    Shapes: ``byte_start``, ``byte_end``: ``[T]``; ``kept_bytes``: ``[B]`` bool → ``[T]`` uint8.
    A zero-width token at byte ``p`` counts as inside kept text iff the bytes at ``p - 1`` and
    ``p`` (those that exist) are kept and the text is not empty.

    Example: kept_bytes = [1, 1, 0, 1]; tokens [0, 2) → 1, [1, 3) → 0, [3, 4) → 1, [4, 4) → 1.
    """
    n = len(kept_bytes)
    out = np.zeros(len(byte_start), np.uint8)
    if n == 0:
        return out
    # prefix sums: number of kept bytes in [a, b) = cs[b] - cs[a]
    cs = np.concatenate([[0], np.cumsum(kept_bytes.astype(np.int64))])
    for i, (a, b) in enumerate(zip(byte_start.tolist(), byte_end.tolist(), strict=True)):
        if b > a:
            out[i] = cs[b] - cs[a] == b - a
        else:
            lo, hi = max(a - 1, 0), min(a + 1, n)
            out[i] = cs[hi] - cs[lo] == hi - lo
    return out


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
) -> np.ndarray:
    """Per-token supervision mask ``[T]`` (uint8) from per-char kept flags over the assistant text
    (:func:`gfcr.records.assistant_text_ranges`).

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
        local = np.zeros(len(dec.text), bool)
        local[off : off + len(stored)] = kept_chars[ca:cb]
        if len(stored) and off:  # whitespace the engine stripped follows its neighbour's decision
            local[:off] = kept_chars[ca]
        if len(stored) and off + len(stored) < len(local):
            local[off + len(stored) :] = kept_chars[cb - 1]
        kept_bytes = char_mask_to_byte_mask(dec.text, local)
        mask[a:b] = token_supervision(dec.byte_start, dec.byte_end, kept_bytes)
    mask[np.asarray(token_role) != GENERATED] = 0
    return mask
