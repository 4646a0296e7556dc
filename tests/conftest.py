"""Shared test fixtures (record builders live in gfcr.testing)."""

from __future__ import annotations

import os

import pytest

# Same as the CLI: OpenMP threads that spin while waiting slow torch down badly on a busy CPU.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


@pytest.fixture
def store(tmp_path):
    from gfcr.store import RolloutStore

    return RolloutStore.open(tmp_path / "store", create=True)
