"""Multi-turn (agentic) episodes in the training loop: the calculator env's observations are context
(token_role 0) and get no loss; the K episodes of a prompt form the advantage group."""

from __future__ import annotations

import functools
import json

import numpy as np
import pytest
import torch

from gfcr.filters import verifiers
from gfcr.filters.reward import longest_generated_run
from gfcr.filters.verifiers import Verdict
from gfcr.generate import envs
from gfcr.records import Message
from gfcr.store import RolloutStore
from gfcr.testing import make_rollout
from gfcr.train.config import load_config
from gfcr.train.loop import TrainError, final_turn_text, train

CALC = "<calc>2*(3+4)</calc>"


class ForcedCalculator(envs.CalculatorEnv):
    """The calculator env, with a ``<calc>`` call appended to the first ``forced`` turns: a random
    tiny model never writes one itself, and the test needs observations. Later turns end the episode."""

    name = "forced_calculator"

    def __init__(self, forced: int = 2):
        super().__init__()
        self.forced, self.turn = forced, 0

    def step(self, action_text):
        self.turn += 1
        if self.turn > self.forced:
            return None, True, {"calls": 0}
        return super().step(action_text + CALC)


class EvenFinalTurn:
    """Passes when the judged text is non-empty with an even length; records what it was shown. (With the
    end-of-turn bias most final turns are empty: counting those as failures keeps the rewards of a
    group from being equal for most draws, whatever the sampler's random numbers.)"""

    name = "even_final_turn"
    version = "test"
    seen: list[str] = []

    def verify(self, completion, answer=None, tests=None, **context):
        EvenFinalTurn.seen.append(completion)
        ok = len(completion) > 0 and len(completion) % 2 == 0
        return Verdict(passed=ok, score=float(ok), evidence={"len": len(completion)})


@pytest.fixture
def eos_biased(monkeypatch, tiny_dir):
    """The random tiny model, with +5.5 on the end-of-turn logit so most turns end by themselves
    (a turn cut at max_tokens ends a multi-turn episode). Applies to sampling and training alike."""
    from transformers import AutoTokenizer, LlamaForCausalLM

    eos = AutoTokenizer.from_pretrained(tiny_dir).eos_token_id
    orig = LlamaForCausalLM.forward

    @functools.wraps(orig)
    def forward(self, *a, **kw):
        out = orig(self, *a, **kw)
        bias = torch.zeros(out.logits.shape[-1], dtype=out.logits.dtype, device=out.logits.device)
        bias[eos] = 5.5
        out.logits = out.logits + bias
        return out

    monkeypatch.setattr(LlamaForCausalLM, "forward", forward)
    return eos


def _cfg(tiny_dir, tmp_path, **over):
    base = {
        "model": tiny_dir, "output_dir": str(tmp_path / "runs"), "steps": 2, "tensorboard": False,
        "tasks": [{"name": "arith", "n_train": 4, "n_eval": 0, "params": {"level": 1}}],
        "generate.topology": {"name": "multi_turn", "params": {"env": "forced_calculator", "max_turns": 3, "k": 3}},
        "generate.prompts_per_step": 2, "generate.max_tokens": 8,
        "verify.verifier": EvenFinalTurn.name, "optim.lr": 1e-3,
    }
    base.update(over)
    return load_config(None, base)


def test_longest_generated_run_by_hand():
    assert longest_generated_run(np.array([0, 0, 1, 1, 1, 0, 1, 1, 0])) == 3
    assert longest_generated_run(np.array([0, 1, 0, 1, 1, 1, 1])) == 4  # a run at the end
    assert longest_generated_run(np.array([1, 0, 0])) == 1
    assert longest_generated_run(np.array([0, 0])) == 0
    assert longest_generated_run(np.array([], dtype=np.uint8)) == 0


def test_final_turn_text_is_the_last_assistant_message():
    msgs = [Message("user", "q"), Message("assistant", "a1 " + CALC), Message("user", "<result>14</result>"),
            Message("assistant", "so 14")]
    assert final_turn_text(make_rollout(messages=msgs)) == "so 14"
    assert final_turn_text(make_rollout(messages=[Message("user", "q")])) == ""


@pytest.mark.parametrize("params, match", [
    ({}, "generate.topology.params.env"),
    ({"env": "calculator", "max_turns": 0}, "max_turns"),
    ({"env": "calculator", "m": 2}, "unknown key 'm' for topology 'multi_turn'; allowed: env, k, max_turns, obs_role"),
])
def test_bad_multi_turn_params_are_refused_at_config_load(tiny_dir, tmp_path, params, match):
    from gfcr.config import ConfigError

    with pytest.raises(ConfigError, match=match):
        _cfg(tiny_dir, tmp_path, **{"generate.topology.params": params, "verify.verifier": "numeric"})


def test_an_unknown_env_is_refused_before_the_run(tiny_dir, tmp_path):
    cfg = _cfg(tiny_dir, tmp_path, **{"generate.topology.params": {"env": "no_such_env"}, "verify.verifier": "numeric"})
    with pytest.raises(TrainError, match="generate.topology.params.env"):
        train(cfg, run_dir=tmp_path / "r", progress=False)
    assert not (tmp_path / "r").exists()


def test_multi_turn_trains_on_policy_tokens_only(tiny_dir, tmp_path, monkeypatch, eos_biased):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from gfcr.train import trainer as trainer_mod
    from gfcr.train.losses import policy_gradient_loss, token_logprobs

    monkeypatch.setitem(envs.ENVS, ForcedCalculator.name, ForcedCalculator)
    monkeypatch.setitem(verifiers.VERIFIERS, EvenFinalTurn.name, EvenFinalTurn)
    monkeypatch.setattr(EvenFinalTurn, "seen", [])
    updates = []
    orig_update = trainer_mod.PolicyTrainer.update

    def spy(self, rollouts, advantages, *rest):
        updates.append((list(rollouts), list(advantages), trainer_mod.collate(rollouts, advantages, self.pad_id)))
        return orig_update(self, rollouts, advantages, *rest)

    monkeypatch.setattr(trainer_mod.PolicyTrainer, "update", spy)
    res = train(_cfg(tiny_dir, tmp_path), run_dir=tmp_path / "mt", progress=False)
    rows = [json.loads(x) for x in res.metrics_path.read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1]

    tok = AutoTokenizer.from_pretrained(tiny_dir)
    rs = RolloutStore.open(res.store_path).rollouts()
    assert len(rs) == 2 * 2 * 3  # steps x prompts x K episodes, one rollout each
    with_obs = 0
    for r in rs:
        role = np.asarray(r.token_role)
        assert set(np.unique(role)) <= {0, 1}
        assert np.all(np.asarray(r.logprobs)[role == 0] == 0.0)
        assert r.sampling["env"] == ForcedCalculator.name and r.meta["turns"] >= 1
        obs = [m.content for m in r.messages if m.role == "user" and "<result>" in m.content]
        if obs:
            with_obs += 1
            assert obs[0] == "<result>14</result>"
            assert "<result>14</result>" in tok.decode(np.asarray(r.token_ids)[role == 0])  # context tokens
        assert "<result>" not in tok.decode(np.asarray(r.token_ids)[role == 1])  # never the policy's
        assert r.n_generated == r.cost.gen_tokens > 0
    assert with_obs >= 4  # the env's observations are in the stored episodes

    # the verifier judged each episode's final turn; group = the K episodes of a prompt (GRPO sums to 0)
    assert sorted(EvenFinalTurn.seen) == sorted(final_turn_text(r) for r in rs)
    groups: dict[str, list] = {}
    for r in rs:
        groups.setdefault(r.group_id, []).append(r)
    assert len(groups) == 4 and all(len(g) == 3 for g in groups.values())
    for g in groups.values():
        assert sum(r.signals["advantage"] for r in g) == pytest.approx(0.0, abs=1e-6)
    assert any(r.signals["advantage"] != 0 for r in rs), [(r.group_id, final_turn_text(r)) for r in rs]

    # the update's loss mask is exactly token_role == 1: observation tokens carry no loss
    assert len(updates) == 2
    for batch_rs, advs, batch in updates:
        assert advs == [r.signals["advantage"] for r in batch_rs]
        for i, r in enumerate(batch_rs):
            n = len(r.token_ids)
            assert torch.equal(batch.loss_mask[i, :n], torch.from_numpy(np.asarray(r.token_role) == 1))
            assert not batch.loss_mask[i, n:].any()

    # and their gradient is exactly zero: d loss / d logits at every position predicting a context token
    batch_rs, advs, batch = updates[0]
    model = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32)
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits.float()
    logits.retain_grad()
    out = policy_gradient_loss(token_logprobs(logits, batch.input_ids), batch.behaviour_logp, batch.advantages,
                               batch.loss_mask)
    out.loss.backward()
    grad_rows = logits.grad.abs().sum(-1)  # [B, T]; row t-1 predicts token t
    ctx_next = ~batch.loss_mask[:, 1:]
    assert torch.all(grad_rows[:, :-1][ctx_next] == 0)
    live = torch.tensor([a != 0 for a in advs])
    assert (grad_rows[:, :-1][batch.loss_mask[:, 1:] & live[:, None]] > 0).any()
