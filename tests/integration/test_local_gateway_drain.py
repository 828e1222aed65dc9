"""Scale-down through the real gateway runtime: the pool drains with ``Runtime.wait_drained``.

In process: the gateway's Runtime and DataPlane on loopback, the local pool feeding its
endpoints, real demo replicas under real cgroups.  Replicas are scaled by hand (no scaler),
so which replica serves which request is known: round robin over two replicas.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import httpx
import pytest

from gateway.dataplane.server import DataPlane
from gateway.dataplane.updates import routes_from_settings
from gateway.platforms.local.discovery import LocalEndpointSource
from gateway.runtime import Runtime
from gateway.settings import parse_settings
from tests.support.localpool import Harness, needs_cgroups, run_harness, until
from tests.support.procs import pid_alive


@pytest.fixture
async def harness() -> AsyncIterator[Harness]:
    async for h in run_harness():
        yield h


@needs_cgroups
async def test_a_retired_replica_finishes_its_request_through_the_gateway_before_sigterm(
    harness: Harness,
) -> None:
    spec = harness.spec()
    settings = parse_settings(
        {
            "platform": "local",
            "services": {
                "api": {
                    "routes": [{"path": "/"}],
                    "balancer": "round_robin",
                    "replicas": spec.model_dump(mode="json"),
                    "scaling": {"max_replicas": 4},
                }
            },
        }
    )
    runtime = Runtime(settings)
    runtime.apply_routes(routes_from_settings(settings))
    pool = harness.pool({"api": spec}, drain=runtime.wait_drained)
    dataplane = DataPlane(runtime, [], asyncio.get_running_loop())
    host, port = await dataplane.start("127.0.0.1", 0)
    service = runtime.services["api"]

    async def feed() -> None:
        async for update in LocalEndpointSource(pool).updates():
            runtime.apply_endpoints(update)

    feeder = asyncio.create_task(feed())
    try:
        async with pool, httpx.AsyncClient(base_url=f"http://{host}:{port}", timeout=60) as client:
            pool.scale("api", 2, 0.5)
            assert await until(lambda: len(service.endpoints.routable) == 2)

            # Round robin: one long request on each replica.
            slow = [asyncio.create_task(client.get("/slow?sleep_ms=1500")) for _ in range(2)]
            assert await until(
                lambda: [ep.in_flight for ep in service.endpoints.endpoints] == [1, 1]
            )

            pool.set_replicas("api", 1)
            victim = pool.status("api").replicas[-1]
            assert victim.address is not None and victim.pid is not None
            # Withdrawn and draining in the gateway; the process still serves (no SIGTERM yet).
            assert await until(lambda: victim.address not in pool.endpoints("api"))
            assert await until(
                lambda: (
                    (ep := service.endpoints.get(victim.address or "")) is not None
                    and ep.state.value == "draining"
                )
            )
            ep = service.endpoints.get(victim.address)
            assert ep is not None and ep.in_flight == 1
            assert all(e.address != victim.address for e in service.endpoints.routable)
            assert not any(t.done() for t in slow)
            health = await client.get(f"http://{victim.address}/healthz")
            assert health.status_code == 200  # still listening: not SIGTERMed while draining

            # New requests go to the survivor only.
            for _ in range(4):
                assert (await client.get("/")).json()["pid"] != victim.pid

            responses = await asyncio.gather(*slow)
            assert [r.status_code for r in responses] == [200, 200]
            assert victim.pid in {r.json()["pid"] for r in responses}
            # Drained, then stopped, and gone from the gateway.
            assert await until(lambda: not pid_alive(victim.pid or 0))
            assert await until(lambda: service.endpoints.get(victim.address or "") is None)
            assert await until(lambda: len(pool.status("api").replicas) == 1)
    finally:
        feeder.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await feeder
        await dataplane.stop(1.0)
