"""verify_rollout / verify_many / reverify_store and the `gfcr verify` command on a real store."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from gfcr.cli import app
from gfcr.filters import get_verifier, reverify_store, verify_many, verify_rollout
from gfcr.records import Message, Prompt, Rollout
from gfcr.store import RolloutStore


def _rollout(pid: str, text: str, task: str = "arith", reward: float = 0.0, i: int = 0) -> Rollout:
    return Rollout(run_id="run1", prompt_id=pid, task=task, sample_index=i, token_ids=[1, 2, 3], token_role=[0, 1, 1],
                   logprobs=[0.0, -0.1, -0.2], reward=reward,
                   messages=[Message("user", "q"), Message("assistant", text)])


PROMPTS = [
    Prompt(prompt_id="p1", task="arith", messages=[Message("user", "1+2?")], answer="3"),
    Prompt(prompt_id="p2", task="arith", messages=[Message("user", "half of 3/2?")], answer="3/4"),
    Prompt(prompt_id="c1", task="code", messages=[Message("user", "write inc")], tests=["assert inc(1) == 2"]),
]
TEXTS = [("p1", "Answer: 3"), ("p1", "Answer: 4"), ("p2", "\\boxed{0.75}"), ("p2", "no idea"), ("zz", "Answer: 1")]


def test_verify_rollout_writes_evidence_and_keeps_input():
    r = _rollout("p1", "so 1+2 = 3")
    out = verify_rollout(r, get_verifier("numeric"), PROMPTS[0])
    assert out.reward == 1.0 and out.verified is True and r.verified is None and r.reward == 0.0
    assert out.verifier["name"] == "numeric" and out.verifier["evidence"]["extracted"] == "3"
    with pytest.raises(ValueError, match="does not belong"):
        verify_rollout(r, get_verifier("numeric"), PROMPTS[1])


@pytest.mark.parametrize("workers", [1, 2])
def test_verify_many_order_and_missing_prompt(workers):
    rs = [_rollout(p, t, i=i) for i, (p, t) in enumerate(TEXTS)]
    out = verify_many(rs, "math", PROMPTS, workers=workers)
    assert [r.rollout_id for r in out] == [r.rollout_id for r in rs]
    assert [r.verified for r in out] == [True, False, True, False, None]
    assert out[-1].verifier["evidence"]["error"].startswith("no gold answer")


def test_composite_and_format():
    comp = get_verifier("composite", parts=[{"name": "numeric", "weight": 1.0},
                                            {"name": "format", "weight": 0.2, "params": {"pattern": r"^Answer: "}}])
    v = comp.verify("work\nAnswer: 3", "3")
    assert v.passed is True and v.score == pytest.approx(1.2)
    v2 = comp.verify("it is 3", "3")
    assert v2.passed is False and v2.score == pytest.approx(1.0)
    js = get_verifier("format", json_schema={"type": "object", "required": ["a"]})
    assert js.verify('{"a": 1}').passed and not js.verify('{"b": 1}').passed
    with pytest.raises(ValueError, match="exactly one"):
        get_verifier("format")
    assert get_verifier("format", pattern="").verify("anything").passed  # the empty regex matches, as in `re`
    with pytest.raises(ValueError, match="unknown verifier"):
        get_verifier("nope")
    with pytest.raises(ValueError, match="extra"):
        get_verifier("math", timeout=3)


def test_env_verifier():
    r = _rollout("p1", "done")
    r.signals["env_success"] = 1.0
    v = get_verifier("env").verify("", rollout=r)
    assert v.passed is True and v.score == 1.0
    assert get_verifier("env").verify("").passed is None


def _store(tmp_path):
    st = RolloutStore.open(tmp_path / "store", create=True)
    st.upsert_prompts(PROMPTS)
    rs = [_rollout(p, t, i=i) for i, (p, t) in enumerate(TEXTS[:4])]
    rs.append(_rollout("c1", "```python\ndef inc(x):\n    return x + 1\n```", task="code"))
    st.append(rs)
    return st


def test_reverify_store_new_version_old_reachable(tmp_path):
    st = _store(tmp_path)
    v0 = st.version
    s = reverify_store(st, "math", where="task = 'arith'")
    assert s["n"] == 4 and s["passed"] == 2 and s["changed"] == 4 and s["version_after"] > v0
    now = {r.rollout_id: r for r in st.rollouts()}
    assert sorted(r.reward for r in now.values() if r.task == "arith") == [0.0, 0.0, 1.0, 1.0]
    old = st.checkout(v0)
    assert all(r.verified is None for r in old.rollouts())
    # re-verifying reproduces the stored rewards
    assert reverify_store(st, "math", where="task = 'arith'")["changed"] == 0


def test_cli_verify(tmp_path):
    st = _store(tmp_path)
    v0 = st.version
    res = CliRunner().invoke(app, ["verify", str(tmp_path / "store"), "--verifier", "code",
                                   "--where", "task = 'code'", "--workers", "2"])
    assert res.exit_code == 0, res.output
    summary = json.loads(res.output.strip().splitlines()[-1])
    assert summary["n"] == 1 and summary["version_before"] == v0
    st2 = RolloutStore.open(tmp_path / "store")
    code = st2.rollouts(task="code")[0]
    if code.verifier["evidence"].get("isolation") in ("bwrap", "unshare"):
        assert code.verified is True and code.reward == 1.0
    bad = CliRunner().invoke(app, ["verify", str(tmp_path / "store"), "--verifier", "math", "--options", '{"bogus": 1}'])
    assert bad.exit_code != 0 and "bogus" in bad.output
