"""Routing tables through the real gateway: hosts, wildcards, Exact/Prefix precedence, 404, default backend."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.processes import Gateway, Upstream, gateway, upstreams

NAMES = ("web", "wild", "api", "exact", "deep", "fallback")


@pytest.fixture(scope="module")
def ups() -> Iterator[dict[str, Upstream]]:
    with upstreams(*NAMES) as started:
        yield {u.name: u for u in started}


def config(ups: dict[str, Upstream], default_backend: str | None = None) -> dict[str, object]:
    def svc(name: str, routes: list[dict[str, str]]) -> dict[str, object]:
        return {"routes": routes, "endpoints": [ups[name].address]}

    cfg: dict[str, object] = {
        "services": {
            "web": svc("web", [{"host": "www.example.test", "path": "/"}]),
            "wild": svc("wild", [{"host": "*.example.test", "path": "/"}]),
            "api": svc("api", [{"path": "/api", "path_type": "Prefix"}]),
            "exact": svc(
                "exact",
                [
                    {"path": "/api/health", "path_type": "Exact"},
                    {"path": "/Case", "path_type": "Exact"},
                ],
            ),
            "deep": svc("deep", [{"path": "/api/v2/", "path_type": "ImplementationSpecific"}]),
            "fallback": {"endpoints": [ups["fallback"].address]},
        }
    }
    if default_backend:
        cfg["default_backend"] = default_backend
    return cfg


@pytest.fixture(scope="module")
def gw(ups: dict[str, Upstream], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    with gateway(config(ups), tmp_path_factory.mktemp("routing") / "sluice.yaml") as g:
        yield g


CASES = [
    # (Host header, path, upstream that must answer, or None for the gateway's 404)
    ("www.example.test", "/", "web"),
    ("WWW.Example.Test:8080", "/anything", "web"),
    ("img.example.test", "/x", "wild"),
    ("a.img.example.test", "/api", "api"),  # two labels: not the wildcard; falls to any-host
    ("example.test", "/x", None),
    ("other.test", "/api", "api"),
    ("other.test", "/api/", "api"),
    ("other.test", "/api/users?id=1", "api"),
    ("other.test", "/apix", None),
    ("other.test", "/api/health", "exact"),
    ("other.test", "/api/health/", "api"),  # Exact does not ignore the trailing slash
    ("other.test", "/api/healthz", "api"),
    ("other.test", "/api/v2", "deep"),  # trailing slash of the rule ignored
    ("other.test", "/api/v2/items", "deep"),
    ("other.test", "/Case", "exact"),
    ("other.test", "/case", None),  # Exact is case-sensitive
    ("www.example.test", "/api/health", "web"),  # exact host tier wins over any-host rules
]


@pytest.mark.parametrize(("host", "path", "expected"), CASES)
def test_routes(gw: Gateway, host: str, path: str, expected: str | None) -> None:
    r = httpx.get(gw.url + path, headers={"Host": host}, timeout=10)
    if expected is None:
        assert r.status_code == 404
        assert r.headers["sluice-error"] == "no-route"
        assert "x-upstream" not in r.headers
    else:
        assert r.status_code == 200, r.text
        assert r.headers["x-upstream"] == expected
        assert r.json()["target"] == path


def test_default_backend_takes_unmatched_requests(ups: dict[str, Upstream], tmp_path: Path) -> None:
    with gateway(config(ups, default_backend="fallback"), tmp_path / "sluice.yaml") as g:
        r = httpx.get(g.url + "/nothing/matches", headers={"Host": "nowhere.test"}, timeout=10)
        assert r.status_code == 200
        assert r.headers["x-upstream"] == "fallback"
        r = httpx.get(g.url + "/api/x", timeout=10)
        assert r.headers["x-upstream"] == "api"
