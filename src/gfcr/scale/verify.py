"""``ray_verify``: re-verify a store's rollouts on Ray actors and write one new store version.

Each actor runs :func:`gfcr.filters.apply.verify_many` (the in-process code path) over a chunk of
rollouts and sends back only the verdict fields (``reward``, ``verified``, ``verifier``); the
driver applies them to its rollouts and writes all of them with one ``store.update`` (one commit),
exactly as :func:`gfcr.filters.apply.reverify_store` does. Any failed chunk (after
``max_retries``) stops the run before anything is written.

math-verify's own timeouts use signals, which only work on a process's main thread; Ray runs the
methods of a synchronous actor on its worker's main thread (:meth:`VerifyWorker.environment`
reports it, and the tests check it), and the ``math`` verifier sends each check to its own worker
processes anyway.
"""

from __future__ import annotations

import copy
import time
from collections import deque
from typing import Any

import pyarrow as pa

from gfcr.records import Prompt, Rollout, table_to_rollouts

from .cluster import ScaleError, error_cause, init_ray, kill_actors

VERDICT_FIELDS = ("reward", "verified", "verifier")


class VerifyWorker:
    """Actor body: one verifier built from ``(name, options)`` or a picklable verifier instance."""

    def __init__(self, verifier: Any, options: dict[str, Any] | None = None):
        from gfcr.filters.verifiers import get_verifier

        self.verifier = get_verifier(verifier, **(options or {})) if isinstance(verifier, str) else verifier

    def verify(self, table: pa.Table, lo: int, hi: int, prompts: list[Prompt]) -> list[tuple[float, bool | None, dict[str, Any]]]:
        """Verdict fields of rows ``[lo, hi)`` of ``table`` (the rollouts to verify; shared through
        Ray's object store, so each actor reads it without a copy per chunk), in order."""
        from gfcr.filters.apply import verify_many

        out = verify_many(table_to_rollouts(table.slice(lo, hi - lo)), self.verifier, prompts, workers=1)
        return [(r.reward, r.verified, r.verifier) for r in out]

    def environment(self) -> dict[str, Any]:
        """Where this actor's methods run: main thread or not, and whether math-verify's signal
        timeouts (its defaults) work here."""
        import os
        import threading

        env: dict[str, Any] = {"pid": os.getpid(),
                               "main_thread": threading.current_thread() is threading.main_thread()}
        try:
            from math_verify import parse, verify
        except ImportError:
            env["math_verify"] = None
            return env
        try:
            env["math_verify"] = bool(verify(parse("$\\frac{1}{2}$"), parse("$0.5$")))
        except Exception as e:  # noqa: BLE001 - reported to the caller, not swallowed
            env["math_verify"] = f"{type(e).__name__}: {e}"
        return env


def apply_verdicts(rollouts: list[Rollout], verdicts: list[tuple[float, bool | None, dict[str, Any]]]) -> list[Rollout]:
    """Copies of ``rollouts`` with ``(reward, verified, verifier)`` set from ``verdicts`` (same order)."""
    if len(rollouts) != len(verdicts):
        raise ValueError(f"{len(rollouts)} rollouts but {len(verdicts)} verdicts")
    out = []
    for r, (reward, verified, evidence) in zip(rollouts, verdicts, strict=True):
        c = copy.copy(r)
        c.signals = dict(r.signals)
        c.reward, c.verified, c.verifier = float(reward), verified, evidence
        out.append(c)
    return out


def _record(v: Any) -> Any:
    """A verifier record without its timing (``cost_s`` differs on every run)."""
    return {k: x for k, x in v.items() if k != "cost_s"} if isinstance(v, dict) else v


def workers_note(asked: int, used: int, n: int, chunk_size: int) -> str | None:
    """Why fewer actors ran than asked, or None: one actor per chunk of ``chunk_size`` rows at most.

    Example: ``workers_note(4, 1, 78, 256)`` → ``"1 of 4 workers: 78 rollouts are 1 chunk of at most 256
    (--chunk-size 20 gives 4)"``.
    """
    if used >= asked:
        return None
    per = max(1, -(-n // asked))
    return (f"{used} of {asked} workers: {n} rollouts are {used} chunk{'s' if used != 1 else ''} of at most "
            f"{chunk_size} (--chunk-size {per} gives {min(asked, -(-n // per))})")


def ray_verify(
    store: Any,
    verifier: Any,
    *,
    options: dict[str, Any] | None = None,
    where: str | None = None,
    workers: int = 2,
    chunk_size: int = 256,
    max_retries: int = 1,
    actor_options: dict[str, Any] | None = None,
    address: str | None = None,
    num_cpus: int | None = None,
    write: bool = True,
) -> dict[str, Any]:
    """Re-verify ``store``'s rollouts (optionally a SQL ``where``) on ``workers`` Ray actors.

    Long because: one dispatch loop (chunks to idle actors, a failed chunk retried on a fresh actor) between
    reading the rows and writing the verdicts as one store version.

    ``verifier`` is a registered name (``math``, ``numeric``…, built with ``options`` inside each
    actor) or a picklable verifier instance. Gold answers/tests come from the prompts table. With
    ``write`` the new verdicts are one new store version (``store.update``), unless no row's reward,
    verdict or verifier record (its timing aside) changed: then nothing is committed (``written``
    says which). The summary has the same keys as :func:`~gfcr.filters.apply.reverify_store`'s plus
    ``workers`` (actors used: one per chunk at most), ``workers_note`` (why fewer than asked, else
    None), ``chunks``, ``seconds`` and ``rollouts_per_s``. ``write=False`` also returns the verified rollouts
    (``"rollouts"``) without writing.
    """
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    if isinstance(verifier, str):
        from gfcr.filters.verifiers import get_verifier

        get_verifier(verifier, **(options or {}))  # refuse a bad name/config before starting anything
    before = store.version
    table = store.scan(where=where) if where else store.scan()
    n = table.num_rows
    if n == 0:
        return {"n": 0, "changed": 0, "passed": 0, "unjudged": 0, "missing_prompts": 0, "workers": 0,
                "chunks": 0, "seconds": 0.0, "rollouts_per_s": 0.0, "version_before": before, "version_after": before}
    prompt_ids = sorted(set(table.column("prompt_id").to_pylist()))
    prompts = {p.prompt_id: p for p in store.prompts(ids=prompt_ids)}
    bounds = [(i, min(i + chunk_size, n)) for i in range(0, n, chunk_size)]

    started = init_ray(address, num_cpus)
    import ray

    opts = {"num_cpus": 1, "max_restarts": 0}
    opts.update(actor_options or {})
    actor_cls = ray.remote(**opts)(VerifyWorker)
    n_actors = min(workers, len(bounds))
    actors = [actor_cls.remote(verifier, options) for _ in range(n_actors)]
    t0 = time.perf_counter()
    table_ref = ray.put(table)
    results: dict[int, list[Any]] = {}
    attempts = [0] * len(bounds)
    todo: deque[int] = deque(range(len(bounds)))
    idle = deque(range(n_actors))
    running: dict[Any, tuple[int, int]] = {}
    try:
        while len(results) < len(bounds):
            while todo and idle:
                c, a = todo.popleft(), idle.popleft()
                lo, hi = bounds[c]
                part = table.slice(lo, hi - lo)
                need = [prompts[p] for p in sorted(set(part.column("prompt_id").to_pylist())) if p in prompts]
                running[actors[a].verify.remote(table_ref, lo, hi, need)] = (c, a)
            ready, _ = ray.wait(list(running), num_returns=1)
            c, a = running.pop(ready[0])
            try:
                results[c] = ray.get(ready[0])
            except (ray.exceptions.RayTaskError, ray.exceptions.RayActorError) as e:
                attempts[c] += 1
                if isinstance(e, ray.exceptions.RayActorError):
                    actors[a] = actor_cls.remote(verifier, options)
                if attempts[c] > max_retries:
                    cause = error_cause(e)
                    raise ScaleError(f"verification of rows {bounds[c][0]}..{bounds[c][1] - 1} failed {attempts[c]} "
                                     f"time(s): {type(cause).__name__}: {str(cause).strip().splitlines()[0] if str(cause).strip() else ''}. "
                                     f"Nothing was written (store version {store.version}).") from cause
                todo.appendleft(c)
            idle.append(a)
    finally:
        kill_actors(ray, actors)
        if started:
            ray.shutdown()
    dt = time.perf_counter() - t0
    old = table_to_rollouts(table)
    new = apply_verdicts(old, [v for c in range(len(bounds)) for v in results[c]])
    changed = sum((a.reward != b.reward) or (a.verified != b.verified) for a, b in zip(old, new, strict=True))
    differ = changed or any(_record(a.verifier) != _record(b.verifier) for a, b in zip(old, new, strict=True))
    if write and differ:  # a version that changes nothing is not committed
        store.update(new)
    out = {"n": n, "changed": changed, "passed": sum(r.verified is True for r in new),
           "unjudged": sum(r.verified is None for r in new),
           "missing_prompts": len(set(prompt_ids) - set(prompts)), "workers": n_actors,
           "workers_note": workers_note(workers, n_actors, n, chunk_size), "chunks": len(bounds),
           "seconds": round(dt, 3), "rollouts_per_s": round(n / max(dt, 1e-9), 2), "written": bool(write and differ),
           "version_before": before, "version_after": store.version}
    if not write:
        out["rollouts"] = new
    return out
