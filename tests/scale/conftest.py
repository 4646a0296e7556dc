"""Fixtures of the Ray tests: one loopback-only 2-CPU cluster per module, a tiny model folder."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def cluster():
    ray = pytest.importorskip("ray")
    from gfcr.scale import init_ray

    started = init_ray(num_cpus=2)
    yield ray
    if started:
        ray.shutdown()


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    from gfcr.testing import save_tiny

    return save_tiny(str(tmp_path_factory.mktemp("tiny") / "model"))
