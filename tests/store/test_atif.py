"""ATIF (Harbor RFC 0001; v1.4 to v1.8): import of a trajectory written field by field from the published
schema (tests/contracts/gen_atif.py), and gfcr's export read back by the import with every field
equal."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gfcr.formats import ImportFormatError, import_rollouts
from gfcr.formats.export import export
from gfcr.records import rollouts_to_table
from gfcr.store import RolloutStore

FIX = Path(__file__).resolve().parents[1] / "contracts" / "fixtures"


def test_atif_trajectory_fields(store):
    res = import_rollouts(store, "atif", [str(FIX / "atif" / "trajectory.json")], run_id="a")
    [r] = store.rollouts(run="a")
    assert res.written == 1
    assert [m.role for m in r.messages] == ["system", "user", "assistant", "tool", "tool", "assistant"]
    calls = json.loads(r.messages[2].tool_calls)
    assert [c["function"]["name"] for c in calls] == ["add", "noop"] and calls[0]["function"]["arguments"] == {"a": 2, "b": 3}
    assert (r.messages[3].name, r.messages[3].content) == ("call_1", "5")
    # tokens: the new part of each prompt is context, each completion generated, log-probs placed there
    assert r.token_ids.tolist() == [1, 10, 11, 2, 1, 12, 13, 14, 2, 20, 21, 22, 1, 30, 31, 2, 40, 41]
    assert r.token_role.tolist() == [0] * 9 + [1] * 3 + [0] * 4 + [1] * 2
    assert r.logprobs[9:12].tolist() == [-0.5, -0.25, -0.125] and r.logprobs[16:].tolist() == [-1.0, -0.75]
    assert r.tokens_source == "engine" and r.policy_version == "tiny-policy@step-7"
    # ATIF holds none of these: null, never invented
    assert r.reward is None and r.verified is None and r.finish_reason is None
    assert r.meta["atif"]["steps"][2]["reasoning_content"] == "Two numbers: use add."
    assert r.meta["atif"]["extra"] == {"task_id": "add-2-3"} and r.meta["session_id"] == "sess-0001"
    assert [m.role for m in store.prompts(ids=[r.prompt_id])[0].messages] == ["system", "user"]


def test_atif_prompt_that_does_not_extend_the_history_is_text_only(store, tmp_path):
    t = json.loads((FIX / "atif" / "trajectory.json").read_text())
    t["steps"][3]["metrics"]["prompt_token_ids"] = [1, 99]  # retokenized history: no single sequence
    (tmp_path / "t.json").write_text(json.dumps(t))
    [r] = import_rollouts(store, "atif", [str(tmp_path / "t.json")], run_id="a").rollouts
    assert r.tokens_source == "none" and len(r.token_ids) == 0
    t["steps"][2]["metrics"]["logprobs"][0] = float("nan")
    t["steps"][3]["metrics"]["prompt_token_ids"] = t["steps"][2]["metrics"]["prompt_token_ids"] + [20, 21, 22]
    (tmp_path / "t.json").write_text(json.dumps(t))
    with pytest.raises(ImportFormatError, match=r"steps\[2\]: field 'metrics.logprobs\[0\]': must be finite"):
        import_rollouts(store, "atif", [str(tmp_path / "t.json")], run_id="b")


def _rows(store):
    return store.scan().sort_by("rollout_id").to_pylist()


@pytest.mark.parametrize("source", ["prime-rl", "trl", "atif", "harbor", "atropos", "made"])
def test_atif_export_reads_back_with_every_field_equal(tmp_path, source):
    from gfcr.testing import make_rollout

    a = RolloutStore.open(tmp_path / "a", create=True)
    if source == "prime-rl":  # multi-turn, tool turns, exact tokens, signals, policy spans
        import_rollouts(a, "prime-rl", [str(FIX / "prime_rl")], run_id="p")
    elif source == "trl":  # text only, tool calls, reward columns
        import_rollouts(a, "trl", [str(FIX / "trl")], run_id="t", reward_columns=["accuracy_reward", "format_reward"])
    elif source == "atif":
        import_rollouts(a, "atif", [str(FIX / "atif" / "trajectory.json")], run_id="x")
    elif source == "harbor":  # v1.6-v1.8: continuation, content parts, no session_id, verifier rewards
        import_rollouts(a, "atif", [str(FIX / "harbor_job")], run_id="h")
    elif source == "atropos":  # tokens and no messages at all (an empty ATIF steps list was invalid)
        import_rollouts(a, "atropos", [str(FIX / "atropos")], run_id="at")
    else:  # tokens that do not pair up with assistant turns, a verdict, trailing context
        rs = [make_rollout(i, n_ctx=3, n_gen=4) for i in range(3)]
        rs[1].verified, rs[1].reward, rs[1].finish_reason = True, 0.5, "length"
        a.append(rollouts_to_table(rs))
    out = tmp_path / "x.atif.jsonl"
    n = export(a, "atif", out)
    lines = out.read_text().splitlines()
    assert n == a.count() == len(lines) > 0
    for line in lines:
        t = json.loads(line)
        assert t["schema_version"] == "ATIF-v1.8" and {s["source"] for s in t["steps"]} <= {"system", "user", "agent"}
        assert t["steps"]  # Harbor's Trajectory: min_length=1
        for s in t["steps"]:  # Harbor's validator: a result's source_call_id names a call of its step
            calls = {c["tool_call_id"] for c in s.get("tool_calls") or []}
            assert all(r.get("source_call_id") in calls for r in (s.get("observation") or {}).get("results", [])
                       if "source_call_id" in r)
        assert [s["step_id"] for s in t["steps"]] == list(range(1, len(t["steps"]) + 1))
        if source in ("prime-rl", "atif"):  # exact tokens reach ATIF readers in the standard fields
            agent = [s for s in t["steps"] if s["source"] == "agent"]
            assert agent and all("completion_token_ids" in s["metrics"] for s in agent)
            assert "tokens" not in t["extra"]["gfcr"]
    b = RolloutStore.open(tmp_path / "b", create=True)
    res = import_rollouts(b, "atif", [str(out)])
    assert res.written == n
    assert _rows(a) == _rows(b)  # every field, created_at included
