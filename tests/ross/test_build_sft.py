"""Masked-SFT loss by hand, zero gradient on masked-out tokens, the build stage and TRL acceptance."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from gfcr.ross.audit import audit_rollouts, select_rollouts
from gfcr.ross.build import IGNORE_INDEX, build_dataset, labels_from_mask, load_dataset_rows
from gfcr.ross.judges import ArithSteps, KeepAll
from gfcr.testing import tiny_model
from gfcr.train.losses import masked_nll
from gfcr.train.sft import collate, length_grouped_batches, mean_token_nll, train_masked_sft

from .test_judges_audit import _store_with


def test_masked_nll_hand_worked():
    logits = torch.log(torch.tensor([[[0.5, 0.25, 0.125, 0.125], [0.25, 0.25, 0.25, 0.25], [0.7, 0.1, 0.1, 0.1]]]))
    ids = torch.tensor([[0, 0, 1]])
    loss, n = masked_nll(logits, ids, torch.tensor([[0, 1, 1]]))
    assert n == 2 and math.isclose(float(loss), (math.log(2) + math.log(4)) / 2, rel_tol=1e-6)
    loss, n = masked_nll(logits, ids, torch.tensor([[1, 0, 1]]))  # position 0 is never a target
    assert n == 1 and math.isclose(float(loss), math.log(4), rel_tol=1e-6)
    loss, n = masked_nll(logits, ids, torch.zeros(1, 3, dtype=torch.long))
    assert n == 0 and float(loss) == 0.0


def test_labels_from_mask():
    assert labels_from_mask(np.array([5, 6, 7]), np.array([0, 1, 0])).tolist() == [-100, 6, -100]
    with pytest.raises(ValueError, match="loss_mask"):
        labels_from_mask(np.array([5, 6]), np.array([1]))


def test_length_grouped_batches_group_similar_lengths():
    b = length_grouped_batches([5, 1, 4, 2, 9, 8], 2, seed=3)
    assert sorted(map(sorted, b)) == [[0, 2], [1, 3], [4, 5]]
    assert b == length_grouped_batches([5, 1, 4, 2, 9, 8], 2, seed=3)


def test_masked_sft_loss_on_tiny_model_and_zero_grad_outside_mask(tok):
    model = tiny_model(tok, seed=1)
    rows = [{"input_ids": [3, 40, 41, 42, 43, 44, 45], "loss_mask": [0, 0, 1, 1, 0, 1, 0]},
            {"input_ids": [7, 8, 9, 10], "loss_mask": [0, 1, 0, 1]}]
    b = collate(rows, tok.pad_token_id)
    out = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"])
    logits = out.logits
    logits.retain_grad()
    loss, n = masked_nll(logits, b["input_ids"], b["loss_mask"])
    # by hand: mean of -log softmax at each masked-in target
    terms = []
    for i, r in enumerate(rows):
        for t, m in enumerate(r["loss_mask"]):
            if m and t > 0:
                p = torch.softmax(logits[i, t - 1].detach(), -1)[r["input_ids"][t]]
                terms.append(-math.log(float(p)))
    assert int(n) == len(terms) == 5
    assert math.isclose(float(loss.detach()), sum(terms) / len(terms), rel_tol=1e-5)
    # HF's own loss with labels=-100 outside the mask agrees
    labels = torch.where(b["loss_mask"].bool(), b["input_ids"], torch.full_like(b["input_ids"], IGNORE_INDEX))
    assert math.isclose(float(model(**{k: b[k] for k in ("input_ids", "attention_mask")}, labels=labels).loss),
                        float(loss), rel_tol=1e-5)
    loss.backward()
    g = logits.grad[:, :-1].abs().sum(-1)  # gradient on the prediction of token t+1
    target_mask = b["loss_mask"][:, 1:].bool()
    assert torch.all(g[~target_mask] == 0)
    assert torch.all(g[target_mask] > 0)


def test_train_masked_sft_lowers_loss_and_ignores_masked_out_tokens(tok, tmp_path):
    model = tiny_model(tok, seed=2)
    ids = tok("12 + 7 = 19. Answer: 19", add_special_tokens=False)["input_ids"]
    rows = [{"input_ids": ids, "loss_mask": [0] * 4 + [1] * (len(ids) - 4)}] * 4
    before = mean_token_nll(model, rows, tok.pad_token_id).mean_nll
    res = train_masked_sft(model, rows, tok.pad_token_id, epochs=3, lr=3e-3, batch_size=2, out_dir=tmp_path / "m",
                           tokenizer=tok)
    after = mean_token_nll(model, rows, tok.pad_token_id).mean_nll
    assert res.steps == 6 and after < before
    assert (tmp_path / "m" / "sft.json").exists()
    # rows with nothing masked in leave the weights untouched
    m2 = tiny_model(tok, seed=2)
    w0 = [p.detach().clone() for p in m2.parameters()]
    r = train_masked_sft(m2, [{"input_ids": ids, "loss_mask": [0] * len(ids)}], tok.pad_token_id, epochs=1)
    assert r.steps == 0 and all(torch.equal(a, b) for a, b in zip(w0, m2.parameters(), strict=True))


@pytest.fixture
def audited_store(tmp_path, tok):
    store = _store_with(tmp_path, tok)
    sel = select_rollouts(store)
    audit_rollouts(store, sel, ArithSteps(), tok)
    audit_rollouts(store, sel, KeepAll(), tok)
    return store


def test_build_masked_and_ablations(audited_store, tmp_path):
    res = build_dataset(audited_store, tmp_path / "ross", "arith-steps")
    rows = load_dataset_rows(tmp_path / "ross")
    assert res.rows == len(rows) == 6 and 0 < res.supervised_tokens < res.generated_tokens
    for r in rows:
        ids, lab, m = map(np.array, (r["input_ids"], r["labels"], r["loss_mask"]))
        assert np.all(lab[m == 1] == ids[m == 1]) and np.all(lab[m == 0] == IGNORE_INDEX)
    nomask = build_dataset(audited_store, tmp_path / "nomask", "arith-steps", no_mask=True)
    rows_nm = load_dataset_rows(tmp_path / "nomask")
    assert [r["input_ids"] for r in rows_nm] == [r["input_ids"] for r in rows]  # same samples and context
    assert nomask.supervised_tokens == nomask.generated_tokens == res.generated_tokens
    ka = build_dataset(audited_store, tmp_path / "keepall", "keep-all")
    assert ka.supervised_tokens == ka.generated_tokens
    with pytest.raises(FileExistsError):
        build_dataset(audited_store, tmp_path / "ross", "arith-steps")
    import datasets

    hf = datasets.load_from_disk(str(tmp_path / "ross" / "hf"))
    assert hf.num_rows == 6 and hf[0]["labels"] == rows[0]["labels"]


def test_trl_sfttrainer_one_step_on_exported_dataset(audited_store, tmp_path, tok):
    import datasets
    from trl import SFTConfig, SFTTrainer

    build_dataset(audited_store, tmp_path / "ross", "arith-steps")
    ds = datasets.load_from_disk(str(tmp_path / "ross" / "hf")).select_columns(["input_ids", "labels"])
    model = tiny_model(tok, seed=0)
    cfg = SFTConfig(output_dir=str(tmp_path / "trl"), max_steps=1, per_device_train_batch_size=2, bf16=False,
                    gradient_checkpointing=False, report_to=[], logging_steps=1, save_strategy="no",
                    use_cpu=True, dataloader_num_workers=0)
    trainer = SFTTrainer(model=model, args=cfg, train_dataset=ds, processing_class=tok)
    w0 = [p.detach().clone() for p in model.parameters()]
    out = trainer.train()
    assert out.global_step == 1 and math.isfinite(out.training_loss)
    assert any(not torch.equal(a, b) for a, b in zip(w0, model.parameters(), strict=True))
    # the explicit labels reach the model: the batch TRL builds keeps -100 where our mask is 0
    batch = trainer.data_collator([ds[0]])
    lab = batch["labels"][0]
    assert int((lab != IGNORE_INDEX).sum()) == sum(1 for x in ds[0]["labels"] if x != IGNORE_INDEX)
