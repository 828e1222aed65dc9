"""The local pool with real demo replicas under real CPU cgroups on this machine.

Every test uses a unique cgroup parent (``sluice-test-<hex>``) and a unique process marker;
the fixture checks that both are gone afterwards (the cgroup directories, and through
/proc every process carrying the marker).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.dataplane.updates import EndpointUpdate
from gateway.platforms.local.actuator import LocalActuator
from gateway.platforms.local.cgroup_parent import sweep_stale
from gateway.platforms.local.cgroups import DEFAULT_WEIGHT_CORES, detect_layout, weight_for
from gateway.platforms.local.discovery import LocalEndpointSource
from gateway.platforms.local.pool import Enforcement, LocalPool, PoolUpdate, ReplicaPhase
from scaler.decision import Decision
from scaler.policy import CpuPolicy, ScalingPolicy
from scaler.signals import ServiceSignals
from tests.support.localpool import ROOT, Harness, get, needs_cgroups, run_harness, until
from tests.support.procs import pid_alive, pids_with_marker, wait_until


@pytest.fixture
async def harness() -> AsyncIterator[Harness]:
    async for h in run_harness():
        yield h


@needs_cgroups
@pytest.mark.parametrize("enforcement", ["limit", "share"])
async def test_replicas_become_ready_in_their_own_cgroups(
    harness: Harness, enforcement: Enforcement
) -> None:
    pool = harness.pool({"api": harness.spec()}, enforcement=enforcement)
    async with pool:
        pool.scale("api", 2, 0.5)
        assert await until(lambda: pool.status("api").ready == 2)
        status = pool.status("api")
        assert status.cpu_applied and status.cpu_per_replica_cores == 0.5
        assert status.enforcement == enforcement
        # limit: 0.5 is the quota and the weight, replicas right below the parent;
        # share: no cap (no cpu.max, no budget) and the default weight, replicas in a cgroup
        # of the service's (default weight too: no entitlement set).
        cap = 0.5 if enforcement == "limit" else None
        weight_cores = 0.5 if enforcement == "limit" else DEFAULT_WEIGHT_CORES
        assert status.cpu_cap_per_replica_cores == cap
        cgroups = pool.replica_cgroups("api")
        assert len(cgroups) == 2
        assert pool.cgroups is not None
        holder = pool.cgroups.cpu_dir if enforcement == "limit" else pool.cgroups.cpu_dir / "api"
        for replica, cg in zip(status.replicas, cgroups, strict=True):
            assert cg.cpu_dir.parent == holder
            assert replica.pid in cg.pids()
            assert cg.read_limit().cores == cap
            assert cg.read_limit().weight == weight_for(weight_cores, cg.layout.version)
            assert replica.address is not None
            body = (await get(replica.address, "/work?cpu_ms=5")).json()
            assert body["pid"] == replica.pid
            assert body["cpu_ms"] == 5
        assert sorted(pool.endpoints("api")) == sorted(
            r.address for r in status.replicas if r.address
        )


@needs_cgroups
@pytest.mark.parametrize(("before", "after"), [(0.2, 1.0), (1.0, 0.2)], ids=["raise", "reclaim"])
async def test_cpu_limit_changes_in_place_while_a_request_runs(
    harness: Harness, before: float, after: float
) -> None:
    pool = harness.pool({"api": harness.spec()}, enforcement="limit")
    async with pool:
        pool.scale("api", 1, before)
        assert await until(lambda: pool.status("api").ready == 1)
        (replica,) = pool.status("api").replicas
        (cg,) = pool.replica_cgroups("api")
        assert replica.address is not None
        baseline = cg.read_usage().usage_s or 0.0
        request = asyncio.create_task(get(replica.address, "/work?cpu_ms=600"))
        # Change the limit once the request is visibly burning CPU.
        assert await until(lambda: (cg.read_usage().usage_s or 0.0) - baseline > 0.08)
        assert not request.done()
        pool.set_cpu("api", after)
        limit = cg.read_limit()
        assert limit.cores == pytest.approx(after)
        if cg.layout.version == 1:
            assert (cg.cpu_dir / "cpu.cfs_quota_us").read_text().strip() == str(
                round(after * 100_000)
            )
        else:
            assert (cg.cpu_dir / "cpu.max").read_text().split()[0] == str(round(after * 100_000))
        response = await request
        assert response.status_code == 200
        assert response.json()["cpu_ms"] == 600
        assert response.json()["pid"] == replica.pid
        after_status = pool.status("api")
        assert after_status.restarts_total == 0
        assert after_status.replicas[0].pid == replica.pid  # nothing was restarted
        usage = cg.read_usage()
        assert usage.usage_s is not None and usage.usage_s - baseline >= 0.6
        assert usage.throttled_s > 0  # the lower of the two limits held the request back


@needs_cgroups
async def test_a_crashed_replica_is_withdrawn_and_restarted(harness: Harness) -> None:
    pool = harness.pool({"api": harness.spec()})
    seen: list[PoolUpdate] = []

    async def watch() -> None:
        async for update in pool.updates():
            seen.append(update)

    async with pool:
        watcher = asyncio.create_task(watch())
        pool.scale("api", 1, 0.5)
        assert await until(lambda: pool.status("api").ready == 1)
        (old,) = pool.status("api").replicas
        assert old.pid is not None
        os.kill(old.pid, signal.SIGKILL)
        assert await until(
            lambda: pool.status("api").ready == 1 and pool.status("api").replicas[0].pid != old.pid
        )
        (new,) = pool.status("api").replicas
        assert pool.status("api").restarts_total == 1
        assert new.restarts == 1
        assert new.pid in pool.replica_cgroups("api")[0].pids()
        assert (await get(new.address or "", "/")).json()["pid"] == new.pid
        assert await until(lambda: bool(seen) and seen[-1].addresses == (new.address,))
    await asyncio.wait_for(watcher, 10)  # the stream ends when the pool closes
    addresses = [u.addresses for u in seen]
    assert (old.address,) in addresses
    crash_gap = addresses.index((old.address,)) + 1
    assert addresses[crash_gap] == ()  # withdrawn before the restart became ready


@needs_cgroups
async def test_a_replica_that_keeps_crashing_backs_off_and_is_never_routed(
    harness: Harness,
) -> None:
    pool = harness.pool({"bad": harness.spec(["sh", "-c", "exit 3"])})
    async with pool:
        pool.scale("bad", 1, 0.5)
        assert await until(lambda: pool.status("bad").restarts_total >= 3)
        assert pool.endpoints("bad") == ()
        assert pool.status("bad").ready == 0


@needs_cgroups
async def test_scale_down_withdraws_then_drains_then_terminates(harness: Harness) -> None:
    events: list[tuple[Any, ...]] = []
    in_flight: dict[str, asyncio.Task[httpx.Response]] = {}
    pool: LocalPool

    async def drain(service: str, address: str) -> None:
        if address not in in_flight:
            events.append(("close", address))  # the pool's own close() drains the survivor
            return
        pid = next(r.pid for r in pool.status(service).replicas if r.address == address)
        assert pid is not None
        events.append(("drain", address in pool.endpoints(service), pid_alive(pid)))
        response = await in_flight[address]  # the gateway would wait for its in-flight requests
        events.append(("drained", response.status_code, pid_alive(pid)))

    pool = harness.pool({"api": harness.spec()}, drain=drain)
    async with pool:
        pool.scale("api", 2, 1.0)
        assert await until(lambda: pool.status("api").ready == 2)
        victim = pool.status("api").replicas[-1]  # the newest ready replica goes first
        assert victim.address is not None and victim.pid is not None
        in_flight[victim.address] = asyncio.create_task(get(victim.address, "/slow?sleep_ms=500"))
        await asyncio.sleep(0.1)  # let the request reach the replica (not an assertion)
        pool.set_replicas("api", 1)
        assert await until(lambda: len(pool.status("api").replicas) == 1)
        assert not pid_alive(victim.pid)
        assert pool.status("api").replicas[0].name != victim.name
        assert pool.endpoints("api") == (pool.status("api").replicas[0].address,)
    survivor = events[-1][1]
    assert events == [("drain", False, True), ("drained", 200, True), ("close", survivor)]
    assert (await in_flight[victim.address]).json()["pid"] == victim.pid


@needs_cgroups
async def test_sigkill_after_the_grace_period(harness: Harness) -> None:
    stubborn = str(ROOT / "tests" / "support" / "stubborn_server.py")
    pool = harness.pool({"s": harness.spec(["{python}", stubborn, "{port}"], grace_s=0.3)})
    async with pool:
        pool.scale("s", 1, 0.5)
        assert await until(lambda: pool.status("s").ready == 1)
        pid = pool.status("s").replicas[0].pid
        assert pid is not None
        pool.set_replicas("s", 0)
        assert await until(lambda: not pool.status("s").replicas)
        assert not pid_alive(pid)


@needs_cgroups
async def test_stop_leaves_no_process_and_no_cgroup_even_with_grandchildren(
    harness: Harness,
) -> None:
    command = ["sh", "-c", "sleep 300 & exec {python} -m gateway.tools.demo --port {port}"]
    pool = harness.pool({"api": harness.spec(command)})
    async with pool:
        pool.scale("api", 2, 0.5)
        assert await until(lambda: pool.status("api").ready == 2)
        assert len(pids_with_marker(harness.marker)) == 4  # 2 replicas + 2 grandchildren
        assert pool.cgroups is not None
        parent_dir = pool.cgroups.cpu_dir
        assert parent_dir.is_dir()
    assert pids_with_marker(harness.marker) == []
    assert not parent_dir.exists()


@needs_cgroups
@pytest.mark.parametrize(
    ("grandchild", "enforcement"),
    [(False, "limit"), (True, "limit"), (True, "share")],
    ids=["replicas", "grandchildren", "grandchildren-in-a-service-cgroup"],
)
def test_replicas_die_with_a_killed_sluice(
    harness: Harness, grandchild: bool, enforcement: Enforcement
) -> None:
    start = random.randrange(20000, 60000, 100)
    runner = subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "tests" / "support" / "pool_runner.py"),
            str(start),
            str(start + 20),
            harness.marker,
            "2",
            enforcement,
            *(["grandchild"] if grandchild else []),
        ],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        assert runner.stdout is not None
        line = runner.stdout.readline().split()
        assert line[:1] == ["READY"], line
        parent, pids = line[1], [int(p) for p in line[2:]]
        assert all(pid_alive(p) for p in pids)
    finally:
        runner.kill()
        runner.wait()
        if runner.stdout:
            runner.stdout.close()
    # PR_SET_PDEATHSIG: the kernel kills each replica when Sluice dies.
    assert wait_until(lambda: not any(pid_alive(p) for p in pids))
    layout = detect_layout(Path("/proc/self/mountinfo").read_text())
    assert (layout.cpu_root / parent).is_dir()  # what a killed Sluice leaves: the cgroup
    if enforcement == "share":  # with the service's cgroup between it and the replicas'
        assert (layout.cpu_root / parent / "api" / "api-0").is_dir()
    # The next Sluice start sweeps it, killing whatever still ran inside (the grandchildren).
    assert parent in sweep_stale(layout)
    assert not (layout.cpu_root / parent).exists()
    assert wait_until(lambda: pids_with_marker(harness.marker) == [])


@needs_cgroups
@pytest.mark.parametrize("enforcement", ["limit", "share"])
async def test_actuator_applies_decisions_and_reports_state_and_cpu(
    harness: Harness, enforcement: Enforcement
) -> None:
    pool = harness.pool({"api": harness.spec()}, enforcement=enforcement)
    policy = ScalingPolicy(min_replicas=1, max_replicas=4, cpu=CpuPolicy(min=0.25, max=1.0))
    actuator = LocalActuator(pool, {"api": policy})

    def cap(decided: float) -> float:
        """limit: the decided CPU is the quota; share: cpu.max is."""
        return decided if enforcement == "limit" else 1.0

    def weight(decided: float) -> float:
        """limit: the decided CPU is the weight; share: the default (inside the service's)."""
        return decided if enforcement == "limit" else DEFAULT_WEIGHT_CORES

    async with pool:
        assert await until(lambda: pool.status("api").ready == 1)
        (first,) = pool.replica_cgroups("api")
        assert first.read_limit().cores == cap(0.25)
        assert first.read_limit().weight == weight_for(weight(0.25), first.layout.version)
        decision = Decision(
            service="api",
            at=1.0,
            replicas=2,
            cpu_per_replica_cores=0.5,
            allocated_cores=1.0,
            rule="stable",
        )
        await actuator.apply({"api": decision, "ghost": decision})
        assert await until(lambda: pool.status("api").ready == 2)
        state = (await actuator.current())["api"]
        assert (state.replicas, state.ready_replicas, state.cpu_per_replica_cores) == (2, 2, 0.5)
        assert state.cpu_cap_per_replica_cores == cap(0.5)
        assert state.cpu_limits_applied
        limits = [cg.read_limit() for cg in pool.replica_cgroups("api")]
        assert [lim.cores for lim in limits] == [cap(0.5), cap(0.5)]
        assert [lim.weight for lim in limits] == [weight_for(weight(0.5), first.layout.version)] * 2

        frozen = Decision(
            service="api",
            at=2.0,
            replicas=0,
            cpu_per_replica_cores=0.1,
            allocated_cores=0,
            rule="frozen: stale signals",
            frozen=True,
        )
        await actuator.apply({"api": frozen})
        assert pool.status("api").desired == 2

        address = pool.status("api").replicas[0].address or ""
        assert (await get(address, "/?cpu_ms=100")).status_code == 200
        signals = actuator.add_cpu_signals({"api": ServiceSignals(service="api", at=3.0)})
        assert signals["api"].cpu_seconds_total is not None
        assert signals["api"].cpu_seconds_total >= 0.1
        assert signals["api"].cpu_throttled_seconds_total is not None


@needs_cgroups
async def test_endpoint_source_yields_ready_replicas(harness: Harness) -> None:
    pool = harness.pool({"api": harness.spec()})
    source = LocalEndpointSource(pool)
    got: list[EndpointUpdate] = []

    async def watch() -> None:
        async for update in source.updates():
            got.append(update)

    async with pool:
        watcher = asyncio.create_task(watch())
        assert await until(lambda: bool(got))
        assert got[0] == EndpointUpdate(service="api", endpoints=())
        pool.scale("api", 1, 0.5)
        assert await until(lambda: len(got) >= 2)
        address = pool.status("api").replicas[0].address
        assert [e.address for e in got[-1].endpoints] == [address]
        assert got[-1].endpoints[0].ready
    await asyncio.wait_for(watcher, 10)  # the stream ends when the pool closes


async def test_without_cgroups_replicas_still_scale_and_cpu_is_not_applied(
    harness: Harness, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    info = tmp_path / "mountinfo"
    info.write_text("22 1 0:21 / / rw - overlay overlay rw\n")
    pool = harness.pool({"api": harness.spec()}, mountinfo_path=info)
    actuator = LocalActuator(pool)
    with caplog.at_level(logging.WARNING):
        async with pool:
            pool.scale("api", 1, 0.5)
            assert await until(lambda: pool.status("api").ready == 1)
            pool.set_cpu("api", 0.75)
            state = (await actuator.current())["api"]
            assert not state.cpu_limits_applied
            assert state.cpu_per_replica_cores == 0.75
            assert pool.cpu_totals("api").usage_s is None
            body = json.loads((await get(pool.endpoints("api")[0], "/")).text)
            assert body["pid"] == pool.status("api").replicas[0].pid
    warnings = [
        r.getMessage() for r in caplog.records if "CPU limits are NOT applied" in r.getMessage()
    ]
    assert len(warnings) == 1
    assert pool.status("api").replicas == ()
    assert all(r.phase is not ReplicaPhase.READY for r in pool.status("api").replicas)


@needs_cgroups
async def test_kill_now_stops_everything_without_restarts(harness: Harness) -> None:
    pool = harness.pool({"api": harness.spec()})
    async with pool:
        pool.scale("api", 2, 0.5)
        assert await until(lambda: pool.status("api").ready == 2)
        pids = [r.pid for r in pool.status("api").replicas]
        pool.kill_now()
        assert await until(lambda: not pool.status("api").replicas)
        assert not any(pid_alive(p) for p in pids if p is not None)
        pool.set_replicas("api", 1)  # refused: the pool was killed
        assert pool.status("api").desired == 0
        assert pool.status("api").restarts_total == 0


@needs_cgroups
async def test_a_failing_probe_withdraws_a_replica_without_restarting_it(
    harness: Harness, tmp_path: Path
) -> None:
    sick = tmp_path / "sick"
    server = str(ROOT / "tests" / "support" / "health_file_server.py")
    readiness = {"period_s": 0.05, "failure_threshold": 2}
    pool = harness.pool(
        {"s": harness.spec(["{python}", server, "{port}", str(sick)], readiness=readiness)}
    )
    async with pool:
        pool.scale("s", 1, 0.5)
        assert await until(lambda: pool.status("s").ready == 1)
        (replica,) = pool.status("s").replicas
        sick.touch()
        assert await until(lambda: pool.status("s").replicas[0].phase is ReplicaPhase.UNREADY)
        assert pool.endpoints("s") == ()
        assert pool.status("s").replicas[0].pid == replica.pid  # still running
        sick.unlink()
        assert await until(lambda: pool.status("s").ready == 1)
        assert pool.endpoints("s") == (replica.address,)
        assert pool.status("s").restarts_total == 0


@needs_cgroups
async def test_a_replica_never_ready_is_restarted_after_the_startup_timeout(
    harness: Harness, tmp_path: Path
) -> None:
    sick = tmp_path / "sick"
    sick.touch()
    server = str(ROOT / "tests" / "support" / "health_file_server.py")
    readiness = {"startup_timeout_s": 1.5}
    pool = harness.pool(
        {"s": harness.spec(["{python}", server, "{port}", str(sick)], readiness=readiness)}
    )
    async with pool:
        pool.scale("s", 1, 0.5)
        assert await until(lambda: pool.status("s").restarts_total >= 2)
        assert pool.endpoints("s") == ()
        sick.unlink()
        assert await until(lambda: pool.status("s").ready == 1)


@needs_cgroups
@pytest.mark.parametrize("enforcement", ["limit", "share"])
async def test_a_replica_limit_above_the_pool_cap_is_clamped_to_it(
    harness: Harness, enforcement: Enforcement
) -> None:
    pool = harness.pool({"api": harness.spec()}, total_cpu_cores=0.5, enforcement=enforcement)
    async with pool:
        pool.set_cpu_cap("api", 3.0)
        pool.scale("api", 1, 2.0)
        assert await until(lambda: pool.status("api").ready == 1)
        assert pool.cgroups is not None
        assert pool.cgroups.group.read_limit().cores == 0.5
        assert pool.replica_cgroups("api")[0].read_limit().cores == 0.5
        assert pool.status("api").cpu_cap_per_replica_cores == 0.5
        assert pool.status("api").cpu_applied
