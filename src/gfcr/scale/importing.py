"""``ray_import`` (``gfcr scale import``): a dump's files split across Ray workers that each write data
files, committed once.

The dump's files (found and ordered as ``gfcr store import`` finds them,
:func:`gfcr.formats.dump_files`) are cut into ``workers`` contiguous shares of about equal bytes
(:func:`split_files`). Each share is one Ray task: it opens the store, runs the ordinary importer on its
files with every write staged (:func:`gfcr.formats.staged.stage_import`: parse, validate, skip stored
ids, write the rows as Lance data files, no commit) and returns what it staged (fragment metadata, ids,
prompts; kilobytes). Once every task has finished, the driver commits them all at once
(:func:`gfcr.formats.staged.commit_import`): one rollouts commit, one prompt upsert, one state write.

All or nothing: a task that fails (bad input in its files, a worker that died) stops the import
before the commit, so the store stays exactly as it was (the files other tasks staged stay
unreferenced, :mod:`gfcr.store.staging`); the error is one line naming the share's files and the cause.

What scales with workers: reading, parsing, validating, mapping and writing the data files (every
task is independent). What stays serial: finding the files, the driver's id check and the single
commit (a few requests whatever the row count; its manifest lists one fragment per staged batch).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from gfcr.formats import dump_files
from gfcr.formats.staged import StagedImport, commit_import, stage_import
from gfcr.store.core import RolloutStore

from .cluster import ScaleError, error_cause, ray_session


def split_files(files: list[Path], workers: int) -> list[list[Path]]:
    """``files`` (in import order) cut into at most ``workers`` contiguous, non-empty shares of about
    equal total size (greedy: a share closes once it holds its fair part of the bytes left).

    Example: sizes [1, 1, 1, 1], 2 workers → [[f0, f1], [f2, f3]]; 3 files, 5 workers → 3 shares."""
    sizes = [max(1, f.stat().st_size) for f in files]
    shares: list[list[Path]] = []
    left, i = sum(sizes), 0
    for k in range(min(workers, len(files)), 0, -1):
        target, share, got = left / k, [], 0
        while i < len(files) and (not share or (got + sizes[i] / 2 <= target and len(files) - i > k - 1)):
            share.append(files[i])
            got += sizes[i]
            i += 1
        shares.append(share)
        left -= got
    if i < len(files):
        shares[-1].extend(files[i:])
    return shares


def _stage_share(where: str, storage_options: dict[str, str] | None, fmt: str, files: list[str], roots: list[str],
                 opts: dict[str, Any]) -> StagedImport:
    """One Ray task: open the store and stage the import of ``files`` (see the module)."""
    store = RolloutStore.open(where, storage_options=storage_options if storage_options else None, verify=False)
    return stage_import(store, fmt, files, roots, **opts)


def ray_import(store: RolloutStore, fmt: str, paths: list[str], workers: int = 2, address: str | None = None,
               num_cpus: int | None = None, **opts: Any) -> dict[str, Any]:
    """Import the dump at ``paths`` (format ``fmt``; ``opts`` as :func:`gfcr.formats.import_rollouts`
    takes them, a tokenizer by name) on ``workers`` Ray tasks, committed once (see the module).
    Returns ``written``, ``skipped``, ``files``, ``workers`` (the shares run), ``notes``, ``tokens``,
    ``version`` (the rollouts version after). :class:`ScaleError` in one line when a task failed
    (nothing committed)."""
    if workers < 1:
        raise ScaleError(f"--workers must be at least 1 (got {workers})")
    roots = [os.path.abspath(p) for p in paths]
    files = dump_files(fmt, roots)
    if not files:
        raise ScaleError(f"no {fmt} files under {', '.join(paths)}; nothing was written")
    shares = split_files(files, workers)
    where = str(Path(store.path).resolve()) if store.local else store.location.uri
    so = None if store.local else store.location.storage_options
    before = store.count()
    with ray_session(address, num_cpus) as ray:
        task = ray.remote(num_cpus=1, max_retries=0)(_stage_share)
        refs = [task.remote(where, so, fmt, [str(f) for f in share], roots, opts) for share in shares]
        parts: list[StagedImport] = []
        for share, ref in zip(shares, refs, strict=True):
            try:
                parts.append(ray.get(ref))
            except Exception as e:  # noqa: BLE001 - a Ray task error wraps the worker's own
                for r in refs:
                    ray.cancel(r, force=True)
                cause = error_cause(e)
                names = ", ".join(f.name for f in share[:3]) + (f" and {len(share) - 3} more" if len(share) > 3 else "")
                raise ScaleError(f"the import worker for {names} failed ({type(cause).__name__}: "
                                 f"{str(cause).splitlines()[0][:300] if str(cause) else '-'}); nothing was committed: "
                                 f"the store is as it was ({before} rollouts)") from None
    out = commit_import(store, parts)
    return {**out, "workers": len(shares), "version": store.version}


__all__ = ["ray_import", "split_files"]
