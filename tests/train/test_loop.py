"""The loop as a library: config checks, engines refused before anything is written, helpers."""

from __future__ import annotations

import json

import numpy as np
import pytest

from gfcr.train.config import load_config
from gfcr.train.loop import TrainError, step_rng, train


def _cfg(tiny_dir, tmp_path, steps=3, **over):
    base = {
        "model": tiny_dir, "output_dir": str(tmp_path / "runs"), "steps": steps, "tensorboard": False,
        "tasks": [{"name": "arith", "n_train": 8, "n_eval": 2, "params": {"level": 1}}],
        "generate.topology.params.k": 2, "generate.prompts_per_step": 2, "generate.max_tokens": 5,
    }
    base.update(over)
    return load_config(None, base)


def test_step_rng_depends_only_on_seed_step_stage():
    a = step_rng(0, 3, "select").integers(0, 10**9, 4)
    assert np.array_equal(a, step_rng(0, 3, "select").integers(0, 10**9, 4))
    assert not np.array_equal(a, step_rng(0, 4, "select").integers(0, 10**9, 4))


def test_resume_refuses_changed_config(tiny_dir, tmp_path):
    cfg = _cfg(tiny_dir, tmp_path, steps=1)
    d = tmp_path / "run"
    train(cfg, run_dir=d, progress=False)
    changed = _cfg(tiny_dir, tmp_path, steps=2, **{"optim.lr": 0.5})
    with pytest.raises(TrainError, match="optim"):
        train(changed, resume=d, progress=False)


def test_unusable_engines_are_refused_before_anything_is_written(tiny_dir, tmp_path, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    cfg = _cfg(tiny_dir, tmp_path, steps=1, **{"generate.engine": "vllm"})
    with pytest.raises(TrainError, match=r"pip install 'gfcr\[vllm\]'"):
        train(cfg, run_dir=tmp_path / "r", progress=False)
    assert not (tmp_path / "r").exists()
    from gfcr.serve import free_port

    url = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there
    cfg = _cfg(tiny_dir, tmp_path, steps=1, **{"generate.engine": {"name": "openai", "params": {"base_url": url}}})
    with pytest.raises(TrainError, match="no server answers"):
        train(cfg, run_dir=tmp_path / "r", progress=False)
    assert not (tmp_path / "r").exists()


def test_dynamic_sampling_and_replay_are_wired(tiny_dir, tmp_path):
    cfg = _cfg(tiny_dir, tmp_path, steps=2, **{
        "control": {"selector": "uniform", "group": {"name": "dynamic_sampling", "params": {"max_num_gen_batches": 2}}},
        "replay": {"buffer": "fifo", "per_step": 2},
        "signals.entropy": False,
    })
    res = train(cfg, run_dir=tmp_path / "ds", progress=False)
    rows = [json.loads(x) for x in res.metrics_path.read_text().splitlines()]
    # a random tiny model never answers: no group has variance, so both rounds run every step
    assert [r["ds_rounds"] for r in rows] == [2, 2]
    assert rows[0]["n_rollouts"] == 8 and rows[0]["n_trained"] == 0
    from gfcr.store import RolloutStore

    t = RolloutStore.open(res.store_path).scan(columns=["group_id", "sample_index", "step"]).to_pylist()
    assert len(t) == 16
    assert len({(r["group_id"], r["sample_index"]) for r in t}) == 16
    assert any(r["group_id"].endswith("#r1") for r in t)
    # signals.entropy off: no entropy forward; the hf engine's own per-token entropies still give the signal
    assert all("seconds/entropy" not in r for r in rows)
    assert all(np.isfinite(r.signals["entropy"]) for r in RolloutStore.open(res.store_path).rollouts())
