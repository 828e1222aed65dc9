"""Lease leader election: two contenders, one leader, failover; the actuator obeys it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

import pytest

from gateway.platforms.kubernetes.actuator import KubernetesActuator
from gateway.platforms.kubernetes.api import KubeApi
from gateway.platforms.kubernetes.leader import LeaderElector
from gateway.platforms.kubernetes.model import Workload
from scaler.decision import Decision
from tests.support.fake_kube import FakeKube
from tests.support.kube_objects import deployment


class ManualClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def fake() -> Iterator[FakeKube]:
    with FakeKube() as f:
        yield f


def elector(api: KubeApi, identity: str, clock: ManualClock) -> LeaderElector:
    return LeaderElector(
        api,
        "sluice",
        "sluice-scaler",
        identity,
        lease_duration_s=15,
        renew_deadline_s=10,
        retry_period_s=2,
        clock=clock,
    )


async def test_one_leader_and_failover_when_the_leader_stops_renewing(fake: FakeKube) -> None:
    clock = ManualClock()
    api = KubeApi.connect(host=fake.url)
    try:
        a, b = elector(api, "gw-a", clock), elector(api, "gw-b", clock)
        assert await a.try_acquire_or_renew()
        assert not await b.try_acquire_or_renew()
        assert a.is_leader() and not b.is_leader()
        lease = fake.get("leases", "sluice", "sluice-scaler")
        assert lease is not None
        assert lease["spec"]["holderIdentity"] == "gw-a"
        assert lease["spec"]["leaseDurationSeconds"] == 15
        assert lease["spec"]["leaseTransitions"] == 0

        # a renews within the lease; b keeps waiting
        clock.now += 8
        assert await a.try_acquire_or_renew()
        clock.now += 8
        assert not await b.try_acquire_or_renew()  # saw a renewal 8 s ago (its own clock)

        # a stops renewing: it stops leading after renew_deadline, before b may take over
        clock.now += 10
        assert not a.is_leader()
        assert not await b.try_acquire_or_renew()  # only 10 s since b saw the last change
        clock.now += 6
        assert await b.try_acquire_or_renew()
        assert b.is_leader() and not a.is_leader()
        lease = fake.get("leases", "sluice", "sluice-scaler")
        assert lease is not None
        assert lease["spec"]["holderIdentity"] == "gw-b"
        assert lease["spec"]["leaseTransitions"] == 1

        # a comes back: it sees b's lease and stays a follower
        assert not await a.try_acquire_or_renew()
        assert not a.is_leader()
        # every write carried the read resourceVersion; lease verbs are exactly get/create/update
        assert {c.verb for c in fake.requests if c.resource == "leases"} == {
            "get",
            "create",
            "update",
        }
    finally:
        await api.close()


async def test_holder_is_who_leads_as_each_candidate_last_saw_the_lease(fake: FakeKube) -> None:
    """A follower knows the leader (to tell it of a request held at zero): the holder while
    the record it saw change is younger than the Lease's duration, then nobody."""
    clock = ManualClock()
    api = KubeApi.connect(host=fake.url)
    try:
        a, b = elector(api, "gw-a", clock), elector(api, "gw-b", clock)
        assert b.holder() is None  # has not read the Lease yet
        assert await a.try_acquire_or_renew()
        assert a.holder() == "gw-a"
        assert not await b.try_acquire_or_renew()
        assert b.holder() == "gw-a"

        clock.now += 8
        assert await a.try_acquire_or_renew()
        clock.now += 8
        assert not await b.try_acquire_or_renew()  # saw the renewal
        assert b.holder() == "gw-a"

        # a stops renewing: 15 s after b saw the last change, nobody leads as b sees it
        clock.now += 14.9
        assert b.holder() == "gw-a"
        clock.now += 0.2
        assert b.holder() is None
        assert await b.try_acquire_or_renew()
        assert b.holder() == "gw-b"
        assert not await a.try_acquire_or_renew()
        assert a.holder() == "gw-b"
    finally:
        await api.close()


async def test_racing_candidates_one_wins_by_conflict(fake: FakeKube) -> None:
    clock = ManualClock()
    api = KubeApi.connect(host=fake.url)
    try:
        a, b = elector(api, "gw-a", clock), elector(api, "gw-b", clock)
        assert await a.try_acquire_or_renew()
        await a.release()
        assert not a.is_leader()
        results = await asyncio.gather(a.try_acquire_or_renew(), b.try_acquire_or_renew())
        assert sorted(results) == [False, True]
        assert a.is_leader() != b.is_leader()
    finally:
        await api.close()


async def test_only_the_leader_actuates_and_stops_at_once(fake: FakeKube) -> None:
    fake.put(deployment("web", 1))
    clock = ManualClock()
    api = KubeApi.connect(host=fake.url)
    try:
        a, b = elector(api, "gw-a", clock), elector(api, "gw-b", clock)
        target = {"shop/web": Workload("Deployment", "shop", "web")}
        act_a = KubernetesActuator(api, lambda: target, leader=a)
        act_b = KubernetesActuator(api, lambda: target, leader=b)
        await a.try_acquire_or_renew()
        await b.try_acquire_or_renew()

        def d(n: int) -> dict[str, Decision]:
            return {"shop/web": Decision("shop/web", 0.0, n, 0.5, n * 0.5, "stable")}

        await act_b.apply(d(5))
        assert fake.get("deployments", "shop", "web")["spec"]["replicas"] == 1  # type: ignore[index]
        await act_a.apply(d(3))
        assert fake.get("deployments", "shop", "web")["spec"]["replicas"] == 3  # type: ignore[index]
        # a has not renewed for longer than renew_deadline: it stops actuating at once
        clock.now += 10.5
        await act_a.apply(d(7))
        assert fake.get("deployments", "shop", "web")["spec"]["replicas"] == 3  # type: ignore[index]
    finally:
        await api.close()


async def test_two_run_loops_elect_exactly_one_and_fail_over(fake: FakeKube) -> None:
    api = KubeApi.connect(host=fake.url)
    kw = {"lease_duration_s": 2, "renew_deadline_s": 1.0, "retry_period_s": 0.1}
    a = LeaderElector(api, "sluice", "l", "gw-a", **kw)  # type: ignore[arg-type]
    b = LeaderElector(api, "sluice", "l", "gw-b", **kw)  # type: ignore[arg-type]
    ta, tb = asyncio.create_task(a.run()), asyncio.create_task(b.run())
    try:
        async with asyncio.timeout(10):
            while not (a.is_leader() or b.is_leader()):
                await asyncio.sleep(0.05)
        assert a.is_leader() != b.is_leader()
        leader_task, follower = (ta, b) if a.is_leader() else (tb, a)
        leader_task.cancel()  # stops and releases the lease
        with contextlib.suppress(asyncio.CancelledError):
            await leader_task
        async with asyncio.timeout(10):
            while not follower.is_leader():
                await asyncio.sleep(0.05)
    finally:
        for t in (ta, tb):
            t.cancel()
        await asyncio.gather(ta, tb, return_exceptions=True)
        await api.close()
