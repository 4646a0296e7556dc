"""NeMo Gym token capture (``<rollout_id>.tokens.jsonl``): the fixture was written by Gym's own
``capture_tokens`` + ``TokenCaptureStore`` (tests/contracts/gen_nemo_gym.py); every field checked."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from gfcr.formats import ImportFormatError, import_rollouts

FIX = Path(__file__).resolve().parents[1] / "contracts" / "fixtures" / "nemo_gym"


def _lines(name: str) -> list[dict]:
    return [json.loads(x) for x in (FIX / f"{name}.tokens.jsonl").read_text().splitlines()]


def test_every_entry_field_maps(store):
    res = import_rollouts(store, "nemo-gym", [str(FIX)], run_id="g")
    assert res.written == 5 and store.count() == 5
    rs = {r.meta["model_call_id"]: r for r in store.rollouts(run="g")}
    assert sorted(rs) == ["call-a1", "call-a2", "call-b1", "call-c1", "call-d1"]
    for name in ("rollout-a", "rollout-b", "rollout-c", "rollout-d"):
        for i, e in enumerate(_lines(name), start=1):
            r = rs[e["model_call_id"]]
            n_p = len(e["prompt_token_ids"])
            assert r.token_ids.tolist() == e["prompt_token_ids"] + e["generation_token_ids"]
            assert r.token_role.tolist() == [0] * n_p + [1] * len(e["generation_token_ids"])
            assert r.logprobs[:n_p].tolist() == [0.0] * n_p
            assert r.logprobs[n_p:].tolist() == pytest.approx(e["generation_log_probs"], rel=1e-6)
            assert r.meta["gym_rollout_id"] == e["rollout_id"] == name and r.meta["line"] == i
            assert r.meta["file"] == f"{name}.tokens.jsonl" and r.meta["model"] == e["model"] == "policy"
            assert r.meta["output_items"] == e["output_items"] and r.meta["token_item_index"] == e["token_item_index"]
            assert r.meta["created_at"] == e["created_at"] and r.meta["routed_experts"] is None
            assert r.meta["schema_version"] == e["schema_version"] == 1 and r.meta["extra"] == {}
            assert r.sampling == {"model": "policy"} and r.tokens_source == "engine"
            # what a capture does not hold: null / unknown, never invented
            assert r.reward is None and r.verified is None and r.finish_reason is None
            assert r.step == 0 and r.policy_version == "unknown" and r.meta["step_in_dump"] is False
            assert r.group_id == f"g/{name}/{e['model_call_id']}" and r.sample_index == 0
    # the assistant turn: a function_call item as tool_calls, a Responses message's output_text, a chat message
    tc = json.loads(rs["call-a1"].messages[0].tool_calls)
    assert tc == [{"id": "call-1", "type": "function", "function": {"name": "calculator", "arguments": "{\"expr\": \"2+2\"}"}}]
    assert rs["call-a1"].messages[0].content == ""
    assert [(m.role, m.content, m.tool_calls) for m in rs["call-a2"].messages] == [("assistant", "4", None)]
    assert rs["call-b1"].messages[0].content == "four"
    # the same prompt tokens, one prompt; a lost call (no token ids / an intent without entry) flags its rollout
    assert rs["call-a1"].prompt_id == rs["call-b1"].prompt_id != rs["call-a2"].prompt_id
    assert store.count("prompts") == 4
    assert rs["call-c1"].meta["capture_incomplete"] is True and rs["call-c1"].meta["lost_calls"] == ["call-c2"]
    assert rs["call-d1"].meta["capture_incomplete"] is True and rs["call-d1"].meta["lost_calls"] == ["call-d2"]
    assert "capture_incomplete" not in rs["call-a1"].meta and "capture_incomplete" not in rs["call-b1"].meta
    again = import_rollouts(store, "nemo-gym", [str(FIX)], run_id="g")
    assert again.written == 0 and again.skipped == 5


@pytest.mark.parametrize(("mutate", "field"), [
    (lambda e: e.update(schema_version=2), "schema_version"),
    (lambda e: e.update(generation_log_probs=e["generation_log_probs"][:-1]), "generation_log_probs"),
    (lambda e: e.update(generation_log_probs=[float("nan")] * len(e["generation_log_probs"])), "generation_log_probs[0]"),
    (lambda e: e.update(rollout_id="other"), "rollout_id"),
    (lambda e: e.pop("prompt_token_ids"), "prompt_token_ids"),
])
def test_malformed_entry_names_file_line_field_and_writes_nothing(store, tmp_path, mutate, field):
    d = tmp_path / "cap"
    shutil.copytree(FIX, d)
    e = _lines("rollout-b")[0]
    mutate(e)
    (d / "rollout-b.tokens.jsonl").write_text(json.dumps(e) + "\n")
    with pytest.raises(ImportFormatError, match="rollout-b.tokens.jsonl: line 1: field '" + re.escape(field)):
        import_rollouts(store, "nemo-gym", [str(d)], run_id="g")
    assert store.count() == 0 and store.count("prompts") == 0


JOB = Path(__file__).resolve().parents[1] / "contracts" / "fixtures" / "nemo_gym_job"


def test_capture_key_is_gyms_own():
    """``maybe_rollout_id_from_run_body`` @ 07d6b0d0: explicit id, else task-rollout, -a{n} for n > 0."""
    from gfcr.formats.nemo_gym import capture_key

    assert capture_key({"_ng_task_index": 3, "_ng_rollout_index": 1}) == "3-1"
    assert capture_key({"_ng_task_index": 3, "_ng_rollout_index": 1, "_ng_attempt_index": 0}) == "3-1"
    assert capture_key({"_ng_task_index": 3, "_ng_rollout_index": 1, "_ng_attempt_index": 2}) == "3-1-a2"
    assert capture_key({"_ng_rollout_id": "x", "_ng_task_index": 3, "_ng_rollout_index": 1}) == "x"
    assert capture_key({"_ng_task_index": 3}) is None


def test_results_file_rewards_are_joined_to_every_call_of_their_trajectory(store):
    res = import_rollouts(store, "nemo-gym", [str(JOB)], run_id="g")
    assert res.written == 5
    got = {r.meta["model_call_id"]: (r.reward, r.verified, r.meta.get("reward_source")) for r in store.rollouts(run="g")}
    assert got == {"call-a1": (1.0, None, "rollouts.jsonl:1"), "call-a2": (1.0, None, "rollouts.jsonl:1"),
                   "call-b1": (0.0, None, "rollouts.jsonl:2"), "call-c1": (0.5, None, "rollouts.jsonl:3"),
                   "call-d1": (None, None, None)}  # rollout-d's attempt failed: no results line, reward unknown
    assert any("rewards joined from the Gym results file(s) rollouts.jsonl" in n for n in res.notes)


def test_without_results_rewards_stay_null_and_the_note_says_how_to_join(store):
    res = import_rollouts(store, "nemo-gym", [str(JOB / "captures")], run_id="g")
    assert all(r.reward is None for r in store.rollouts(run="g"))
    assert any("no Gym results file among the paths" in n for n in res.notes)


def test_a_trajectory_with_two_rewards_is_refused_naming_both(store, tmp_path):
    d = tmp_path / "job"
    shutil.copytree(JOB, d)
    first = json.loads((d / "rollouts.jsonl").read_text().splitlines()[0])
    with open(d / "rollouts.jsonl", "a") as f:
        f.write(json.dumps({**first, "reward": 0.25}) + "\n")
    with pytest.raises(ImportFormatError, match=r"rollout-a.*0.25.*rollouts.jsonl:1"):
        import_rollouts(store, "nemo-gym", [str(d)], run_id="g")
    assert store.count() == 0
