"""The loop with an engine that has its own weights: an hf copy (sync 'copy') and a gfcr serve server
(engine 'openai', sync 'http'). Each step's rollouts must name the weights that sampled them, and the
engine must hold exactly the trainer's weights after each push."""

from __future__ import annotations

import json

import pytest
import torch

from gfcr.train.config import ConfigError, load_config
from gfcr.train.loop import TrainingRun, prepare_run


def _cfg(tiny_dir, tmp_path, steps, **over):
    base = {
        "model": tiny_dir, "output_dir": str(tmp_path / "runs"), "steps": steps, "tensorboard": False,
        "tasks": [{"name": "arith", "n_train": 8, "n_eval": 0, "params": {"level": 1}}],
        "generate.topology.params.k": 2, "generate.prompts_per_step": 2, "generate.max_tokens": 4, "signals.entropy": False,
        "optim.lr": 0.05,  # big steps so every update changes the weights hash
    }
    base.update(over)
    return load_config(None, base)


def _run(cfg):
    d, resuming = prepare_run(cfg, None, None)
    t = TrainingRun(cfg, d, resuming, progress=False)
    t.setup()
    initial = t.policy_version
    t.run()
    metrics = [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()]
    versions = {}
    for r in t.store.rollouts(run=t.run_id):
        versions.setdefault(r.step, set()).add(r.policy_version)
    return t, initial, metrics, versions


def _assert_same_weights(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    for k in sa:
        torch.testing.assert_close(sa[k], sb[k], atol=0, rtol=0)


def test_copy_engine_is_synced_every_step(tiny_dir, tmp_path):
    t, initial, metrics, versions = _run(_cfg(tiny_dir, tmp_path, 3, **{"generate.sync": "copy"}))
    assert t.engine.model is not t.model
    _assert_same_weights(t.engine.model, t.model)
    after = [m["policy_version"] for m in metrics]
    assert len(set(after)) == 3 and initial not in after
    assert versions == {0: {initial}, 1: {after[0]}, 2: {after[1]}}
    assert all("seconds/sync" in m for m in metrics)


def test_sync_every_two_samples_with_stale_weights_and_says_so(tiny_dir, tmp_path):
    t, initial, metrics, versions = _run(_cfg(tiny_dir, tmp_path, 3, **{"generate.sync": "copy", "generate.sync_every": 2}))
    after = [m["policy_version"] for m in metrics]
    # step 1 still samples with the initial weights (no push after step 0); step 2 with those after step 1
    assert versions == {0: {initial}, 1: {initial}, 2: {after[1]}}
    assert ["seconds/sync" in m for m in metrics] == [False, True, True]  # pushed after step 1 and at the last step
    _assert_same_weights(t.engine.model, t.model)


def test_openai_engine_trains_against_gfcr_serve(tiny_dir, tmp_path):
    from gfcr.generate.engines.hf import HFEngine
    from gfcr.serve import serve_in_thread

    served = HFEngine(tiny_dir)  # the server's own copy, loaded from the same folder
    with serve_in_thread(served, model_name="tiny", allow_weight_updates=True) as url:
        cfg = _cfg(tiny_dir, tmp_path, 2, **{"generate.engine": {"name": "openai",
                                                                  "params": {"base_url": url, "model": "tiny"}}})
        assert cfg.generate.sync == "http"
        t, initial, metrics, versions = _run(cfg)
        _assert_same_weights(served.model, t.model)
        assert served.policy_version == metrics[-1]["policy_version"]
    assert versions == {0: {initial}, 1: {metrics[0]["policy_version"]}}
    assert (t.run_dir / "sync" / "weights.safetensors").exists()
    assert "api_key" not in (t.run_dir / "config.yaml").read_text()


@pytest.mark.parametrize("over, match", [
    ({"generate.engine": "vllm", "generate.sync": "http"}, "does not work with engine 'vllm'"),
    ({"generate.sync_every": 2}, "sync_every > 1 needs"),
    ({"generate.engine": "openai"}, "needs generate.engine.params.base_url"),
    ({"generate.engine": {"name": "openai", "params": {"base_url": "http://127.0.0.1:1/v1", "api_key": "k"}}},
     "api_key_env"),
])
def test_engine_and_sync_settings_are_checked_at_load(tiny_dir, tmp_path, over, match):
    with pytest.raises(ConfigError, match=match):
        _cfg(tiny_dir, tmp_path, 1, **over)


@pytest.mark.parametrize("topology, params", [
    ("tree", {"m": 2, "n": 1, "l": 1, "t": 1}),
    ("multi_turn", {"env": "calculator", "max_turns": 2, "k": 2}),
])
def test_tree_and_multi_turn_sample_through_gfcr_serve(tiny_dir, tmp_path, topology, params):
    """Topologies that continue token prefixes work through the server: the trainer's tokenizer
    builds the prompt ids, the server samples from exactly those ids."""
    from gfcr.generate.engines.hf import HFEngine
    from gfcr.serve import serve_in_thread

    served = HFEngine(tiny_dir)
    with serve_in_thread(served, model_name="tiny", allow_weight_updates=True) as url:
        cfg = _cfg(tiny_dir, tmp_path, 2, **{
            "generate.engine": {"name": "openai", "params": {"base_url": url, "model": "tiny"}},
            "generate.topology": {"name": topology, "params": params}})
        t, initial, metrics, versions = _run(cfg)
        _assert_same_weights(served.model, t.model)
    assert versions == {0: {initial}, 1: {metrics[0]["policy_version"]}}
    rs = t.store.rollouts(run=t.run_id)
    assert all(r.tokens_source == "engine" for r in rs)
    if topology == "tree":
        assert any(r.parent_id is not None for r in rs)
    else:
        assert all((r.token_role == 0).any() and (r.token_role == 1).any() for r in rs)


def test_resume_pushes_the_checkpoint_weights_to_a_copy_engine(tiny_dir, tmp_path):
    """A resumed run's engine must sample from the checkpoint, not from the base model it was built from."""
    from gfcr.models import model_hash
    from gfcr.train.loop import train

    cfg = _cfg(tiny_dir, tmp_path, 3, **{"generate.sync": "copy"})
    first = train(cfg, run_dir=tmp_path / "r", progress=False, stop_after=2)
    assert first.steps_done == 2
    metrics = [json.loads(x) for x in first.metrics_path.read_text().splitlines()]
    d, resuming = prepare_run(cfg, tmp_path / "r", None)
    t = TrainingRun(cfg, d, resuming, progress=False)
    t.setup()
    assert t.start_step == 2 and t.engine.model is not t.model
    assert model_hash(t.engine.model) == model_hash(t.model)  # the initial push loaded the checkpoint
    assert t.engine.policy_version == metrics[-1]["policy_version"]
    t.run()
    step2 = {r.policy_version for r in t.store.rollouts(run=t.run_id, steps=(2, 2))}
    assert step2 == {metrics[-1]["policy_version"]}
    t.close()
