"""Fixtures shared by the store tests."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gfcr.testing import make_rollout


def fragmented_store(path: str | os.PathLike[str], fragments: int, per: int) -> Path:
    """A new store at ``path`` of ``fragments`` commits of ``per`` rollouts each (step = commit
    index, no automatic compaction, so one fragment per commit): the damaged-store tests' base."""
    from gfcr.store import RolloutStore

    s = RolloutStore.open(path, create=True, auto_compact=0)
    for b in range(fragments):
        s.append([make_rollout(b * per + i, step=b) for i in range(per)])
    assert s.count() == fragments * per and len(s.dataset("rollouts").get_fragments()) == fragments
    return Path(path)


@pytest.fixture(scope="session")
def make_fragmented_store():
    """:func:`fragmented_store`, for module-scoped fixtures (the damaged-store tests' base)."""
    return fragmented_store
