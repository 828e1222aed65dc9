"""``budget.enforcement: share`` on real cgroups: the parent's quota is the budget, a replica's
weight is its decided CPU and its quota its service's ``cpu.max``; and the kernel lends idle
CPU of the budget to a busy replica beyond its guaranteed share.

The behavioural checks compare CPU time used (cgroup counters) with the share over a bounded
busy period, with generous margins; nothing is asserted about latency.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from gateway.platforms.local.actuator import LocalActuator
from gateway.platforms.local.cgroups import ReplicaCgroup, weight_for
from gateway.platforms.local.pool import Enforcement, LocalPool
from scaler.decision import Decision
from scaler.policy import ScalingPolicy
from tests.support.localpool import Harness, get, needs_cgroups, run_harness, until

SHIELD_SHARES_V1 = 65536
SHIELD_WEIGHT_V2 = 5000


@pytest.fixture
async def harness() -> AsyncIterator[Harness]:
    async for h in run_harness():
        yield h


def policy(cpu_max: float) -> ScalingPolicy:
    return ScalingPolicy.model_validate(
        {"min_replicas": 1, "max_replicas": 2, "cpu": {"min": 0.1, "max": cpu_max}}
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
async def test_parent_quota_is_the_budget_and_replicas_follow_decisions(harness: Harness) -> None:
    pool = harness.pool(
        {"a": harness.spec(), "b": harness.spec()}, total_cpu_cores=1.5, enforcement="share"
    )
    actuator = LocalActuator(pool, {"a": policy(1.0), "b": policy(2.0)})
    async with pool:
        await ready(pool)
        assert pool.cgroups is not None
        assert pool.cgroups.group.read_limit().cores == 1.5
        for step, (a_cores, b_cores) in enumerate([(0.2, 1.3), (0.9, 0.3)]):
            await actuator.apply(
                {"a": decision("a", 2, a_cores, step), "b": decision("b", 1, b_cores, step)}
            )
            await ready(pool)
            for name, cores, cap in (("a", a_cores, 1.0), ("b", b_cores, 1.5)):
                cgroups = pool.replica_cgroups(name)
                assert len(cgroups) == (2 if name == "a" else 1)
                for cg in cgroups:
                    limit = cg.read_limit()
                    assert limit.weight == weight_for(cores, cg.layout.version), (name, step)
                    # b's cpu.max (2.0) is above the budget: capped at the budget.
                    assert limit.cores == cap, (name, step)
            states = await actuator.current()
            assert states["a"].cpu_per_replica_cores == a_cores
            assert states["a"].cpu_cap_per_replica_cores == 1.0
            assert states["b"].cpu_cap_per_replica_cores == 1.5
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
    actuator = LocalActuator(pool, {"busy": policy(1.0), "idle": policy(1.0)})
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
            # Idle budget is lent: far above its guaranteed 0.1 core (with no neighbour it
            # gets close to the whole 1-core budget; 3x the share is a generous floor).
            assert cores_used > 3 * guaranteed, cores_used
        else:
            # A hard cap: never more than its decided CPU (one CFS period of slack).
            assert cores_used < guaranteed * 1.5 + 0.1 / wall_s, cores_used
            assert cg.read_usage().throttled_s > 0
