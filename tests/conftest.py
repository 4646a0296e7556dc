"""Shared test fixtures (record builders live in gfcr.testing)."""

from __future__ import annotations

import pytest


@pytest.fixture
def store(tmp_path):
    from gfcr.store import RolloutStore

    return RolloutStore.open(tmp_path / "store", create=True)
