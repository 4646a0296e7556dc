"""A background store writer: one rollouts commit per training step, off the training thread.

The training thread hands over a *job* (a callable that builds the step's records from tensors
it has already copied) and returns at once; a single writer thread runs the jobs in order and
commits each step's rollouts with one ``store.append`` (one Lance commit: the step lands whole or
not at all). Prompts a step mentions that the store does not hold yet are inserted first, and an
optional ``after`` callback (e.g. saving a selector's state) runs once the rollouts are committed, and
an optional ``tracker`` (:class:`~gfcr.integrations.trackers.TrackerHook`) pushes the step's numbers and
a sample of its rollouts to an experiment tracker (a tracker that fails is warned about once and turned
off; the store keeps every step).

Back-pressure: at most ``max_pending`` steps wait in the queue; when the writer falls that far
behind, ``submit`` blocks instead of dropping data or growing memory without bound. A failed job
stops the writer; the error is raised in the training thread on the next ``submit``/``flush``/
``close`` (never swallowed), and nothing of the failed step is in the store.

A run killed mid-training (SIGKILL, OOM) loses only the steps still queued: every committed step
is intact, because each is one commit.
"""

from __future__ import annotations

import atexit
import queue
import threading
import time
import warnings
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gfcr.records import Prompt, Rollout


class WriterError(RuntimeError):
    """The background writer failed on a step; the step named in the message was not written."""


@dataclass
class StepBatch:
    """What one training step writes: its rollouts (one commit), prompts to register, and a
    callback run after the commit (given the store). ``fresh_ids=False`` makes the store check the
    rollout ids against those it holds (needed only for ids that are not fresh random uuids)."""

    step: int
    rollouts: list[Rollout]
    prompts: list[Prompt] = field(default_factory=list)
    after: Callable[[Any], None] | None = None
    fresh_ids: bool = True  # rollout ids are new random uuids: skip the look-up against stored ids


_STOP = object()


class StepWriter:
    """Runs step jobs on one background thread; see the module docstring.

    ``stats`` counts committed steps and rows, and the writer thread's wall and CPU seconds.
    """

    def __init__(self, store: Any, max_pending: int = 4, name: str = "gfcr-step-writer",
                 tracker: Callable[[int, list[Rollout]], None] | None = None):
        if max_pending < 1:
            raise ValueError(f"max_pending must be >= 1, got {max_pending}")
        self.store = store
        self.tracker = tracker  # e.g. gfcr.integrations.trackers.TrackerHook: called after each commit
        self._q: queue.Queue[Any] = queue.Queue(maxsize=max_pending)
        self._error: BaseException | None = None
        self._failed_step: int | None = None
        self._known_prompts: set[str] = set()
        self._closed = False
        self.stats: dict[str, float] = {"steps": 0, "rows": 0, "write_s": 0.0, "cpu_s": 0.0}
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()
        ref = weakref.ref(self)
        atexit.register(lambda: (w := ref()) is not None and w._close_quietly())

    # --- training-thread side -----------------------------------------------------------
    def submit(self, step: int, job: Callable[[], StepBatch]) -> None:
        """Queue ``job`` (built and committed on the writer thread). Blocks while ``max_pending``
        steps are waiting. Raises :class:`WriterError` if an earlier step failed."""
        if self._closed:
            raise WriterError("the writer is closed; create a new recorder to write more steps")
        self.raise_if_failed()
        self._q.put((int(step), job))

    def flush(self) -> None:
        """Wait until every submitted step is committed (or the writer failed)."""
        self._q.join()
        self.raise_if_failed()

    def close(self) -> None:
        """Commit what is queued, stop the thread, and raise a pending error."""
        if not self._closed:
            self._closed = True
            self._q.put(_STOP)
            self._thread.join()
        self.raise_if_failed()

    def _close_quietly(self) -> None:
        if not self._closed:
            self._closed = True
            self._q.put(_STOP)
            self._thread.join(timeout=600)

    def raise_if_failed(self) -> None:
        if self._error is not None:
            raise WriterError(f"writing step {self._failed_step} to the store failed: "
                              f"{type(self._error).__name__}: {self._error}") from self._error

    # --- writer thread ---------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            item = self._q.get()
            try:
                if item is _STOP:
                    return
                if self._error is not None:
                    continue  # drain: nothing after a failed step is written (steps stay contiguous)
                step, job = item
                t0, c0 = time.perf_counter(), time.thread_time()
                try:
                    self._commit(job())
                except BaseException as e:  # noqa: BLE001 - re-raised in the training thread
                    self._error, self._failed_step = e, step
                self.stats["write_s"] += time.perf_counter() - t0
                self.stats["cpu_s"] += time.thread_time() - c0
            finally:
                self._q.task_done()

    def _commit(self, batch: StepBatch) -> None:
        store = self.store
        if batch.prompts:
            fresh = {p.prompt_id: p for p in batch.prompts if p.prompt_id not in self._known_prompts}
            if fresh:
                have = store.existing_ids(list(fresh), table="prompts", column="prompt_id")
                new = [p for pid, p in fresh.items() if pid not in have]
                if new:
                    store.upsert_prompts(new)
                self._known_prompts.update(fresh)
        if batch.rollouts:
            store.append(batch.rollouts, source="live", check_existing=not batch.fresh_ids)
        self.stats["steps"] += 1
        self.stats["rows"] += len(batch.rollouts)
        if batch.after is not None:
            batch.after(store)
        if self.tracker is not None and batch.rollouts:
            try:
                self.tracker(batch.step, batch.rollouts)
            except Exception as e:  # noqa: BLE001 - the store is the record; a tracker outage must not stop it
                warnings.warn(f"pushing step {batch.step} to the tracker failed ({type(e).__name__}: {e}); "
                              "the step is in the store; the tracker is off for the rest of the run",
                              RuntimeWarning, stacklevel=1)
                self.tracker = None
