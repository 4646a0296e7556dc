"""The end-of-sequence rule (issue 28): ROSS must teach the model to stop after the answer.

Under the old rule (``eos_rule="neighbours"``) the eos token is supervised only when the
character before it is kept, so after excluded trailing chatter it never is: the model is never
taught to stop. The default ``"after-answer"`` supervises the eos that closes the last assistant
turn when the kept text ends on the line stating the verified final answer.
"""

from __future__ import annotations

import numpy as np
import pytest

from gfcr.ross.audit import judge_rollout, make_audit, realign
from gfcr.ross.judges import ArithSteps, JudgeReply, KeepAll
from gfcr.ross.verdict import kept_ends_with_answer

from .conftest import make_prompt, make_rollout

Q = "What is 12 + 7? End with 'Answer: N'."
CHATTER = "12 + 7 = 18.\nWait, no.\n12 + 7 = 19.\nAnswer: 19\nLet me double check: 12 + 7 = 19.\nDone!\n"


class Fixed:
    name, version, mode = "fixed", "1", "select-keep"

    def __init__(self, raw):
        self.raw = raw

    def respond(self, request, feedback=None):
        return JudgeReply(self.raw)


def _audit(tok, text, judge, gold="19", **kw):
    r = make_rollout(tok, Q, text, gold=gold)
    dec, err, raws, cost, meta = judge_rollout(r, make_prompt(Q, gold), judge)
    return r, make_audit(r, dec, err, tok, judge, raws, cost, meta, **kw)


def test_eos_is_supervised_after_excluded_trailing_chatter(tok):
    r, a = _audit(tok, CHATTER, ArithSteps())
    assert a.status == "kept" and r.token_ids[-1] == tok.eos_token_id
    assert a.mask[-1] == 1  # main: 0, the model was never taught to stop
    assert a.meta["eos_rule"] == "after-answer" and a.meta["eos_supervised"] is True
    sup = tok.decode(r.token_ids[a.mask.astype(bool)], skip_special_tokens=True)
    assert "double check" not in sup and "Done" not in sup  # the chatter itself stays unsupervised


def test_old_rule_is_kept_behind_its_name(tok):
    r, a = _audit(tok, CHATTER, ArithSteps(), eos_rule="neighbours")
    assert a.status == "kept" and a.mask[-1] == 0 and a.meta["eos_supervised"] is False
    r2, b = _audit(tok, CHATTER, ArithSteps())
    assert np.array_equal(a.mask[:-1], b.mask[:-1])  # the rules differ only at the eos
    with pytest.raises(ValueError, match="eos_rule"):
        _audit(tok, CHATTER, ArithSteps(), eos_rule="always")


def test_eos_not_supervised_when_the_kept_text_does_not_end_on_the_answer(tok):
    # the kept text goes on past the answer line (a kept remark after it): the model stopped late
    text = "12 + 7 = 19.\nAnswer: 19\nSo the sum is nineteen.\nBye bye.\n"
    raw = ('{"verdict": "usable", "keep": [1, 2, 3], "exclude": [{"unit": 4, "category": "redundant_exploration"}]}')
    r, a = _audit(tok, text, Fixed(raw))
    assert a.status == "kept" and a.mask[-1] == 0 and a.meta["eos_supervised"] is False
    # without a known answer the old rule applies
    r, a = _audit(tok, CHATTER, Fixed('{"verdict": "usable", "keep": [3, 4], "exclude": ['
                                      '{"units": [1, 2], "category": "corrected_mistake"}, '
                                      '{"units": [5, 6], "category": "redundant_exploration"}]}'), gold=None)
    assert a.status == "kept" and a.mask[-1] == 0


def test_keep_all_and_a_clean_ending_are_unchanged(tok):
    for text in (CHATTER, "12 + 7 = 19.\nAnswer: 19"):
        r, a = _audit(tok, text, KeepAll())
        assert a.mask[-1] == 1


def test_kept_ends_with_answer_by_hand():
    text = "a\nAnswer: 7.\nbye\n"
    kept = np.ones(len(text), bool)
    kept[13:] = False  # "bye\n" excluded
    assert kept_ends_with_answer(text, kept, "7", None)
    assert not kept_ends_with_answer(text, np.ones(len(text), bool), "7", None)  # "bye" kept after it
    k2 = kept.copy()
    k2[10] = False  # the "7" itself excluded
    assert not kept_ends_with_answer(text, k2, "7", None)
    assert not kept_ends_with_answer(text, kept, None, None)
    # two turns: the answer is in the first, the last turn is excluded whole -> no
    t2 = "Answer: 7\nok"
    assert not kept_ends_with_answer(t2, np.array([True] * 10 + [False] * 2), "7", [(0, 9), (10, 12)])


def test_realign_applies_the_rule(tmp_path, tok):
    from gfcr.ross.audit import audit_rollouts, select_rollouts
    from gfcr.store import RolloutStore

    store = RolloutStore.open(tmp_path / "s", create=True)
    r = make_rollout(tok, Q, CHATTER, gold="19")
    store.append([r])
    store.upsert_prompts([make_prompt(Q, "19")])
    audit_rollouts(store, select_rollouts(store), ArithSteps(), tok, eos_rule="neighbours")
    assert store.audits(judge="arith-steps").to_pylist()[0]["mask"][-1] == 0
    realign(store, tok, "arith-steps", ArithSteps.version)
    assert store.audits(judge="arith-steps").to_pylist()[0]["mask"][-1] == 1
