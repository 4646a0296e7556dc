"""Random-row reads on object storage: which data files to read whole, and a local cache of them.

A take of ``m`` rows from one data file of ``size`` bytes can read each row's byte ranges (about one
request per row when the rows lie farther apart than a request is worth) or the whole file in one
request. The cost model: one request costs as much as reading :data:`REQUEST_BYTES` bytes (``B``),
so the file is read whole when ``size <= m * B`` (:func:`plan_reads`). It counts one request per
sampled row, a lower bound (measured: ~1.5 per row for all 24 columns, plus ~3 per file for its
metadata), so near the break-even it keeps the range reads, which move fewer bytes.

A uniform sample of ``k`` rows from a table of ``S`` bytes has rows ``S / k`` bytes apart: every
plan costs at least ``min(k * B, S)`` (fewer requests than rows means reading the bytes between
them). Cold, nothing does better; only a cache does, across samples. :class:`ReadCache` keeps
whole copies of a table's data files (immutable in Lance: a file's path never names other bytes)
in a local folder and serves takes from them. A file is fetched when the range reads it has served
in this process (``m * B`` per take, its "rent") reach its size (or at once when it is to be read
whole anyway): the break-even rule of ski rental, which costs at most twice what knowing the future
samples would (Karlin et al., "Competitive snoopy caching", 1988). Repeated samples of a replay
buffer then cost no data requests for the files already fetched.

Lance keeps file metadata and indices in its session, not the data a take reads (a warm sample of
1M rows x 512 tokens: 956 requests), and pylance has no hook to wrap its object store. The copies are
read by opening the table's manifest at the same version over the local folder (``LanceDataset(...,
serialized_manifest=...)``, the form Lance pickles a dataset in), so offsets, row ids and deletions
mean what they mean on object storage. Numbers: docs/store.md, "Random-row reads on object storage".
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import uuid
from collections.abc import Collection, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lance
from lance.file import LanceFileSession

#: what one request to object storage costs, in bytes read: a small GET's first byte takes "tens of
#: milliseconds" (AWS, "Best Practices Design Patterns: Optimizing Amazon S3 Performance", Timeouts and
#: retries) and one connection reads 85-90 MB/s (AWS S3 User Guide, "Performance design patterns":
#: "one concurrent request for each 85-90 MB/s"): ~20-25 ms x 88 MB/s = 1.8-2.2 MB
REQUEST_BYTES = 2 * 1024 * 1024
#: a file read whole without the cache is held in memory by Lance: at most this large
WHOLE_FILE_MAX = 64 * 1024 * 1024
#: environment: the read cache's folder (no cache when unset), its size in bytes, the request cost
CACHE_ENV, CACHE_BYTES_ENV, REQUEST_BYTES_ENV = "GFCR_READ_CACHE", "GFCR_READ_CACHE_BYTES", "GFCR_REQUEST_BYTES"
#: the read cache's size when GFCR_READ_CACHE_BYTES is not set
CACHE_BYTES = 8 * 1024**3


def plan_reads(sizes: Mapping[int, int | None], rows: Mapping[int, int], request_bytes: int,
               cached: Collection[int] = (), rent: Mapping[int, float] | None = None, cache_bytes: int = 0,
               cacheable: Collection[int] | None = None, whole_max: int = WHOLE_FILE_MAX) -> dict[int, str]:
    """How to read each fragment of a take: ``"local"`` (from the read cache: its files are there, or
    are worth fetching: ``rent + m * B >= size``, and fit ``cache_bytes``), ``"whole"`` (one request:
    ``size <= m * B`` and ``size <= whole_max``) or ``"rows"`` (the rows' byte ranges).

    ``sizes``: fragment id -> bytes of its data files (None: unknown, read by rows); ``rows``: fragment
    id -> rows taken from it (``m``); ``request_bytes``: ``B``; ``cached``: fragments whose files are
    in the cache; ``rent``: range reads already served per fragment (bytes); ``cache_bytes``: the
    cache's size (0: no cache); ``cacheable``: fragments the cache may fetch (None: all).

    Example: sizes ``{1: 15e6, 2: 15e6}``, rows ``{1: 50, 2: 5}``, B = 2 MiB, no cache →
    ``{1: "whole", 2: "rows"}`` (15 MB ≤ 50 × 2 MiB; 15 MB > 5 × 2 MiB); with a cache and
    ``rent={2: 6e6}`` → ``{1: "local", 2: "local"}`` (6 MB + 10.5 MB ≥ 15 MB).
    """
    out = {}
    for fid, m in rows.items():
        size, pay = sizes.get(fid), m * request_bytes
        if fid in cached:
            out[fid] = "local"
        elif not size:
            out[fid] = "rows"
        elif (cache_bytes and size <= cache_bytes and (cacheable is None or fid in cacheable)
              and (rent or {}).get(fid, 0.0) + pay >= size):
            out[fid] = "local"
        elif size <= pay and size <= whole_max:
            out[fid] = "whole"
        else:
            out[fid] = "rows"
    return out


def fragment_files(frag: Any) -> list[str] | None:
    """The files of Lance fragment ``frag`` relative to its table (data files, then its deletion file),
    or None when one lies outside the table's folder (another base path) or the fragment has overlays.
    Example: → ``["data/0101….lance", "_deletions/3-7-991….arrow"]``."""
    m = frag.metadata
    if getattr(m, "overlays", None) or any(getattr(f, "base_id", None) is not None for f in m.files):
        return None
    files = [f"data/{f.path}" for f in m.files]
    d = m.deletion_file
    if d is not None:
        if getattr(d, "base_id", None) is not None:
            return None
        files.append(d.path(frag.fragment_id))
    return files


def fragment_bytes(frag: Any) -> int | None:
    """Bytes of fragment ``frag``'s data files as Lance recorded them (None if one is unrecorded)."""
    sizes = [f.file_size_bytes for f in frag.metadata.files]
    return None if not sizes or any(not s for s in sizes) else int(sum(sizes))


@dataclass
class ReadCache:
    """Whole local copies of remote tables' data and deletion files under ``root`` (one folder per
    table URI), at most ``max_bytes`` in all: the least recently used files go first. Files are
    written under a temporary name and renamed, and a take reads hard links made for it alone, so
    processes may share the folder (one evicting a file another is reading takes nothing from it).
    ``rent``: per table and fragment, the range reads it served in this process (:func:`plan_reads`)."""

    root: Path
    max_bytes: int = CACHE_BYTES
    rent: dict[tuple[str, int], float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.root = Path(self.root)
        if self.max_bytes <= 0:
            raise ValueError(f"the read cache's size must be positive, got {self.max_bytes}")

    @classmethod
    def shared(cls, root: str | os.PathLike[str], max_bytes: int | None = None) -> ReadCache:
        """The process's one cache object for folder ``root`` (so its rent outlives a store object)."""
        key = (str(Path(root).expanduser().resolve()), int(max_bytes or CACHE_BYTES))
        if key not in _SHARED:
            _SHARED[key] = cls(Path(key[0]), key[1])
        return _SHARED[key]

    @classmethod
    def from_env(cls) -> ReadCache | None:
        """The cache that ``GFCR_READ_CACHE`` (a folder) and ``GFCR_READ_CACHE_BYTES`` name; None if unset."""
        root = os.environ.get(CACHE_ENV)
        if not root:
            return None
        return cls.shared(root, env_int(CACHE_BYTES_ENV, CACHE_BYTES))

    def folder(self, uri: str) -> Path:
        """The folder of table ``uri``'s copies, e.g. ``root/3f9a…-rollouts.lance``."""
        return self.root / f"{hashlib.sha256(uri.encode()).hexdigest()[:20]}-{uri.rstrip('/').rsplit('/', 1)[-1]}"

    def has(self, uri: str, files: list[str]) -> bool:
        base = self.folder(uri)
        return all((base / f).is_file() for f in files)

    @contextmanager
    def view(self, ds: lance.LanceDataset, uri: str, files: list[str], storage_options: dict[str, str] | None,
             **open_args: Any) -> Iterator[lance.LanceDataset]:
        """Table ``ds`` (at its version) over local copies of ``files``: those absent are fetched
        first (one GET each); the view reads hard links to them made for this call. Only takes from
        fragments whose files are among ``files`` may be made through it."""
        base = self.folder(uri)
        (base / ".reads").mkdir(parents=True, exist_ok=True)
        here = Path(tempfile.mkdtemp(prefix=f"take-{os.getpid()}-", dir=base / ".reads"))
        try:
            fetched = False
            for rel in files:
                fetched |= self._link(uri, rel, here / rel, storage_options)
            if fetched:
                self._trim(base)
            yield lance.LanceDataset(str(here), version=ds.version, serialized_manifest=manifest_bytes(ds), **open_args)
        finally:
            shutil.rmtree(here, ignore_errors=True)

    def _link(self, uri: str, rel: str, dest: Path, storage_options: dict[str, str] | None) -> bool:
        """Hard-link the copy of ``rel`` to ``dest``, fetching it first if absent; whether it fetched."""
        src = self.folder(uri) / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.utime(src)  # (least recently used first out)
            os.link(src, dest)
            return False
        except FileNotFoundError:
            src.parent.mkdir(parents=True, exist_ok=True)
            tmp = src.with_name(f".{os.getpid()}-{uuid.uuid4().hex[:8]}-{src.name}.part")
            LanceFileSession(uri, storage_options=storage_options).download_file(rel, str(tmp))
            os.link(tmp, dest)  # (before the rename: a concurrent trim cannot take it from this take)
            os.replace(tmp, src)
            return True

    def _trim(self, base: Path) -> None:
        """Delete the least recently used copies (of any table) until the cache holds ``max_bytes``, and
        the links of takes whose process has ended (killed mid-take) in ``base``."""
        for d in (base / ".reads").glob("take-*-*"):
            if not _alive(int(d.name.split("-")[1])):
                shutil.rmtree(d, ignore_errors=True)
        for part in [*base.glob("data/.*.part"), *base.glob("_deletions/.*.part")]:  # (fetches cut short)
            if not _alive(int(part.name[1:].split("-")[0])):
                part.unlink(missing_ok=True)
        files = []
        for p in self.root.glob("*/*/*"):
            if p.parent.name in ("data", "_deletions") and not p.name.startswith("."):
                try:
                    st = p.stat()
                except FileNotFoundError:  # (another process trimmed it meanwhile)
                    continue
                files.append((st.st_mtime, st.st_size, p))
        total = sum(s for _, s, _ in files)
        for _, size, p in sorted(files):
            if total <= self.max_bytes:
                break
            p.unlink(missing_ok=True)
            total -= size


_SHARED: dict[tuple[str, int], ReadCache] = {}


def _alive(pid: int) -> bool:
    """Is process ``pid`` running (on this machine)?"""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # (another user's process)
        return True
    return True


def env_int(name: str, default: int) -> int:
    """The positive integer in environment variable ``name`` (``default`` if unset); one-line error otherwise."""
    v = os.environ.get(name)
    if not v:
        return default
    if not v.isdigit() or int(v) <= 0:
        raise ValueError(f"{name}={v!r}: expected a positive number of bytes")
    return int(v)


@dataclass
class RemoteReads:
    """How a take reads a table on object storage: ``uri`` and ``storage_options`` of the table,
    ``reopen(block)``: the table at the same version with another read block, ``open_args``: Lance's
    open arguments for a local view (read params, session), ``request_bytes``: ``B`` of
    :func:`plan_reads`, ``cache``: the read cache (None: none)."""

    uri: str
    storage_options: dict[str, str] | None
    reopen: Any
    open_args: dict[str, Any] = field(default_factory=dict)
    request_bytes: int = REQUEST_BYTES
    cache: ReadCache | None = None


def manifest_bytes(ds: lance.LanceDataset) -> bytes:
    """Lance's serialised manifest of ``ds`` at its version (what it pickles a dataset with)."""
    return ds._ds.serialized_manifest()
