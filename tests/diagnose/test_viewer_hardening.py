"""Viewer hardening (issue 30, item 5): every bad query value is a 400 with one line naming the
parameter, never a 5xx; the Host check accepts the loopback names with a trailing dot and refuses
look-alikes."""

from __future__ import annotations

from urllib.parse import quote

import pytest
from diag_helpers import group
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient

from gfcr.diagnose.viewer import create_app, host_allowed

BAD_VALUES = ["99999999999999999999999", "-99999999999999999999999", "9223372036854775808", "-1", "1e400", "-1e400",
              "nan", "inf", "-inf", "", " ", "abc", "0x10", "1.5", "true", "maybe", "\x00", "'", "\"", "' OR '1'='1",
              "%", "\\", "[]", "{}", "é", "\ud7ff", "x" * 5000]


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    from gfcr.store import RolloutStore

    store = RolloutStore.open(tmp_path_factory.mktemp("h") / "store", create=True)
    store.append(group("A", 0, "p1", [1.0, 0.0], [True, False]) + group("A", 1, "p2", [0.5], [None]))
    return create_app(store.path)


def _params(dependant, kind):
    """A route's own parameters of ``kind`` and its dependencies' (the list's filters are one)."""
    return [p.name for p in getattr(dependant, kind)] + [n for d in dependant.dependencies for n in _params(d, kind)]


def _api_routes(app):
    out = []
    for r in app.routes:
        if isinstance(r, APIRoute) and r.path.startswith("/api"):
            out.append((r.path, _params(r.dependant, "query_params"), _params(r.dependant, "path_params")))
    return out


def test_the_routes_fuzzed_are_all_of_them(app):
    """Guard: the fuzz below walks the app's own route table, so a new parameter is fuzzed too."""
    routes = {p: q for p, q, _ in _api_routes(app)}
    assert set(routes) == {"/api/summary", "/api/rollouts", "/api/rollouts/{rollout_id}", "/api/ross", "/api/paired",
                           "/api/histogram", "/api/lineage"}
    assert set(routes["/api/paired"]) == {"a", "b"} and set(routes["/api/lineage"]) == {"run", "step", "limit"}
    assert {"field", "bins", "q", "reward_min", "gen_max", "audit"} <= set(routes["/api/histogram"])
    assert {"step_min", "step_max", "reward_min", "reward_max", "offset", "limit", "verified", "finish", "q", "gen_min",
            "gen_max", "audit", "judge", "sort", "order"} <= set(routes["/api/rollouts"])
    assert set(routes["/api/rollouts/{rollout_id}"]) == {"judge"} and set(routes["/api/ross"]) == {"judge", "run"}


def test_every_bad_query_value_is_a_400_or_a_plain_answer(app):
    """Every query parameter of every /api route, and every path parameter, with each bad value:
    never a 5xx; a refusal is a 400 whose detail is one line naming the parameter."""
    client = TestClient(app, raise_server_exceptions=False)
    seen = {"400": 0, "2xx/404": 0}
    for path, query, path_params in _api_routes(app):
        for value in BAD_VALUES:
            url = path
            for p in path_params:
                url = url.replace("{" + p + "}", "id")
            for name in query:
                r = client.get(url, params={name: value})
                assert r.status_code < 500, (path, name, value, r.status_code, r.text[:200])
                if r.status_code == 400:
                    detail = r.json()["detail"]
                    assert isinstance(detail, str) and "\n" not in detail, detail
                    assert name in detail or "reward" in detail, (name, detail)
                    seen["400"] += 1
                else:  # (the fuzz's path parameter names no rollout: 404 there)
                    assert r.status_code == (404 if path_params else 200), (path, name, value, r.status_code)
                    seen["2xx/404"] += 1
            for p in path_params:
                if value in ("", " "):
                    continue
                r = client.get(path.replace("{" + p + "}", quote(value, safe="")))
                assert r.status_code in (200, 404), (path, p, value, r.status_code, r.text[:200])
    assert seen["400"] > 100 and seen["2xx/404"] > 50


@pytest.mark.parametrize(("name", "value"), [("step_min", "99999999999999999999999"),
                                             ("step_max", "99999999999999999999999"),
                                             ("offset", "99999999999999999999999"), ("limit", "201"),
                                             ("reward_min", "nan"), ("finish", "bogus"), ("verified", "maybe")])
def test_out_of_range_values_are_400(app, name, value):
    r = TestClient(app, raise_server_exceptions=False).get("/api/rollouts", params={name: value})
    assert r.status_code == 400 and name.split("_")[0] in r.json()["detail"], r.text


def test_largest_step_is_answered(app):
    c = TestClient(app)
    assert c.get("/api/rollouts", params={"step_min": 2**63 - 1}).json()["total"] == 0
    assert c.get("/api/rollouts", params={"step_max": 2**63 - 1}).json()["total"] == 3


@pytest.mark.parametrize("header", ["localhost", "localhost:8765", "LocalHost.:8765", "localhost.", "127.0.0.1.",
                                    "127.0.0.1:1", "[::1]", "[::1]:8765"])
def test_loopback_names_are_accepted(header):
    assert host_allowed(header, ["localhost", "127.0.0.1", "::1"])


@pytest.mark.parametrize("header", ["", "localhost..", "localhost.evil.example", "evil.localhost", "localhost:",
                                    "localhost:80:80", "localhost:8o", "[::1]evil.example", "[::1]:", "[::1]x:80",
                                    "[::1", "::1", "127.0.0.1.evil", "127.0.0.2", "localhost@evil", ".localhost",
                                    "0x7f.0.0.1", "localhost :80"])
def test_look_alikes_are_refused(header):
    assert not host_allowed(header, ["localhost", "127.0.0.1", "::1"])


def test_app_host_check_end_to_end(tmp_path):
    guarded = create_app(_store(tmp_path), allowed_hosts=["localhost", "127.0.0.1", "::1"])
    c = TestClient(guarded, raise_server_exceptions=False)
    for host in ("localhost.:8765", "127.0.0.1.", "[::1]:8765"):
        assert c.get("/api/summary", headers={"host": host}).status_code == 200, host
    for host in ("[::1]evil.example", "localhost.evil.example:8765", "rebound.example"):
        r = c.get("/api/summary", headers={"host": host})
        assert r.status_code == 400 and "Invalid host header" in r.text, host
        assert r.headers["content-security-policy"].startswith("default-src 'none'")


def _store(tmp_path):
    from gfcr.store import RolloutStore

    s = RolloutStore.open(tmp_path / "s", create=True)
    s.append(group("A", 0, "p1", [1.0], [True]))
    return s.path
