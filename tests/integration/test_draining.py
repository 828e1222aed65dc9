"""Endpoint removal through a live data plane: in-flight requests finish, new ones go elsewhere.

The data plane runs in the test's event loop (as a platform would drive it) in front of a
real upstream process; the endpoint set is changed with ``Runtime.apply_endpoints``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest

from gateway.dataplane.server import DataPlane
from gateway.dataplane.updates import EndpointInfo, EndpointUpdate, RouteRule, RoutesUpdate
from gateway.runtime import Runtime
from gateway.settings import parse_settings
from tests.support.processes import Upstream, upstreams


@pytest.fixture(scope="module")
def ups() -> Iterator[list[Upstream]]:
    with upstreams("d1", "d2") as started:
        yield started


@pytest.fixture
async def live(ups: list[Upstream]) -> AsyncIterator[tuple[Runtime, str]]:
    rt = Runtime(parse_settings({"services": {"svc": {}}}))
    rt.apply_routes(RoutesUpdate((RouteRule("svc", None, "/", "Prefix"),)))
    dp = DataPlane(rt)
    host, port = await dp.start("127.0.0.1", 0)
    try:
        yield rt, f"http://{host}:{port}"
    finally:
        await dp.stop(0)


def update(*ups: Upstream) -> EndpointUpdate:
    return EndpointUpdate("svc", tuple(EndpointInfo(u.address) for u in ups))


async def test_removed_endpoint_finishes_in_flight_then_drains(
    live: tuple[Runtime, str], ups: list[Upstream]
) -> None:
    rt, url = live
    d1, d2 = ups
    rt.apply_endpoints(update(d1))
    async with httpx.AsyncClient(base_url=url, timeout=20) as client:
        slow = asyncio.ensure_future(client.get("/delay", params={"s": 1.0}))
        ep = rt.services["svc"].endpoints.get(d1.address)
        assert ep is not None
        for _ in range(1000):
            if ep.in_flight == 1:
                break
            await asyncio.sleep(0.005)
        assert ep.in_flight == 1
        # The platform replaces d1 by d2: d1 drains.
        rt.apply_endpoints(update(d2))
        assert not rt.is_drained("svc", d1.address)
        quick = await client.get("/echo")
        assert quick.headers["x-upstream"] == "d2"  # no new requests to the draining one
        assert not slow.done() or ep.in_flight == 0
        r = await slow
        assert r.status_code == 200
        assert r.headers["x-upstream"] == "d1"  # the in-flight request completed
        assert await rt.wait_drained("svc", d1.address, timeout_s=10) is True
        assert rt.services["svc"].endpoints.get(d1.address) is None


async def test_no_ready_endpoint_is_503_and_recovers(
    live: tuple[Runtime, str], ups: list[Upstream]
) -> None:
    rt, url = live
    async with httpx.AsyncClient(base_url=url, timeout=20) as client:
        r = await client.get("/echo")
        assert r.status_code == 503
        assert r.headers["sluice-error"] == "no-endpoints"
        terminating = EndpointInfo(ups[0].address, ready=False, serving=True, terminating=True)
        rt.apply_endpoints(EndpointUpdate("svc", (terminating,)))
        r = await client.get("/echo")
        assert r.headers["x-upstream"] == "d1"  # serving+terminating used when nothing is ready
        rt.apply_endpoints(EndpointUpdate("svc", (terminating, EndpointInfo(ups[1].address))))
        r = await client.get("/echo")
        assert r.headers["x-upstream"] == "d2"
