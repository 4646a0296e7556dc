"""Masked SFT checkpoints: a run stopped mid-epoch (an exception, as a kill would leave it) and resumed from
its checkpoint ends with the uninterrupted run's weights, bit for bit, and the same per-step losses; a
checkpoint of other rows or arguments is refused; ROSS's train stage skips a finished variant."""

from __future__ import annotations

import json
import random

import pytest
import torch

import gfcr.train.sft as sft
from gfcr.testing import tiny_model, tiny_tokenizer
from gfcr.train.sft import train_masked_sft


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


def _rows(n=22, seed=0, vocab=256):
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        k = rng.randint(6, 30)
        rows.append({"input_ids": [rng.randrange(5, vocab) for _ in range(k)],
                     "loss_mask": [0] * (k // 3) + [rng.choice([0, 1, 1]) for _ in range(k - k // 3)]})
    return rows


KW = dict(epochs=2, lr=1e-3, batch_size=4, seed=3, warmup_frac=0.3, weight_decay=0.01)


class _Killed(Exception):
    pass


def _state(m):
    return {k: v.clone() for k, v in m.state_dict().items()}


@pytest.mark.parametrize("kill_after", [4, 6, 9])  # mid-epoch with a checkpoint 0 / 2 steps back, and in epoch 2
def test_resumed_sft_equals_the_uninterrupted_run(tok, tmp_path, monkeypatch, kill_after):
    rows = _rows()
    ref_model = tiny_model(tok, seed=1)
    ref = train_masked_sft(ref_model, rows, tok.pad_token_id, **KW)
    assert ref.steps == 12  # 22 rows / 4 → 6 steps an epoch

    real_step = sft.sft_step
    calls = {"n": 0}

    def dying_step(*a, **k):
        calls["n"] += 1
        if calls["n"] > kill_after:
            raise _Killed
        return real_step(*a, **k)

    ck = tmp_path / "ck"
    monkeypatch.setattr(sft, "sft_step", dying_step)
    with pytest.raises(_Killed):
        train_masked_sft(tiny_model(tok, seed=1), rows, tok.pad_token_id, checkpoint_dir=ck, checkpoint_every=4, **KW)
    monkeypatch.setattr(sft, "sft_step", real_step)
    assert (ck / "sft_state.pt").exists()
    m = tiny_model(tok, seed=1)  # a fresh process would load the initial weights again
    res = train_masked_sft(m, rows, tok.pad_token_id, checkpoint_dir=ck, checkpoint_every=4, **KW)
    assert res.steps == ref.steps and res.losses == ref.losses and res.tokens == ref.tokens
    got, want = _state(m), _state(ref_model)
    assert got.keys() == want.keys()
    assert all(torch.equal(got[k], want[k]) for k in want)


def test_resume_without_the_optimizer_state_would_differ(tok, tmp_path, monkeypatch):
    """The check above has power: the same resume restoring only the weights and the position (fresh AdamW
    moments and schedule) ends elsewhere."""
    rows = _rows()
    ref_model = tiny_model(tok, seed=1)
    train_masked_sft(ref_model, rows, tok.pad_token_id, **KW)
    ck = tmp_path / "ck"
    real_step, calls = sft.sft_step, {"n": 0}

    def dying_step(*a, **k):
        calls["n"] += 1
        if calls["n"] > 7:
            raise _Killed
        return real_step(*a, **k)

    monkeypatch.setattr(sft, "sft_step", dying_step)
    with pytest.raises(_Killed):  # killed in epoch 2, after the epoch-end checkpoint
        train_masked_sft(tiny_model(tok, seed=1), rows, tok.pad_token_id, checkpoint_dir=ck, **KW)
    monkeypatch.setattr(sft, "sft_step", real_step)
    real_load = sft._load_sft_state

    def weights_only_load(path, key, model, opt, sched, res):
        st = torch.load(path, map_location="cpu", weights_only=True)
        model.load_state_dict(st["model"])
        return (int(st["pos"][0]), int(st["pos"][1])), 0.0

    monkeypatch.setattr(sft, "_load_sft_state", weights_only_load)
    m = tiny_model(tok, seed=1)
    train_masked_sft(m, rows, tok.pad_token_id, checkpoint_dir=ck, **KW)
    assert not all(torch.equal(a, b) for a, b in zip(m.state_dict().values(), ref_model.state_dict().values(), strict=True))
    monkeypatch.setattr(sft, "_load_sft_state", real_load)


def test_a_checkpoint_of_other_rows_or_arguments_is_refused(tok, tmp_path):
    rows = _rows()
    ck = tmp_path / "ck"
    train_masked_sft(tiny_model(tok, seed=1), rows, tok.pad_token_id, checkpoint_dir=ck, **{**KW, "epochs": 1})
    with pytest.raises(ValueError, match="checkpoint of other rows or training arguments"):
        train_masked_sft(tiny_model(tok, seed=1), rows, tok.pad_token_id, checkpoint_dir=ck, **{**KW, "epochs": 1, "lr": 2e-3})
    other = [dict(r) for r in rows]
    other[0] = {**other[0], "loss_mask": [1] * len(other[0]["loss_mask"])}
    with pytest.raises(ValueError, match="checkpoint of other rows"):
        train_masked_sft(tiny_model(tok, seed=1), other, tok.pad_token_id, checkpoint_dir=ck, **{**KW, "epochs": 1})


def test_ross_train_stage_resumes_a_killed_variant_and_skips_finished_ones(tmp_path, tok, monkeypatch):
    """`gfcr ross train` on the same run folder after a kill: the finished variant is not trained again, the
    killed one continues from its checkpoint and ends with the uninterrupted run's weights."""
    from tests.ross.test_pipeline import _config
    from transformers import AutoModelForCausalLM

    from gfcr.ross.config import load_config
    from gfcr.ross.pipeline import run_ross

    c = _config(tmp_path, tok)
    c.update(variants=["positive_sft", "ross"], base_model=None, stages=["select", "audit", "build"])
    c["train"].update(epochs=2, batch_size=2, checkpoint_every=1)
    cfg = load_config(None, c)
    quiet = {"log": lambda *_: None}
    ref, rd = tmp_path / "ref", tmp_path / "rd"
    for d in (ref, rd):
        run_ross(cfg, run_dir=d, **quiet)
    run_ross(cfg.model_copy(update={"stages": ["train"]}), run_dir=ref, **quiet)

    real_step, calls = sft.sft_step, {"n": 0}
    steps_first = json.loads((ref / "models" / "positive_sft" / "sft.json").read_text())["steps"]

    def dying_step(*a, **k):
        calls["n"] += 1
        if calls["n"] > steps_first + 2:  # in the second variant, after its step-2 checkpoint
            raise _Killed
        return real_step(*a, **k)

    monkeypatch.setattr(sft, "sft_step", dying_step)
    with pytest.raises(_Killed):
        run_ross(cfg.model_copy(update={"stages": ["train"]}), run_dir=rd, **quiet)
    monkeypatch.setattr(sft, "sft_step", real_step)
    assert (rd / "models" / "positive_sft" / "sft.json").exists() and (rd / "checkpoints" / "ross" / "sft_state.pt").exists()
    res = run_ross(cfg.model_copy(update={"stages": ["train"]}), run_dir=rd, **quiet)
    assert res.results["train"]["positive_sft"]["already_trained"] is True
    assert "already_trained" not in res.results["train"]["ross"]
    assert not (rd / "checkpoints" / "ross").exists()  # removed once the variant is saved
    for v in ("positive_sft", "ross"):
        a = AutoModelForCausalLM.from_pretrained(ref / "models" / v).state_dict()
        b = AutoModelForCausalLM.from_pretrained(rd / "models" / v).state_dict()
        assert all(torch.equal(a[k], b[k]) for k in a), v
