"""math-verify in persistent worker processes, with our own timeout.

math-verify's own timeouts use signals and raise off the main thread, and a pathological
expression can keep sympy busy for minutes. Here each check goes to a worker: a fresh interpreter
(``python this_file``, the equivalent of a ``spawn`` start: nothing is forked from the caller, and
the caller's ``__main__`` is never re-imported) speaking JSON lines over pipes, with math-verify's
timeouts off inside it. The caller waits at most ``timeout_s``; a worker that overruns or dies is
killed and replaced on next use. Safe from any thread: a queue hands each caller its own idle worker.
"""

from __future__ import annotations

import atexit
import json
import os
import queue
import select
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

STARTUP_GRACE_S = 60.0  # a cold worker also imports math-verify/sympy before its first answer


@dataclass
class MathCheck:
    """Result of one gold-vs-prediction comparison."""

    status: str  # ok | error | timeout | crashed
    equal: bool
    parsed_gold: str | None = None
    parsed_pred: str | None = None
    error: str | None = None


class _Worker:
    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            close_fds=True,
        )
        self.warm = False
        self._buf = b""

    def ask(self, gold: str, pred: str, timeout_s: float) -> dict | None:
        """Send one request; the reply, or None on timeout. Raises OSError/EOFError if it died."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write((json.dumps([gold, pred]) + "\n").encode())
        self.proc.stdin.flush()
        deadline = time.monotonic() + timeout_s + (0.0 if self.warm else STARTUP_GRACE_S)
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                raise EOFError("worker closed its output")
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        self.warm = True
        return json.loads(line)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                if f:
                    f.close()
            except OSError:
                pass


class MathVerifyPool:
    """A small pool of math-verify worker processes (started lazily, replaced after a timeout)."""

    def __init__(self, size: int = 1) -> None:
        self._idle: queue.Queue[_Worker | None] = queue.Queue()
        self._lock = threading.Lock()
        self._all: set[_Worker] = set()
        self.size = 0
        self.resize(size)

    def resize(self, size: int) -> None:
        """Grow the pool to ``size`` slots (never shrinks)."""
        with self._lock:
            while self.size < size:
                self._idle.put(None)  # a slot; its worker starts on first use
                self.size += 1

    def check(self, gold: str, pred: str, timeout_s: float = 5.0) -> MathCheck:
        """Is ``pred`` equivalent to ``gold`` (math-verify ``verify(gold, pred)``)? Never hangs."""
        worker = self._idle.get()
        try:
            if worker is None:
                worker = _Worker()
                with self._lock:
                    self._all.add(worker)
            reply = worker.ask(gold, pred, timeout_s)
            if reply is None:
                self._retire(worker)
                worker = None
                return MathCheck("timeout", False, error=f"math-verify took longer than {timeout_s}s")
            return MathCheck(**reply)
        except (EOFError, OSError, ValueError) as e:
            if worker is not None:
                self._retire(worker)
                worker = None
            return MathCheck("crashed", False, error=f"math-verify worker died: {type(e).__name__}: {e}")
        finally:
            self._idle.put(worker)

    def _retire(self, worker: _Worker) -> None:
        worker.kill()
        with self._lock:
            self._all.discard(worker)

    def pids(self) -> list[int]:
        with self._lock:
            return [w.proc.pid for w in self._all]

    def close(self) -> None:
        with self._lock:
            workers = list(self._all)
            self._all.clear()
        for w in workers:
            w.kill()


_POOL: MathVerifyPool | None = None
_POOL_LOCK = threading.Lock()


def math_pool(size: int = 1) -> MathVerifyPool:
    """The process-wide pool, grown to at least ``size`` workers."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = MathVerifyPool(size)
            atexit.register(_POOL.close)
        else:
            _POOL.resize(size)
        return _POOL


def _serve() -> None:  # the worker process
    import logging

    logging.disable(logging.WARNING)
    from math_verify import parse, verify

    out = sys.stdout
    for line in sys.stdin:
        gold, pred = json.loads(line)
        try:
            g = parse(gold, parsing_timeout=None)
            p = parse(pred, parsing_timeout=None)
            equal = bool(verify(g, p, timeout_seconds=None)) if g and p else False
            reply = {"status": "ok", "equal": equal, "parsed_gold": str(g[0]) if g else None,
                     "parsed_pred": str(p[0]) if p else None, "error": None}
        except Exception as e:  # a parse/compare failure is a verdict, not a worker crash
            reply = {"status": "error", "equal": False, "error": f"{type(e).__name__}: {e}"}
        out.write(json.dumps(reply) + "\n")
        out.flush()


if __name__ == "__main__":
    if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
        sys.path.pop(0)  # run by path: keep this package's modules from shadowing anything
    _serve()
