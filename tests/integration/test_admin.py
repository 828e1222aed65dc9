"""The admin plane on its own port: health, readiness, metric values, the JSON API."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.processes import Gateway, Upstream, gateway, upstreams


@pytest.fixture(scope="module")
def ups() -> Iterator[list[Upstream]]:
    with upstreams("m1", "m2") as started:
        yield started


@pytest.fixture(scope="module")
def gw(ups: list[Upstream], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    cfg = {
        "services": {
            "api": {
                "routes": [{"path": "/"}],
                "endpoints": [u.address for u in ups],
                "balancer": "round_robin",
            },
            "idle": {"routes": [{"path": "/idle"}], "endpoints": []},
        }
    }
    with gateway(cfg, tmp_path_factory.mktemp("admin") / "sluice.yaml") as g:
        with httpx.Client(base_url=g.url, timeout=10) as client:
            for _ in range(6):
                assert client.get("/echo").status_code == 200
            for _ in range(2):
                assert client.get("/status/503").status_code == 503
            assert client.get("/status/404").status_code == 404
            assert client.get("/idle").status_code == 503
        yield g


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_health_and_readiness(gw: Gateway) -> None:
    r = httpx.get(gw.admin_url + "/healthz", timeout=10)
    assert (r.status_code, r.text) == (200, "ok\n")
    r = httpx.get(gw.admin_url + "/readyz", timeout=10)
    assert (r.status_code, r.text) == (200, "ready\n")


def test_metrics_values(gw: Gateway) -> None:
    r = httpx.get(gw.admin_url + "/metrics", timeout=10)
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain")
    m = samples(r.text)
    assert m[("sluice_requests_total", (("code", "200"), ("service", "api")))] == 6
    assert m[("sluice_requests_total", (("code", "503"), ("service", "api")))] == 2
    assert m[("sluice_requests_total", (("code", "404"), ("service", "api")))] == 1
    assert m[("sluice_requests_total", (("code", "503"), ("service", "idle")))] == 1
    assert m[("sluice_arrivals_total", (("service", "api"),))] == 9
    assert m[("sluice_in_flight", (("service", "api"),))] == 0
    assert m[("sluice_request_duration_seconds_count", (("service", "api"),))] == 9
    assert m[("sluice_request_duration_seconds_bucket", (("le", "+Inf"), ("service", "api")))] == 9
    assert m[("sluice_request_duration_seconds_sum", (("service", "api"),))] > 0
    assert m[("sluice_endpoints", (("service", "api"), ("state", "ready")))] == 2
    assert m[("sluice_endpoints", (("service", "idle"), ("state", "ready")))] == 0
    # Buckets are cumulative.
    buckets = sorted(
        (float(dict(labels)["le"]), v)
        for (name, labels), v in m.items()
        if name == "sluice_request_duration_seconds_bucket" and dict(labels)["service"] == "api"
    )
    values = [v for _, v in buckets]
    assert values == sorted(values)


def test_api_services(gw: Gateway, ups: list[Upstream]) -> None:
    data = httpx.get(gw.admin_url + "/api/services", timeout=10).json()
    api = data["services"]["api"]
    assert api["balancer"] == "round_robin"
    assert sorted(e["address"] for e in api["endpoints"]) == sorted(u.address for u in ups)
    assert all(
        e["state"] == "ready" and e["routable"] and e["in_flight"] == 0 for e in api["endpoints"]
    )
    assert api["completions"] == {"2xx": 6, "4xx": 1, "5xx": 2}
    signals = api["signals"]
    assert signals["service"] == "api"
    assert signals["arrivals_total"] == 9
    assert signals["completions_total"] == 9
    assert signals["errors_total"] == 2
    assert signals["in_flight"] == 0
    assert signals["queued"] == 0
    assert signals["ready_replicas"] == 2
    assert signals["latency_p50_s"] is not None
    assert data["services"]["idle"]["signals"]["ready_replicas"] == 0


def test_api_signals(gw: Gateway) -> None:
    data = httpx.get(gw.admin_url + "/api/signals", timeout=10).json()
    assert set(data["signals"]) == {"api", "idle"}
    assert data["signals"]["api"]["arrivals_total"] == 9
    assert isinstance(data["at"], float)
    # Nothing in flight: the concurrency integral is the requests' latencies summed.
    m = samples(httpx.get(gw.admin_url + "/metrics", timeout=10).text)
    spent = m[("sluice_request_duration_seconds_sum", (("service", "api"),))]
    assert data["signals"]["api"]["concurrency_seconds_total"] == pytest.approx(spent, rel=1e-9)
