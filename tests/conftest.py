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


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    """A tiny random Llama + tokenizer saved as an HF folder (one per test module)."""
    from gfcr.testing import save_tiny

    return save_tiny(str(tmp_path_factory.mktemp("tiny") / "model"))
