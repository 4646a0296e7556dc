"""Shared helpers for the ROSS tests: rollouts built from text with the tiny tokenizer."""

from __future__ import annotations

import numpy as np
import pytest

from gfcr.records import Message, Prompt, Rollout
from gfcr.testing import tiny_tokenizer


@pytest.fixture(scope="session")
def tok():
    return tiny_tokenizer()


def make_rollout(tok, question: str, answer_text: str, gold: str | None = None, step: int = 0,
                 verified: bool = True, run_id: str = "run", prompt_id: str = "p0", eos: bool = True) -> Rollout:
    """A single-turn rollout: ChatML context tokens (role 0) + the tokens of ``answer_text`` (role 1)."""
    ctx = tok.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True, tokenize=False)
    ctx_ids = tok(ctx, add_special_tokens=False)["input_ids"]
    gen_ids = tok(answer_text, add_special_tokens=False)["input_ids"] + ([tok.eos_token_id] if eos else [])
    ids = np.array(ctx_ids + gen_ids, np.int32)
    role = np.array([0] * len(ctx_ids) + [1] * len(gen_ids), np.uint8)
    lp = np.where(role == 1, -0.5, 0.0).astype(np.float32)
    return Rollout(
        run_id=run_id, prompt_id=prompt_id, token_ids=ids, token_role=role, logprobs=lp, task="arith", step=step,
        messages=[Message("user", question), Message("assistant", answer_text)], reward=1.0 if verified else 0.0,
        verified=verified, verifier={"name": "numeric", "evidence": {"parsed": gold}} if gold else {},
    )


def make_prompt(question: str, gold: str, prompt_id: str = "p0", split: str = "train") -> Prompt:
    return Prompt(prompt_id=prompt_id, task="arith", messages=[Message("user", question)], answer=gold, split=split)


def judge_text(tok, question: str, text: str, gold: str) -> tuple:
    """Judge the one-turn rollout answering ``question`` with ``text`` by ``arith-steps``: its audit,
    the judge's reply (a dict) and the kept characters of ``text`` ("" unless kept)."""
    import json

    from gfcr.ross.audit import judge_rollout, make_audit
    from gfcr.ross.judges import ArithSteps

    r = make_rollout(tok, question, text, gold=gold)
    judge = ArithSteps()
    dec, err, raws, cost, meta = judge_rollout(r, make_prompt(question, gold), judge)
    assert err is None, raws
    a = make_audit(r, dec, err, tok, judge, raws, cost, meta)
    kept = "".join(c for c, k in zip(text, dec.kept_chars, strict=True) if k) if dec.status == "kept" else ""
    return a, json.loads(raws[-1]), kept
