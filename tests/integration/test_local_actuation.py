"""The real scaler engine driving the real local pool: decisions become replicas and cgroup limits.

Signals are synthetic (no gateway here; so no measured CPU either, which would contradict
the synthetic load) and time is a stepped clock; the replicas, their cgroups and the
in-flight request are real.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from gateway.platforms.local.actuator import LocalActuator
from gateway.platforms.local.cgroups import DEFAULT_WEIGHT_CORES, weight_for
from gateway.platforms.local.pool import Enforcement, LocalPool
from scaler.decision import Decision, ServiceState
from scaler.engine import Engine
from scaler.policy import BudgetConfig, ScalingPolicy
from scaler.signals import ServiceSignals
from tests.support.localpool import Harness, get, needs_cgroups, run_harness, until


@pytest.fixture
async def harness() -> AsyncIterator[Harness]:
    async for h in run_harness():
        yield h


def policy(**kw: object) -> ScalingPolicy:
    base: dict[str, object] = {"target": 10, "cpu": {"min": 0.1, "max": 1.0, "request": 0.25}}
    base.update(kw)
    return ScalingPolicy.model_validate(base)


async def settle(pool: LocalPool) -> None:
    """Wait until every service has exactly its desired replicas, all ready."""
    assert await until(
        lambda: all(
            s.ready == s.desired and len(s.replicas) == s.desired for s in pool.statuses().values()
        )
    )


def quotas_match(pool: LocalPool, decisions: dict[str, Decision], engine: Engine) -> None:
    """limit: every replica's quota and weight are its decided CPU (the quotas together within
    the budget); share: every replica has the default weight and its service's cpu.max (1.0)
    as quota, and the service's cgroup has the service's fair share as weight."""
    total = 0.0
    for name, d in decisions.items():
        for cg in pool.replica_cgroups(name):
            limit = cg.read_limit()
            version = cg.layout.version
            if pool.enforcement == "share":
                assert limit.weight == weight_for(DEFAULT_WEIGHT_CORES, version), name
                assert limit.cores == 1.0, (name, d.summary())
                continue
            assert limit.weight == weight_for(d.cpu_per_replica_cores, version), name
            cores = limit.cores
            assert cores == pytest.approx(d.cpu_per_replica_cores, abs=1e-5), (name, d.summary())
            total += cores or 0.0
        group = pool.service_cgroup(name)
        if pool.enforcement == "share":
            assert group is not None
            entitled = group.read_limit()
            assert entitled.weight == weight_for(engine.fair_share(name), group.layout.version)
            assert entitled.quota_us is None, name  # only its replicas' cpu.max and the budget
        else:
            assert group is None
    assert total <= 2.0 + 1e-6, "the cgroup quotas in force exceed the 2-CPU budget"


@needs_cgroups
@pytest.mark.parametrize("enforcement", ["limit", "share"])
async def test_lend_then_reclaim_in_place_on_real_replicas(
    harness: Harness, enforcement: Enforcement
) -> None:
    policies = {"long": policy(max_replicas=8), "short": policy(min_replicas=0, max_replicas=8)}
    pool = harness.pool(
        {"long": harness.spec(), "short": harness.spec()},
        total_cpu_cores=2.0,
        enforcement=enforcement,
    )
    actuator = LocalActuator(pool, policies)
    engine = Engine(policies, BudgetConfig(cpu=2))
    states: dict[str, ServiceState] = {}
    async with pool:
        # The long-lived service is busy, the short one idle: long borrows the whole budget.
        for t in range(8):
            signals = {
                "long": ServiceSignals("long", float(t), in_flight=200),
                "short": ServiceSignals("short", float(t)),
            }
            decisions = engine.tick(float(t), signals, states)
            await actuator.apply(decisions)
            await settle(pool)
            states = dict(await actuator.current())
        assert pool.cgroups is not None
        assert (
            pool.cgroups.group.read_limit().cores == 2.0
        )  # the kernel caps them all at the budget
        assert decisions["long"].allocated_cores == pytest.approx(2.0)
        assert states["short"].replicas == 0
        quotas_match(pool, decisions, engine)
        long_pids = sorted(r.pid for r in pool.status("long").replicas if r.pid)
        assert len(long_pids) == decisions["long"].replicas

        # A request in flight on the borrower while its CPU is reclaimed.
        address = pool.endpoints("long")[0]
        baseline = pool.cpu_totals("long").usage_s or 0.0
        request = asyncio.create_task(get(address, "/?cpu_ms=500"))
        assert await until(lambda: (pool.cpu_totals("long").usage_s or 0.0) - baseline > 0.05)

        # The short service's burst: it gets its fair share back within one tick.
        signals = {
            "long": ServiceSignals("long", 8.0, in_flight=200),
            "short": ServiceSignals("short", 8.0, in_flight=500),
        }
        decisions = engine.tick(8.0, signals, states)
        assert decisions["short"].allocated_cores == pytest.approx(engine.fair_share("short"))
        await actuator.apply(decisions)
        await settle(pool)
        quotas_match(pool, decisions, engine)
        assert decisions["long"].cpu_per_replica_cores < 1.0
        # Reclaimed in place: the same long-lived processes, nothing restarted.
        assert sorted(r.pid for r in pool.status("long").replicas if r.pid) == long_pids
        assert pool.status("long").restarts_total == 0
        response = await request
        assert response.status_code == 200 and response.json()["cpu_ms"] == 500

        states = dict(await actuator.current())
        assert states["short"].ready_replicas == decisions["short"].replicas >= 1
        assert all(s.cpu_limits_applied for s in states.values())
