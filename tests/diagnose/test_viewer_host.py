"""gfcr view on a loopback bind answers only requests whose Host header names a loopback host."""

from fastapi.testclient import TestClient

from gfcr.diagnose.viewer import create_app


def test_viewer_host_check(store):
    app = create_app(store.path, allowed_hosts=["localhost", "127.0.0.1", "::1"])
    for base in ("http://127.0.0.1:8765", "http://localhost:8765", "http://[::1]:8765"):
        assert TestClient(app, base_url=base).get("/api/summary").status_code == 200
    r = TestClient(app, base_url="http://rebound.example:8765").get("/api/summary")
    assert r.status_code == 400 and "Invalid host header" in r.text
    assert TestClient(create_app(store.path)).get("/api/summary").status_code == 200  # no list: any host
