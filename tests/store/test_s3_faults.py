"""Faults on object storage: the loopback S3 server behind a fault proxy (also on 127.0.0.1) that answers
503 to some requests, delays every request, or goes down mid-write and comes back. What must hold: 0 rows
lost among committed batches, 0 doubled, the store opens, and a failed write ends in bounded time with an
error (Lance's own retries are bounded by ``client_max_retries`` / ``client_retry_timeout``)."""

from __future__ import annotations

import http.client
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from tests.store.conftest import s3_uri

from gfcr.store import RolloutStore
from gfcr.store.errors import StoreUnreachable
from gfcr.testing import make_rollout

pytestmark = pytest.mark.usefixtures("s3_env")


class FaultProxy:
    """An HTTP proxy on 127.0.0.1 in front of the S3 server. ``every``: answer 503 to every n-th request
    (0 = never); ``delay_s``: sleep before forwarding; ``down``: answer 503 to everything (the server
    stopped). Counts requests and injected faults."""

    def __init__(self, upstream: str):
        self.upstream = upstream.removeprefix("http://")
        self.every, self.delay_s, self.down = 0, 0.0, False
        self.requests = self.faults = 0
        self.lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def _forward(self):
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else None
                with proxy.lock:
                    proxy.requests += 1
                    fail = proxy.down or (proxy.every and proxy.requests % proxy.every == 0)
                    proxy.faults += bool(fail)
                if proxy.delay_s:
                    time.sleep(proxy.delay_s)
                if fail:
                    msg = b"<Error><Code>ServiceUnavailable</Code><Message>injected</Message></Error>"
                    self.send_response(503)
                    self.send_header("Content-Length", str(len(msg)))
                    self.end_headers()
                    self.wfile.write(msg)
                    return
                conn = http.client.HTTPConnection(proxy.upstream, timeout=60)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("connection",)}
                conn.request(self.command, self.path, body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)
                conn.close()

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _forward  # noqa: N815

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()


@pytest.fixture
def proxy(s3_server):
    p = FaultProxy(s3_server)
    yield p
    p.close()


def _opts(p: FaultProxy, retries: int = 10, timeout_s: int = 30) -> dict[str, str]:
    return {"aws_endpoint": p.url, "aws_access_key_id": "testing", "aws_secret_access_key": "testing",
            "aws_region": "us-east-1", "allow_http": "true", "client_max_retries": str(retries),
            "client_retry_timeout": str(timeout_s)}


def _batch(b: int, n: int = 8):
    return [make_rollout(b * 100 + i, step=b, rollout_id=f"r{b}-{i}") for i in range(n)]


def test_503s_are_retried_and_nothing_is_lost_or_doubled(proxy):
    uri = s3_uri("faults503")
    st = RolloutStore.open(uri, create=True, storage_options=_opts(proxy))
    proxy.every = 4  # one request in four answered 503
    for b in range(6):
        st.append(_batch(b))
    assert proxy.faults >= 5  # the faults were really injected
    proxy.every = 0
    again = RolloutStore.open(uri, storage_options=_opts(proxy))
    ids = again.scan(columns=["rollout_id"]).column(0).to_pylist()
    assert len(ids) == 48 and len(set(ids)) == 48


def test_a_slow_server_slows_appends_but_loses_nothing(proxy):
    uri = s3_uri("slow")
    st = RolloutStore.open(uri, create=True, storage_options=_opts(proxy))
    proxy.delay_s = 0.05
    t0 = time.perf_counter()
    for b in range(3):
        st.append(_batch(b))
    assert time.perf_counter() - t0 >= 0.05 * proxy.requests * 0.5  # the delay was paid (calls partly overlap)
    assert RolloutStore.open(uri, storage_options=_opts(proxy)).count() == 24


def test_server_down_mid_write_then_back_loses_no_committed_batch(proxy):
    uri = s3_uri("down")
    st = RolloutStore.open(uri, create=True, storage_options=_opts(proxy, retries=2, timeout_s=5))
    for b in range(3):
        st.append(_batch(b))
    proxy.down = True
    t0 = time.perf_counter()
    with pytest.raises(StoreUnreachable) as e:
        st.append(_batch(3))
    assert time.perf_counter() - t0 < 60  # bounded: no endless retry
    assert str(e.value).startswith("the object store did not complete the write (503 Service Unavailable, after 2 "
                                   "retries)") and "\n" not in str(e.value) and ".rs:" not in str(e.value)
    proxy.down = False  # the server is back
    back = RolloutStore.open(uri, storage_options=_opts(proxy))
    ids = set(back.scan(columns=["rollout_id"]).column(0).to_pylist())
    assert {f"r{b}-{i}" for b in range(3) for i in range(8)} <= ids  # every committed batch
    assert len(ids) in (24, 32) and back.count() == len(ids)  # the failed batch whole or not at all, never doubled
    if len(ids) == 24:  # written again: lands once
        back.append(_batch(3))
    assert RolloutStore.open(uri, storage_options=_opts(proxy)).count() == 32
