"""Store integrity: what every commit records, the cheap checks of every open, and the full
verification of ``gfcr store check``.

Long because: the record (its log included), the cheap checks and the full check read the same
layout facts (version manifests, data files, deletion files, the manifest's
``"committed"``/``"files"``) and must agree.

**Recorded at commit.** After every write, :func:`record_commit` records the table's new Lance
version and row count (``"committed"``) and a digest of each file it wrote (``"files"``: size and
XXH3-128; stores from before issue 44 hold SHA-256 entries, still verified, :data:`DIGESTS`), under
a lock, never going backwards when writers race. An append's record is one line appended to
``gfcr-store.log`` (:func:`read_log`; its new fragment's file is the only one digested); any other
write (a merge, a compaction, a record that finds the log behind Lance) and every
:data:`LOG_MAX`-th record rewrite ``gfcr-store.json`` atomically by rename with the log folded in
(:func:`write_manifest`). The manifest a reader sees is ``gfcr-store.json`` with the log's records
applied (:func:`read_manifest`). Lance itself records each data file's size in its version manifest
(``DataFile.file_size_bytes``), and every Lance data file ends in the magic bytes ``LANC``.

**Checked at every open** (:func:`quick_check`, called by ``RolloutStore.open``, so by every
``gfcr store`` command; cost: one Lance open, a ``stat`` and a 4-byte read per data file):

1. ``gfcr-store.json`` is there and parses, and every whole line of ``gfcr-store.log`` is a record
   (else one line naming that file);
2. per table, the newest Lance version manifest on disk is not older than the version recorded at
   the last commit: Lance silently opens the previous version when the newest manifest is deleted
   (a rollback with exit 0), this refuses it;
3. the newest version manifest reads (else one line naming *that* file, not Lance's source file);
   at the recorded version, the row count is the recorded one;
4. every data file of the opened version exists, has the size recorded at commit, and ends in a
   Lance footer; every deletion file exists, at the size recorded in ``"files"``.

What the cheap checks cannot see: a data file damaged inside, at its recorded size, with its
footer intact. :func:`check_store` (``gfcr store check``) reads every fragment of every table one by
one and every version manifest, and reports which fragments are damaged and how many rows still
read. :func:`salvage` copies every readable row into a new store; :func:`accept` records the
current state as the store's own (after a damaged newest version manifest was moved aside, or to
rewrite a lost ``gfcr-store.json``). docs/store.md says what is recoverable and how.

Layout facts used (Lance 0.x/1.x local datasets): version manifests live in
``<table>.lance/_versions/`` named ``{2^64 - 1 - version}.manifest`` (the V2 naming scheme; the V1
scheme names them ``{version}.manifest``); data files in ``<table>.lance/data/``.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import threading
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import lance
import pyarrow as pa
import pyarrow.compute as pc
import xxhash

from gfcr.store.errors import NETWORK, StoreDamaged, StoreError, lance_reason

MANIFEST = "gfcr-store.json"
#: the record log beside it: one line per commit recorded since gfcr-store.json was last written
LOG = "gfcr-store.log"
LOG_FORMAT = "gfcr-store-log"
#: a record rewrites gfcr-store.json (the log folded in, a new empty log) once the log holds this many
LOG_MAX = 256
FORMAT = "gfcr-store"
_U64 = 2**64 - 1
_MAGIC = b"LANC"
_LANCE_ERRORS = (OSError, RuntimeError, ValueError)


def _open_or_reason(open_: Callable[[], lance.LanceDataset]) -> tuple[lance.LanceDataset | None, str | None]:
    """``(dataset, None)``, or ``(None, reason)`` when Lance cannot open it: an error, or a Rust panic
    (pyo3's ``PanicException`` derives from ``BaseException``; a version manifest cut to 0 bytes
    raises one)."""
    try:
        return open_(), None
    except _LANCE_ERRORS as e:
        return None, lance_reason(e)
    except BaseException as e:
        if type(e).__name__ != "PanicException":
            raise
        return None, f"Lance panicked reading it: {lance_reason(e)}"


def _hint(path: Path) -> str:
    return f"run `gfcr store check {path}` for a full report and what can be recovered (docs/store.md)"


#: The store this process opened last: the CLI names it in its one line for a read that failed
#: inside a data file (:func:`read_damage`).
_LAST_OPENED: list[Path | str] = []


def opened(path: Path | str) -> None:
    """Note that this process opened the store at ``path`` (a local path or a remote URI, kept as given)."""
    _LAST_OPENED[:] = [path]


_DECODE = re.compile(r"(?:LanceError\((?:Arrow|IO|Corrupt\w*)\)|External error): (?!LanceError)(.*?)"
                     r"(?:,? /\S+\.rs:\d+:\d+|$)")


def read_damage(e: BaseException) -> str | None:
    """The one line for a read that failed *inside* a Lance data file (a fragment damaged at its
    recorded size, which the cheap checks of an open cannot see), or None when ``e`` is something
    else. The error and its causes are searched for Lance's decode/IO errors as pyarrow, Lance and
    DuckDB pass them on ("LanceError(Arrow): …", "External error: Encountered corrupt file …"); a
    missing dataset ("was not found") is not damage, and an object store that does not answer
    (:data:`gfcr.store.errors.NETWORK`) gets a "cannot reach" line instead.

    Example: ``StoreError("scan failed (filter None): External error: LanceError(Arrow): Invalid
    argument error: Last offset 16711685 of Utf8 is larger than values length 5, /x/constant.rs:236:21")``
    after ``opened(Path("st"))`` → ``"a data file of the store st is damaged (Invalid argument
    error: Last offset … values length 5); run `gfcr store check st` …"``."""
    where = _LAST_OPENED[0] if _LAST_OPENED else None
    if NETWORK.search(str(e)):  # the object store did not answer: nothing is known to be damaged
        return f"cannot reach the store {where or ''}: {lance_reason(e)[:300]}; check the endpoint and credentials"
    seen: set[int] = set()
    x: BaseException | None = e
    while x is not None and id(x) not in seen:
        seen.add(id(x))
        msg = " ".join(str(x).split())
        m = _DECODE.search(msg)
        if m and "was not found" not in msg:
            name = f"the store {where}" if where is not None else "the store"
            return f"a data file of {name} is damaged ({m.group(1).strip()}); " + _hint(where or Path("STORE"))
        x = x.__cause__ or x.__context__
    return None


# --- the manifest and its record log --------------------------------------------------------------
def _parse_manifest(path: Path, raw: bytes) -> dict[str, Any]:
    f = Path(path) / MANIFEST
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise StoreDamaged(f"{f} is damaged (not UTF-8 text at byte {e.start}); {_hint(path)}") from None
    try:
        m = json.loads(text)
    except json.JSONDecodeError as e:
        what = "empty" if not text.strip() else f"not valid JSON: {e.msg} (line {e.lineno}, column {e.colno})"
        raise StoreDamaged(f"{f} is damaged ({what}, {len(text)} bytes); {_hint(path)}") from None
    if not isinstance(m, dict) or m.get("format") != FORMAT:
        raise StoreDamaged(f"{f} is not a gfcr store manifest (no \"format\": \"{FORMAT}\"); {_hint(path)}")
    return m


def _read_snapshot(path: Path) -> bytes:
    f = Path(path) / MANIFEST
    try:
        return f.read_bytes()
    except FileNotFoundError:
        raise StoreDamaged(f"{f} is missing; {_hint(path)}") from None


def read_manifest(path: Path) -> dict[str, Any]:
    """The store's manifest: ``gfcr-store.json`` with the commit records of ``gfcr-store.log`` applied
    (:func:`read_log`, :func:`apply_records`); :class:`StoreDamaged` naming the file when
    ``gfcr-store.json`` is missing, empty, not JSON or not a gfcr manifest, or a record of the log is
    damaged."""
    m = _parse_manifest(path, _read_snapshot(path))
    return apply_records(m, read_log(path, m, 0)[0])


def new_manifest(tables: list[str]) -> dict[str, Any]:
    """The fields of a new store's ``gfcr-store.json`` (``committed`` is added by the caller)."""
    from gfcr import __version__
    from gfcr.records import SCHEMA_VERSION, utcnow

    return {"format": FORMAT, "schema_version": SCHEMA_VERSION, "created_at": utcnow().isoformat(),
            "created_by": f"gfcr {__version__}", "tables": sorted(tables)}


def _log_header(epoch: str) -> bytes:
    return json.dumps({"format": LOG_FORMAT, "epoch": epoch}).encode() + b"\n"


def write_manifest(path: Path, manifest: dict[str, Any]) -> bytes:
    """Write ``gfcr-store.json`` atomically (a temporary file renamed over it) under a new log epoch
    (set in ``manifest["log"]``), then start an empty ``gfcr-store.log`` of that epoch the same way;
    returns the manifest's bytes. The records of the log it replaces must be in ``manifest`` (it is
    written from :func:`read_manifest`'s view). A stop between the two renames leaves a log of the
    old epoch, which readers ignore and the next record replaces."""
    manifest["log"] = os.urandom(8).hex()
    raw = json.dumps(manifest).encode()  # no indent: json's C encoder (indent=2 took ~2 ms at 60 fragments)
    tag = f"{os.getpid()}.{threading.get_ident()}.tmp"
    tmp, tmp_log = Path(path) / f"{MANIFEST}.{tag}", Path(path) / f"{LOG}.{tag}"
    try:
        tmp.write_bytes(raw)
        tmp_log.write_bytes(_log_header(manifest["log"]))
        os.replace(tmp, Path(path) / MANIFEST)
        os.replace(tmp_log, Path(path) / LOG)
        return raw
    except BaseException:
        tmp.unlink(missing_ok=True)  # e.g. a full disk: the old manifest stays as it was
        tmp_log.unlink(missing_ok=True)
        raise


def _record_ok(r: Any) -> bool:
    return (isinstance(r, dict) and isinstance(r.get("table"), str) and isinstance(r.get("version"), int)
            and isinstance(r.get("rows"), int) and isinstance(r.get("files"), dict))


def read_log(path: Path, manifest: dict[str, Any], start: int) -> tuple[list[dict[str, Any]], int | None, int]:
    """The commit records of ``gfcr-store.log`` from byte ``start`` (0: the whole log, its header
    checked) for the manifest ``manifest`` (``gfcr-store.json`` as read). Returns ``(records, end,
    size)``: ``end`` is the byte after the last whole line, ``size`` the file's (-1 when byte ``start``
    does not follow a newline: the log was cut or rewritten since; read it whole); a last line without
    its newline (a writer stopped mid-line, or writing now) is not a record yet. ``end`` is None when
    no log belongs to this manifest: none written yet (an older store), or one of an earlier epoch
    left by a stop between :func:`write_manifest`'s renames. :class:`StoreDamaged` names the log when
    its header or a whole line is not what a record writes.

    Example: header ``{"format": "gfcr-store-log", "epoch": "ab12…"}`` then
    ``{"table": "rollouts", "version": 5, "rows": 256, "files": {…}}`` and half a line → one record,
    ``end`` = the byte after it, ``size`` = ``end`` + the half line."""
    epoch = manifest.get("log")
    f = Path(path) / LOG
    if epoch is None:
        return [], None, 0
    try:
        with open(f, "rb") as fh:
            fh.seek(max(start - 1, 0))
            data = fh.read()
    except FileNotFoundError:
        return [], None, 0
    if start:
        if data[:1] != b"\n":  # not where a line ended: the log was cut or rewritten since
            return [], None, -1
        data = data[1:]
    size, cut = start + len(data), data.rfind(b"\n") + 1
    body, pos = data[:cut], start
    if start == 0:
        nl = data.find(b"\n")
        try:
            head = json.loads(data[:nl]) if nl >= 0 else None
        except (json.JSONDecodeError, UnicodeDecodeError):
            head = None
        if not isinstance(head, dict) or head.get("format") != LOG_FORMAT:
            raise StoreDamaged(f"{f} is damaged (no log header in its first line, {size} bytes); {_hint(path)}")
        if head.get("epoch") != epoch:
            return [], None, size
        body, pos = data[nl + 1 : cut], nl + 1
    if not body:
        return [], start + cut if start else pos, size
    try:
        recs = json.loads(b"[" + body.rstrip(b"\n").replace(b"\n", b",") + b"]")
    except (json.JSONDecodeError, UnicodeDecodeError):
        recs = None
    if recs is None or not all(_record_ok(r) for r in recs):
        raise StoreDamaged(f"{f} is damaged (a line between bytes {pos} and {start + cut} is not a commit "
                           f"record); {_hint(path)}")
    return recs, start + cut, size


def apply_records(m: dict[str, Any], records: list[dict[str, Any]]) -> dict[str, Any]:
    """``m`` (a manifest) with the log's ``records`` applied in order, in place: each sets its
    table's ``"committed"`` when its version is newer (never backwards) and adds its files' digests.

    Example: committed rollouts v4; records v5 (+file a), v3 (+file b) → committed v5, files a and b."""
    if records:
        c, files = m.setdefault("committed", {}), m.setdefault("files", {})
        for r in records:
            if r["version"] > int((c.get(r["table"]) or {}).get("version", -1)):
                c[r["table"]] = {"version": r["version"], "rows": r["rows"]}
            files.update(r["files"])
    return m


@contextmanager
def file_lock(lock_file: Path | str) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``lock_file`` (created if missing) for the ``with`` block."""
    with open(lock_file, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def record_commit(path: Path, name: str, ds: lance.LanceDataset,
                  since: lance.LanceDataset | None = None) -> None:
    """Record ``ds``'s version and row count as table ``name``'s last commit (kept when a racing
    writer already recorded a newer version). The commit itself has landed: a record that cannot be
    written (a full disk) is a warning, and the manifest keeps its older record (which the checks
    read as "Lance is ahead", never as damage).

    ``since``: the version an append committed on top of. When the manifest's record is that version
    and ``ds`` is the very next one (no other commit in between), only the fragments ``ds`` added are
    digested (:func:`digest_added`) and the record is one line appended to ``gfcr-store.log``;
    otherwise every file of ``ds`` is compared with the record (:func:`record_digests`, which also
    catches files a crashed writer never recorded) and ``gfcr-store.json`` is rewritten with the log
    folded in, as it is once the log holds :data:`LOG_MAX` records."""
    try:
        _record(path, name, ds, since)
    except OSError as e:
        _MEMO.pop(os.path.join(path, MANIFEST), None)
        warnings.warn(f"table {name} version {ds.version} is committed but {Path(path) / MANIFEST} could not "
                      f"record it ({e})", RuntimeWarning, stacklevel=3)


#: per manifest file, what this process last read or wrote: the bytes of ``gfcr-store.json``, the
#: log's end and record count, and the manifest with the log applied; so that a writer's next record
#: reads ``gfcr-store.json`` (one read) and the log's new lines only, parsing the manifest again only
#: when another writer rewrote it
_MEMO: dict[str, tuple[bytes, int | None, int, dict[str, Any]]] = {}


def _current(path: Path, mf: str) -> tuple[bytes, dict[str, Any], int | None, int, int]:
    """Under the record lock: ``(gfcr-store.json's bytes, the manifest with the log applied, the log's
    end, its record count, its size)`` (see :func:`read_log`)."""
    hit = _MEMO.pop(mf, None)
    raw = _read_snapshot(path)
    if hit is not None and raw == hit[0] and hit[1] is not None:
        m, start, n = hit[3], hit[1], hit[2]
    else:
        m, start, n = _parse_manifest(path, raw), 0, 0
    recs, end, size = read_log(path, m, start)
    if size < start:  # the log changed under the bytes this process read (cut by hand): read it whole again
        m, n = _parse_manifest(path, raw), 0
        recs, end, size = read_log(path, m, 0)
    return raw, apply_records(m, recs), end, n + len(recs), size


def _record(path: Path, name: str, ds: lance.LanceDataset, since: lance.LanceDataset | None = None) -> None:
    mf = os.path.join(path, MANIFEST)
    with file_lock(os.path.join(path, ".manifest.lock")):
        raw, m, end, n, size = _current(path, mf)
        c = m.setdefault("committed", {})
        old = c.get(name) or {}
        if int(old.get("version", 0)) >= ds.version:
            _MEMO[mf] = (raw, end, n, m)
            return
        entry = {"version": int(ds.version), "rows": int(ds.count_rows())}
        files = m.get("files")
        added = None
        if (since is not None and files is not None and int(old.get("version", -1)) == since.version
                and ds.version == since.version + 1):
            added = digest_added(str(path), name, ds, since, files)
        if added is not None and end is not None and n < LOG_MAX:
            line = json.dumps({"table": name, **entry, "files": added}).encode() + b"\n"
            _append(os.path.join(path, LOG), end, size, line)
            apply_records(m, [{"table": name, **entry, "files": added}])
            _MEMO[mf] = (raw, end + len(line), n + 1, m)
            return
        c[name] = entry
        if added is None:
            record_digests(Path(path), name, ds, m.setdefault("files", {}))
        else:
            files.update(added)
        _MEMO[mf] = (write_manifest(path, m), len(_log_header(m["log"])), 0, m)


def _append(f: str, end: int, size: int, line: bytes) -> None:
    """Append ``line`` (one record) to the log ``f`` whose whole lines end at ``end`` (of ``size``
    bytes): a line a stopped writer left half-written is cut off first. One ``write`` (``O_APPEND``)."""
    if size != end:
        os.truncate(f, end)
    fd = os.open(f, os.O_WRONLY | os.O_APPEND)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def sha256_file(f: Path) -> str:
    """Hex SHA-256 of the file ``f`` (``hashlib.file_digest``: one reused buffer; 0.9x the CPU of
    1 MiB reads, 0.75x of hashing a memory map, on a 15 MB data file). What stores written before
    :data:`DIGEST` recorded (``"sha256"``); still verified."""
    with open(f, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def xxh3_file(f: Path) -> str:
    """Hex XXH3-128 of the file ``f`` (32 hex digits), read through one reused buffer like
    :func:`sha256_file`: 1.6 ms of CPU for a 15 MB data file against SHA-256's 11 ms (SHA-NI),
    about the cost of reading the file (bench/append_bench.py, docs/performance.md)."""
    with open(f, "rb") as fh:
        return hashlib.file_digest(fh, xxhash.xxh3_128).hexdigest()


#: the digest every new data and deletion file gets at its commit, and how each recorded one is
#: verified: the key of a ``"files"`` entry names its algorithm (older stores recorded ``"sha256"``).
#: XXH3-128 is not cryptographic: it finds damage at rest (a flipped bit, a cut or zeroed range:
#: missed with probability 2^-128), not a writer who also rewrites the record.
DIGEST = "xxh3_128"
DIGESTS: dict[str, Callable[[Path], str]] = {"xxh3_128": xxh3_file, "sha256": sha256_file}
#: the algorithms' names in reports
DIGEST_NAMES = {"xxh3_128": "XXH3-128", "sha256": "SHA-256"}


def digest_entry(f: Path | str) -> dict[str, Any]:
    """The ``"files"`` entry of file ``f``: ``{"size": bytes, DIGEST: hex}``.

    Example: a 113,462-byte data file → ``{"size": 113462, "xxh3_128": "9f0c…"}`` (32 hex digits)."""
    return {"size": os.stat(f).st_size, DIGEST: DIGESTS[DIGEST](Path(f))}


def record_digests(path: Path, name: str, ds: lance.LanceDataset, files: dict[str, Any]) -> int:
    """Add :func:`digest_entry` under ``files`` for each data file of ``ds`` not digested yet (Lance
    data files are immutable: a file is hashed once, at the commit that wrote it), and for each
    fragment's deletion file (``_deletions/…``, also immutable: a later delete writes a new one), and
    drop table ``name``'s entries for files its current version no longer uses (after a compaction or
    a newer deletion file). Keys are paths relative to the store, e.g.
    ``rollouts.lance/data/ab12….lance``, ``rollouts.lance/_deletions/0-3-1193….arrow``; returns
    files hashed."""
    uri = path / f"{name}.lance"
    prefix = f"{name}.lance/"
    current = {}
    for frag in ds.get_fragments():
        d = deletion_file(uri, frag)
        for f in [f for f, _ in fragment_files(uri, frag)] + ([d] if d is not None else []):
            current[f.relative_to(path).as_posix()] = f
    for k in [k for k in files if k.startswith(prefix) and k not in current]:
        del files[k]
    hashed = 0
    for k, f in current.items():
        if k not in files:
            files[k] = digest_entry(f)
            hashed += 1
    return hashed


def digest_added(path: str, name: str, ds: lance.LanceDataset, since: lance.LanceDataset,
                 files: dict[str, Any]) -> dict[str, Any] | None:
    """The :func:`digest_entry` of each data file of the fragments ``ds`` holds and ``since`` does not
    (an append's new fragments) that ``files`` does not hold yet: :func:`record_digests` for one
    append, without walking every fragment of the table; None when ``ds`` lacks a fragment of
    ``since`` (not an append: walk it with :func:`record_digests`). ``files`` is not changed.

    Example: ``since`` with fragments 0-2, ``ds`` (one append later) with 0-3 → ``{"rollouts.lance/
    data/<fragment 3's file>": {"size": …, "xxh3_128": …}}``."""
    now, before = set(ds.fragment_ids()), set(since.fragment_ids())
    if not before <= now:
        return None
    out: dict[str, Any] = {}
    for i in sorted(now - before):
        for df in ds.get_fragment(i).metadata.files:
            k = f"{name}.lance/data/{df.path}"
            if k not in files:
                out[k] = digest_entry(os.path.join(path, k))
    return out


def refuse_lost_manifest(path: Path, tables: list[str]) -> None:
    """:class:`StoreDamaged` when ``gfcr-store.json`` is missing at ``path`` but its tables hold more
    than an interrupted init leaves (their first, empty version): writing a fresh manifest over
    them would forget what was recorded."""
    for name in tables:
        uri = Path(path) / f"{name}.lance"
        if uri.exists() and (max(version_files(uri), default=0) > 1 or any((uri / "data").glob("*.lance"))):
            raise StoreDamaged(f"{Path(path) / MANIFEST} is missing but the store's tables hold data; "
                               f"run `gfcr store check {path}` (`--accept` writes a new manifest)")


# --- Lance files -----------------------------------------------------------------------------------
def version_files(uri: Path) -> dict[int, Path]:
    """``{version: manifest file}`` of the Lance dataset at ``uri`` (both naming schemes).

    Example: ``_versions/18446744073709551614.manifest`` → version 1; ``_versions/3.manifest`` → 3."""
    out: dict[int, Path] = {}
    d = Path(uri) / "_versions"
    if not d.is_dir():
        return out
    for f in d.iterdir():
        if f.suffix != ".manifest" or not f.stem.isdigit():
            continue
        n = int(f.stem)
        out[_U64 - n if n > 2**63 else n] = f
    return out


def fragment_files(uri: Path, frag: Any) -> list[tuple[Path, int | None]]:
    """``(data file, size recorded at commit)`` of one Lance fragment."""
    md = frag.metadata
    return [(Path(uri) / "data" / df.path, getattr(df, "file_size_bytes", None) or None) for df in md.files]


def deletion_file(uri: Path, frag: Any) -> Path | None:
    """The deletion file of one Lance fragment (the rows deleted from it), or None when it has none.

    Example: fragment 0 after ``delete("a < 3")`` at version 1 → ``uri/_deletions/0-1-1193….arrow``."""
    d = frag.metadata.deletion_file
    return Path(uri) / d.path(frag.fragment_id) if d is not None else None


def deletion_problem(path: Path, f: Path, digests: dict[str, Any]) -> str | None:
    """What is wrong with deletion file ``f`` that a ``stat`` sees (missing, or another size than
    recorded at commit; Lance records no size of its own for these), or None."""
    try:
        size = f.stat().st_size
    except FileNotFoundError:
        return "is missing (its fragment's deleted rows would read again)"
    want = digests.get(f.relative_to(path).as_posix())
    if want and size != want["size"]:
        return f"has {size} bytes, {want['size']} recorded at commit (truncated or overwritten)"
    return None


def fragment_problems(path: Path, uri: Path, frag: Any, digests: dict[str, Any]) -> list[tuple[Path, str | None]]:
    """``(file, what is wrong with it or None)`` for each data file of one fragment and its
    deletion file, by what a ``stat`` and a 4-byte read see (:func:`file_problem`,
    :func:`deletion_problem`): the cheap checks of an open and the first step of the full check."""
    out = [(f, file_problem(f, size)) for f, size in fragment_files(uri, frag)]
    if (d := deletion_file(uri, frag)) is not None:
        out.append((d, deletion_problem(path, d, digests)))
    return out


def file_problem(f: Path, recorded: int | None) -> str | None:
    """What is wrong with data file ``f`` (missing, other size than recorded, no Lance footer), or None."""
    try:
        size = f.stat().st_size
    except FileNotFoundError:
        return "is missing"
    if recorded is not None and size != recorded:
        return f"has {size} bytes, {recorded} recorded at commit (truncated or overwritten)"
    if size < len(_MAGIC):
        return f"has {size} bytes (no Lance footer)"
    with open(f, "rb") as fh:
        fh.seek(-len(_MAGIC), os.SEEK_END)
        if fh.read(len(_MAGIC)) != _MAGIC:
            return "does not end in a Lance footer (overwritten)"
    return None


def _rollback_problem(path: Path, name: str, uri: Path, files: dict[int, Path], rec: dict[str, Any]) -> str | None:
    newest = max(files) if files else None
    if rec and (newest is None or newest < int(rec["version"])):
        return (f"{uri}/_versions: the newest version manifest is missing: {MANIFEST} recorded version "
                f"{rec['version']} ({rec['rows']} rows) of table {name} at its last commit, but the newest on disk "
                f"is {newest}; opening it would roll the table back")
    return None


def quick_check(path: Path, manifest: dict[str, Any], tables: list[str],
                opener: Callable[[str], lance.LanceDataset]) -> None:
    """The cheap checks of every open (module docstring, items 2-4); :class:`StoreDamaged` naming
    the first damage found. ``opener(uri)`` opens a Lance dataset at its latest version."""
    path = Path(path)
    committed = manifest.get("committed") or {}
    for name in tables:
        uri = path / f"{name}.lance"
        if not uri.is_dir():
            raise StoreDamaged(f"{uri} is missing: table {name} of the store is gone; {_hint(path)}")
        files = version_files(uri)
        rec = committed.get(name) or {}
        prob = _rollback_problem(path, name, uri, files, rec)
        if prob:
            raise StoreDamaged(f"{prob}; {_hint(path)}")
        ds, why = _open_or_reason(lambda uri=uri: opener(str(uri)))
        if ds is None:
            newest = max(files) if files else None
            f = files.get(newest, uri / "_versions") if newest is not None else uri / "_versions"
            raise StoreDamaged(f"{f} (version {newest}, the newest of table {name}) is damaged: Lance cannot read it "
                               f"({why}); {_hint(path)}")
        if rec and ds.version == int(rec["version"]) and ds.count_rows() != int(rec["rows"]):
            raise StoreDamaged(f"{uri}: version {ds.version} holds {ds.count_rows()} rows, {rec['rows']} recorded at "
                               f"commit; {_hint(path)}")
        digests = manifest.get("files") or {}
        for frag in ds.get_fragments():
            for f, prob in fragment_problems(path, uri, frag, digests):
                if prob:
                    raise StoreDamaged(f"{f} (fragment {frag.fragment_id} of table {name}, "
                                       f"{frag.metadata.physical_rows} rows) {prob}; {_hint(path)}")


# --- the full check --------------------------------------------------------------------------------
@dataclass
class FragmentReport:
    """One fragment of a table's newest readable version, read whole."""

    fragment_id: int
    rows: int
    readable: bool
    problem: str | None = None


@dataclass
class TableReport:
    """One table: its versions, the version checked, and its fragments."""

    name: str
    version: int | None  #: the newest readable version (None: none reads)
    recorded_version: int | None  #: recorded in gfcr-store.json at the last commit (None: not recorded)
    rows: int = 0  #: rows of ``version`` per Lance's manifest
    rows_readable: int = 0  #: rows of its fragments that read whole
    versions_readable: list[int] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    fragments: list[FragmentReport] = field(default_factory=list)
    files_digested: int = 0  #: data and deletion files whose digest recorded at commit was verified
    files_not_digested: int = 0  #: data and deletion files with no recorded digest (written before digests were kept)


@dataclass
class CheckReport:
    """The result of :func:`check_store`: ``ok`` when no problem was found anywhere."""

    path: str
    problems: list[str] = field(default_factory=list)
    tables: list[TableReport] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems and all(not t.problems for t in self.tables)

    @property
    def all_problems(self) -> list[str]:
        return self.problems + [p for t in self.tables for p in t.problems]

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "ok": self.ok, **asdict(self)}


def digest_problem(path: Path, f: Path, digests: dict[str, Any]) -> str | None:
    """``f``'s digest against the one recorded at commit, by the algorithm recorded with it
    (:data:`DIGESTS`); None when it matches or none is recorded.

    Example: an entry ``{"size": 9, "sha256": "ab…"}`` (an older store) is checked with SHA-256, one
    with ``"xxh3_128"`` with XXH3-128; a mismatch reads ``has XXH3-128 1f2e…, 9a8b… recorded at
    commit (damaged inside, at its recorded size)``."""
    want = digests.get(f.relative_to(path).as_posix())
    if not want:
        return None
    alg = next((a for a in DIGESTS if a in want), None)
    if alg is None:
        return f"has a digest of an unknown kind recorded at commit ({sorted(want)}); upgrade gfcr"
    got = DIGESTS[alg](f)
    if got != want[alg]:
        return (f"has {DIGEST_NAMES[alg]} {got[:12]}…, {want[alg][:12]}… recorded at commit "
                "(damaged inside, at its recorded size)")
    return None


def _check_table(path: Path, name: str, rec: dict[str, Any], digests: dict[str, Any] | None = None) -> TableReport:
    digests = digests or {}
    uri = path / f"{name}.lance"
    rep = TableReport(name, None, int(rec["version"]) if rec else None)
    if not uri.is_dir():
        rep.problems.append(f"{uri} is missing")
        return rep
    files = version_files(uri)
    for v in sorted(files):
        ds, why = _open_or_reason(lambda v=v: lance.dataset(str(uri), version=v))
        if ds is not None:
            rep.versions_readable.append(v)
        else:
            rep.problems.append(f"{files[v]} (version {v} of table {name}) is damaged: {why}")
    prob = _rollback_problem(path, name, uri, files, rec)
    if prob:
        rep.problems.append(prob)
    if not rep.versions_readable:
        rep.problems.append(f"{uri}: no version of table {name} reads")
        return rep
    rep.version = max(rep.versions_readable)
    ds = lance.dataset(str(uri), version=rep.version)
    rep.rows = ds.count_rows()
    if rec and rep.version == int(rec["version"]) and rep.rows != int(rec["rows"]):
        rep.problems.append(f"{uri}: version {rep.version} holds {rep.rows} rows, {rec['rows']} recorded at commit")
    for frag in ds.get_fragments():
        n = frag.count_rows()
        ffiles = fragment_problems(path, uri, frag, digests)
        probs = [f"{f} {p}" for f, p in ffiles if p]
        if not probs:
            for f, _ in ffiles:
                known = f.relative_to(path).as_posix() in digests
                rep.files_digested += known
                rep.files_not_digested += not known
            probs = [f"{f} {p}" for f, _ in ffiles if (p := digest_problem(path, f, digests))]
        if not probs:
            try:
                got = ds.scanner(fragments=[frag]).to_table().num_rows
                if got != n:
                    probs.append(f"read {got} rows, {n} recorded")
            except (*_LANCE_ERRORS, pa.ArrowException) as e:
                probs.append(f"does not read: {lance_reason(e)}")
        fr = FragmentReport(frag.fragment_id, n, not probs, "; ".join(probs) or None)
        rep.fragments.append(fr)
        if fr.readable:
            rep.rows_readable += n
        else:
            rep.problems.append(f"fragment {frag.fragment_id} of table {name} ({n} rows) is damaged: {fr.problem}")
    return rep


def doubled_problem(ds: lance.LanceDataset, t: TableReport, column: str = "rollout_id") -> str | None:
    """The problem line when a key of ``ds`` (the table ``t`` checked) is stored more than once, over its
    fragments that read whole; None when each is stored once. Left by a staged commit that raced a commit
    of the same ids and stopped before dropping its copies (gfcr.store.staging), or by appends of one id
    from two processes. Example: ids [a, b, a] → "table rollouts: 1 rollout_id(s) stored more than once …"."""
    good = [ds.get_fragment(f.fragment_id) for f in t.fragments if f.readable]
    if not good:
        return None
    vc = pc.value_counts(ds.scanner(columns=[column], fragments=good).to_table().column(0))
    many = vc.filter(pc.greater(vc.field("counts"), 1)).field("values").to_pylist()
    if not many:
        return None
    return (f"table {t.name}: {len(many)} {column}(s) stored more than once (e.g. {sorted(many)[0]!r}): a racing "
            "commit stopped before dropping its copies, or two processes appended one id (docs/store.md, "
            "\"Staged writes\")")


def check_store(path: str | os.PathLike[str], tables: list[str]) -> CheckReport:
    """Verify everything: the manifest, every version manifest of every table, and every fragment of
    each table's newest readable version, read whole one at a time. Never raises for damage."""
    path = Path(path)
    rep = CheckReport(str(path))
    committed: dict[str, Any] = {}
    digests: dict[str, Any] = {}
    try:
        m = read_manifest(path)
        committed, digests = m.get("committed") or {}, m.get("files") or {}
    except StoreDamaged as e:
        rep.problems.append(str(e).split("; run `gfcr store check")[0])
    for name in tables:
        rep.tables.append(_check_table(path, name, committed.get(name) or {}, digests))
        t = rep.tables[-1]
        if name == "rollouts" and t.version is not None:
            dup = doubled_problem(lance.dataset(str(path / "rollouts.lance"), version=t.version), t)
            if dup:
                t.problems.append(dup)
    return rep


def salvage(path: str | os.PathLike[str], out: str | os.PathLike[str], tables: list[str],
            init: Callable[[Path], None]) -> dict[str, int]:
    """Copy every row of every readable fragment (each table's newest readable version) of the store
    at ``path`` into a new store at ``out`` (``init(out)`` creates it); returns rows copied per table."""
    out = Path(out)
    if out.exists():
        raise StoreError(f"{out} exists; salvage writes a new store: choose a new path")
    rep = check_store(path, tables)
    init(out)
    copied = {}
    for t in rep.tables:
        copied[t.name] = 0
        if t.version is None:
            continue
        ds = lance.dataset(str(Path(path) / f"{t.name}.lance"), version=t.version)
        good = [ds.get_fragment(f.fragment_id) for f in t.fragments if f.readable]
        if not good:
            continue
        rows = ds.scanner(fragments=good).to_table()
        if rows.num_rows:
            dst = str(out / f"{t.name}.lance")
            schema = lance.dataset(dst).schema
            after = lance.write_dataset(rows.select(schema.names).cast(schema), dst, mode="append")
            record_commit(out, t.name, after)
        copied[t.name] = rows.num_rows
    return copied


def accept(path: str | os.PathLike[str], tables: list[str], fresh_manifest: dict[str, Any]) -> CheckReport:
    """Record each table's current newest version as the store's own (a new ``gfcr-store.json``,
    ``fresh_manifest`` where the old one does not read). Refused while a version manifest of a
    newest version or a fragment is damaged: move the file aside, or :func:`salvage`, first."""
    path = Path(path)
    rep = check_store(path, tables)
    bad = [p for t in rep.tables for p in t.problems if "roll the table back" not in p and "more than once" not in p]
    if bad:
        raise StoreDamaged(f"cannot accept {path} as it is: {bad[0]} (and {len(bad) - 1} more); move a damaged "
                           "newest version manifest aside, or `gfcr store check --salvage NEW` the readable rows")
    with file_lock(Path(path) / ".manifest.lock"):
        try:
            m = read_manifest(path)
        except StoreDamaged:
            m = dict(fresh_manifest)
        m["committed"] = {t.name: {"version": t.version, "rows": t.rows} for t in rep.tables}
        for t in rep.tables:  # the files of the accepted versions, as they are now
            if t.version is not None:
                record_digests(path, t.name, lance.dataset(str(path / f"{t.name}.lance"), version=t.version),
                               m.setdefault("files", {}))
        write_manifest(path, m)
    return check_store(path, tables)
