"""Fixtures shared by the store tests."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from gfcr.testing import make_rollout


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
    """moto's S3 server (``ThreadedMotoServer``, the same HTTP API as S3) on 127.0.0.1 at a free
    port, with the bucket :data:`S3_BUCKET`; yields its endpoint URL. Started once per session."""
    import boto3
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # not a line per request in failure reports
    port = free_port()
    srv = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    srv.start()
    endpoint = f"http://127.0.0.1:{port}"
    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="testing",
                 aws_secret_access_key="testing").create_bucket(Bucket=S3_BUCKET)
    yield endpoint
    srv.stop()


@pytest.fixture
def s3_env(s3_server, monkeypatch):
    """The environment variables Lance's object store (and child processes) read to reach the server."""
    for k, v in {"AWS_ENDPOINT_URL": s3_server, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                 "AWS_REGION": "us-east-1", "AWS_ALLOW_HTTP": "true"}.items():
        monkeypatch.setenv(k, v)
    return s3_server


def s3_uri(name: str = "store") -> str:
    """A fresh store URI in the test bucket."""
    import uuid

    return f"s3://{S3_BUCKET}/{name}-{uuid.uuid4().hex[:12]}"


@pytest.fixture(params=["local", "s3"])
def store_uri(request, tmp_path):
    """Where a store under test lives: a local directory, or a fresh prefix on the loopback S3 server
    (the store's contract tests run against both)."""
    if request.param == "local":
        return tmp_path / "store"
    request.getfixturevalue("s3_env")
    return s3_uri()
