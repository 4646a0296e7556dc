"""Fixtures of the Ray tests: one loopback-only 2-CPU cluster per module (tiny_dir is in tests/conftest.py)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def cluster():
    ray = pytest.importorskip("ray")
    from gfcr.scale import init_ray

    try:
        started = init_ray(num_cpus=2)
    except RuntimeError:  # Ray's forked head process died before exec (see tests/conftest.py): once more
        ray.shutdown()
        started = init_ray(num_cpus=2)
    yield ray
    if started:
        ray.shutdown()
