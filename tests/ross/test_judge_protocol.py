"""The paper's judge protocol: roles (tool/env turns read-only), the independent re-check, the
category requirement, the discard rule in the prompt; tool-span quotes and a linear parse."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from gfcr.records import Cost, Message, Rollout
from gfcr.ross.audit import judge_request, judge_rollout, make_audit
from gfcr.ross.judges import LLMJudge
from gfcr.ross.units import split_units
from gfcr.ross.verdict import VerdictError, parse_json_object, validate_verdict

from .conftest import make_rollout

Q = "What is 6 * 7? End with 'Answer: N'."
A1 = "I will use the calculator.\n<tool_call>calc 6 * 8</tool_call>"
OBS = "48"
A2 = "Oops, I typed 6 * 8. 6 * 7 = 42.\nAnswer: 42"


def _agent_rollout(tok) -> Rollout:
    """user → assistant (tool call) → tool observation → assistant; tokens per turn."""
    msgs = [Message("user", Q), Message("assistant", A1), Message("tool", OBS), Message("assistant", A2)]
    ids, role = [], []
    for m in msgs:
        head = tok(f"<|im_start|>{m.role}\n", add_special_tokens=False)["input_ids"]
        body = tok(m.content, add_special_tokens=False)["input_ids"]
        end = [tok.eos_token_id]
        gen = m.role == "assistant"
        ids += head + body + end
        role += [0] * len(head) + [int(gen)] * (len(body) + 1)
    return Rollout(run_id="r", prompt_id="p", task="tool:calc", token_ids=np.array(ids, np.int32),
                   token_role=np.array(role, np.uint8), logprobs=np.zeros(len(ids), np.float32), messages=msgs,
                   verified=True, verifier={"evidence": {"extracted": "42"}})


class Chat:
    """A scripted OpenAI-style chat function recording what it was sent."""

    def __init__(self, replies):
        self.replies = list(replies)
        self.seen = []

    def __call__(self, messages):
        self.seen.append(messages)
        return (self.replies.pop(0) if self.replies else "{}"), Cost(100, 20, 0.1)


def test_judge_sees_whole_interaction_with_roles(tok):
    r = _agent_rollout(tok)
    req, bounds = judge_request(r, None, "locate-exclude")
    assert [t.role for t in req.turns] == ["user", "assistant", "tool", "assistant"]
    # units only cover assistant text, and none crosses into the other assistant turn
    assert all(any(a <= u.start and u.end <= b + 1 for a, b in bounds) for u in req.units)
    assert OBS not in [u.text.strip() for u in req.units]
    chat = Chat(['{"verdict": "usable", "exclude": [{"unit": 2, "category": "corrected_mistake"}]}'])
    judge = LLMJudge(chat, mode="locate-exclude", recheck=False)
    dec, err, raws, cost, meta = judge_rollout(r, None, judge)
    assert err is None and dec.status == "kept"
    prompt = chat.seen[0][1]["content"]
    assert "[tool — read-only context, never kept or excluded]\n48" in prompt
    assert prompt.index("[1] I will use") < prompt.index("48") < prompt.index("[3] Oops")
    system = chat.seen[0][0]["content"]
    assert "would have to keep a confirmed error or add missing reasoning" in system
    assert "over-planning, detours" in system and "other: only when none of the above fits" in system
    a = make_audit(r, dec, err, tok, judge, raws, cost, meta)
    assert not a.mask[r.token_role == 0].any()  # the tool turn is never supervised
    sup = tok.decode(r.token_ids[a.mask.astype(bool)], skip_special_tokens=True)
    assert "calc 6 * 8" not in sup and "Answer: 42" in sup


def test_quote_spanning_a_tool_turn_is_rejected(tok):
    r = _agent_rollout(tok)
    req, bounds = judge_request(r, None, "locate-exclude")
    span = "</tool_call>\nOops"  # end of turn 1 + the joiner + start of turn 2: a tool turn lies between
    assert span in req.text
    with pytest.raises(VerdictError, match="spans two assistant turns"):
        validate_verdict({"verdict": "usable", "exclude": [{"quote": span, "category": "other"}]},
                         req.text, req.units, "locate-exclude", None, bounds)


def test_tool_call_unit_never_crosses_turns():
    text = "<tool_call>calc\n2</tool_call> done"
    joined = "call <tool_call>x" + "\n" + "y</tool_call> ok"
    assert len(split_units(text)) == 2
    units = split_units(joined, bounds=[(0, 17), (18, len(joined))])
    assert not any(u.is_tool_call for u in units)  # the open tag in turn 1 does not pair with turn 2's close
    assert "".join(u.text for u in units) == joined


def test_every_unit_kept_or_excluded_with_a_category(tok):
    text = "3 + 4 = 8.\nHmm.\n3 + 4 = 7.\nAnswer: 7\n"
    units = split_units(text)
    with pytest.raises(VerdictError, match=r"unit\(s\) 1, 2 are neither kept nor excluded"):
        validate_verdict({"verdict": "usable", "keep": [3, 4]}, text, units, "select-keep", "7")
    d = validate_verdict({"verdict": "usable", "keep": [3, 4], "exclude": [
        {"units": [1, 2], "category": "corrected_mistake"}]}, text, units, "select-keep", "7")
    assert {s.category for s in d.excluded} == {"corrected_mistake"}
    # 'other' only when the judge says so
    d = validate_verdict({"verdict": "usable", "keep": [3, 4], "exclude": [
        {"unit": 1, "category": "corrected_mistake"}, {"unit": 2, "category": "other", "why": "filler"}]},
        text, units, "select-keep", "7")
    assert [s.category for s in d.excluded] == ["corrected_mistake", "other"]


PROPOSAL = '{"verdict": "usable", "keep": [3, 4], "exclude": [{"units": [1, 2], "category": "corrected_mistake"}]}'
TEXT = "3 + 4 = 8.\nHmm, wait.\n3 + 4 = 7.\nAnswer: 7\n"


@pytest.mark.parametrize("second,outcome,status", [
    (PROPOSAL, "confirmed", "kept"),
    ('{"verdict": "usable", "keep": [2, 3, 4], "exclude": [{"unit": 1, "category": "corrected_mistake"}]}',
     "revised", "kept"),
    ('{"verdict": "discard", "reason": "the fix is asserted, not shown"}', "discarded", "discarded"),
    ("not json", "invalid", "discarded"),
])
def test_recheck_may_confirm_revise_or_discard(tok, second, outcome, status):
    r = make_rollout(tok, Q, TEXT, gold="7")
    chat = Chat([PROPOSAL, second, second, second])
    judge = LLMJudge(chat, mode="select-keep", recheck=True)
    assert judge.version.endswith(":recheck")
    dec, err, raws, cost, meta = judge_rollout(r, None, judge, retries=2)
    assert meta["recheck"]["outcome"] == outcome
    a = make_audit(r, dec, err, tok, judge, raws, cost, meta)
    assert a.status == status
    # the re-check is a separate call that sees the proposal, not the first call's conversation
    rc = chat.seen[1]
    assert "re-check another auditor's proposal" in rc[0]["content"]
    assert json.loads(rc[-1]["content"].split("\n", 1)[1]) == json.loads(PROPOSAL)
    assert len(rc) == 3
    if outcome == "revised":
        kept = "".join(c for c, k in zip(TEXT, dec.kept_chars, strict=True) if k)
        assert kept.startswith("Hmm, wait.")
    if outcome == "invalid":
        assert "re-check" in a.reason and len(raws) == 4


def test_no_recheck_for_a_discard_or_when_off(tok):
    r = make_rollout(tok, Q, TEXT, gold="7")
    chat = Chat(['{"verdict": "discard", "reason": "no"}'])
    dec, *_rest, meta = judge_rollout(r, None, LLMJudge(chat, recheck=True))
    assert dec.status == "discarded" and len(chat.seen) == 1 and "recheck" not in meta
    chat = Chat([PROPOSAL])
    judge_rollout(r, None, LLMJudge(chat, recheck=False))
    assert len(chat.seen) == 1


def test_recheck_is_on_by_default_for_llm_judges_only(tok):
    """Issue 28: the paper re-checks every math/code selection independently; gfcr had it off."""
    from gfcr.ross.config import AuditJudgeConfig
    from gfcr.ross.judges import make_judge

    chat = Chat([PROPOSAL, PROPOSAL])
    judge = make_judge("llm", chat=chat, model="m")
    assert judge.recheck and judge.version == "3:m:recheck"
    r = make_rollout(tok, Q, TEXT, gold="7")
    _, _, _, _, meta = judge_rollout(r, None, judge)
    assert len(chat.seen) == 2 and meta["recheck"]["outcome"] == "confirmed"
    assert AuditJudgeConfig(name="llm", base_url="http://127.0.0.1:1/v1", model="m").recheck is True
    for name in ("arith-steps", "keep-all"):  # rule-based: no re-check call exists
        assert not getattr(make_judge(name), "recheck", False)
    assert not make_judge("llm", chat=chat, model="m", recheck=False).recheck


@pytest.mark.parametrize("raw", [
    "```" + "{" * 262144,                      # an open fence followed by braces
    "```json\n" + '{"a": [' * 40000 + "```",   # deep, unterminated
    "{" * 262144 + '"x"' + "}" * 10,
])
def test_large_hostile_output_parses_in_linear_time(raw):
    t0 = time.process_time()
    with pytest.raises(VerdictError):
        parse_json_object(raw)
    assert time.process_time() - t0 < 5.0  # the former regex took minutes on these


def test_parse_finds_object_with_trailing_text():
    assert parse_json_object('ok {"verdict": "discard", "reason": "r"} and } more')["verdict"] == "discard"
    assert parse_json_object('```json\n{"verdict": "usable"}\n```\nthanks {')["verdict"] == "usable"
