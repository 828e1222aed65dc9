"""Hostile input to the admin API of a real gateway (issue 20, item 8): malformed query
parameters get 400, never 500; without a token, a foreign ``Host`` (DNS rebinding) and a
cross-origin state change (CSRF) get 403."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.support.processes import Gateway, gateway

BAD_LIMITS = ["²", "1" * 5000, "-1", "0", "1.5", " 1", "１"]  # the last: a fullwidth one


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    cfg = {
        "platform": "static",
        "budget": {"cpu": 1},
        "services": {
            "api": {
                "routes": [{"path": "/"}],
                "endpoints": [],
                "scaling": {"min_replicas": 1, "max_replicas": 2},
            }
        },
    }
    with gateway(cfg, tmp_path_factory.mktemp("admin-hostile") / "sluice.yaml") as g:
        yield g


@pytest.fixture
def admin(gw: Gateway) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=gw.admin_url, timeout=10) as client:
        yield client


@pytest.mark.parametrize("path", ["/api/traces", "/api/decisions"])
@pytest.mark.parametrize("limit", BAD_LIMITS, ids=range(len(BAD_LIMITS)))
def test_malformed_limit_is_400(admin: httpx.Client, path: str, limit: str) -> None:
    r = admin.get(path, params={"limit": limit})
    assert r.status_code == 400, r.text
    assert "limit" in r.json()["error"]


@pytest.mark.parametrize(
    ("path", "params"),
    [
        ("/api/traces", {"min_duration_ms": "nan"}),
        ("/api/traces", {"min_duration_ms": "1e999"}),
        ("/api/traces", {"status": "²"}),
        ("/api/traces", {"trace_id": "²" * 32}),
        ("/api/traces", {"kind": "x"}),
        ("/api/traces", {"bogus": "1"}),
        ("/api/decisions", {"bogus": "1"}),
    ],
)
def test_every_parameter_is_checked(admin: httpx.Client, path: str, params: dict[str, str]) -> None:
    r = admin.get(path, params=params)
    assert r.status_code == 400, r.text


@pytest.mark.parametrize("path", ["/api/traces", "/api/decisions"])
def test_good_limit_passes(admin: httpx.Client, path: str) -> None:
    assert admin.get(path, params={"limit": "5"}).status_code == 200


@pytest.mark.parametrize(
    "host", ["evil.example", "evil.example:{port}", "127.0.0.1.evil.example:{port}", "10.0.0.1"]
)
@pytest.mark.parametrize(("method", "path"), [("GET", "/api/services"), ("POST", "/api/reload")])
def test_foreign_host_refused(
    admin: httpx.Client, gw: Gateway, host: str, method: str, path: str
) -> None:
    port = gw.admin_url.rpartition(":")[2]
    r = admin.request(method, path, headers={"Host": host.format(port=port)})
    assert r.status_code == 403, r.text
    assert "Host" in r.json()["error"]


@pytest.mark.parametrize("origin", ["http://evil.example", "null", "http://127.0.0.1:1"])
def test_cross_origin_state_change_refused(admin: httpx.Client, origin: str) -> None:
    r = admin.post("/api/reload", headers={"Origin": origin})
    assert r.status_code == 403, r.text
    assert "cross-origin" in r.json()["error"]


def test_same_origin_and_local_hosts_pass(admin: httpx.Client, gw: Gateway) -> None:
    port = gw.admin_url.rpartition(":")[2]
    # POST /api/reload reloads (200) or reports the config's errors (422): either way it ran.
    assert admin.post("/api/reload", headers={"Origin": gw.admin_url}).status_code == 200
    assert admin.post("/api/reload").status_code == 200
    # Any loopback name and port: an SSH tunnel or a port-forward keeps working.
    for host in (
        f"localhost:{port}",
        f"LOCALHOST:{port}",
        "127.0.0.1:8080",
        "[::1]:1",
        "localhost",
    ):
        assert admin.get("/api/services", headers={"Host": host}).status_code == 200
    tunnel = {"Host": "localhost:8080", "Origin": "http://localhost:8080"}
    assert admin.post("/api/reload", headers=tunnel).status_code == 200
    # A cross-origin read is left to the browser's same-origin policy (no CORS headers).
    assert admin.get("/api/services", headers={"Origin": "http://evil.example"}).status_code == 200
