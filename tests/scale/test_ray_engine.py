"""RayEngine on a real local Ray cluster (one per module, 2 CPUs, loopback only, tiny models).

Test order matters for CPUs: the cluster has 2, each actor takes 1, so the module's 2-worker engine
is closed (last test that uses it) before the training-loop test starts its own actors.
"""

from __future__ import annotations

import json
import os
import time

import numpy as np
import pytest
import torch

from gfcr.generate.engines.base import GenRequest, SamplingParams
from gfcr.generate.sync import WeightSyncError
from gfcr.scale.engine import split_rows

ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def other_model(tmp_path_factory):
    """A tiny model with the same shapes and different weights (seed 1)."""
    from transformers import AutoModelForCausalLM

    from gfcr.testing import save_tiny

    path = save_tiny(str(tmp_path_factory.mktemp("other") / "model"), seed=1)
    return AutoModelForCausalLM.from_pretrained(path).eval()


@pytest.fixture(scope="module")
def engine2(cluster, tiny_dir):
    from gfcr.scale.engine import RayEngine

    eng = RayEngine(model=tiny_dir, workers=2, inner_params={"max_batch": 8})
    yield eng
    eng.close()


def _requests(engine, temperature):
    """Mixed n (2, 3, 1, 3 = 9 rows): with 2 workers the cut (row 4) falls inside the second request."""
    sp = SamplingParams(temperature=temperature, max_tokens=6)
    msgs = [{"role": "user", "content": "what is 2 + 3?"}]
    return [
        GenRequest(messages=msgs, params=sp.model_copy(update={"n": 2, "seed": 11})),
        GenRequest(prompt_ids=engine.encode_messages([{"role": "user", "content": "hi"}]),
                   params=sp.model_copy(update={"n": 3, "seed": 5})),
        GenRequest(prompt_ids=[5, 6, 7, 8, 9, 10, 11], params=sp.model_copy(update={"n": 1, "seed": 3})),
        GenRequest(messages=[{"role": "user", "content": "a longer question about 17 + 25 = ?"}],
                   params=sp.model_copy(update={"n": 3, "seed": 9})),
    ]


def _flat(results):
    return [(tuple(r.prompt_ids.tolist()), tuple(r.token_ids.tolist()), r.logprobs, r.finish_reason)
            for rs in results for r in rs]


def _assert_same(a, b, atol=1e-5):
    assert [x[:2] for x in a] == [y[:2] for y in b]
    assert [x[3] for x in a] == [y[3] for y in b]
    for x, y in zip(a, b, strict=True):
        np.testing.assert_allclose(x[2], y[2], atol=atol, rtol=0)


def test_split_rows_cuts_contiguous_near_equal_shards():
    # rows: r0 r0 r0 r1 | 4 rows in 2 parts -> [r0 r0] [r0 r1]
    assert split_rows([3, 1], 2) == [[(0, 0, 2)], [(0, 2, 1), (1, 0, 1)]]
    # 9 rows in 2 parts: bounds 0, 4, 9 -> request 1 (rows 2..4) is cut after its 2nd row
    assert split_rows([2, 3, 1, 3], 2) == [[(0, 0, 2), (1, 0, 2)], [(1, 2, 1), (2, 0, 1), (3, 0, 3)]]
    assert split_rows([1], 3) == [[], [], [(0, 0, 1)]]
    assert split_rows([2, 2], 1) == [[(0, 0, 2), (1, 0, 2)]]
    with pytest.raises(ValueError, match="at least one row"):
        split_rows([1, 0], 2)


@pytest.fixture(scope="module")
def expected(tiny_dir):
    """A plain in-process HFEngine's results on the same requests, greedy (0.0) and seeded sampling (1.0)."""
    from gfcr.generate.engines.hf import HFEngine

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the actors run torch with 1 thread too
    try:
        local = HFEngine(tiny_dir, max_batch=8)
        want = {t: _flat(local.generate(_requests(local, t))) for t in (0.0, 1.0)}
    finally:
        torch.set_num_threads(threads)
    assert sum(len(x[1]) for x in want[0.0]) > 9  # something was generated
    return want


def test_one_worker_equals_plain_hf_engine(cluster, tiny_dir, expected):
    from gfcr.scale.engine import RayEngine

    with RayEngine(model=tiny_dir, workers=1, inner_params={"max_batch": 8}) as one:
        assert one.name == "ray" and len(one.pids) == 1
        for t in (0.0, 1.0):
            _assert_same(_flat(one.generate(_requests(one, t))), expected[t])


def test_two_workers_equal_plain_hf_engine(engine2, expected):
    # greedy; and seeded sampling, where the request cut in two continues at seed + 2 on actor 1
    assert len(set(engine2.pids)) == 2
    for t in (0.0, 1.0):
        _assert_same(_flat(engine2.generate(_requests(engine2, t))), expected[t])
    assert engine2.generate([]) == []


def test_actors_that_cannot_be_placed_fail_with_the_resources(engine2, tiny_dir):
    from gfcr.scale import ScaleError
    from gfcr.scale.engine import RayEngine

    # engine2's two actors hold both CPUs of the cluster: a third actor cannot start
    with pytest.raises(ScaleError, match=r"only 0 of 1 RayEngine actors started within 1.0 s; each asks for \{'num_cpus': 1\}"):
        RayEngine(model=tiny_dir, workers=1, start_timeout_s=1.0)
    assert engine2.generate(_requests(engine2, 0.0))  # still works: the pending actor was removed


def test_load_weights_reaches_every_actor_and_bad_shapes_keep_old(engine2, other_model):
    from gfcr.generate.engines.hf import teacher_forced_logprobs
    from gfcr.models import model_hash

    old = engine2.weights_hashes()
    assert len(set(old)) == 1 and old[0] != model_hash(other_model, 32)
    engine2.load_weights(other_model, policy_version="v-other")
    assert engine2.weights_hashes() == [model_hash(other_model, 32)] * 2
    assert engine2.policy_version == "v-other"
    reqs = _requests(engine2, 1.0)
    for req, rs in zip(reqs, engine2.generate(reqs), strict=True):
        assert len(rs) == req.params.n
        for r in rs:
            full = np.concatenate([r.prompt_ids, r.token_ids])
            tf = teacher_forced_logprobs(other_model, full, len(r.prompt_ids), temperature=1.0)
            np.testing.assert_allclose(r.logprobs, tf, atol=1e-4, rtol=0)

    sd = {k: v.clone() for k, v in other_model.state_dict().items()}
    name = next(k for k in sd if k.endswith("q_proj.weight"))
    sd[name] = torch.zeros(3, 3)
    sd[next(k for k in sd if k.endswith("k_proj.weight"))] += 1.0  # a valid change that must not be applied
    with pytest.raises(WeightSyncError, match=r"no actor loaded them.*actor 0: .*wrong shapes.*actor 1:"):
        engine2.load_weights(sd, policy_version="v-bad")
    assert engine2.weights_hashes() == [model_hash(other_model, 32)] * 2
    assert engine2.policy_version == "v-other"
    assert all(len(rs) == r.params.n for r, rs in zip(reqs, engine2.generate(reqs), strict=True))


def _dead(pid: int, timeout: float = 20.0) -> bool:
    end = time.time() + timeout
    while time.time() < end:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.2)
    return False


def test_partial_load_refuses_generation_and_close_kills_actors(cluster, engine2, other_model):
    """Runs last on engine2: kills one of its actors, then closes it (frees the CPUs for the next test)."""
    from gfcr.scale import ScaleError

    actors, pids = list(engine2._actors), list(engine2.pids)
    ray.kill(actors[1], no_restart=True)
    with pytest.raises(WeightSyncError, match=r"1 of 2 actors loaded.*actor 1: "):
        engine2.load_weights(other_model.state_dict(), policy_version="v-half")
    with pytest.raises(WeightSyncError, match="different weights"):
        engine2.generate(_requests(engine2, 0.0))
    engine2.close()
    engine2.close()  # twice is fine
    assert all(_dead(p) for p in pids)  # ray.kill is asynchronous: the processes exit shortly after
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(actors[0].info.remote(), timeout=30)
    assert ray.is_initialized()  # the engine did not start Ray, so it leaves it running
    with pytest.raises(ScaleError, match="closed"):
        engine2.generate(_requests(engine2, 0.0))


def test_training_loop_with_ray_engine_syncs_every_actor(cluster, tiny_dir, tmp_path):
    from gfcr.models import model_hash
    from gfcr.scale.engine import RayEngine
    from gfcr.train.config import load_config
    from gfcr.train.loop import TrainingRun, prepare_run

    cfg = load_config(None, {
        "model": tiny_dir, "output_dir": str(tmp_path / "runs"), "steps": 2, "tensorboard": False,
        "tasks": [{"name": "arith", "n_train": 8, "n_eval": 0, "params": {"level": 1}}],
        "generate.topology.params.k": 2, "generate.prompts_per_step": 2, "generate.max_tokens": 4, "signals.entropy": False,
        "optim.lr": 0.05, "generate.engine": "ray",
        "generate.engine.params": {"workers": 2, "inner_params": {"max_batch": 8}},
    })
    assert cfg.generate.sync == "copy"
    d, resuming = prepare_run(cfg, None, None)
    t = TrainingRun(cfg, d, resuming, progress=False)
    try:
        t.setup()
        assert isinstance(t.engine, RayEngine) and t.engine.workers == 2
        initial = t.policy_version
        t.run()
        metrics = [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()]
        versions: dict[int, set[str]] = {}
        for r in t.store.rollouts(run=t.run_id):
            versions.setdefault(r.step, set()).add(r.policy_version)
        after = [m["policy_version"] for m in metrics]
        assert versions == {0: {initial}, 1: {after[0]}} and after[0] != initial
        assert t.engine.weights_hashes() == [model_hash(t.model, 32)] * 2
        assert t.engine.policy_version == after[-1]
        pids = list(t.engine.pids)
    finally:
        t.close()
    assert all(_dead(p) for p in pids)
