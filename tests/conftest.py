"""Shared test fixtures (record builders live in gfcr.testing), and how the suite runs in parallel.

``make test`` runs the suite on pytest-xdist workers (``-n 2 --dist loadgroup --no-loadscope-reorder``). Every test is safe
in parallel (files under ``tmp_path``, servers on ports the OS picks, a file lock around the default
model's one-time conversion); what is not about safety but cost or timing is arranged here:

* each worker gives torch/OpenMP its share of the CPUs (``OMP_NUM_THREADS``, unless already set), so
  that two workers on two cores do not run four threads;
* :data:`GROUPS` keeps some modules on one worker: the Ray modules (a local cluster per module, not
  one per worker), and the load-sensitive ones (the module that loads every core on purpose, and the
  server tests that assert sub-second latencies) so that they never overlap one another;
* the longest tests start first (:data:`FIRST`, then the other ``slow`` ones), so that the last
  minutes are not one long test running alone (``--no-loadscope-reorder`` keeps this order); the
  Ray modules start first too, while their worker has not yet started the thread pools of Lance,
  DuckDB and torch: Ray starts its head processes by ``fork`` with Python code run in the child
  (``preexec_fn``), which a many-threaded parent can crash (seen once: its GCS never started).
"""

from __future__ import annotations

import os

import pytest

# Same as the CLI: OpenMP threads that spin while waiting slow torch down badly on a busy CPU.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 0)  # set in each xdist worker before conftests load
if _WORKERS > 1:  # before torch is imported; the tests' subprocesses inherit it
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, len(os.sched_getaffinity(0)) // _WORKERS)))

#: module path -> group: a group's tests run on one worker, one after another (see pytest_xdist_make_scheduler)
GROUPS = {
    "tests/scale/test_ray.py": "ray",
    "tests/scale/test_ray_engine.py": "ray",
    "tests/filters/test_sandbox_load.py": "cpu-timing",
    "tests/generate/test_serve_compat.py": "cpu-timing",
    "tests/generate/test_serve_batching.py": "cpu-timing",
}
#: started before every other test under xdist (the longest, a few minutes on the real model)
FIRST = ("tests/test_readme.py::test_readme_real_model_commands",)


def pytest_collection_modifyitems(config, items):
    """Under xdist, the longest tests first (a stable sort: :data:`FIRST`, then the ``slow`` ones)."""
    if "PYTEST_XDIST_WORKER" not in os.environ:  # only workers collect; the controller orders by their lists
        return
    items.sort(key=lambda it: (it.nodeid not in FIRST and GROUPS.get(it.nodeid.split("::", 1)[0]) != "ray",
                               it.get_closest_marker("slow") is None))


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadgroup`` with the groups of :data:`GROUPS` (by module path), every other test a unit
    of its own. (xdist's own ``xdist_group`` marks do not reach its scheduler under pytest 9.2, whose
    node ids it can no longer suffix.)"""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return GROUPS.get(nodeid.split("::", 1)[0], nodeid)

    return GroupScheduling(config, log)


@pytest.fixture
def store(tmp_path):
    from gfcr.store import RolloutStore

    return RolloutStore.open(tmp_path / "store", create=True)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    """A tiny random Llama + tokenizer saved as an HF folder (one per test module)."""
    from gfcr.testing import save_tiny

    return save_tiny(str(tmp_path_factory.mktemp("tiny") / "model"))


@pytest.fixture
def tiny_run(tiny_dir, tmp_path):
    """A finished 2-step ``gfcr train`` GRPO run folder of the tiny model on 6 level-1 arith prompts
    (K = 2, 2 prompts a step, 4 new tokens at T = 0.9); a format verifier that most random completions
    pass, so the store holds verified rollouts."""
    from gfcr.train.config import load_config
    from gfcr.train.loop import train

    cfg = load_config(None, {
        "model": tiny_dir, "output_dir": str(tmp_path / "runs"), "steps": 2, "tensorboard": False,
        "tasks": [{"name": "arith", "n_train": 6, "n_eval": 0, "params": {"level": 1}}],
        "generate.topology.params.k": 2, "generate.prompts_per_step": 2, "generate.max_tokens": 4,
        "generate.temperature": 0.9, "signals.entropy": False,
        "verify": {"verifier": {"name": "format", "params": {"pattern": "^[^x]"}}}})
    return train(cfg, run_dir=tmp_path / "run", progress=False)
