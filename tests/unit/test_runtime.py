"""Runtime: what platforms call (endpoint and route updates, drain waits) and the signals it reports."""

from __future__ import annotations

import asyncio

import pytest

from gateway.dataplane.routing import RouteError
from gateway.dataplane.updates import EndpointInfo, EndpointUpdate, RouteRule, RoutesUpdate
from gateway.runtime import Runtime
from gateway.settings import parse_settings


def runtime() -> Runtime:
    settings = parse_settings(
        {
            "services": {
                "api": {
                    "routes": [{"path": "/api"}],
                    "endpoints": ["10.0.0.1:80"],
                    "balancer": "peak_ewma",
                },
            }
        }
    )
    return Runtime(settings, clock=lambda: 100.0)


def test_services_come_from_config_with_their_settings() -> None:
    rt = runtime()
    assert set(rt.services) == {"api"}
    assert rt.services["api"].balancer_name == "peak_ewma"
    assert rt.services["api"].endpoints.routable == ()  # endpoints arrive as updates
    assert rt.ready is False


def test_apply_endpoints_and_unknown_services_are_created() -> None:
    rt = runtime()
    rt.apply_endpoints(EndpointUpdate("api", (EndpointInfo("10.0.0.1:80"),)))
    assert [e.address for e in rt.services["api"].endpoints.routable] == ["10.0.0.1:80"]
    rt.apply_endpoints(EndpointUpdate("ns/web", (EndpointInfo("10.0.0.9:8080"),)))
    assert rt.services["ns/web"].balancer_name == "least_request"


def test_apply_routes_swaps_the_table_whole_and_rejects_bad_updates() -> None:
    rt = runtime()
    rt.apply_routes(RoutesUpdate((RouteRule("api", None, "/api", "Prefix"),)))
    first = rt.routes
    assert rt.routes.match("x", "/api/v1") == "api"
    with pytest.raises(RouteError):
        rt.apply_routes(RoutesUpdate((RouteRule("api", None, "/x", "prefix"),)))
    assert rt.routes is first  # the old table keeps serving
    rt.apply_routes(
        RoutesUpdate((RouteRule("new", "a.test", "/", "Exact"),), default_backend="api")
    )
    assert rt.routes.match("a.test", "/") == "new"
    assert rt.routes.match("b.test", "/zzz") == "api"
    assert "new" in rt.services


async def test_wait_drained_resolves_when_the_last_request_finishes() -> None:
    rt = runtime()
    rt.apply_endpoints(
        EndpointUpdate("api", (EndpointInfo("10.0.0.1:80"), EndpointInfo("10.0.0.2:80")))
    )
    ep = rt.services["api"].endpoints.get("10.0.0.2:80")
    assert ep is not None
    ep.acquire()
    rt.apply_endpoints(EndpointUpdate("api", (EndpointInfo("10.0.0.1:80"),)))
    assert not rt.is_drained("api", "10.0.0.2:80")
    assert await rt.wait_drained("api", "10.0.0.2:80", timeout_s=0.05) is False
    waiter = asyncio.ensure_future(rt.wait_drained("api", "10.0.0.2:80", timeout_s=10))
    await asyncio.sleep(0)
    assert not waiter.done()
    ep.release()
    assert await waiter is True
    assert rt.is_drained("api", "10.0.0.2:80")
    assert await rt.wait_drained("api", "never-seen:1") is True


def test_signals_snapshot_every_service() -> None:
    rt = runtime()
    rt.apply_endpoints(EndpointUpdate("api", (EndpointInfo("10.0.0.1:80"),)))
    stats = rt.services["api"].stats
    stats.arrive(99.5)
    stats.arrive(99.6)
    stats.complete(200, 0.01, 99.7)
    signals = rt.signals()
    assert set(signals) == {"api"}
    s = signals["api"]
    assert (s.at, s.in_flight, s.arrivals_total, s.completions_total, s.ready_replicas) == (
        100.0,
        1,
        2,
        1,
        1,
    )
    assert s.concurrency == 1


def test_an_ejected_endpoint_that_turns_ready_again_is_readmitted() -> None:
    """A replica restarted by its platform (not ready, then ready) is back in rotation at once,
    so it does not hold a max_ejection_percent slot a dead replica needs (issue 20, item 6)."""

    async def scenario() -> None:
        rt = runtime()
        eps = ("10.0.0.1:80", "10.0.0.2:80", "10.0.0.3:80")
        rt.apply_endpoints(EndpointUpdate("api", tuple(EndpointInfo(a) for a in eps)))
        s = rt.services["api"]
        loop = asyncio.get_running_loop()
        assert any(s.outlier.failure(eps[0], loop.time()) for _ in range(100))
        assert [ep.address for ep in s.endpoints.routable] == list(eps[1:])
        down = (EndpointInfo(eps[0], ready=False), *(EndpointInfo(a) for a in eps[1:]))
        rt.apply_endpoints(EndpointUpdate("api", down))
        assert s.endpoints.get(eps[0]).ejected  # type: ignore[union-attr]  # not ready: stays out
        rt.apply_endpoints(EndpointUpdate("api", tuple(EndpointInfo(a) for a in eps)))
        assert [ep.address for ep in s.endpoints.routable] == list(eps)
        assert any(s.outlier.failure(eps[1], loop.time()) for _ in range(100))
        assert [ep.address for ep in s.endpoints.routable] == [eps[0], eps[2]]

    asyncio.run(scenario())
