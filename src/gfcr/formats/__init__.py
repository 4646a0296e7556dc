"""Other frameworks' formats: bring rollouts in from the trainers people already run (one module per
framework, one driver: :func:`import_rollouts`) and take them out as their datasets
(:mod:`~gfcr.formats.export`: JSONL, Parquet, ATIF; :mod:`~gfcr.formats.sft_export`: TRL, verl, slime SFT).

Every importer parses and validates *all* of a file into records before anything is written; a
malformed input raises :class:`ImportFormatError` naming file, line (or record) and field, and the
store is left as it was. Imports are incremental: rollout ids derive from content and source
position, rows already stored are skipped, each file's new rows land in one commit (prompts
first), and a store-wide lock (on object storage: an insert-if-absent commit) makes two racing
imports of the same dump store each rollout once.
:func:`follow` polls a dump folder a trainer keeps writing.

Formats (the per-framework modules say exactly which fields map where; docs/store.md has tables):
``verl``, ``trl``, ``areal``, ``prime-rl``, ``prime-rl-stream``, ``slime``, ``roll``, ``skyrl``, ``open-instruct``, ``atif``, ``atropos``, ``nemo-gym``, ``art``, and
gfcr's own ``jsonl`` / ``parquet`` (:mod:`gfcr.formats.export`).
"""

from __future__ import annotations

import fcntl
import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

from gfcr.formats import (
    areal,
    art,
    atif,
    atropos,
    columnar,
    native,
    nemo_gym,
    open_instruct,
    prime_rl,
    prime_rl_stream,
    roll,
    skyrl,
    slime,
    trl,
    verl,
)
from gfcr.formats._common import (
    FOLLOWING,
    ImportFormatError,
    ImportResult,
    Progress,
    file_scopes,
    find_files,
    load_tokenizer,
    ticking,
    validate_rollouts,
)
from gfcr.formats.export import export, refuse_existing, rollout_to_json, write_new_file  # noqa: F401 - re-exported
from gfcr.records import Rollout, rollouts_to_table
from gfcr.store.core import RolloutStore, StoreError

__all__ = ["FORMATS", "FollowStopped", "ImportFormatError", "ImportResult", "dump_files", "export", "follow",
           "import_rollouts", "load_tokenizer"]

_MODULES: dict[str, ModuleType] = {
    "verl": verl, "trl": trl, "areal": areal, "prime-rl": prime_rl, "prime-rl-stream": prime_rl_stream, "slime": slime, "roll": roll,
    "skyrl": skyrl, "open-instruct": open_instruct, "atif": atif,
    "atropos": atropos, "nemo-gym": nemo_gym, "art": art,
}
FORMATS: dict[str, Callable[..., ImportResult]] = {
    **{k: m.parse for k, m in _MODULES.items()}, "jsonl": native.parse_jsonl, "parquet": native.parse_parquet,
}
_PATTERNS = {**{k: m.PATTERNS for k, m in _MODULES.items()}, "jsonl": ("*.jsonl",), "parquet": ("*.parquet",)}
#: formats whose dumps hold the same rollout in two files on purpose (prime-rl: all/ and effective/)
_DUPLICATES_EXPECTED = {"prime-rl"}


@contextmanager
def _import_lock(store: RolloutStore) -> Iterator[None]:
    """An exclusive lock on the store for the check-then-write of one import, so that two imports
    of the same dump cannot both find a rollout missing and both write it. A remote store has no
    lock to share: its appends skip stored ids in the commit itself instead (``store.if_absent``,
    :mod:`gfcr.store.keys`), which Lance keeps race-free across processes."""
    if not getattr(store, "local", True):
        store.if_absent, was = True, store.if_absent
        try:
            yield
        finally:
            store.if_absent = was
        return
    with open(store.path / ".import.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _sorted(fmt: str, files: list[Path]) -> list[Path]:
    order = getattr(_MODULES.get(fmt), "file_order", None)
    return sorted(files, key=order) if order else files


def dump_files(fmt: str, paths: list[str]) -> list[Path]:
    """The files of ``fmt`` under ``paths``, in the order an import reads them (as :func:`import_rollouts`)."""
    if fmt not in FORMATS:
        raise StoreError(f"unknown import format {fmt!r}; choose one of {sorted(FORMATS)}")
    return _sorted(fmt, find_files(paths, _PATTERNS[fmt]))


def _check(fmt: str, res: ImportResult, f: Path, seen: dict[str, Path]) -> list[Rollout]:
    """Validate ``res``'s rollouts; drop (or refuse) ids already read from another file."""
    validate_rollouts(res.rollouts, f)
    out = []
    for r in res.rollouts:
        if r.rollout_id in seen:
            if fmt in _DUPLICATES_EXPECTED and seen[r.rollout_id] != f:
                continue
            raise ImportFormatError(f, f"record {r.rollout_id}", "rollout_id",
                                    f"duplicate rollout id {r.rollout_id!r}: also read from {seen[r.rollout_id]}")
        seen[r.rollout_id] = f
        out.append(r)
    return out


def _write(store: RolloutStore, fmt: str, batches: list[tuple[Path, ImportResult, list[Rollout]]],
           progress: Progress | None = None) -> tuple[int, int]:
    """Under the import lock: per file, skip stored ids, then prompts and the new rollouts (one
    commit; ``progress("write", k, files)`` after each). Returns (written, skipped)."""
    written = skipped = 0
    inferior = getattr(_MODULES.get(fmt), "inferior_copy", None)
    rank = getattr(_MODULES.get(fmt), "copy_rank", None)
    with _import_lock(store):
        for _f, res, rs in ticking(batches, progress, "write", len(batches)):
            if not rs:
                continue
            have = store.existing_ids([r.rollout_id for r in rs])
            new = [r for r in rs if r.rollout_id not in have]
            if have and inferior is not None:  # e.g. a prime-rl all/ copy, now seen with its advantages
                old = store.get(sorted(have), columns=["rollout_id", "meta"]).to_pylist()
                worse = {o["rollout_id"] for o in old if inferior(json.loads(o["meta"]))}
                upd = [r for r in rs if r.rollout_id in worse and not inferior(r.meta)]
                if upd:
                    store.update(upd)
            if have and rank is not None:  # e.g. a prime-rl-stream trace that has gained annotations
                old = store.get(sorted(have), columns=["rollout_id", "meta"]).to_pylist()
                was = {o["rollout_id"]: rank(json.loads(o["meta"])) for o in old}
                upd = [r for r in rs if r.rollout_id in was and rank(r.meta) > was[r.rollout_id]]
                if upd:
                    store.update(upd)
            skipped += len(rs) - len(new)
            if not new:
                continue
            pids = {r.prompt_id for r in new}
            ps = [p for p in res.prompts if p.prompt_id in pids or fmt in ("jsonl", "parquet")]
            if ps:
                store.upsert_prompts(ps)
            store.append(rollouts_to_table(new, validate=False), source=fmt)
            written += len(new)
    return written, skipped


def import_rollouts(
    store: RolloutStore,
    fmt: str,
    paths: list[str],
    run_id: str | None = None,
    tokenizer: Any | str | None = None,
    trust_pickle: bool = False,
    progress: Progress | None = None,
    scope_roots: list[str] | None = None,
    **options: Any,
) -> ImportResult:
    """Import what is new in ``paths``: parse and validate every file, then (under the store's
    import lock) write each file's not-yet-stored rollouts as one commit, its prompts first.

    ``options`` go to the format's parser: ``reward_columns``/``reward_weights``/``verdict_key``
    (TRL), ``reward_key`` (slime), ``verdict_key`` (verl), ``evals`` (``"separate"`` or ``"skip"``:
    areal, prime-rl, slime), ``vocab`` (token ids must lie below it). A re-run imports only new
    content; the result's ``skipped`` counts rollouts already stored. On any parse error nothing is
    written; an input with no rollouts at all is an error. ``progress(stage, done, total)`` follows
    the files: ``"read"`` as each is parsed and checked, ``"write"`` as each one's rows are committed
    (or found stored); e.g. a 3-file dump calls ``read`` 1, 2, 3, then ``write`` 1, 2, 3.

    Scope: a format whose module sets ``SCOPED`` gets each file's folder relative to the directory
    it was found under (``scope_roots``, default ``paths``; :func:`file_scopes`) and keys its ids and
    groups by it, so two runs' folders under one parent never share an id or a group."""
    if fmt not in FORMATS:
        raise StoreError(f"unknown import format {fmt!r}; choose one of {sorted(FORMATS)}")
    if isinstance(tokenizer, str):
        tokenizer = load_tokenizer(tokenizer)
    if fmt in ("jsonl", "parquet", "atif"):  # atif: a gfcr export keeps its run unless --run is given
        run = run_id
    else:
        run = run_id or f"import-{fmt}"
    kw: dict[str, Any] = {"tokenizer": tokenizer, "trust_pickle": trust_pickle,
                          **{k: v for k, v in options.items() if v is not None}}
    files = _sorted(fmt, find_files(paths, _PATTERNS[fmt]))
    mod = _MODULES.get(fmt)
    scopes = file_scopes(scope_roots or paths, files, getattr(mod, "SCOPE_STRIP", ()))
    scoped = bool(getattr(mod, "SCOPED", False))
    total = ImportResult(fmt, [str(f) for f in files], [], [])
    batches = []
    seen: dict[str, Path] = {}
    if fmt == "verl" and tokenizer is None and kw.pop("columnar", True) and not FOLLOWING.get():
        return _import_columnar(store, files, run, kw, total, seen, progress, scopes)
    kw.pop("columnar", None)
    if getattr(mod, "READS_ROOTS", False):  # the format joins files beside its own (NeMo Gym's results)
        kw["roots"] = [str(p) for p in paths]
    for f in ticking(files, progress, "read", len(files)):
        res = FORMATS[fmt]([str(f)], run, **({**kw, "scope": scopes[f]} if scoped else kw))
        rs = _check(fmt, res, f, seen)
        batches.append((f, res, rs))
        total.rollouts.extend(rs)
        total.prompts.extend(res.prompts)
        total.notes.extend(n for n in res.notes if n not in total.notes)
    ignored = [x for _f, res, _rs in batches for x in res.ignored]
    if ignored and not FOLLOWING.get():
        total.notes.append(ignored_note(fmt, ignored))
    if not total.rollouts and not FOLLOWING.get():
        raise ImportFormatError(paths[0] if paths else "-", "input", "-",
                                f"no rollouts found in {len(files)} file(s): empty dump?")
    total.written, total.skipped = _write(store, fmt, batches, progress)
    if len(batches) == 1:
        total.cursor = batches[0][1].cursor
    if total.skipped and not FOLLOWING.get():
        total.notes.append(f"{total.skipped} rollout(s) were already in the store and were skipped")
    return total


def ignored_note(fmt: str, ignored: list[tuple[str, str]], show: int = 4) -> str:
    """One line for the files a job folder holds beside the format's own, e.g. ``skipped 3 file(s)
    that are not atif data: config.json (not an ATIF trajectory …), …``."""
    shown = ", ".join(f"{Path(p).name} ({why})" for p, why in ignored[:show])
    more = f" and {len(ignored) - show} more" if len(ignored) > show else ""
    return f"skipped {len(ignored)} file(s) that are not {fmt} data: {shown}{more}"


class FollowStopped(ImportFormatError):
    """:func:`follow` met a file it cannot import (after its settle time). Everything the follow
    committed before stays committed; ``committed`` holds its totals, ``cause`` the import error.
    The message names the file and line, what is kept, and how to resume."""

    def __init__(self, cause: ImportFormatError, committed: ImportResult, store_rows: int | None):
        self.path, self.where, self.field = cause.path, cause.where, cause.field
        self.cause, self.committed, self.store_rows = cause, committed, store_rows
        held = f" (store holds {store_rows})" if store_rows is not None else ""
        ValueError.__init__(
            self, f"--follow stopped at {cause}; the {committed.written} rollouts this follow committed are kept{held}; "
                  "fix or move that file, then run the same command again to resume (rows already stored are skipped)")


def _import_columnar(store: RolloutStore, files: list[Path], run: str, kw: dict[str, Any], total: ImportResult,
                     seen: dict[str, Path], progress: Progress | None = None,
                     scopes: dict[Path, str] | None = None) -> ImportResult:
    """verl without a tokenizer: :func:`gfcr.formats.columnar.import_files` (Arrow, one
    append per file, unchanged files skipped by content); files it cannot map exactly go through
    the row parser and :func:`_check` / :func:`_write`, as every other format does."""
    notes: list[str] = []
    kw = dict(kw)
    hold = kw.pop("hold_bytes", 256 << 20)
    stats: dict[str, int] = {}

    def row_parse(f: Path) -> tuple[Path, ImportResult, list[Rollout]]:
        res = FORMATS["verl"]([str(f)], run, **kw, scope=(scopes or {}).get(f, ""))
        notes.extend(n for n in res.notes if n not in notes)
        return f, res, _check("verl", res, f, seen)

    total.written, total.skipped, total.how = columnar.import_files(
        store, files, run, kw.get("verdict_key") or "acc", row_parse, lambda b: _write(store, "verl", b),
        lambda: _import_lock(store), hold_bytes=hold, progress=progress, scopes=scopes, stats=stats)
    total.tokens = "none"
    total.notes.extend(notes or verl.text_only_note("verl", None))
    total.notes.extend(n for n in verl.templated_note(stats.get("templated", 0)) if n not in total.notes)
    unchanged = sum(v == "unchanged" for v in total.how.values())
    if unchanged:
        total.notes.append(f"{unchanged} file(s) unchanged since they were imported into run {run!r}: skipped unread")
    if total.skipped:
        total.notes.append(f"{total.skipped} rollout(s) were already in the store and were skipped")
    return total


def follow(
    store: RolloutStore,
    fmt: str,
    paths: list[str],
    interval: float = 2.0,
    stop: Callable[[], bool] | None = None,
    progress: Callable[[str], None] | None = None,
    settle: float | None = None,
    max_polls: int | None = None,
    **kw: Any,
) -> ImportResult:
    """Import ``paths`` now and again every ``interval`` seconds, each changed file's new rollouts
    as one commit, until ``stop()`` is true (or ``max_polls`` polls). A last line still being
    written is read next time; a file that does not parse yet (a ``.pt``/``.parquet`` being
    written) is retried while it changed within ``settle`` seconds (default 3 × interval), then
    its error is raised as :class:`FollowStopped`, every earlier commit kept. ``progress``
    receives one line per commit. Returns the totals."""
    settle = 3 * interval if settle is None else settle
    if isinstance(kw.get("tokenizer"), str):
        kw["tokenizer"] = load_tokenizer(kw["tokenizer"])
    total = ImportResult(fmt, [], [], [])
    seen: dict[Path, Any] = {}
    mod = _MODULES.get(fmt)
    signature = getattr(mod, "follow_signature", None)
    cursors: dict[Path, dict[str, Any]] = {}  # a resumable format's read position, per file
    polls = 0
    token = FOLLOWING.set(True)
    try:
        while True:
            polls += 1
            for f in _sorted(fmt, find_files(paths, _PATTERNS[fmt])):
                st = f.stat()
                sig = signature(f) if signature is not None else (st.st_size, st.st_mtime_ns)
                if seen.get(f) == sig or st.st_size == 0:
                    continue
                fkw = {**kw, "cursor": cursors.get(f)} if getattr(mod, "RESUMABLE", False) else kw
                try:
                    res = import_rollouts(store, fmt, [str(f)], scope_roots=paths, **fkw)
                except ImportFormatError as e:
                    cursors.pop(f, None)  # advanced in place by the failed parse: start that file over
                    if time.time() - st.st_mtime < settle:
                        continue  # still being written: try again next poll
                    raise FollowStopped(e, total, _count_or_none(store)) from e
                seen[f] = sig
                if res.cursor is not None:
                    cursors[f] = res.cursor
                if str(f) not in total.files:
                    total.files.append(str(f))
                total.written += res.written
                total.skipped += res.skipped
                total.notes.extend(n for n in res.notes if n not in total.notes)
                if res.written and progress is not None:
                    progress(f"+{res.written} rollouts from {f} (this session: {total.written}; "
                             f"store: {store.count()})")
            if (stop is not None and stop()) or (max_polls is not None and polls >= max_polls):
                return total
            deadline = time.monotonic() + interval
            while time.monotonic() < deadline:
                if stop is not None and stop():
                    return total
                time.sleep(min(0.1, interval))
    finally:
        FOLLOWING.reset(token)


def _count_or_none(store: RolloutStore) -> int | None:
    try:
        return store.count()
    except (OSError, RuntimeError, ValueError):  # a store that cannot be read: say nothing about it
        return None
