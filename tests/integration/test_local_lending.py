"""Lending between ticks on real cgroups, through the real gateway (``budget.enforcement: limit``).

In process: the gateway's Runtime and DataPlane on loopback, the local pool feeding its
endpoints, real demo replicas under real cgroups, and the lender wired to the services'
admission as ``sluice run`` wires it (``start_lending``).  The decisions are set by hand (as
if the last tick had left ``idle`` its decided CPU): between two ticks, the lender moves the
quotas in force.  Quotas are read back from the cgroup files; waits are bounded polls.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from gateway.dataplane.server import DataPlane
from gateway.dataplane.updates import routes_from_settings
from gateway.platforms.local.actuator import LocalActuator
from gateway.platforms.local.discovery import LocalEndpointSource
from gateway.platforms.local.platform import lending_report, start_lending, stop_lending
from gateway.platforms.local.pool import LocalPool
from gateway.runtime import Runtime
from gateway.settings import Settings, parse_settings
from scaler.decision import Decision
from tests.support.localpool import Harness, needs_cgroups, run_harness, until

BUDGET = 2.0
BUSY_DECIDED = 0.5
IDLE_DECIDED = 1.0
CPU_MIN = 0.1
EPS = 1e-3  # quotas are whole microseconds per 100 ms period


@pytest.fixture
async def harness() -> AsyncIterator[Harness]:
    async for h in run_harness():
        yield h


def decision(service: str, cores: float) -> Decision:
    return Decision(
        service=service,
        at=1.0,
        replicas=1,
        cpu_per_replica_cores=cores,
        allocated_cores=cores,
        rule="stable",
    )


def quota(pool: LocalPool, service: str) -> float:
    (cg,) = pool.replica_cgroups(service)
    cores = cg.read_limit().cores
    assert cores is not None, f"{service}: no quota in force"
    return cores


def lending_settings(
    specs: dict[str, Any], max_replicas: int, cpu_max: dict[str, float], **budget: Any
) -> Settings:
    """Two services on the local platform under ``limit`` with lending (and ``budget``)."""
    return parse_settings(
        {
            "platform": "local",
            "budget": {"cpu": BUDGET, "enforcement": "limit", "lending": True, **budget},
            "services": {
                name: {
                    "routes": [{"path": f"/{name}"}],
                    "replicas": spec.model_dump(mode="json"),
                    "scaling": {
                        "min_replicas": 1,
                        "max_replicas": max_replicas,
                        "cpu": {"min": CPU_MIN, "max": cpu_max[name]},
                    },
                }
                for name, spec in specs.items()
            },
        }
    )


@dataclass
class Gateway:
    """The real data plane in this process, fed by the local pool's endpoints."""

    runtime: Runtime
    pool: LocalPool
    actuator: LocalActuator
    dataplane: DataPlane
    base_url: str
    feeder: asyncio.Task[None]

    async def close(self) -> None:
        self.feeder.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.feeder
        await self.dataplane.stop(1.0)


async def open_gateway(harness: Harness, settings: Settings, specs: dict[str, Any]) -> Gateway:
    runtime = Runtime(settings)
    runtime.apply_routes(routes_from_settings(settings))
    pool = harness.pool(specs, drain=runtime.wait_drained, total_cpu_cores=BUDGET)
    actuator = LocalActuator(pool, {n: s.scaling for n, s in settings.services.items()})
    dataplane = DataPlane(runtime, [], asyncio.get_running_loop())
    host, port = await dataplane.start("127.0.0.1", 0)

    async def feed() -> None:
        async for update in LocalEndpointSource(pool).updates():
            runtime.apply_endpoints(update)

    feeder = asyncio.create_task(feed())
    return Gateway(runtime, pool, actuator, dataplane, f"http://{host}:{port}", feeder)


@needs_cgroups
async def test_an_idle_service_lends_its_quota_and_its_first_request_takes_it_back(
    harness: Harness,
) -> None:
    specs = {"busy": harness.spec(grace_s=0.5), "idle": harness.spec(grace_s=0.5)}
    settings = lending_settings(specs, 1, {"busy": 1.5, "idle": 1.0})
    assert settings.budget.lend_after_idle_s == pytest.approx(0.02)  # the default
    gw = await open_gateway(harness, settings, specs)
    runtime, pool, actuator = gw.runtime, gw.pool, gw.actuator

    observed: list[tuple[float, float]] = []

    def observe() -> tuple[float, float]:
        """Both quotas in force now, checked against the budget and the decided CPU."""
        busy, idle = quota(pool, "busy"), quota(pool, "idle")
        observed.append((busy, idle))
        assert busy + idle <= BUSY_DECIDED + IDLE_DECIDED + EPS <= BUDGET + EPS, (busy, idle)
        return busy, idle

    lender = None
    stop = asyncio.Event()
    statuses: list[int] = []
    try:
        async with pool, httpx.AsyncClient(base_url=gw.base_url, timeout=60) as client:
            await actuator.apply(
                {"busy": decision("busy", BUSY_DECIDED), "idle": decision("idle", IDLE_DECIDED)}
            )
            assert await until(
                lambda: all(len(s.endpoints.routable) == 1 for s in runtime.services.values())
            )
            lender = start_lending(runtime, pool, settings)
            assert lender is not None
            assert observe() == (pytest.approx(BUSY_DECIDED), pytest.approx(IDLE_DECIDED))

            async def busy_client() -> None:
                for _ in range(2000):  # bounded; stopped long before
                    if stop.is_set():
                        return
                    r = await client.get("/busy/work?cpu_ms=20")
                    statuses.append(r.status_code)

            clients = [asyncio.create_task(busy_client()) for _ in range(3)]

            # busy borrows what idle does not use; idle keeps cpu.min.
            def lent() -> bool:
                busy, idle = observe()
                return busy > BUSY_DECIDED + EPS and abs(idle - CPU_MIN) < EPS

            assert await until(lent), observed[-5:]
            busy, idle = observe()
            assert busy == pytest.approx(BUSY_DECIDED + IDLE_DECIDED - CPU_MIN, abs=EPS)
            assert idle == pytest.approx(CPU_MIN, abs=EPS)
            # The decided CPU is still what the pool reports as decided.
            states = await actuator.current()
            assert states["idle"].cpu_per_replica_cores == IDLE_DECIDED
            assert states["busy"].cpu_per_replica_cores == BUSY_DECIDED
            assert pool.status("idle").quota_in_force_cores == pytest.approx(CPU_MIN)
            # What /api/decisions shows in its budget block.
            report = lending_report(pool, lender, settings)
            assert report["lending"] is True and report["idle"] == ["idle"]
            assert report["lent_cores"] == {
                "idle": pytest.approx(CPU_MIN - IDLE_DECIDED),
                "busy": pytest.approx(IDLE_DECIDED - CPU_MIN),
            }
            assert report["quota_in_force_cores"]["idle"] == pytest.approx(CPU_MIN)

            # One request for idle: its quota is back before it is forwarded (synchronously,
            # in the admission's busy transition), and busy shrank.  The real hook runs; the
            # test only looks at the cgroups right after it returns.
            admission = runtime.services["idle"].admission
            hook = admission.on_busy_change
            assert hook is not None
            at_arrival: list[tuple[float, float]] = []

            def watch(busy: bool) -> None:
                was_idle = "idle" in lender.idle
                hook(busy)
                if busy:
                    assert was_idle
                    at_arrival.append(observe())

            admission.watch_busy(watch)
            response = await client.get("/idle/work?cpu_ms=5")
            assert response.status_code == 200 and response.json()["cpu_ms"] == 5
            assert at_arrival[:1] == [
                (pytest.approx(BUSY_DECIDED, abs=EPS), pytest.approx(IDLE_DECIDED, abs=EPS))
            ]
            # Idle again: lent again after the hold.
            assert await until(lent), observed[-5:]

            stop.set()
            await asyncio.gather(*clients)
            assert statuses and set(statuses) == {200}, statuses[-10:]
            # Stopping the lender puts every quota back to the decided CPU.
            stop_lending(runtime, lender)
            lender = None
            assert observe() == (pytest.approx(BUSY_DECIDED), pytest.approx(IDLE_DECIDED))
            assert runtime.services["idle"].admission.on_busy_change is None
    finally:
        stop.set()
        if lender is not None:
            stop_lending(runtime, lender)
        await gw.close()


@needs_cgroups
async def test_an_idle_replica_of_a_busy_service_lends_and_a_request_sent_to_it_takes_it_back(
    harness: Harness,
) -> None:
    """``api`` runs 2 replicas; one serves a long request, the other nothing: after the hold
    the idle one keeps api's floor over its replicas and lends the rest, to api's busy
    replica and to ``batch``'s; the next request for api goes to it (fewest in flight) and
    its quota is back before the request is sent."""
    specs = {"api": harness.spec(grace_s=0.5), "batch": harness.spec(grace_s=0.5)}
    settings = lending_settings(specs, 2, {"api": 1.0, "batch": 1.0}, lend_replicas=True)
    gw = await open_gateway(harness, settings, specs)
    runtime, pool, actuator = gw.runtime, gw.pool, gw.actuator

    decided = 0.5
    kept = CPU_MIN / 2  # api's floor (1 x cpu.min) over its 2 replicas
    observed: list[tuple[list[float], float]] = []

    def observe() -> tuple[list[float], float]:
        api = sorted(cg.read_limit().cores or 0.0 for cg in pool.replica_cgroups("api"))
        (batch,) = (cg.read_limit().cores or 0.0 for cg in pool.replica_cgroups("batch"))
        observed.append((api, batch))
        assert sum(api) + batch <= 3 * decided + EPS, (api, batch)
        return api, batch

    lender = None
    stop = asyncio.Event()
    try:
        async with pool, httpx.AsyncClient(base_url=gw.base_url, timeout=60) as client:
            await actuator.apply(
                {
                    "api": Decision("api", 1.0, 2, decided, 2 * decided, "stable"),
                    "batch": decision("batch", decided),
                }
            )
            assert await until(
                lambda: [len(s.endpoints.routable) for s in runtime.services.values()] == [2, 1]
            )
            lender = start_lending(runtime, pool, settings)
            assert lender is not None

            async def batch_client() -> None:
                for _ in range(2000):  # bounded; stopped long before
                    if stop.is_set():
                        return
                    r = await client.get("/batch/work?cpu_ms=20")
                    assert r.status_code == 200

            clients = [asyncio.create_task(batch_client()) for _ in range(3)]
            long = asyncio.create_task(client.get("/api/work?cpu_ms=3000"))

            def lent() -> bool:
                api, batch = observe()
                return abs(api[0] - kept) < EPS and batch > decided + EPS

            assert await until(lent), observed[-5:]
            api, batch = observe()
            share = (decided - kept) / 2  # shared equally by api's busy replica and batch's
            assert api == [pytest.approx(kept, abs=EPS), pytest.approx(decided + share, abs=EPS)]
            assert batch == pytest.approx(decided + share, abs=EPS)
            assert lender.idle == set()
            assert [len(a) for a in lender.idle_replicas.values()] == [1, 0]

            # A request for api goes to the idle replica; its quota is back before it is sent.
            endpoints = runtime.services["api"].endpoints
            hook = endpoints.on_busy
            assert hook is not None
            at_send: list[tuple[list[float], float]] = []

            def watch(address: str, busy: bool) -> None:
                was_idle = address in lender.idle_replicas["api"]
                hook(address, busy)
                if busy and was_idle:
                    at_send.append(observe())

            endpoints.on_busy = watch
            response = await client.get("/api/work?cpu_ms=5")
            assert response.status_code == 200
            assert at_send[:1] == [
                ([pytest.approx(decided, abs=EPS)] * 2, pytest.approx(decided, abs=EPS))
            ]
            endpoints.on_busy = hook
            assert await until(lent), observed[-5:]  # idle again: lent again after the hold

            stop.set()
            await asyncio.gather(*clients)
            assert (await long).status_code == 200
            stop_lending(runtime, lender)
            lender = None
            assert observe() == ([pytest.approx(decided)] * 2, pytest.approx(decided))
            assert endpoints.on_busy is None
    finally:
        stop.set()
        if lender is not None:
            stop_lending(runtime, lender)
        await gw.close()
