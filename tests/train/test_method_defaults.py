"""A method's defaults in other config sections are declared on its class (``run_defaults``), and
the config applies them only where it is silent (issue 46 part 4: no per-method block in a validator)."""

from __future__ import annotations

from gfcr.replay.buffers import AR3PO, ExGRPO
from gfcr.train.config import load_config


def test_exgrpo_defaults_come_from_its_class_and_yield_to_the_config():
    cfg = load_config(None, {"replay.buffer": "exgrpo", "generate.prompts_per_step": 3,
                             "generate.topology": {"name": "group", "params": {"k": 5}}})
    want = ExGRPO.run_defaults(3, 5)
    assert want["optim.mini_batch"] == 8  # ceil(3 * 5 / 2): two optimizer steps a step
    got = {"signals.advantage": cfg.signals.advantage.name, "loss.clip": cfg.loss.clip, "loss.agg": cfg.loss.agg,
           "optim.mini_batch": cfg.optim.mini_batch,
           "replay.buffer.params.group_size": cfg.replay.buffer.params["group_size"]}
    assert got == want
    named = load_config(None, {"replay.buffer": {"name": "exgrpo", "params": {"group_size": 3}},
                               "signals.advantage": "grpo", "loss.clip": True, "optim.mini_batch": 2})
    assert (named.signals.advantage.name, named.loss.clip, named.optim.mini_batch,
            named.replay.buffer.params["group_size"]) == ("grpo", True, 2, 3)
    assert named.loss.agg == "seq-mean-token-sum-norm"  # the one it did not name


def test_ar3po_turns_on_its_staged_rollout_unless_another_group_policy_is_named():
    assert AR3PO.run_defaults(4, 8) == {"control.group": "ar3po"}
    assert load_config(None, {"replay.buffer": "ar3po"}).control.group.name == "ar3po"
    other = load_config(None, {"replay.buffer": "ar3po", "control.group": "dynamic_sampling"})
    assert other.control.group.name == "dynamic_sampling"
    assert load_config(None, {}).control.group is None  # no buffer, no default
