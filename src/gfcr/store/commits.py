"""How a store's commit is run: Lance commit conflicts retried with jittered backoff, bounded
(:func:`retry_commit`); a store method's object-store transport errors ended in one line (:func:`writes`).
"""

from __future__ import annotations

import functools
import random
import time
from collections.abc import Callable
from typing import Any, TypeVar

from gfcr.store.errors import CommitGaveUp, StoreError, is_conflict, lance_reason, unreachable_write

_T = TypeVar("_T")


def retry_commit(fn: Callable[[], _T], attempts: int = 12, max_sleep: float = 2.0) -> _T:
    """Run ``fn`` (a whole read-then-commit, re-run from the start), retrying Lance commit conflicts
    (:func:`is_conflict`) with jittered exponential backoff (10 ms doubling, at most ``max_sleep`` s), at
    most ``attempts`` times; then :class:`CommitGaveUp` in one line. An object store that did not answer
    is :class:`StoreUnreachable` in one line (:func:`unreachable_write`); any other error is raised as it is."""
    for i in range(attempts):
        try:
            return fn()
        except (OSError, RuntimeError, ValueError) as e:
            if not is_conflict(e):
                down = unreachable_write(e)
                if down is not None:
                    raise down from e
                raise
            if i == attempts - 1:
                raise CommitGaveUp(f"the commit lost to other writers {attempts} times in a row ({lance_reason(e)[:160]}); "
                                   "nothing of it was written: retry later or write from fewer processes") from e
            time.sleep(min(max_sleep, 0.01 * 2**i) * (0.5 + random.random()))
    raise AssertionError("unreachable")


def writes(fn: Callable[..., _T]) -> Callable[..., _T]:
    """A write method whose object-store transport errors (the store did not answer, after the client's
    own bounded retries) end in one line, :class:`~gfcr.store.errors.StoreUnreachable`."""

    @functools.wraps(fn)
    def run(*a: Any, **kw: Any) -> _T:
        try:
            return fn(*a, **kw)
        except (OSError, RuntimeError, ValueError) as e:
            down = unreachable_write(e)
            if down is None or isinstance(e, StoreError):
                raise
            raise down from e

    return run
