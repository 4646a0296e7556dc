"""Units and char→token alignment on tricky text."""

from __future__ import annotations

import numpy as np
import pytest

from gfcr.records import assistant_text_ranges
from gfcr.ross.align import (
    AlignError,
    align_mask,
    decode_with_offsets,
    token_supervision,
)
from gfcr.ross.units import split_units

from .conftest import make_rollout


def test_units_partition_text_and_attach_blank_lines():
    text = "  \nStep one: 3 + 4 = 7.\n\n   \nStep two.\n<tool>calculator: 6 * 7</tool> done\nAnswer: 7"
    units = split_units(text)
    assert units[0].start == 0 and units[-1].end == len(text)
    assert all(a.end == b.start for a, b in zip(units, units[1:], strict=False))
    assert all(u.text.strip() for u in units)  # no whitespace-only unit
    assert [u.number for u in units] == list(range(1, len(units) + 1))
    tools = [u for u in units if u.is_tool_call]
    assert len(tools) == 1 and tools[0].text == "<tool>calculator: 6 * 7</tool>"
    assert units[0].text.startswith("  \nStep one")  # leading blank joins unit 1
    assert units[0].text.endswith("\n\n   \n")  # blank lines join the previous unit


def test_long_line_split_at_sentence_ends():
    line = "First sentence is here. Second one follows! Third? " * 3
    units = split_units(line.strip(), max_chars=40)
    assert len(units) > 3
    assert "".join(u.text for u in units) == line.strip()
    assert all(u.text.rstrip()[-1] in ".!?" for u in units)


def test_token_supervision_hand_worked():
    kept = np.array([1, 1, 0, 1], bool)
    starts, ends = np.array([0, 1, 3, 4]), np.array([2, 3, 4, 4])
    assert token_supervision(starts, ends, kept).tolist() == [1, 0, 1, 1]
    assert token_supervision(np.array([2]), np.array([2]), kept).tolist() == [0]  # zero-width next to excluded


def _supervised_chars(tok, r, mask):
    """Decoded byte ranges of supervised tokens, as a set of byte offsets of the assistant text."""
    gen = np.flatnonzero(r.token_role == 1)
    dec = decode_with_offsets(tok, r.token_ids[gen])
    out = set()
    for j, i in enumerate(gen):
        if mask[i]:
            out |= set(range(int(dec.byte_start[j]), int(dec.byte_end[j])))
    return dec, out


@pytest.mark.parametrize(
    "text",
    [
        "Héllo wörld — naïve café 数学 题目 🙂\nAnswer: 7",
        "数学题目数学\n题目🙂🙂\n\n   \nAnswer: 42",
        "12 + 7 = 19\n12 + 7 = 19\n12 + 7 = 19\nAnswer: 19",
    ],
)
def test_alignment_supervises_exactly_kept_bytes(tok, text):
    r = make_rollout(tok, "What is 12 + 7?", text)
    full, _ = assistant_text_ranges(r.messages)
    rng = np.random.default_rng(0)
    for _ in range(20):
        kept = rng.random(len(full)) < 0.6
        mask = align_mask(tok, r.token_ids, r.token_role, r.messages, kept)
        assert not mask[r.token_role == 0].any()  # context never supervised
        dec, sup = _supervised_chars(tok, r, mask)
        kept_bytes = np.repeat(kept, [len(c.encode()) for c in full])
        # every supervised byte is kept ...
        assert all(kept_bytes[b] for b in sup)
        # ... and every token whose bytes are all kept is supervised
        gen = np.flatnonzero(r.token_role == 1)
        for j, i in enumerate(gen):
            a, b = int(dec.byte_start[j]), int(dec.byte_end[j])
            if b > a:
                assert mask[i] == kept_bytes[a:b].all()


def test_multibyte_token_straddles_and_boundary(tok):
    text = "café数学\nAnswer: 5"
    r = make_rollout(tok, "q", text)
    gen = np.flatnonzero(r.token_role == 1)
    dec = decode_with_offsets(tok, r.token_ids[gen])
    assert dec.text == text
    # byte-level BPE splits some multi-byte chars across tokens: at least one token ends mid-char
    bounds = {0}
    pos = 0
    for c in text:
        pos += len(c.encode())
        bounds.add(pos)
    assert any(int(e) not in bounds for e in dec.byte_end[:-1])
    # keep only the second line: tokens straddling the newline boundary are unsupervised
    kept = np.zeros(len(text), bool)
    kept[text.index("Answer") :] = True
    mask = align_mask(tok, r.token_ids, r.token_role, r.messages, kept)
    sup_text = tok.decode(r.token_ids[mask.astype(bool)], skip_special_tokens=True)
    assert sup_text and set(sup_text) <= set("Answer: 5")
    assert mask[gen[-1]] == 1  # eos right after kept text is supervised
    kept[-1] = False
    mask = align_mask(tok, r.token_ids, r.token_role, r.messages, kept)
    assert mask[gen[-1]] == 0  # ... and not after excluded text


def test_whitespace_only_kept_region_supervises_only_whitespace(tok):
    text = "Line one.\n\n\n\nLine two.\nAnswer: 2"
    r = make_rollout(tok, "q", text)
    kept = np.zeros(len(text), bool)
    kept[9:13] = True  # only the blank lines
    mask = align_mask(tok, r.token_ids, r.token_role, r.messages, kept)
    sup = tok.decode(r.token_ids[mask.astype(bool)], skip_special_tokens=True)
    assert sup.strip() == ""


def test_decode_mismatch_raises(tok):
    r = make_rollout(tok, "q", "12 + 7 = 19\nAnswer: 19")
    r.messages[1].content = "12 + 7 = 18\nAnswer: 19"  # stored text no longer matches the tokens
    with pytest.raises(AlignError, match="differ"):
        align_mask(tok, r.token_ids, r.token_role, r.messages, np.ones(len(r.messages[1].content), bool))


def test_engine_stripped_whitespace_is_tolerated(tok):
    r = make_rollout(tok, "q", "  Answer: 19\n")
    r.messages[1].content = "Answer: 19"
    mask = align_mask(tok, r.token_ids, r.token_role, r.messages, np.ones(10, bool))
    assert tok.decode(r.token_ids[mask.astype(bool)], skip_special_tokens=True).strip() == "Answer: 19"


def test_multi_turn_runs_align_to_assistant_messages(tok):
    from gfcr.records import Message, Rollout

    seg = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    a1, obs, a2 = "<tool>calculator: 6 * 7</tool>", "<result>42</result>", "So the answer is 42."
    ids = seg("user q\n") + seg(a1) + seg(obs) + seg(a2)
    role = [0] * len(seg("user q\n")) + [1] * len(seg(a1)) + [0] * len(seg(obs)) + [1] * len(seg(a2))
    r = Rollout(run_id="r", prompt_id="p", token_ids=ids, token_role=role, logprobs=[0.0] * len(ids),
                messages=[Message("user", "user q"), Message("assistant", a1), Message("tool", obs),
                          Message("assistant", a2)])
    full, ranges = assistant_text_ranges(r.messages)
    kept = np.zeros(len(full), bool)
    kept[ranges[1][0] : ranges[1][1]] = True  # keep only the second assistant turn
    mask = align_mask(tok, r.token_ids, r.token_role, r.messages, kept)
    assert tok.decode(r.token_ids[mask.astype(bool)]) == a2
    assert not mask[np.asarray(role) == 0].any()


def _invalid_utf8_rollout(tok, tail: str):
    """A generation whose first token is a lone 0xC3 byte (invalid UTF-8), then ``tail``."""
    from gfcr.records import Message, Rollout
    from gfcr.ross.align import _byte_decoder

    lone = {v: k for k, v in _byte_decoder().items()}[0xC3]
    ctx = tok("<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]
    gen = [tok.convert_tokens_to_ids(lone)] * 2 + tok(tail, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    text = tok.decode(gen, skip_special_tokens=True)
    ids = np.array(ctx + gen, np.int32)
    role = np.array([0] * len(ctx) + [1] * len(gen), np.uint8)
    return Rollout(run_id="r", prompt_id="p", token_ids=ids, token_role=role, logprobs=np.zeros(len(ids), np.float32),
                   messages=[Message("user", "q"), Message("assistant", text)]), text


def test_invalid_utf8_bytes_align_exactly(tok):
    r, text = _invalid_utf8_rollout(tok, " wrong 3 + 4 = 8.\nAnswer: 7")
    assert text.startswith("\ufffd\ufffd wrong")
    cut = text.index("Answer")
    kept = np.zeros(len(text), bool)
    kept[cut:] = True  # the judge excluded the first line, kept the answer line
    mask = align_mask(tok, r.token_ids, r.token_role, r.messages, kept)
    gen = np.flatnonzero(r.token_role == 1)
    pieces = [tok.decode([int(r.token_ids[i])]) for i in gen]
    sup = "".join(p for p, i in zip(pieces, gen, strict=True) if mask[i])
    unsup = "".join(p for p, i in zip(pieces, gen, strict=True) if not mask[i])
    assert "Answer: 7" in sup.replace("Ġ", " ") or sup.startswith("Answer")
    assert "wrong" not in sup and "8" not in sup and "wrong" in unsup
    dec = decode_with_offsets(tok, r.token_ids[gen])
    assert dec.text == text and int(dec.widths().sum()) == int(dec.byte_end[-1])


def test_vectorised_decoder_matches_generic(tok):
    from gfcr.ross.align import _decode_generic

    for t in ["Héllo wörld — naïve café 数学 🙂\nAnswer: 7", "12 + 7 = 19\n\n  Answer: 19"]:
        ids = tok(t, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        fast, slow = decode_with_offsets(tok, ids), _decode_generic(tok, ids)
        assert fast.text == slow.text == t
        # both give each token the bytes it contributes (the generic one only at char boundaries)
        bounds = set(np.cumsum(fast.widths()).tolist()) | {0}
        at_char_ends = [i for i in range(len(ids)) if int(fast.byte_end[i]) in bounds]
        assert len(at_char_ends) > len(ids) // 2
        assert all(fast.byte_end[i] == slow.byte_end[i] for i in at_char_ends)
        assert fast.byte_end[-1] == len(t.encode())
