"""Rollout health checks (issue 27, item 2): one test per check on hand-built rollouts, each
returning its evidence; a quiet run on the clean fixture dumps; `gfcr diagnose` and `gfcr report`
list them."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from gfcr.cli import app
from gfcr.diagnose.health import (
    HealthConfig,
    decode_mismatch,
    empty_turns,
    logprob_gap,
    run_health_checks,
    runaway,
    trainer_logprobs,
    unanswered_tool_calls,
)
from gfcr.records import Message, Rollout
from gfcr.testing import tiny_tokenizer

HERE = Path(__file__).resolve().parent


def _row(run="h", text="The answer is 4.", ids=None, role=None, lp=None, finish="stop", messages=None, meta=None,
         rid=None, tok=None, **kw):
    if ids is None:
        gen = tok(text, add_special_tokens=False)["input_ids"] if tok is not None else list(range(10, 20))
        ids = [1, 2, 3] + list(gen)
        role = [0, 0, 0] + [1] * len(gen)
    lp = lp if lp is not None else [0.0 if r == 0 else -0.5 for r in role]
    return Rollout(run_id=run, prompt_id="p", group_id="p@0", token_ids=np.asarray(ids, np.int32),
                   token_role=np.asarray(role, np.uint8), logprobs=np.asarray(lp, np.float32),
                   messages=messages if messages is not None else [Message("user", "2+2?"), Message("assistant", text)],
                   finish_reason=finish, verifier={"name": "exact"}, meta=meta or {},
                   **({"rollout_id": rid} if rid else {}), **kw)


# --- pure checks, hand-worked ------------------------------------------------------------------------


def test_runaway_hand_worked():
    role = np.ones(12, np.int8)
    ids = np.array([5, 6, 7] * 4)
    assert runaway(ids, role, "length", ngram=3, min_repeats=4) == {"repeats": 4, "ngram": 3, "tail": [5, 6, 7],
                                                                     "gen_tokens": 12}
    assert runaway(ids, role, "stop", ngram=3, min_repeats=4) is None  # repeating but it stopped by itself
    assert runaway(np.arange(12), role, "length", ngram=3, min_repeats=4) is None  # at the cap, no repeat


def test_tail_repeats_matches_the_exact_count():
    from gfcr.control.groups import tail_ngram_count
    from gfcr.diagnose.health import tail_repeats

    gen = np.array([1, 2, 1, 2, 1, 2, 5, 6, 7])
    row = np.array([0] * 6 + [1] * 3)
    assert tail_repeats(gen, row, 3, 2).tolist() == [3, 1, 0]  # row 2 has no tokens
    rng = np.random.default_rng(0)
    rows = [rng.integers(0, 3, rng.integers(0, 40)) for _ in range(200)]  # small alphabet: many repeats
    flat = np.concatenate(rows)
    idx = np.repeat(np.arange(len(rows)), [len(r) for r in rows])
    for n in (1, 3, 5):
        assert tail_repeats(flat, idx, len(rows), n).tolist() == [tail_ngram_count(r, n) for r in rows]


def test_turn_checks_hand_worked():
    assert empty_turns([{"role": "user", "content": "q"}, {"role": "assistant", "content": "  "}]) == [
        {"turn": 1, "role": "assistant", "problem": "empty content, no tool call"}]
    assert empty_turns([{"role": "user", "content": "q"}]) == [{"turn": None, "role": "assistant",
                                                                "problem": "no assistant turn"}]
    assert empty_turns([{"role": "user", "content": "q"}, {"role": "assistant", "content": "", "tool_calls": "[{}]"},
                        {"role": "tool", "content": "42"}, {"role": "assistant", "content": "42"}]) == []
    two = '[{"name": "a"}, {"name": "b"}]'
    msgs = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "x", "tool_calls": two},
            {"role": "tool", "content": "1"}, {"role": "assistant", "content": "y", "tool_calls": '[{"name": "c"}]'}]
    assert unanswered_tool_calls(msgs) == [{"turn": 1, "calls": 2, "observations": 1},
                                           {"turn": 3, "calls": 1, "observations": 0}]


def test_logprob_gap_and_trainer_sources_hand_worked():
    assert logprob_gap(np.array([0, -1, -2.]), np.array([0, -1.2, -1.0]), np.array([0, 1, 1])) == pytest.approx(
        {"gap_mean": 0.6, "gap_max": 1.0, "at": 2, "n": 2})
    assert trainer_logprobs({"trainer_logprobs": [0, -1.5]}, 2).tolist() == [0.0, -1.5]
    verl = {"logprobs_from": "rollout_log_probs", "verl": {"n_prompt": 2, "per_token": {"old_log_probs": [-0.5]},
                                                           "layout": {"old_log_probs": "response"}}}
    assert trainer_logprobs(verl, 3).tolist() == [0.0, 0.0, -0.5]
    # verl stored the trainer's own log-probs as `logprobs` (no rollout_log_probs): there is no pair
    assert trainer_logprobs({**verl, "logprobs_from": "old_log_probs"}, 3) is None


def test_decode_mismatch_hand_worked():
    tok = tiny_tokenizer()
    ids = tok("The answer is 5.", add_special_tokens=False)["input_ids"]
    role = np.ones(len(ids), np.int8)
    assert decode_mismatch(tok, np.asarray(ids), role, [{"role": "assistant", "content": "The answer is 5."}]) is None
    ev = decode_mismatch(tok, np.asarray(ids), role, [{"role": "assistant", "content": "The answer is 4."}])
    assert ev["decoded"] == "The answer is 5." and ev["stored"] == "The answer is 4." and ev["run"] == 0


# --- one test per check through the store scan ---------------------------------------------------------


@pytest.fixture
def tok():
    return tiny_tokenizer()


def _only(report, check):
    hits = [i for i in report.issues if i.check == check]
    assert report.counts[check] == len(hits), report.counts
    return hits


def test_check_runaway(store, tok):
    loop = [7, 8, 9, 10] * 20
    store.append([_row(ids=[1, 2] + loop, role=[0, 0] + [1] * 80, finish="length", rid="loop"),
                  _row(ids=[1, 2] + list(range(20, 100)), role=[0, 0] + [1] * 80, finish="length", rid="long-no-loop"),
                  _row(ids=[1, 2] + loop, role=[0, 0] + [1] * 80, finish="stop", rid="loop-but-stopped")])
    (hit,) = _only(run_health_checks(store, decode=False), "runaway")
    assert hit.rollout_id == "loop" and hit.evidence["repeats"] >= 4 and hit.evidence["gen_tokens"] == 80


def test_check_zero_completion(store):
    store.append([_row(ids=[1, 2, 3], role=[0, 0, 0], rid="none"), _row(rid="ok"),
                  _row(ids=[], role=[], lp=[], messages=[Message("user", "q"), Message("assistant", "")], rid="textless",
                       tokens_source="none")])
    hits = _only(run_health_checks(store, decode=False), "zero_completion")
    assert sorted(h.rollout_id for h in hits) == ["none", "textless"]
    assert {h.rollout_id: h.evidence for h in hits}["none"] == {"tokens": 3, "gen_tokens": 0}


def test_check_token_text_mismatch(store, tok):
    good = _row(tok=tok, text="The answer is 4.", rid="good")
    bad = _row(tok=tok, text="The answer is 5.", rid="bad")
    bad.messages = [Message("user", "2+2?"), Message("assistant", "The answer is 4.")]
    store.append([good, bad])
    (hit,) = _only(run_health_checks(store, tokenizer=tok), "token_text_mismatch")
    assert hit.rollout_id == "bad" and hit.evidence["decoded"] == "The answer is 5."
    assert hit.evidence["stored"] == "The answer is 4."
    # without a tokenizer (the store records no model) the check is skipped, and says so
    r = run_health_checks(store)
    assert r.counts["token_text_mismatch"] == 0 and "no model" in r.skipped["token_text_mismatch"]
    assert "--tokenizer" in r.skipped["token_text_mismatch"]


def test_check_empty_turn(store):
    store.append([_row(messages=[Message("user", "q"), Message("assistant", "")], rid="empty"),
                  _row(messages=[Message("user", "q")], rid="missing"),
                  _row(messages=[Message("user", "q"), Message("assistant", "a"), Message("user", ""),
                                 Message("assistant", "b")], rid="empty-user"),
                  _row(rid="fine")])
    hits = _only(run_health_checks(store, decode=False), "empty_turn")
    assert sorted((h.rollout_id, h.evidence["turn"]) for h in hits) == [
        ("empty", 1), ("empty-user", 2), ("missing", None)]


def test_check_empty_turn_of_unicode_whitespace(store):
    """A turn of only Unicode whitespace (no-break, ideographic spaces) is blank to the screen as
    to :func:`empty_turns`; one with a character in it is not."""
    store.append([_row(messages=[Message("user", "q"), Message("assistant", "\u00a0\u3000\t")], rid="spaces"),
                  _row(messages=[Message("user", "q"), Message("assistant", "\u3000x\u00a0")], rid="text")])
    hits = _only(run_health_checks(store, decode=False), "empty_turn")
    assert [(h.rollout_id, h.evidence["turn"]) for h in hits] == [("spaces", 1)]


def test_blank_screen_equals_a_trim_for_every_code_point():
    import pyarrow as pa
    import pyarrow.compute as pc

    cps = [chr(c) for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF]
    a = pa.array(cps + [c + " " + c for c in cps[::97]] + ["", " a ", "\t\n"])
    trim = pc.equal(pc.utf8_length(pc.utf8_trim_whitespace(a)), 0)
    screen = pc.or_(pc.equal(pc.binary_length(a), 0), pc.utf8_is_space(a))  # what checks.screen_batch uses
    assert trim.equals(screen)


def test_check_tool_no_observation(store):
    call = '[{"type": "function", "function": {"name": "calc", "arguments": "{}"}}]'
    store.append([
        _row(messages=[Message("user", "q"), Message("assistant", "calling", tool_calls=call)], rid="dangling"),
        _row(messages=[Message("user", "q"), Message("assistant", "calling", tool_calls=call),
                       Message("assistant", "42")], rid="skipped-obs"),
        _row(messages=[Message("user", "q"), Message("assistant", "calling", tool_calls=call), Message("tool", "42"),
                       Message("assistant", "42")], rid="answered")])
    hits = _only(run_health_checks(store, decode=False), "tool_no_observation")
    assert sorted(h.rollout_id for h in hits) == ["dangling", "skipped-obs"]
    assert all(h.evidence == {"turn": 1, "calls": 1, "observations": 0} for h in hits)


def test_check_logprob_mismatch(store):
    role = [0, 0, 1, 1, 1, 1]
    lp = [0, 0, -0.5, -0.5, -0.5, -0.5]
    store.append([
        _row(ids=list(range(6)), role=role, lp=lp, meta={"trainer_logprobs": [0, 0, -0.52, -0.49, -0.5, -0.51]},
             rid="close"),
        _row(ids=list(range(6)), role=role, lp=lp, meta={"trainer_logprobs": [0, 0, -0.5, -0.5, -0.5, -3.5]},
             rid="one-token-off"),
        _row(ids=list(range(6)), role=role, lp=lp, meta={"trainer_logprobs": [0, 0, -0.8, -0.8, -0.8, -0.8]},
             rid="shifted"),
        _row(ids=list(range(6)), role=role, lp=lp, rid="no-trainer")])
    r = run_health_checks(store, decode=False)
    hits = {h.rollout_id: h for h in _only(r, "logprob_mismatch")}
    assert set(hits) == {"one-token-off", "shifted"} and r.checked["logprob_mismatch"] == 3
    assert hits["one-token-off"].evidence["gap_max"] == pytest.approx(3.0) and hits["one-token-off"].evidence["at"] == 5
    assert hits["shifted"].evidence["gap_mean"] == pytest.approx(0.3, abs=1e-6)
    lax = run_health_checks(store, decode=False, config=HealthConfig(max_gap_mean=0.8, max_gap=5.0))
    assert lax.counts["logprob_mismatch"] == 0


def _verl_rows(shift: float = 0.0):
    sys.path.insert(0, str(HERE.parent / "integrations"))
    try:
        from test_verl_live import stand_in
    finally:
        sys.path.pop(0)
    from gfcr.integrations.verl import dataproto_to_rollouts

    batch, doc = stand_in()
    if shift:
        batch.batch["old_log_probs"] = batch.batch["old_log_probs"] - shift
    rs, ps = dataproto_to_rollouts(batch, "verl-live" if not shift else "verl-shifted",
                                   reward_extra_info=doc["reward_extra_info"])
    return rs, ps


def test_verl_batch_with_both_log_probs(store):
    """verl's DataProto fixture keeps rollout_log_probs (sampler) and old_log_probs (trainer),
    0.01 apart at most: quiet; shifted by 0.3 nats, every row is listed."""
    rs, ps = _verl_rows()
    shifted, _ = _verl_rows(0.3)
    store.upsert_prompts(ps)
    store.append(rs + shifted)
    r = run_health_checks(store, decode=False)
    assert r.checked["logprob_mismatch"] == 12
    assert {h.run_id for h in r.issues if h.check == "logprob_mismatch"} == {"verl-shifted"}
    assert r.counts["logprob_mismatch"] == 6


def test_quiet_on_the_clean_fixture_dumps(store, tmp_path):
    """Every real dump of the contract fixtures: no health issue; the token/text check is skipped
    (the dumps record no model) and says so."""
    from test_false_alarms import _import_all_fixtures

    _import_all_fixtures(store, tmp_path)
    rs, ps = _verl_rows()
    store.upsert_prompts(ps)
    store.append(rs)
    r = run_health_checks(store)
    assert r.clean, [(i.check, i.run_id, i.message) for i in r.issues]
    assert r.checked["runaway"] == store.count(where="tokens_source <> 'none'") and r.checked["empty_turn"] > 0 and r.checked["logprob_mismatch"] == 6
    assert "token_text_mismatch" in r.skipped


def test_cli_diagnose_and_report_list_them(store, tmp_path):
    call = '[{"type": "function", "function": {"name": "calc", "arguments": "{}"}}]'
    store.append([_row(ids=[1, 2, 3], role=[0, 0, 0], rid="none"),
                  _row(messages=[Message("user", "q"), Message("assistant", "c", tool_calls=call)], rid="dangling")])
    runner = CliRunner()
    res = runner.invoke(app, ["diagnose", str(store.path)])
    assert res.exit_code == 0, res.output
    assert "Zero completion tokens: 1" in res.output and "Tool call with no observation after it: 1" in res.output
    assert "none" in res.output and "dangling" in res.output and "skipped" in res.output
    js = runner.invoke(app, ["diagnose", str(store.path), "--json"])
    import json

    doc = json.loads(js.output)
    assert doc["health"]["counts"]["zero_completion"] == 1 and doc["health"]["issues"][0]["evidence"]
    assert all(f["rows"] for f in doc["findings"])  # findings carry their evidence rows in JSON too
    out = tmp_path / "r.html"
    rep = runner.invoke(app, ["report", str(store.path), "--out", str(out)])
    assert rep.exit_code == 0 and "[health] Zero completion tokens: 1" in rep.output
    page = out.read_text()
    assert 'id="health"' in page and 'data-check="zero_completion"' in page and "dangling" in page


def test_the_stores_ngram_count_is_the_early_exits():
    from gfcr.control.groups import tail_ngram_count as control_count
    from gfcr.store.checks import tail_ngram_count

    rng = np.random.default_rng(0)
    for _ in range(200):
        t = rng.integers(0, 3, int(rng.integers(0, 40)))
        n = int(rng.integers(1, 6))
        assert tail_ngram_count(t, n) == control_count(t, n)
