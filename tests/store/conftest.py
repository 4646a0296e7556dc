"""Fixtures shared by the store tests."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from gfcr.testing import make_rollout

#: a writer process for the racing-writer tests: a fresh interpreter (spawned, never forked) that reads
#: the object store's endpoint from the environment and appends ``batches`` batches of ``size`` rows,
#: printing one JSON line per committed batch
APPEND_WRITER = r"""
import sys, json
from gfcr.store import RolloutStore
from gfcr.testing import make_rollout
uri, tag, batches, size = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
store = RolloutStore.open(uri)
for b in range(batches):
    store.append([make_rollout(i, step=b, run=tag, n_ctx=8, n_gen=16, seed=b, rollout_id=f"{tag}-{b}-{i}")
                  for i in range(size)])
    print(json.dumps({"committed": b}), flush=True)
"""


def fragmented_store(path: str | os.PathLike[str], fragments: int, per: int) -> Path:
    """A new store at ``path`` of ``fragments`` commits of ``per`` rollouts each (step = commit
    index, no automatic compaction, so one fragment per commit): the damaged-store tests' base."""
    from gfcr.store import RolloutStore

    s = RolloutStore.open(path, create=True, auto_compact=0)
    for b in range(fragments):
        s.append([make_rollout(b * per + i, step=b) for i in range(per)])
    assert s.count() == fragments * per and len(s.dataset("rollouts").get_fragments()) == fragments
    return Path(path)


@pytest.fixture(scope="session")
def make_fragmented_store():
    """:func:`fragmented_store`, for module-scoped fixtures (the damaged-store tests' base)."""
    return fragmented_store


# --- object storage: a real S3 protocol server on loopback -------------------------------------------
S3_BUCKET = "gfcr-test"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on (the OS picks it)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def s3_server():
    """moto's S3 server (the same HTTP API as S3) on 127.0.0.1 at a free port, with the bucket
    :data:`S3_BUCKET`; yields its endpoint URL. Started once per session. It is
    :class:`gfcr.testing.S3Server`, whose conditional PUTs are atomic as on S3 (moto's alone are not)."""
    from gfcr.testing import S3Server

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # not a line per request in failure reports
    srv = S3Server(free_port(), S3_BUCKET)
    yield srv.endpoint
    srv.stop()


@pytest.fixture
def s3_env(s3_server, monkeypatch):
    """The environment variables Lance's object store (and child processes) read to reach the server."""
    for k, v in {"AWS_ENDPOINT_URL": s3_server, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                 "AWS_REGION": "us-east-1", "AWS_ALLOW_HTTP": "true"}.items():
        monkeypatch.setenv(k, v)
    return s3_server


@pytest.fixture(scope="module")
def s3_counted():
    """A second moto S3 server that records every request it answers (:class:`gfcr.testing.S3Server`:
    ``srv.count("GET", "/data/")`` → requests and bytes), with the bucket :data:`S3_BUCKET`."""
    from gfcr.testing import S3Server

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    srv = S3Server(free_port(), S3_BUCKET)
    yield srv
    srv.stop()


@pytest.fixture
def s3_counted_env(s3_counted, monkeypatch):
    """:func:`s3_env` for the :func:`s3_counted` server; returns the server."""
    for k, v in {"AWS_ENDPOINT_URL": s3_counted.endpoint, "AWS_ACCESS_KEY_ID": "testing",
                 "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1", "AWS_ALLOW_HTTP": "true"}.items():
        monkeypatch.setenv(k, v)
    return s3_counted


def s3_uri(name: str = "store") -> str:
    """A fresh store URI in the test bucket."""
    import uuid

    return f"s3://{S3_BUCKET}/{name}-{uuid.uuid4().hex[:12]}"


# --- object storage: Azure Blob through Azurite, Azure's own emulator (npm), on loopback --------------
AZ_CONTAINER = "gfcr-test"
#: Azurite's well-known development account and key (public, documented by Microsoft: "Azurite", "Connect
#: to Azurite with SDKs and tools"); they authenticate against the emulator only
AZ_ACCOUNT = "devstoreaccount1"
AZ_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
_REPO = Path(__file__).resolve().parents[2]


def azurite_command() -> list[str]:
    """How to start Azurite's blob service: ``$GFCR_AZURITE``, the project's install
    (``.cache/azurite``, ``make azurite``), or one on ``PATH``; skips the test, naming what is missing."""
    import shutil

    if shutil.which("node") is None:
        pytest.skip("node is not installed: the az:// tests need Azurite (npm), `make azurite` installs it")
    for exe in (os.environ.get("GFCR_AZURITE"), _REPO / ".cache/azurite/node_modules/.bin/azurite-blob",
                shutil.which("azurite-blob")):
        if exe and Path(exe).is_file():
            return [str(exe)]
    pytest.skip("Azurite is not installed: run `make azurite` (npm ci into .cache/azurite) for the az:// tests")


def az_create_container(endpoint: str, name: str) -> None:
    """Create container ``name`` on the Azurite account at ``endpoint`` (one ``PUT ?restype=container``
    signed with the account's key: Azure's "Authorize with Shared Key"; Lance never creates containers)."""
    import base64
    import hashlib
    import hmac
    import urllib.request
    from email.utils import formatdate

    headers = {"x-ms-date": formatdate(usegmt=True), "x-ms-version": "2021-08-06"}
    to_sign = ("PUT\n" + "\n" * 11 + "".join(f"{k}:{v}\n" for k, v in sorted(headers.items()))
               + f"/{AZ_ACCOUNT}/{AZ_ACCOUNT}/{name}\nrestype:container")
    sig = base64.b64encode(hmac.new(base64.b64decode(AZ_KEY), to_sign.encode(), hashlib.sha256).digest()).decode()
    req = urllib.request.Request(f"{endpoint}/{name}?restype=container", method="PUT",
                                 headers={**headers, "Authorization": f"SharedKey {AZ_ACCOUNT}:{sig}", "Content-Length": "0"})
    with urllib.request.urlopen(req, timeout=10) as r:
        assert r.status == 201, r.status


def start_azurite(folder: Path, log: Path | None = None, port: int | None = None, on_disk: bool = False):
    """Azurite's blob service on 127.0.0.1 at ``port`` (default: a free one), run in ``folder``, with the
    container :data:`AZ_CONTAINER`; returns ``(process, endpoint)``. Data in memory, or with ``on_disk``
    in ``folder`` (so that an Azurite started again there serves what the stopped one held). ``log``:
    Azurite's debug log (every request with its headers and answer)."""
    import subprocess
    import time
    import urllib.error

    port = port or free_port()
    keep = ["--location", str(folder)] if on_disk else ["--inMemoryPersistence"]
    cmd = [*azurite_command(), "--blobHost", "127.0.0.1", "--blobPort", str(port), *keep,
           "--skipApiVersionCheck", "--loose", "--silent", "--disableTelemetry"]
    if log is not None:
        cmd += ["--debug", str(log)]
    proc = subprocess.Popen(cmd, cwd=folder, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    endpoint = f"http://127.0.0.1:{port}/{AZ_ACCOUNT}"
    deadline = time.monotonic() + 30
    while True:
        try:
            az_create_container(endpoint, AZ_CONTAINER)
            return proc, endpoint
        except urllib.error.HTTPError as e:
            if e.code == 409:  # ContainerAlreadyExists: an Azurite started again on its data
                return proc, endpoint
            raise
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"Azurite did not start: {proc.stderr.read().decode()[-300:]}") from None
            time.sleep(0.1)


@pytest.fixture(scope="session")
def az_server(tmp_path_factory):
    """Azurite (Azure's storage emulator, installed by ``make azurite``) serving Azure Blob on 127.0.0.1 at a
    free port, with the container :data:`AZ_CONTAINER`; yields the account's endpoint URL. Once per session."""
    proc, endpoint = start_azurite(tmp_path_factory.mktemp("azurite"))
    yield endpoint
    proc.terminate()
    proc.wait(10)


def az_vars(endpoint: str) -> dict[str, str]:
    """The environment variables Lance's Azure object store reads to reach the emulator at ``endpoint``."""
    return {"AZURE_STORAGE_ACCOUNT_NAME": AZ_ACCOUNT, "AZURE_STORAGE_ACCOUNT_KEY": AZ_KEY,
            "AZURE_STORAGE_ENDPOINT": endpoint, "AZURE_ALLOW_HTTP": "true"}


@pytest.fixture
def az_env(az_server, monkeypatch):
    """The environment variables Lance's object store (and child processes) read to reach Azurite."""
    for k, v in az_vars(az_server).items():
        monkeypatch.setenv(k, v)
    return az_server


def az_uri(name: str = "store") -> str:
    """A fresh store URI in the test container."""
    import uuid

    return f"az://{AZ_CONTAINER}/{name}-{uuid.uuid4().hex[:12]}"


@dataclass(frozen=True)
class Remote:
    """An object-storage backend under test: ``scheme`` (``s3`` or ``az``) and the loopback server's
    ``endpoint`` (the URL Lance's object store is pointed at; Azurite's includes the account)."""

    scheme: str
    endpoint: str

    def uri(self, name: str = "store") -> str:
        """A fresh store URI on this backend (:func:`s3_uri`, :func:`az_uri`)."""
        return s3_uri(name) if self.scheme == "s3" else az_uri(name)

    def options(self, endpoint: str | None = None, retries: int = 10, timeout_s: int = 30) -> dict[str, str]:
        """Lance's storage options reaching ``endpoint`` (default: the server's own; a fault proxy's URL
        in front of it) with the given bounded retries. Example (S3, a proxy on port 5000):
        ``{"aws_endpoint": "http://127.0.0.1:5000", …, "client_max_retries": "10", "client_retry_timeout": "30"}``."""
        endpoint = endpoint or self.endpoint
        if self.scheme == "s3":
            o = {"aws_endpoint": endpoint, "aws_access_key_id": "testing", "aws_secret_access_key": "testing",
                 "aws_region": "us-east-1"}
        else:
            o = {"account_name": AZ_ACCOUNT, "account_key": AZ_KEY, "azure_storage_endpoint": endpoint}
        return {**o, "allow_http": "true", "client_max_retries": str(retries), "client_retry_timeout": str(timeout_s)}


@pytest.fixture(params=["s3", "az"])
def remote(request) -> Remote:
    """Each object-storage backend in turn, its environment set for this process and its children
    (``s3_env``, ``az_env``): the fault and many-writer tests run on both."""
    return Remote(request.param, request.getfixturevalue(f"{request.param}_env"))


@pytest.fixture(params=["local", "s3", "az"])
def store_uri(request, tmp_path):
    """Where a store under test lives: a local directory, a fresh prefix on the loopback S3 server, or
    one in a container of the loopback Azurite (the store's contract tests run against all three)."""
    if request.param == "local":
        return tmp_path / "store"
    if request.param == "az":
        request.getfixturevalue("az_env")
        return az_uri()
    request.getfixturevalue("s3_env")
    return s3_uri()
