"""``budget.enforcement: share`` on real cgroups: the parent's quota is the budget, each
service's cgroup is weighted by its entitlement (whatever is decided), its replicas inside at
equal weights with its ``cpu.max`` as quota; the kernel lends idle CPU of the budget to a
busy service beyond its entitlement, and under contention shares it by entitlement.

The behavioural checks compare CPU time used (cgroup counters) over bounded busy periods,
as ratios with generous margins; nothing is asserted about latency.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator

import httpx
import pytest

from gateway.platforms.local.actuator import LocalActuator, entitlements
from gateway.platforms.local.cgroups import DEFAULT_WEIGHT_CORES, ReplicaCgroup, weight_for
from gateway.platforms.local.pool import Enforcement, LocalPool
from scaler.decision import Decision
from scaler.policy import ScalingPolicy
from tests.support.localpool import DEMO, Harness, get, needs_cgroups, run_harness, until

SHIELD_SHARES_V1 = 65536
SHIELD_WEIGHT_V2 = 5000


@pytest.fixture
async def harness() -> AsyncIterator[Harness]:
    async for h in run_harness():
        yield h


def policy(cpu_max: float, weight: float = 1.0, max_replicas: int = 2) -> ScalingPolicy:
    return ScalingPolicy.model_validate(
        {
            "min_replicas": 1,
            "max_replicas": max_replicas,
            "cpu": {"min": 0.1, "max": cpu_max},
            "weight": weight,
        }
    )


def decision(service: str, replicas: int, cores: float, at: float = 1.0) -> Decision:
    return Decision(
        service=service,
        at=at,
        replicas=replicas,
        cpu_per_replica_cores=cores,
        allocated_cores=replicas * cores,
        rule="stable",
    )


async def ready(pool: LocalPool) -> None:
    assert await until(
        lambda: all(
            s.ready == s.desired and len(s.replicas) == s.desired for s in pool.statuses().values()
        )
    )


def shield(pool: LocalPool) -> None:
    """Raise the pool's weight against the machine's other processes (other test suites
    share these cores): only the competition *outside* the budget changes, not its quota."""
    assert pool.cgroups is not None
    d = pool.cgroups.cpu_dir
    if pool.cgroups.layout.version == 2:
        (d / "cpu.weight").write_text(str(SHIELD_WEIGHT_V2))
    else:
        (d / "cpu.shares").write_text(str(SHIELD_SHARES_V1))


@needs_cgroups
async def test_services_are_weighted_by_entitlement_and_replicas_capped_at_cpu_max(
    harness: Harness,
) -> None:
    pool = harness.pool(
        {"a": harness.spec(), "b": harness.spec()}, total_cpu_cores=1.5, enforcement="share"
    )
    policies = {"a": policy(1.0), "b": policy(2.0, weight=2.0)}
    actuator = LocalActuator(pool, policies)
    entitled = entitlements(1.5, policies)  # the engine's fair shares: a 0.5, b 1.0
    assert entitled == {"a": pytest.approx(0.5), "b": pytest.approx(1.0)}
    async with pool:
        await ready(pool)
        assert pool.cgroups is not None
        assert pool.cgroups.group.read_limit().cores == 1.5
        for step, (a_cores, b_cores) in enumerate([(0.2, 1.3), (0.9, 0.3)]):
            await actuator.apply(
                {"a": decision("a", 2, a_cores, step), "b": decision("b", 1, b_cores, step)}
            )
            await ready(pool)
            for name, cap in (("a", 1.0), ("b", 1.5)):
                group = pool.service_cgroup(name)
                assert group is not None and group.cpu_dir == pool.cgroups.cpu_dir / name
                limit = group.read_limit()
                # Whatever was decided: the service's weight is its entitlement, no quota.
                assert limit.weight == weight_for(entitled[name], group.layout.version), step
                assert limit.quota_us is None
                cgroups = pool.replica_cgroups(name)
                assert len(cgroups) == (2 if name == "a" else 1)
                for cg in cgroups:
                    assert cg.cpu_dir.parent == group.cpu_dir
                    limit = cg.read_limit()
                    assert limit.weight == weight_for(DEFAULT_WEIGHT_CORES, cg.layout.version)
                    # b's cpu.max (2.0) is above the budget: capped at the budget.
                    assert limit.cores == cap, (name, step)
            states = await actuator.current()
            assert states["a"].cpu_per_replica_cores == a_cores
            assert states["a"].cpu_cap_per_replica_cores == 1.0
            assert states["b"].cpu_cap_per_replica_cores == 1.5
            assert pool.status("b").entitlement_cores == pytest.approx(1.0)
        # A new entitlement (the budget re-measured, a reload) is written in place.
        pids = sorted(r.pid for r in pool.status("a").replicas if r.pid)
        pool.set_entitlements({"a": 1.0, "b": 0.5})
        a_group, b_group = pool.service_cgroup("a"), pool.service_cgroup("b")
        assert a_group is not None and b_group is not None
        assert a_group.read_limit().weight == weight_for(1.0, a_group.layout.version)
        assert b_group.read_limit().weight == weight_for(0.5, b_group.layout.version)
        assert sorted(r.pid for r in pool.status("a").replicas if r.pid) == pids
        assert pool.cgroups.group.read_limit().cores == 1.5


@needs_cgroups
async def test_the_budget_can_change_under_running_replicas(harness: Harness) -> None:
    pool = harness.pool({"a": harness.spec()}, total_cpu_cores=1.0, enforcement="share")
    actuator = LocalActuator(pool, {"a": policy(1.0)})
    async with pool:
        await ready(pool)
        assert pool.cgroups is not None
        (cg,) = pool.replica_cgroups("a")
        assert cg.read_limit().cores == 1.0
        # Shrinking: the replica's cap goes down with it (v1 refuses a child above its parent).
        pool.set_total_cpu(0.5)
        assert pool.cgroups.group.read_limit().cores == 0.5
        assert cg.read_limit().cores == 0.5
        pool.set_total_cpu(2.0)
        assert pool.cgroups.group.read_limit().cores == 2.0
        assert cg.read_limit().cores == 1.0  # cpu.max again
        assert pool.status("a").cpu_applied
        assert (await actuator.current())["a"].cpu_limits_applied


@needs_cgroups
async def test_memory_limits_and_cpu_totals_in_the_service_cgroups(harness: Harness) -> None:
    pool = harness.pool(
        {"a": harness.spec(memory_max="256Mi")}, total_cpu_cores=1.0, enforcement="share"
    )
    actuator = LocalActuator(pool, {"a": policy(1.0)})
    async with pool:
        await actuator.apply({"a": decision("a", 2, 0.5)})
        await ready(pool)
        group = pool.service_cgroup("a")
        assert group is not None
        for cg in pool.replica_cgroups("a"):
            assert cg.mem_dir is not None and group.mem_dir is not None
            assert cg.mem_dir.parent == group.mem_dir
            name = "memory.max" if cg.layout.version == 2 else "memory.limit_in_bytes"
            assert (cg.mem_dir / name).read_text().strip() == str(256 * 1024**2)
        assert pool.status("a").memory_applied
        for address in pool.endpoints("a"):
            assert (await get(address, "/work?cpu_ms=100")).status_code == 200
        before = pool.cpu_totals("a").usage_s
        assert before is not None and before >= 0.2
        await actuator.apply({"a": decision("a", 1, 0.5, 2.0)})
        assert await until(lambda: len(pool.replica_cgroups("a")) == 1)
        # The removed replica's CPU still counts: the totals only grow, and they are what
        # the service's cgroup counted (it holds every replica, past and present).
        after = pool.cpu_totals("a").usage_s
        assert after is not None and after >= before
        in_group = group.read_usage().usage_s
        assert in_group is not None and in_group == pytest.approx(after, abs=0.05)


async def busy_usage(
    pool: LocalPool, service: str, cg: ReplicaCgroup, window_s: float
) -> tuple[float, float]:
    """Keep one replica of ``service`` busy, return (CPU seconds it used, wall seconds) over
    a bounded window that starts once it is visibly burning CPU."""
    (address,) = pool.endpoints(service)
    start = cg.read_usage().usage_s or 0.0
    request = asyncio.create_task(get(address, "/work?cpu_ms=60000", timeout_s=120))
    try:
        assert await until(lambda: (cg.read_usage().usage_s or 0.0) - start > 0.02)
        loop = asyncio.get_running_loop()
        t0, u0 = loop.time(), cg.read_usage().usage_s or 0.0
        await asyncio.sleep(window_s)
        t1, u1 = loop.time(), cg.read_usage().usage_s or 0.0
        assert not request.done(), "the busy request ended before the window did"
    finally:
        request.cancel()
        with pytest.raises(asyncio.CancelledError):
            await request
    return u1 - u0, t1 - t0


@needs_cgroups
@pytest.mark.parametrize("enforcement", ["share", "limit"])
async def test_an_idle_budget_is_lent_to_a_busy_replica_only_in_share_mode(
    harness: Harness, enforcement: Enforcement
) -> None:
    guaranteed = 0.1
    pool = harness.pool(
        {"busy": harness.spec(grace_s=0.5), "idle": harness.spec(grace_s=0.5)},
        total_cpu_cores=1.0,
        enforcement=enforcement,
    )
    # Entitlements (fair shares of the 1-core budget by weight): busy 0.1, idle 0.9.
    policies = {"busy": policy(1.0, weight=1.0), "idle": policy(1.0, weight=9.0)}
    assert entitlements(1.0, policies)["busy"] == pytest.approx(guaranteed)
    actuator = LocalActuator(pool, policies)
    async with pool:
        await actuator.apply(
            {"busy": decision("busy", 1, guaranteed), "idle": decision("idle", 1, 0.9)}
        )
        await ready(pool)
        shield(pool)
        (cg,) = pool.replica_cgroups("busy")
        used_s, wall_s = await busy_usage(pool, "busy", cg, window_s=2.0)
        # (The demo's burn goes on after the request is cancelled; closing the pool kills it.)
        cores_used = used_s / wall_s
        if enforcement == "share":
            # Idle budget is lent: far above its entitled 0.1 core (with no neighbour it
            # gets close to the whole 1-core budget; 3x the share is a generous floor).
            assert cores_used > 3 * guaranteed, cores_used
        else:
            # A hard cap: never more than its decided CPU (one CFS period of slack).
            assert cores_used < guaranteed * 1.5 + 0.1 / wall_s, cores_used
            assert cg.read_usage().throttled_s > 0


BURN_MS = 3000
"""CPU the first service burns per request: its busy spells end by themselves."""


async def start_burn(pool: LocalPool, service: str, cpu_ms: int) -> asyncio.Task[httpx.Response]:
    """One request burning ``cpu_ms`` of CPU in ``service``'s replica, once it visibly runs."""
    group = pool.service_cgroup(service)
    assert group is not None
    (address,) = pool.endpoints(service)
    before = used(group)
    request = asyncio.create_task(get(address, f"/work?cpu_ms={cpu_ms}", timeout_s=120))
    assert await until(lambda: used(group) - before > 0.02), f"{service} does not burn CPU"
    return request


def used(cg: ReplicaCgroup) -> float:
    usage = cg.read_usage().usage_s
    assert usage is not None, "no CPU accounting for a service cgroup"
    return usage


async def contended_ratio(
    pool: LocalPool, a_request: asyncio.Task[httpx.Response]
) -> tuple[float, float]:
    """While both services burn: (a's CPU / b's CPU, b's cores) over a window that ends when a
    has used 1 s of CPU (long before its request's end), measured from the services' cgroups."""
    a, b = pool.service_cgroup("a"), pool.service_cgroup("b")
    assert a is not None and b is not None
    loop = asyncio.get_running_loop()
    t0, a0, b0 = loop.time(), used(a), used(b)
    assert await until(lambda: used(a) - a0 >= 1.0, timeout_s=60)
    t1, a1, b1 = loop.time(), used(a), used(b)
    assert not a_request.done(), "a's busy spell ended inside the window"
    return (a1 - a0) / max(b1 - b0, 1e-3), (b1 - b0) / (t1 - t0)


def cpus_allowed(pid: int) -> str:
    """The CPUs a process may run on, as the kernel lists them (``Cpus_allowed_list``)."""
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("Cpus_allowed_list:"):
                return line.split(":", 1)[1].strip()
    raise AssertionError(f"no Cpus_allowed_list for pid {pid}")


@needs_cgroups
async def test_the_kernel_guarantees_entitlements_and_lends_idle_cpu_on_one_core(
    harness: Harness,
) -> None:
    """Two services entitled to 0.75 and 0.25 of a 1-core budget.  Below every CPU the pool
    pins the replicas to one CPU (the highest allowed; a cpuset), so they contend for it and
    the weights decide: both busy, the first gets about 3x the second's CPU; the first idle,
    the second gets about all of it; the decided CPU turned upside down changes neither.
    (Under the budget's quota alone, on two CPUs, each would run on its own CPU until the
    quota ran out, and the weights would decide nothing.)"""
    pool = harness.pool(
        {"a": harness.spec(DEMO, grace_s=0.5), "b": harness.spec(DEMO, grace_s=0.5)},
        total_cpu_cores=1.0,
        enforcement="share",
    )
    policies = {
        "a": policy(1.0, weight=3.0, max_replicas=1),
        "b": policy(1.0, weight=1.0, max_replicas=1),
    }
    assert entitlements(1.0, policies) == {"a": pytest.approx(0.75), "b": pytest.approx(0.25)}
    actuator = LocalActuator(pool, policies)
    async with pool:
        allowed = sorted(os.sched_getaffinity(0))
        assert pool.cgroups is not None
        if len(allowed) > 1 and pool.cgroups.pinned is None:
            pytest.skip(f"replicas not pinned to one CPU here: {pool.unpinned_reason}")
        await actuator.apply({"a": decision("a", 1, 0.75), "b": decision("b", 1, 0.25)})
        await ready(pool)
        if len(allowed) > 1:
            assert pool.cgroups.pinned == (allowed[-1],)
            for service in ("a", "b"):
                (replica,) = pool.status(service).replicas
                assert replica.pid is not None
                assert cpus_allowed(replica.pid) == str(allowed[-1])
        shield(pool)  # against the machine's other processes on that CPU, not between a and b
        b_request = await start_burn(pool, "b", 60_000)  # b stays busy to the end
        try:
            # 1. Both busy: CPU in the ratio of the entitlements (3:1).
            a_request = await start_burn(pool, "a", BURN_MS)
            ratio, b_contended = await contended_ratio(pool, a_request)
            assert 2.0 < ratio < 4.5, ratio

            # 2. a's spell ends (its request answered): b gets about the whole core now,
            # compared with what b and a got together while both were busy.
            response = await asyncio.wait_for(a_request, timeout=60)
            assert response.status_code == 200
            b_group = pool.service_cgroup("b")
            assert b_group is not None
            loop = asyncio.get_running_loop()
            t0, u0 = loop.time(), used(b_group)
            await asyncio.sleep(1.5)
            b_alone = (used(b_group) - u0) / (loop.time() - t0)
            pair = b_contended * (1 + ratio)  # both services' cores while contending
            assert b_alone > 0.7 * pair, (b_alone, pair)
            assert b_alone > 2.0 * b_contended, (b_alone, b_contended)

            # 3. Decisions the other way round (a 0.1, b 0.9 per replica): the weights are
            # the entitlements, so a still gets about 3x b's CPU, not a ninth of it.
            await actuator.apply({"a": decision("a", 1, 0.1, 2), "b": decision("b", 1, 0.9, 2)})
            assert pool.status("a").cpu_per_replica_cores == 0.1
            a_request = await start_burn(pool, "a", BURN_MS)
            ratio_after, _ = await contended_ratio(pool, a_request)
            assert 2.0 < ratio_after < 4.5, ratio_after
            await asyncio.wait_for(a_request, timeout=60)
        finally:
            b_request.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await b_request
