"""Dynamic batching for ``gfcr serve``: concurrent requests share one ``engine.generate`` call.

Each HTTP request hands its :class:`~gfcr.generate.engines.base.GenRequest` s to
:meth:`Batcher.generate`, which queues them as one *job* and waits. One worker thread takes the
oldest job, then keeps taking queued jobs until the queue has been quiet for ``max_wait_ms`` (the
*quiet-gap rule*), at most ``stretch x max_wait_ms`` after the oldest job arrived (``stretch = 1``: a
fixed window of ``max_wait_ms`` from the oldest job), or until the rows (the sum of ``params.n``) would
pass ``max_batch_rows``, and runs them all in ONE ``engine.generate`` call under ``lock``. The
quiet-gap rule is the default (``stretch = 4``): it lets a burst whose requests arrive spread over more
than ``max_wait_ms`` share one call, and its window is never shorter than the fixed one
(docs/generate.md, "Dynamic batching", has the measurement). Each caller gets back exactly its own
results (the engine returns results per request, in order; the batcher slices them back per job).

Rules:

- Jobs with different sampling parameters share a call (the hf engine takes per-request params).
- **Seeded requests share calls** (``batch_seeded=True``, the default: RL through a server seeds
  every group request, so without it batching would do nothing for training). The hf engine draws
  each sample from its own seeded generator (:func:`~gfcr.generate.engines.hf_sampling.row_generator`,
  a fixed block of uniforms per step), so the random draws never depend on the batch; the logits
  do, at the level of float rounding (other prompts change the padding and the matrix shapes), and
  only a draw landing within that rounding of a boundary of the CDF (or a greedy near-tie) could
  differ. ``batch_seeded=False`` runs every seeded job in its own call: exactly the tokens of an
  unbatched server, by construction, at the price of no batching for seeded work.
- A job bigger than ``max_batch_rows`` runs alone (the engine splits it into its own batches).
- If a shared call raises, each of its jobs is run again on its own, so a bad request fails alone
  and the others still get their answers.
- ``lock`` is held around every engine call, so whoever else takes it (``gfcr serve``'s weight
  loads) never lands in the middle of a generation: each call sees one set of weights.
- **Cancellation**: a job carries a ``threading.Event`` (``submit(reqs, cancel=ev)``; its requests get it
  as ``GenRequest.cancel``). A job cancelled while queued is never run (its future fails with
  :class:`RequestCancelledError`); one cancelled while running stops decoding at the engine's next
  step (the hf engine drops its rows, finish reason ``abort``), so the others in its call run on and
  the next queued job starts as soon as the call ends. :meth:`Batcher.close` cancels everything,
  running work included: shutting down never waits for abandoned work.
"""

from __future__ import annotations

import dataclasses
import queue
import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from gfcr.generate.engines.base import GenRequest, GenResult


class BatcherClosedError(RuntimeError):
    """The batcher was closed before (or while) the request was waiting to be served."""


class RequestCancelledError(RuntimeError):
    """The job was cancelled (its client went away) before it was run."""


@dataclass
class _Job:
    reqs: list[GenRequest]
    future: Future = field(default_factory=Future)
    t_enqueued: float = field(default_factory=time.monotonic)
    cancel: threading.Event = field(default_factory=threading.Event)

    @property
    def cancelled(self) -> bool:
        return self.cancel.is_set()

    @property
    def rows(self) -> int:
        return sum(r.params.n for r in self.reqs)

    @property
    def seeded(self) -> bool:
        return any(r.params.seed is not None for r in self.reqs)


def split_results(results: list[list[GenResult]], sizes: list[int]) -> list[list[list[GenResult]]]:
    """Cut the per-request results of one merged call back into per-job lists.

    Args:
        results: ``sum(sizes)`` lists, one per request, in the order the requests were merged.
        sizes: requests per job, in merge order.
    Returns:
        ``len(sizes)`` lists; job ``j`` gets ``results[sum(sizes[:j]) : sum(sizes[:j + 1])]``.

    Example: ``sizes = [2, 1]``, ``results = [a, b, c]`` gives ``[[a, b], [c]]``.
    """
    if sum(sizes) != len(results):
        raise RuntimeError(f"the engine returned {len(results)} result lists for {sum(sizes)} requests")
    out, at = [], 0
    for s in sizes:
        out.append(results[at : at + s])
        at += s
    return out


class Batcher:
    """Merges concurrent generation jobs into shared engine calls (see the module docstring).

    Args:
        engine: anything with ``generate(list[GenRequest]) -> list[list[GenResult]]``.
        max_batch_rows: most sequences (sum of ``n``) merged into one engine call.
        max_wait_ms: how long the oldest queued job waits for company before its call starts.
        lock: taken around every engine call (share it with whatever must not run during one).
        batch_seeded: let seeded jobs share calls (the default; the draws never depend on the batch, the
            logits only up to float rounding); False runs each seeded job alone.
        on_batch: called as ``on_batch(rows, waits)`` before each merged engine call (rows merged, the
            seconds each job waited in the queue); gfcr serve's ``/metrics`` uses it.
        stretch: the window may grow, while jobs keep arriving, to this many times ``max_wait_ms``
            (1 = a fixed window from the oldest job).
    """

    def __init__(self, engine: Any, max_batch_rows: int = 32, max_wait_ms: float = 20.0,
                 lock: threading.Lock | None = None, batch_seeded: bool = True, stretch: float = 4.0,
                 on_batch: Any = None):
        if max_batch_rows < 1:
            raise ValueError(f"max_batch_rows must be >= 1, got {max_batch_rows}")
        if max_wait_ms < 0:
            raise ValueError(f"max_wait_ms must be >= 0, got {max_wait_ms}")
        self.engine = engine
        self.max_batch_rows = int(max_batch_rows)
        self.max_wait_s = float(max_wait_ms) / 1000.0
        self.lock = lock or threading.Lock()
        self.batch_seeded = bool(batch_seeded)
        if stretch < 1:
            raise ValueError(f"stretch must be >= 1, got {stretch}")
        self.stretch = float(stretch)
        self.calls = 0  # engine.generate calls made
        self.jobs = 0  # jobs served (successfully or not)
        self._q: queue.Queue[_Job | None] = queue.Queue()
        self._held: deque[_Job] = deque()  # taken from the queue but left for the next call
        self._running: list[_Job] = []  # the jobs of the engine call in progress
        self._closed = False
        self._draining = False
        self._outstanding: set[Future] = set()  # futures not yet resolved (drain waits for them)
        self.on_batch = on_batch  # on_batch(rows, queue waits in s) before each engine call (gfcr serve's /metrics)
        self._gate = threading.Lock()  # orders submit against close: no job is queued after the drain
        self._worker = threading.Thread(target=self._loop, name="gfcr-batcher", daemon=True)
        self._worker.start()

    # --- callers ------------------------------------------------------------------------------
    def submit(self, reqs: list[GenRequest], cancel: threading.Event | None = None) -> Future:
        """Queue ``reqs`` as one job; the future resolves to their results (one list per request).
        Setting ``cancel`` (made here if not given; the requests get it as ``GenRequest.cancel``)
        withdraws the job (see the module docstring)."""
        ev = cancel if cancel is not None else threading.Event()
        job = _Job([r if r.cancel is ev else dataclasses.replace(r, cancel=ev) for r in reqs], cancel=ev)
        if not job.reqs:
            job.future.set_result([])
            return job.future
        with self._gate:
            if self._closed or self._draining:
                raise BatcherClosedError("gfcr serve is shutting down; the request was not run")
            self._outstanding.add(job.future)
            job.future.add_done_callback(self._outstanding.discard)
            self._q.put(job)
        return job.future

    def drain(self, timeout_s: float = 30.0) -> bool:
        """Refuse new jobs, let the queued and running ones finish (at most ``timeout_s``), then
        :meth:`close` (which cancels whatever is left). Returns whether everything finished in time."""
        with self._gate:
            self._draining = True
        t_end = time.monotonic() + max(0.0, timeout_s)
        while self._outstanding and time.monotonic() < t_end:
            time.sleep(0.01)
        done = not self._outstanding
        self.close(timeout_s=5.0)
        return done

    def generate(self, reqs: list[GenRequest]) -> list[list[GenResult]]:
        """:meth:`submit` and wait: what ``engine.generate(reqs)`` would return (it raises what it would raise)."""
        return self.submit(reqs).result()

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop the worker: the call in progress is cancelled (the engine stops at its next step), jobs
        still queued fail with :class:`BatcherClosedError`; waits at most ``timeout_s`` for the worker."""
        with self._gate:
            if self._closed:
                return
            self._closed = True
            self._q.put(None)
        for j in list(self._running):
            j.cancel.set()
        self._worker.join(timeout=timeout_s)
        self._fail_pending()

    # --- worker -------------------------------------------------------------------------------
    def _fail_pending(self) -> None:
        pending = list(self._held)
        self._held.clear()
        while True:
            try:
                j = self._q.get_nowait()
            except queue.Empty:
                break
            if j is not None:
                pending.append(j)
        for j in pending:
            if not j.future.done():
                j.future.set_exception(BatcherClosedError("gfcr serve is shutting down; the request was not run"))

    def _next(self, timeout: float | None) -> _Job | None:
        """The next job that is still wanted (held ones first); ``None`` on timeout or close."""
        while True:
            if self._held:
                job: _Job | None = self._held.popleft()
            else:
                try:
                    job = self._q.get(timeout=timeout) if timeout is None or timeout > 0 else self._q.get_nowait()
                except queue.Empty:
                    return None
            if job is None or not job.cancelled:
                return job
            if not job.future.done():  # withdrawn while queued: never run
                job.future.set_exception(RequestCancelledError("the request was cancelled before it ran"))

    def _alone(self, job: _Job) -> bool:
        return (job.seeded and not self.batch_seeded) or job.rows >= self.max_batch_rows

    def _collect(self, first: _Job) -> list[_Job]:
        """``first`` plus the jobs that may join it within the wait window."""
        batch, rows = [first], first.rows
        if self._alone(first) or self.max_wait_s == 0:
            return batch
        deadline = first.t_enqueued + self.max_wait_s
        cap = first.t_enqueued + self.max_wait_s * self.stretch
        held_over: list[_Job] = []
        while rows < self.max_batch_rows and not self._closed:
            job = self._next(deadline - time.monotonic())
            if job is None:
                if self._closed:
                    break
                if time.monotonic() >= deadline:
                    break
                continue
            if self._alone(job) or rows + job.rows > self.max_batch_rows:
                held_over.append(job)  # served by a later call, in arrival order
                if rows + job.rows > self.max_batch_rows and not self._alone(job):
                    break
                continue
            batch.append(job)
            rows += job.rows
            deadline = min(cap, max(deadline, job.t_enqueued + self.max_wait_s))  # quiet for max_wait: go
        self._held.extendleft(reversed(held_over))
        return batch

    def _loop(self) -> None:
        while not self._closed:
            first = self._next(None)
            if first is None:
                if self._closed:
                    return
                continue
            self._run(self._collect(first))

    def _call(self, reqs: list[GenRequest]) -> list[list[GenResult]]:
        with self.lock:
            self.calls += 1
            return self.engine.generate(reqs)

    def _run(self, batch: list[_Job]) -> None:
        self._running = batch
        if self._closed:  # close() came between collecting and running (it cancels what it sees running)
            for j in batch:
                j.cancel.set()
        try:
            self._run_batch(batch)
        finally:
            self._running = []

    def _run_batch(self, batch: list[_Job]) -> None:
        reqs = [r for j in batch for r in j.reqs]
        if self.on_batch is not None:
            now = time.monotonic()
            self.on_batch(sum(j.rows for j in batch), [now - j.t_enqueued for j in batch])
        try:
            parts = split_results(self._call(reqs), [len(j.reqs) for j in batch])
        except Exception as e:  # noqa: BLE001 - re-run each job alone so only the bad one fails
            if len(batch) == 1:
                batch[0].future.set_exception(e)
                self.jobs += 1
                return
            for j in batch:
                try:
                    j.future.set_result(self._call(j.reqs))
                except Exception as e1:  # noqa: BLE001 - handed to that job's caller
                    j.future.set_exception(e1)
                self.jobs += 1
            return
        for j, part in zip(batch, parts, strict=True):
            j.future.set_result(part)
            self.jobs += 1
