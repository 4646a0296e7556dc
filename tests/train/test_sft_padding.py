"""Masked SFT with bounded padding: the micro-batch planner, the padding it reports on a long-tailed
length mix, and a micro-batched step's loss and gradient equal to the unpadded per-row computation."""

from __future__ import annotations

import json
import math
import random

import pytest
import torch

from gfcr.ross.config import RossConfig
from gfcr.testing import tiny_model, tiny_tokenizer
from gfcr.train.losses import masked_nll
from gfcr.train.sft import (
    length_grouped_batches,
    packed_batches,
    sft_step,
    split_by_padding,
    train_masked_sft,
)


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


def _pad(lengths, groups):
    slots = sum(len(g) * max(lengths[i] for i in g) for g in groups)
    return 1 - sum(lengths) / slots


def test_split_by_padding_hand_worked():
    # longest first: 400 + 390 pads 10/800; + 120 would pad 24%; 120 + 100 would pad 8.3%; 100 + 98 pads 1%
    lens = [100, 400, 390, 120, 98]
    assert split_by_padding(lens, 0.05) == [[1, 2], [3], [0, 4]]
    assert math.isclose(_pad(lens, [[1, 2, 3, 0, 4]]), 1 - 1108 / 2000)  # one [5, 400] tensor: 44.6%
    assert split_by_padding(lens, 1.0) == [[1, 2, 3, 0, 4]]  # the whole step as one tensor
    assert split_by_padding(lens, 0.25) == [[1, 2, 3], [0, 4]]  # 1 - 910/1200 = 24.2% <= 25%
    assert split_by_padding([7, 7, 5, 7], 0.0) == [[0, 1, 3], [2]]  # equal lengths never pad
    assert split_by_padding([], 0.05) == []
    with pytest.raises(ValueError, match="max_pad_fraction"):
        split_by_padding([3], -0.1)


@pytest.mark.parametrize("limit", [0.0, 0.05, 0.2])
def test_split_by_padding_bounds_every_micro_batch(limit):
    rng = random.Random(7)
    for _ in range(200):
        lens = [max(1, int(rng.lognormvariate(4.5, 0.8))) for _ in range(rng.randint(1, 16))]
        groups = split_by_padding(lens, limit)
        assert sorted(i for g in groups for i in g) == list(range(len(lens)))
        assert all(_pad([lens[i] for i in g], [list(range(len(g)))]) <= limit + 1e-9 for g in groups)


def _rows(n_short=30, n_tail=10, seed=0, vocab=256):
    """Short arithmetic-like rows (8-14 tokens) and a long tail (20-120): the mix that padded badly."""
    rng = random.Random(seed)
    lens = [rng.randint(8, 14) for _ in range(n_short)] + [int(min(120, 20 * rng.paretovariate(1.2)))
                                                            for _ in range(n_tail)]
    rng.shuffle(lens)
    rows = []
    for n in lens:
        ctx = max(1, n // 3)
        rows.append({"input_ids": [rng.randrange(5, vocab) for _ in range(n)],
                     "loss_mask": [0] * ctx + [rng.choice([0, 1, 1]) for _ in range(n - ctx)]})
    return rows


def _reference(model, rows, idx):
    """Unpadded per-row computation: each sequence alone, sum of NLLs / total supervised targets."""
    tot, cnt = 0.0, 0
    for i in idx:
        ids = torch.tensor([rows[i]["input_ids"]])
        mean, n = masked_nll(model(input_ids=ids).logits, ids, torch.tensor([rows[i]["loss_mask"]]))
        tot = tot + mean * n
        cnt += int(n)
    return tot / cnt


@pytest.mark.parametrize(("packing", "impl"), [(False, "sdpa"), (True, "sdpa"), (True, "eager")])
def test_micro_batched_step_equals_unpadded_per_row(tok, packing, impl):
    rows = _rows(seed=1)
    lengths = [len(r["input_ids"]) for r in rows]
    if packing:
        step = max(packed_batches(lengths, 8, 48, seed=0), key=len)  # the step with the most packed rows
    else:  # the length-grouped step whose one-tensor padding is worst
        step = max(([[i] for i in b] for b in length_grouped_batches(lengths, 8, 0)),
                   key=lambda b: _pad([lengths[r[0]] for r in b], [list(range(len(b)))]))
    seqs = [i for row in step for i in row]
    m_ref = tiny_model(tok, seed=5)
    m_ref.set_attn_implementation(impl)
    ref = _reference(m_ref, rows, seqs)
    ref.backward()
    m = tiny_model(tok, seed=5)
    m.set_attn_implementation(impl)
    st = sft_step(m, rows, step, tok.pad_token_id, packing=packing, max_pad_fraction=0.05)
    assert st["forwards"] > 1  # really split into micro-batches
    assert 1 - st["real"] / st["slots"] <= 0.05
    assert st["real"] == sum(lengths[i] for i in seqs)
    assert st["n"] == sum(sum(rows[i]["loss_mask"][1:]) for i in seqs)
    assert math.isclose(st["loss"], float(ref.detach()), rel_tol=1e-5)
    for (name, p1), p2 in zip(m_ref.named_parameters(), m.parameters(), strict=True):
        assert p1.grad is not None and p1.grad.abs().sum() > 0, name
        assert torch.allclose(p1.grad, p2.grad, rtol=1e-4, atol=1e-6), name
    # the one-tensor layout (max_pad_fraction=1) computes the same loss with more padding
    m1 = tiny_model(tok, seed=5)
    m1.set_attn_implementation(impl)
    one = sft_step(m1, rows, step, tok.pad_token_id, packing=packing, max_pad_fraction=1.0)
    assert one["forwards"] == 1 and one["slots"] > st["slots"]
    assert math.isclose(one["loss"], st["loss"], rel_tol=1e-5)


@pytest.mark.parametrize("packing", [False, True])
def test_long_tailed_mix_reports_at_most_5_percent_padding(tok, packing):
    rows = _rows()
    kw = {"epochs": 1, "lr": 1e-3, "batch_size": 8, "packing": packing, "max_tokens_per_row": 48}
    old = train_masked_sft(tiny_model(tok, seed=2), rows, tok.pad_token_id, max_pad_fraction=1.0, **kw)
    new = train_masked_sft(tiny_model(tok, seed=2), rows, tok.pad_token_id, **kw)
    d_old, d_new = old.to_dict(), new.to_dict()
    assert d_old["pad_fraction"] > 0.15  # the one-tensor layout pads this mix heavily (the test can fail)
    assert d_new["pad_fraction"] <= 0.05
    assert d_new["real_tokens"] == d_old["real_tokens"] == sum(len(r["input_ids"]) for r in rows)
    assert d_new["tokens_processed"] < d_old["tokens_processed"] and d_new["forwards"] > d_old["forwards"]
    assert math.isclose(d_new["pad_fraction"], 1 - d_new["real_tokens"] / d_new["tokens_processed"], abs_tol=1e-4)
    # same batches, same loss: the two runs follow the same trajectory
    assert new.steps == old.steps == 5 and new.tokens == old.tokens
    for a, b in zip(old.losses, new.losses, strict=True):
        assert math.isclose(a, b, rel_tol=1e-4)


def test_max_pad_fraction_checked_and_recorded(tok, tmp_path):
    rows = _rows(n_short=4, n_tail=2)
    with pytest.raises(ValueError, match="max_pad_fraction must be >= 0"):
        train_masked_sft(tiny_model(tok), rows, tok.pad_token_id, max_pad_fraction=-1)
    train_masked_sft(tiny_model(tok), rows, tok.pad_token_id, epochs=1, out_dir=tmp_path / "m")
    sft = json.loads((tmp_path / "m" / "sft.json").read_text())
    assert sft["max_pad_fraction"] == 0.05 and sft["pad_fraction"] <= 0.05
    assert RossConfig(store="s", upstream_model="m").train.max_pad_fraction == 0.05
    with pytest.raises(ValueError, match="max_pad_fraction"):
        RossConfig(store="s", upstream_model="m", train={"max_pad_fraction": 1.5})


@pytest.mark.parametrize("packing", [False, True])
def test_bfloat16_autocast_step_matches_float32(tok, packing):
    """``autocast="bfloat16"``: the forwards run in bfloat16 (their logits differ from float32), the loss
    and gradient stay within bfloat16's precision of the float32 step, and the weights and their
    gradients stay float32."""
    rows = _rows(seed=3)
    lengths = [len(r["input_ids"]) for r in rows]
    step = packed_batches(lengths, 8, 48, seed=0)[0] if packing else [[i] for i in range(8)]
    m32, m16 = tiny_model(tok, seed=4), tiny_model(tok, seed=4)
    a = sft_step(m32, rows, step, tok.pad_token_id, packing=packing)
    b = sft_step(m16, rows, step, tok.pad_token_id, packing=packing, autocast="bfloat16")
    assert a["n"] == b["n"] > 0 and a["forwards"] == b["forwards"]
    assert a["loss"] != b["loss"]  # really computed in another dtype
    assert math.isclose(a["loss"], b["loss"], rel_tol=2e-2)
    g32 = torch.cat([p.grad.flatten() for p in m32.parameters()])
    g16 = torch.cat([p.grad.flatten() for p in m16.parameters()])
    assert all(p.dtype == torch.float32 and p.grad.dtype == torch.float32 for p in m16.parameters())
    assert torch.nn.functional.cosine_similarity(g32, g16, dim=0) > 0.98


def test_autocast_checked_recorded_and_saved_as_float32(tok, tmp_path):
    rows = _rows(n_short=6, n_tail=2)
    with pytest.raises(ValueError, match="autocast must be one of"):
        sft_step(tiny_model(tok), rows, [[0], [1]], tok.pad_token_id, autocast="float16")
    res = train_masked_sft(tiny_model(tok, seed=1), rows, tok.pad_token_id, epochs=1, lr=1e-3,
                           out_dir=tmp_path / "m", autocast="bfloat16")  # warns where the CPU lacks bf16 units
    assert res.steps == 1 and math.isfinite(res.losses[0])
    assert json.loads((tmp_path / "m" / "sft.json").read_text())["autocast"] == "bfloat16"
    from transformers import AutoModelForCausalLM

    saved = AutoModelForCausalLM.from_pretrained(tmp_path / "m")
    assert next(saved.parameters()).dtype == torch.float32
    assert RossConfig(store="s", upstream_model="m").train.autocast is None
    assert RossConfig(store="s", upstream_model="m", train={"autocast": "bfloat16"}).train.autocast == "bfloat16"
    with pytest.raises(ValueError, match="autocast"):
        RossConfig(store="s", upstream_model="m", train={"autocast": "float16"})


@pytest.mark.parametrize("has_units", [False, True])
def test_bfloat16_autocast_warns_on_a_cpu_without_bfloat16_units(tok, monkeypatch, has_units):
    import warnings

    import gfcr.train.sft as sft

    monkeypatch.setattr(sft, "cpu_has_bf16_matmul", lambda: has_units)
    rows = _rows(n_short=2, n_tail=0)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        train_masked_sft(tiny_model(tok, seed=1), rows, tok.pad_token_id, epochs=1, autocast="bfloat16")
        train_masked_sft(tiny_model(tok, seed=1), rows, tok.pad_token_id, epochs=1)  # float32: never
    msgs = [str(w.message) for w in seen if "bfloat16 autocast" in str(w.message)]
    assert len(msgs) == (0 if has_units else 1), msgs
