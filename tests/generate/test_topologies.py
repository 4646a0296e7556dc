
import numpy as np
import pytest

from gfcr.generate.engines import SamplingParams
from gfcr.generate.topologies import (
    EPTree,
    Group,
    MultiTurn,
)
from gfcr.records import CONTEXT, GENERATED
from gfcr.tasks.arith import make_arith


@pytest.fixture(scope="module")
def prompts():
    return make_arith(n=3, level=1, seed=0).prompts()


def test_group_rollouts_are_token_faithful(engine, tiny, prompts):
    _, tok = tiny
    rs = Group(k=3, params=SamplingParams(max_tokens=12, temperature=1.0), seed=1).generate(engine, prompts, run_id="r1", step=2)
    assert len(rs) == 9
    for r in rs:
        r.validate()
        assert r.step == 2 and r.run_id == "r1" and r.policy_version == "tiny-0"
        p = next(p for p in prompts if p.prompt_id == r.prompt_id)
        want_prompt = engine.encode_messages([m.to_dict() for m in p.messages])
        n_ctx = int(np.count_nonzero(r.token_role == CONTEXT))
        assert r.token_ids[:n_ctx].tolist() == want_prompt
        assert np.all(r.token_role[n_ctx:] == GENERATED) and np.all(r.logprobs[:n_ctx] == 0)
        assert r.cost.gen_tokens == r.n_generated and r.cost.prompt_tokens == n_ctx
        assert r.messages[-1].role == "assistant"
        assert r.messages[-1].content == tok.decode(r.generated_ids.tolist(), skip_special_tokens=True)
        assert r.sampling["engine"] == "hf" and r.sampling["temperature"] == 1.0
    by_group = {}
    for r in rs:
        by_group.setdefault(r.group_id, []).append(r.sample_index)
    assert sorted(map(sorted, by_group.values())) == [[0, 1, 2]] * 3
    again = Group(k=3, params=SamplingParams(max_tokens=12), seed=1).generate(engine, prompts[:1], run_id="r1", step=2)
    assert [r.token_ids.tolist() for r in again] == [r.token_ids.tolist() for r in rs[:3]]


def test_tree_children_share_parent_prefix(engine, prompts):
    topo = EPTree(m=2, n=2, l=2, t=2, params=SamplingParams(max_tokens=10, temperature=1.0), seed=3)
    rs = topo.generate(engine, prompts[:2], run_id="t", step=0)
    assert len(rs) == 2 * topo.leaves_per_prompt
    by_id = {r.rollout_id: r for r in rs}
    n_children = 0
    for r in rs:
        r.validate()
        if r.parent_id is None:
            continue
        n_children += 1
        parent = by_id[r.parent_id]
        b = r.branch_pos
        assert parent.group_id == r.group_id
        assert r.token_ids[:b].tolist() == parent.token_ids[:b].tolist()
        assert r.token_role[:b].tolist() == parent.token_role[:b].tolist()
        np.testing.assert_array_equal(r.logprobs[:b], parent.logprobs[:b])
        assert np.all(r.token_role[b:] == GENERATED)
        assert r.n_generated <= 10  # budget respected across the shared prefix
    assert n_children == 2 * 2 * 2 * 2 * 2


class CountingEnv:
    """Two observations, then done."""

    name = "counting"

    def __init__(self):
        self.n = 0

    def reset(self, task):
        return "Tools: none."

    def step(self, action_text):
        self.n += 1
        if self.n >= 3:
            return "bye", True, {"n": self.n}
        return f"observation {self.n}: keep going", False, {"n": self.n}


def test_multi_turn_tokens_decode_to_the_chat_template(engine, tiny, prompts):
    _, tok = tiny
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    # every turn ends with the ChatML end-of-turn token after a few tokens: stop on a common token too
    params = SamplingParams(max_tokens=6, temperature=1.0, stop_token_ids=list(range(0, len(tok), 3)))
    rs = MultiTurn(env=CountingEnv, k=2, max_turns=5, params=params, seed=0).generate(engine, prompts[:1], run_id="m")
    assert len(rs) == 2
    for r in rs:
        r.validate()
        msgs = [m.to_dict() for m in r.messages]
        msgs = [{"role": m["role"], "content": m["content"]} for m in msgs]
        text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=False)
        assert tok.decode(r.token_ids.tolist(), skip_special_tokens=False) == text
        obs_msgs = [m for m in msgs if m["content"].startswith("observation")]
        if r.finish_reason == "env_done":
            assert len(obs_msgs) == 2 and r.meta["final_observation"] == "bye" and r.meta["turns"] == 3
        # observation text lies wholly in context tokens
        for m in obs_msgs:
            for piece in (m["content"],):
                ids = tok(piece, add_special_tokens=False)["input_ids"]
                seq = r.token_ids.tolist()
                hits = [i for i in range(len(seq) - len(ids) + 1) if seq[i : i + len(ids)] == ids]
                assert hits, "observation tokens not found verbatim"
                assert all(r.token_role[hits[0] + j] == CONTEXT for j in range(len(ids)))
        assert np.all(r.logprobs[r.token_role == CONTEXT] == 0)
        assert r.n_generated == r.cost.gen_tokens > 0
        assert eos is not None


def test_calculator_and_python_envs():
    from gfcr.generate.envs import CalculatorEnv, PythonEnv, make_env, safe_eval

    assert safe_eval("2 * (3 + 4)") == 14 and safe_eval("7 / 2") == 3.5
    with pytest.raises(ValueError):
        safe_eval("__import__('os')")
    env = make_env("calculator")
    assert "<calc>" in env.reset(None)
    obs, done, info = env.step("Let me compute <calc>12 * 12</calc> and <calc>1/0</calc>")
    assert not done and "<result>144</result>" in obs and "ZeroDivisionError" in obs
    assert env.step("Answer: 144") == (None, True, {"calls": 0})
    assert isinstance(env, CalculatorEnv)
    py = PythonEnv(timeout_s=20)
    obs, done, info = py.step("Run:\n```python\nprint(6 * 7)\n```")
    assert not done and "42" in obs and info["ran"]
    assert py.step("done")[1] is True
