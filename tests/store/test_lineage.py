"""Lineage (`gfcr.store.lineage`): which rollouts trained a checkpoint — by hand on a built store (the
module docstring's example, a replayed copy, rows that do not say), and on a real `gfcr train` run with a
replay buffer, checked against the loop's own per-step counts; `gfcr store lineage --checkpoint`."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from gfcr.store import RolloutStore
from gfcr.store.lineage import lineage
from gfcr.testing import make_rollout


def test_lineage_by_hand(store):
    rows = [
        make_rollout(0, step=0, rollout_id="a", meta={"trained": True, "replayed_at_step": [1, 3]}),
        make_rollout(1, step=0, rollout_id="b", meta={"trained": False}),
        make_rollout(2, step=1, rollout_id="c", meta={"trained": True}),
        make_rollout(3, step=1, rollout_id="copy", signals={"replayed": 1.0}, meta={}),
        make_rollout(4, step=1, rollout_id="imported", meta={}),
        make_rollout(5, step=2, rollout_id="later", meta={"trained": True}),
        make_rollout(6, step=0, rollout_id="other-run", run="run-b", meta={"trained": True}),
    ]
    store.append(rows)
    lin = lineage(store, "run-a", 1)
    assert lin.rollout_ids == ["a", "c", "copy"]
    a = lin.used[0]
    assert a.trained_at == [0, 1] and a.fresh and a.replayed == [1]  # its use at step 3 is after the checkpoint
    cp = lin.used[2]
    assert cp.trained_at == [1] and not cp.fresh and cp.replayed == [1]
    assert lin.per_step == {0: {"fresh": 1, "replayed": 0}, 1: {"fresh": 1, "replayed": 2}}
    assert lin.unknown == ["imported"]
    assert lineage(store, "run-a", 0).rollout_ids == ["a"]
    assert lineage(store, "run-a", 3).used[0].trained_at == [0, 1, 3]
    with pytest.raises(ValueError, match="no run 'run-z'"):
        lineage(store, "run-z", 1)


def test_lineage_of_a_real_run_matches_the_loops_counts(tiny_dir, tmp_path):
    from gfcr.train.config import load_config
    from gfcr.train.loop import train

    cfg = load_config(None, {
        "model": tiny_dir, "output_dir": str(tmp_path / "runs"), "steps": 3, "tensorboard": False,
        "tasks": [{"name": "arith", "n_train": 8, "n_eval": 0, "params": {"level": 1}}],
        "generate.topology.params.k": 4, "generate.prompts_per_step": 2, "generate.max_tokens": 4, "optim.lr": 1e-3,
        "replay": {"buffer": "fifo", "per_step": 3}})
    res = train(cfg, run_dir=tmp_path / "run", progress=False)
    rows = {r["step"]: r for r in map(json.loads, res.metrics_path.read_text().splitlines())}
    store = RolloutStore.open(res.store_path)
    run = store.stats()[0]["run_id"]
    lin = lineage(store, run, 2)
    for s in (0, 1, 2):
        assert lin.per_step[s]["fresh"] == rows[s]["n_trained"]
        assert lin.per_step[s]["replayed"] == rows[s]["n_replayed"]
    assert lin.unknown == []
    ckpt = sorted((res.run_dir / "checkpoints").iterdir())[-1]
    out = subprocess.run([sys.executable, "-m", "gfcr", "store", "lineage", str(res.store_path), "--checkpoint", str(ckpt),
                          "--json"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    got = [json.loads(x) for x in out.stdout.splitlines()]
    assert [g["rollout_id"] for g in got] == lin.rollout_ids
    bad = subprocess.run([sys.executable, "-m", "gfcr", "store", "lineage", str(res.store_path), "--checkpoint",
                          str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "not a gfcr train checkpoint folder" in bad.stderr
