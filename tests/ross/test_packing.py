"""Packed masked SFT: the planner, the block-diagonal mask, and packed == unpacked loss/NLL/gradient."""

from __future__ import annotations

import json
import math

import pytest
import torch

from gfcr.ross.config import RossConfig
from gfcr.testing import tiny_model
from gfcr.train.losses import masked_nll
from gfcr.train.sft import (
    additive_mask,
    collate_packed,
    mean_token_nll,
    pack_sequences,
    packed_batches,
    train_masked_sft,
)


def test_pack_sequences_hand_worked():
    # longest first: 11 alone (> 10); 8 opens a row; 5 opens a row; 4 joins 5 (9);
    # 3 fits nowhere (11, 12) so opens a row; 2 joins 8 (10, exact fit).
    assert pack_sequences([5, 3, 8, 2, 4, 11], 10) == [[5], [2, 3], [0, 4], [1]]
    # balanced over the same 4 rows: 11 | 8 | 5 + 2 | 4 + 3 (loads 11, 8, 7, 7)
    assert pack_sequences([5, 3, 8, 2, 4, 11], 10, balance=True) == [[5], [2], [0, 3], [4, 1]]
    # 8 sequences of ~150 tokens in rows of 1024: first-fit leaves a short second row, balance does not.
    # first-fit: 160+155+150*4 = 915 (+145 > 1024), then 145+140 = 285; balanced: 600 and 600
    lens = [150, 160, 140, 155, 145, 150, 150, 150]
    assert [sum(lens[i] for i in r) for r in pack_sequences(lens, 1024)] == [915, 285]
    assert [sum(lens[i] for i in r) for r in pack_sequences(lens, 1024, balance=True)] == [600, 600]
    # balancing [5, 5, 4, 3, 3] in 2 rows of 10 would give 5+4 | 5+3+3 = 11 > 10: the first-fit plan stays
    assert pack_sequences([5, 5, 4, 3, 3], 10, balance=True) == pack_sequences([5, 5, 4, 3, 3], 10) == [[0, 1], [2, 3, 4]]
    assert pack_sequences([], 4) == []
    with pytest.raises(ValueError, match="at least 1 token"):
        pack_sequences([3, 0], 4)
    with pytest.raises(ValueError, match="max_tokens"):
        pack_sequences([3], 0)


def test_packed_batches_keep_batch_membership():
    lengths = [5, 3, 8, 2, 4, 11, 6]
    batches = packed_batches(lengths, batch_size=3, max_tokens=10, seed=1)
    assert len(batches) == 3  # ceil(7 / 3): same number of steps as padded batches
    flat = sorted(i for b in batches for row in b for i in row)
    assert flat == list(range(7))
    for b in batches:
        assert sum(len(row) for row in b) <= 3
        for row in b:
            assert len(row) == 1 or sum(lengths[i] for i in row) <= 10
    assert batches == packed_batches(lengths, 3, 10, seed=1)


def test_collate_packed_hand_worked():
    a = {"input_ids": [7, 8, 9], "loss_mask": [1, 1, 1]}
    b = {"input_ids": [4, 5], "loss_mask": [1, 1]}
    c = {"input_ids": [6], "loss_mask": [0]}
    out = collate_packed([[a, b], [c]], pad_id=0)
    assert out["input_ids"].tolist() == [[7, 8, 9, 4, 5], [6, 0, 0, 0, 0]]
    assert out["position_ids"].tolist() == [[0, 1, 2, 0, 1], [0, 0, 0, 0, 0]]
    # first token of each sequence is never a target (no prediction across the boundary 9 -> 4)
    assert out["loss_mask"].tolist() == [[0, 1, 1, 0, 1], [0, 0, 0, 0, 0]]
    assert out["labels"].tolist() == [[-100, 8, 9, -100, 5], [-100] * 5]
    assert out["seq_ids"].tolist() == [[0, 0, 0, 1, 1], [0, -1, -1, -1, -1]]
    assert out["attention_mask"].shape == (2, 1, 5, 5)
    assert out["attention_mask"][0, 0].int().tolist() == [
        [1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [1, 1, 1, 0, 0],
        [0, 0, 0, 1, 0],
        [0, 0, 0, 1, 1],
    ]
    # padding attends only to itself (no fully masked row), real token 6 only to itself
    assert out["attention_mask"][1, 0].int().tolist() == [[int(i == j) for j in range(5)] for i in range(5)]
    add = additive_mask(out["attention_mask"], torch.float32)
    assert add[0, 0, 3, 3] == 0 and add[0, 0, 3, 2] == torch.finfo(torch.float32).min
    with pytest.raises(ValueError, match="loss_mask has 1 entries for 2 tokens"):
        collate_packed([[{"input_ids": [1, 2], "loss_mask": [1]}]], 0)


def _seqs():
    g = torch.Generator().manual_seed(0)
    out = []
    for n in (7, 5, 9, 4, 6):
        ids = torch.randint(5, 400, (n,), generator=g).tolist()
        mask = [1] + torch.randint(0, 2, (n - 1,), generator=g).tolist()  # first 1 must be ignored
        mask[-1] = 1
        out.append({"input_ids": ids, "loss_mask": mask})
    return out


def _unpacked(model, seqs):
    """Per-sequence (nll_sum, n) with each sequence alone in a row (no padding)."""
    res = []
    for r in seqs:
        ids = torch.tensor([r["input_ids"]])
        logits = model(input_ids=ids).logits
        loss, n = masked_nll(logits, ids, torch.tensor([r["loss_mask"]]))
        res.append((loss * n, n))
    return res


def _packed(model, seqs, max_tokens):
    plan = pack_sequences([len(r["input_ids"]) for r in seqs], max_tokens)
    b = collate_packed([[seqs[i] for i in row] for row in plan], pad_id=0)
    logits = model(input_ids=b["input_ids"], position_ids=b["position_ids"],
                   attention_mask=additive_mask(b["attention_mask"], torch.float32)).logits
    loss, n = masked_nll(logits, b["input_ids"], b["loss_mask"])
    # per-sequence sums: target t belongs to the sequence of position t
    logp = torch.log_softmax(logits[:, :-1], -1).gather(-1, b["input_ids"][:, 1:, None]).squeeze(-1)
    m, seg = b["loss_mask"][:, 1:].bool(), b["seq_ids"][:, 1:]
    per = {}
    for r, row in enumerate(plan):
        for j, i in enumerate(row):
            sel = m[r] & (seg[r] == j)
            per[i] = (-(logp[r][sel]).sum(), int(sel.sum()))
    return loss, n, per, plan, b, logits


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_packed_loss_and_per_sequence_nll_equal_unpacked(tok, impl):
    model = tiny_model(tok, seed=3)
    model.set_attn_implementation(impl)
    seqs = _seqs()
    with torch.no_grad():
        ref = _unpacked(model, seqs)
        loss, n, per, plan, _, _ = _packed(model, seqs, max_tokens=16)
    assert any(len(row) > 1 for row in plan)  # something is really packed
    tot = sum(float(s) for s, _ in ref)
    cnt = sum(int(k) for _, k in ref)
    assert int(n) == cnt
    assert math.isclose(float(loss), tot / cnt, rel_tol=1e-5, abs_tol=1e-5)
    for i, (s, k) in enumerate(ref):
        assert per[i][1] == int(k)
        assert math.isclose(float(per[i][0]), float(s), rel_tol=1e-5, abs_tol=1e-5)


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_changing_one_sequence_leaves_its_pack_neighbour_untouched(tok, impl):
    model = tiny_model(tok, seed=4)
    model.set_attn_implementation(impl)
    a = {"input_ids": [11, 12, 13, 14, 15], "loss_mask": [0, 1, 1, 1, 1]}
    a2 = {"input_ids": [90, 91, 92, 93, 94], "loss_mask": [0, 1, 1, 1, 1]}
    b = {"input_ids": [21, 22, 23, 24], "loss_mask": [0, 1, 1, 1]}
    with torch.no_grad():
        outs = []
        for first in (a, a2):
            p = collate_packed([[first, b]], 0)
            outs.append(model(input_ids=p["input_ids"], position_ids=p["position_ids"],
                              attention_mask=additive_mask(p["attention_mask"], torch.float32)).logits[0, 5:])
        assert torch.allclose(outs[0], outs[1], atol=1e-6)
        # the same change does move B's logits when the mask is a plain causal one (the test can fail)
        leaky = [model(input_ids=collate_packed([[f, b]], 0)["input_ids"]).logits[0, 5:] for f in (a, a2)]
        assert not torch.allclose(leaky[0], leaky[1], atol=1e-3)
        # and the packed B logits equal B alone
        alone = model(input_ids=torch.tensor([b["input_ids"]])).logits[0]
        assert torch.allclose(outs[0], alone, atol=1e-5)


def test_packed_gradient_equals_unpacked_gradient(tok):
    """Normalisation: mean over the supervised tokens of the whole batch (sum of NLLs / total count)."""
    seqs = _seqs()
    m1 = tiny_model(tok, seed=5)
    ref = _unpacked(m1, seqs)
    cnt = sum(k for _, k in ref)
    (sum(s for s, _ in ref) / cnt).backward()
    m2 = tiny_model(tok, seed=5)
    loss, *_ = _packed(m2, seqs, max_tokens=16)
    loss.backward()
    for (name, p1), p2 in zip(m1.named_parameters(), m2.parameters(), strict=True):
        assert p1.grad is not None and p1.grad.abs().sum() > 0, name
        assert torch.allclose(p1.grad, p2.grad, rtol=1e-4, atol=1e-6), name


def test_hf_labels_loss_matches_on_packed_batch(tok):
    model = tiny_model(tok, seed=6)
    seqs = _seqs()
    with torch.no_grad():
        loss, _, _, _, b, _ = _packed(model, seqs, max_tokens=16)
        hf = model(input_ids=b["input_ids"], position_ids=b["position_ids"],
                   attention_mask=additive_mask(b["attention_mask"], torch.float32), labels=b["labels"]).loss
    assert math.isclose(float(hf), float(loss), rel_tol=1e-5)


def test_train_masked_sft_packing_lowers_loss(tok, tmp_path):
    model = tiny_model(tok, seed=2)
    texts = ["12 + 7 = 19. Answer: 19", "3 + 4 = 7. Answer: 7", "20 + 22 = 42. So the answer is 42. Answer: 42"]
    rows = []
    for t in texts:
        ids = tok(t, add_special_tokens=False)["input_ids"]
        rows.append({"input_ids": ids, "loss_mask": [0] * 4 + [1] * (len(ids) - 4)})
    rows = rows * 2
    before = mean_token_nll(model, rows, tok.pad_token_id).mean_nll
    res = train_masked_sft(model, rows, tok.pad_token_id, epochs=3, lr=3e-3, batch_size=3, packing=True,
                           max_tokens_per_row=64, out_dir=tmp_path / "m", tokenizer=tok)
    after = mean_token_nll(model, rows, tok.pad_token_id).mean_nll
    assert res.steps == 6 and after < before - 0.5
    assert (tmp_path / "m" / "sft.json").read_text().count('"packing": true') == 1
    # nothing masked in: no step, weights unchanged
    m2 = tiny_model(tok, seed=2)
    w0 = [p.detach().clone() for p in m2.parameters()]
    r = train_masked_sft(m2, [{"input_ids": rows[0]["input_ids"], "loss_mask": [0] * len(rows[0]["input_ids"])}],
                         tok.pad_token_id, epochs=1, packing=True)
    assert r.steps == 0 and all(torch.equal(a, b) for a, b in zip(w0, m2.parameters(), strict=True))


def test_packing_in_ross_config():
    cfg = RossConfig(store="s", upstream_model="m", train={"packing": True, "max_tokens_per_row": 512})
    assert cfg.train.packing and cfg.train.max_tokens_per_row == 512
    assert RossConfig(store="s", upstream_model="m").train.packing is False
    with pytest.raises(ValueError):
        RossConfig(store="s", upstream_model="m", train={"max_tokens_per_row": 2})


def test_packing_refuses_attention_without_4d_masks(tok):
    model = tiny_model(tok, seed=2)
    model.config._attn_implementation = "flash_attention_2"
    w0 = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(ValueError, match="attn_implementation='sdpa' or 'eager'"):
        train_masked_sft(model, [{"input_ids": [5, 6, 7], "loss_mask": [0, 1, 1]}], tok.pad_token_id, packing=True)
    assert all(torch.equal(a, b) for a, b in zip(w0, model.parameters(), strict=True))


def test_ross_run_trains_packed_from_config(tmp_path, tok):
    from gfcr.ross.config import load_config
    from gfcr.ross.pipeline import run_ross

    from .test_pipeline import _config

    raw = _config(tmp_path, tok)
    raw.update(variants=["ross"], stages=["select", "audit", "build", "train"])
    cfg = load_config(None, {**raw, "train.packing": True, "train.max_tokens_per_row": 256})
    res = run_ross(cfg, log=lambda *_: None)
    tr = res.results["train"]["ross"]
    assert tr["steps"] == 2 and tr["pad_fraction"] is not None  # 6 rows, batch 4
    sft = json.loads((res.run_dir / "models" / "ross" / "sft.json").read_text())
    assert sft["packing"] is True and sft["max_tokens_per_row"] == 256
