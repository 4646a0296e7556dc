"""Where a store lives: a local directory or an object-store URI (``s3://``, ``gs://``, ``az://``).

:func:`locate` turns what a user typed into a :class:`Location`: a local path stays a
:class:`~pathlib.Path` (``file://`` is read as one); ``s3://bucket/prefix``, ``s3+ddb://…``,
``gs://…`` and ``az://…`` are kept as URIs, never passed through ``Path`` (which collapses ``//``
and would create a local folder ``s3:/bucket/…``). Any other ``scheme://`` is refused in one line.

Endpoint and credentials of a remote store come from the environment variables Lance's object
store reads (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
``AWS_REGION``, ``AWS_ALLOW_HTTP``; ``GOOGLE_SERVICE_ACCOUNT``…; ``AZURE_STORAGE_ACCOUNT_NAME``…),
or from ``storage_options`` (Lance's keys, e.g. ``{"aws_endpoint": "http://127.0.0.1:9000"}``),
which win over the environment. gfcr adds bounded retries (:data:`REMOTE_DEFAULTS`) unless given.

Each backend commits a Lance version by creating its manifest only if it is absent, so that of
two racing commits one fails and is retried (:data:`COMMIT_HANDLERS` names them); a backend
without such a commit is refused unless the user opts in (``allow_unsafe_commits``).

Example: ``locate("s3://bkt/runs/a/")`` → ``Location(uri="s3://bkt/runs/a", local=None, scheme="s3")``;
``locate("runs/a")`` → ``Location(uri="runs/a", local=Path("runs/a"), scheme="file")``;
``locate("ftp://x")`` → ``StoreError("unknown store URI scheme 'ftp' in 'ftp://x'; …")``.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gfcr.store.errors import StoreError

#: scheme -> how Lance detects a racing commit on it (a name for docs, errors and `gfcr store info`)
COMMIT_HANDLERS = {
    "file": "local disk: the version manifest is created by an atomic rename that fails when it exists",
    "s3": "S3 conditional PUT (If-None-Match: *) of the version manifest; the server must honour it",
    "s3+ddb": "DynamoDB external manifest store (a conditional put in a DynamoDB table)",
    "gs": "GCS conditional create (ifGenerationMatch=0) of the version manifest",
    "az": "Azure Blob conditional Put Blob (If-None-Match: *) of the version manifest; the second of two racing "
          "commits is refused (409 BlobAlreadyExists)",
}
#: schemes Lance reads and writes but whose commit does not detect a racing writer
UNSAFE_SCHEMES = {"memory": "Lance's in-memory store (one process only)"}
#: storage options that turn an S3 commit's conditional PUT off (object_store's ``conditional_put``,
#: set for servers that do not honour ``If-None-Match``): the commit then overwrites a racing one
_NO_CONDITIONAL_PUT = ("aws_conditional_put", "conditional_put")
#: storage options gfcr sets for a remote store unless the caller gives them: a few bounded retries,
#: so an unreachable endpoint fails in seconds (Lance's own defaults retry for up to 180 s)
REMOTE_DEFAULTS = {"client_max_retries": "3", "client_retry_timeout": "20", "connect_timeout": "5s"}
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
UNSAFE_ENV = "GFCR_ALLOW_UNSAFE_COMMITS"


@dataclass(frozen=True)
class Location:
    """A store's place. ``uri``: what Lance is given (no trailing ``/``); ``local``: the directory
    of a local store (None for a remote one); ``scheme``: ``file``, ``s3``, ``gs``, ``az``…;
    ``storage_options``: Lance's object-store options (None for a local store)."""

    uri: str
    local: Path | None
    scheme: str
    storage_options: dict[str, str] | None = field(default=None, compare=False)

    @property
    def remote(self) -> bool:
        return self.local is None

    def join(self, name: str) -> str:
        """The URI of ``name`` inside the store (e.g. ``s3://bkt/st/rollouts.lance``)."""
        return str(self.local / name) if self.local is not None else f"{self.uri}/{name}"

    @property
    def commit_handler(self) -> str:
        return COMMIT_HANDLERS.get(self.scheme) or UNSAFE_SCHEMES.get(self.scheme, "unknown")

    def __str__(self) -> str:
        return self.uri


def is_uri(x: Any) -> bool:
    """Is ``x`` a ``scheme://…`` string (not a local path)?"""
    return isinstance(x, str) and bool(_SCHEME.match(x))


def locate(where: str | os.PathLike[str] | Location, storage_options: dict[str, Any] | None = None,
           allow_unsafe_commits: bool = False) -> Location:
    """The :class:`Location` of ``where`` (module docstring); :class:`StoreError` in one line for an
    unknown scheme, a URI without a bucket, or a backend whose commits cannot detect a racing
    writer (unless ``allow_unsafe_commits`` or the environment variable ``GFCR_ALLOW_UNSAFE_COMMITS=1``)."""
    if isinstance(where, Location):
        return where
    s = os.fspath(where)
    m = _SCHEME.match(s)
    if not m:
        if storage_options:
            raise StoreError(f"storage_options were given for the local path {s!r}; they apply to s3://, gs://, az:// stores")
        return Location(s, Path(s), "file")
    scheme = m.group(1).lower()
    if scheme == "file":
        return locate(s[len("file://"):] or "/", storage_options)
    known = sorted(COMMIT_HANDLERS)
    if scheme not in COMMIT_HANDLERS and scheme not in UNSAFE_SCHEMES:
        raise StoreError(f"unknown store URI scheme {scheme!r} in {s!r}; a store is a local path or an "
                         f"{', '.join(k + '://' for k in known if k != 'file')} URI")
    opts = {str(k): str(v) for k, v in (storage_options or {}).items()}
    unsafe = UNSAFE_SCHEMES.get(scheme) or next(
        (f"S3 with {k}={v}" for k, v in opts.items() if k.lower() in _NO_CONDITIONAL_PUT and v.lower() == "disabled"), None)
    if unsafe and not (allow_unsafe_commits or os.environ.get(UNSAFE_ENV) == "1"):
        raise StoreError(f"{s!r}: {unsafe} cannot detect a racing commit, so two writers could overwrite each "
                         f"other's rows; pass allow_unsafe_commits=True (or {UNSAFE_ENV}=1) to use it anyway")
    rest = s[m.end():].rstrip("/")
    if not rest or rest.startswith("/"):
        raise StoreError(f"store URI {s!r} names no bucket; write {scheme}://BUCKET/PREFIX")
    return Location(f"{s[:m.end()]}{rest}", None, scheme, {**REMOTE_DEFAULTS, **opts})
