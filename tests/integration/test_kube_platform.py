"""The whole Kubernetes loop on a fake API: two gateway replicas, one leader, merged signals,
the real scaler engine deciding, the leader's actuator applying; failover to the other."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from gateway.platforms.kubernetes.api import KubeApi
from gateway.platforms.kubernetes.model import Workload, format_cpu
from gateway.platforms.kubernetes.platform import KubernetesControl
from gateway.settings import Settings, parse_settings, resolve_enforcement
from scaler.engine import Engine
from scaler.loop import ScalerLoop
from scaler.signals import ServiceSignals
from tests.support.fake_kube import FakeKube
from tests.support.kube_objects import deployment, endpoint_slice, ingress, pod
from tests.support.signal_peer import SignalPeer

TIMEOUT_S = 15


@pytest.fixture
def fake() -> Iterator[FakeKube]:
    with FakeKube() as f:
        yield f


def settings(identity: str) -> Settings:
    return parse_settings(
        {
            "platform": "kubernetes",
            "budget": {"cpu": 4},
            "kubernetes": {
                "identity": identity,
                "status_addresses": ["203.0.113.9"],
                "lease": {"duration_s": 2, "renew_deadline_s": 1.0, "retry_period_s": 0.1},
            },
        }
    )


async def until(pred: Any) -> None:
    async with asyncio.timeout(TIMEOUT_S):
        while not pred():
            await asyncio.sleep(0.02)


async def test_leader_scales_from_merged_signals_and_the_other_takes_over(fake: FakeKube) -> None:
    fake.put(
        ingress(
            "web",
            [("shop.test", "/", "Prefix", "web", 80)],
            annotations={
                "sluice.io/target": "4",
                "sluice.io/max-replicas": "8",
                "sluice.io/cpu-max": "0.5",
            },
        )
    )
    fake.put(deployment("web", 1))
    guaranteed = {
        "requests": {"cpu": "100m", "memory": "64Mi"},
        "limits": {"cpu": "100m", "memory": "64Mi"},
    }
    fake.put(pod("web-1", "web", guaranteed))
    fake.put(endpoint_slice("web-1", "web", [("10.0.0.1", {"ready": True})], [("http", 8080)]))
    budget = resolve_enforcement(settings("gw-a")).budget  # as the gateway resolves it
    with SignalPeer() as peer_a, SignalPeer() as peer_b:
        for name, peer in (("sluice-a", peer_a), ("sluice-b", peer_b)):
            fake.put(
                endpoint_slice(
                    name,
                    "sluice",
                    [("localhost", {"ready": True})],
                    [("admin", peer.port)],
                    namespace="sluice",
                )
            )
        async with httpx.AsyncClient() as http, contextlib.AsyncExitStack() as stack_b:
            stack_a = contextlib.AsyncExitStack()
            a = await stack_a.enter_async_context(
                KubernetesControl(settings("gw-a"), http, api=KubeApi.connect(host=fake.url))
            )
            b = await stack_b.enter_async_context(
                KubernetesControl(settings("gw-b"), http, api=KubeApi.connect(host=fake.url))
            )
            stacks = {id(a): stack_a, id(b): stack_b}
            try:
                await until(
                    lambda: (
                        (a.elector.is_leader() or b.elector.is_leader())
                        and all(len(p.discovery.peer_admin_addresses()) == 2 for p in (a, b))
                        and all("shop/web" in p.discovery.policies() for p in (a, b))
                    )
                )
                leader, follower = (a, b) if a.elector.is_leader() else (b, a)
                assert not follower.elector.is_leader()
                assert await follower.signals(0.0) == {}  # followers decide nothing

                loops = {
                    id(p): ScalerLoop(Engine(p.discovery.policies(), budget), p.signals, p.actuator)
                    for p in (a, b)
                }
                decision = None
                for _ in range(40):
                    now = asyncio.get_running_loop().time()
                    # each gateway replica sees part of the load: 12 + 18 in flight
                    peer_a.signals = [
                        ServiceSignals("shop/web", now, in_flight=12, arrivals_total=100, rps=20)
                    ]
                    peer_b.signals = [
                        ServiceSignals("shop/web", now, in_flight=18, arrivals_total=200, rps=30)
                    ]
                    assert (await leader.signals())["shop/web"].in_flight == 30
                    # the follower's loop sees no signals: frozen, and its actuator writes nothing
                    followed = await loops[id(follower)].tick()
                    assert followed["shop/web"].frozen
                    decision = (await loops[id(leader)].tick())["shop/web"]
                    if decision.replicas > 1:
                        break
                    await asyncio.sleep(0.05)
                assert decision is not None and decision.replicas > 1, decision
                # told something else directly, the follower's actuator still writes nothing
                await follower.actuator.apply(
                    {"shop/web": dataclasses.replace(decision, replicas=7)}
                )
                web = fake.get("deployments", "shop", "web") or {}
                assert web["spec"]["replicas"] == decision.replicas
                limits = (fake.get("pods", "shop", "web-1") or {})["spec"]["containers"][0][
                    "resources"
                ]["limits"]
                assert limits["cpu"] == format_cpu(decision.cpu_per_replica_cores)
                scaled = [e for e in fake.list("events") if e["reason"] == "Scaled"]
                assert scaled and decision.rule in scaled[-1]["message"]
                # enforcement: auto is share on kubernetes; web-1 is Guaranteed, so it keeps
                # requests = limits (said once in a ResizeLimited Event) and its service is
                # reported capped: the engine decides for it as under limit
                assert leader.actuator.enforcement == "share"
                assert any(e["reason"] == "ResizeLimited" for e in fake.list("events"))
                assert (await leader.actuator.current())["shop/web"].cpu_capped

                # the leader goes away (releases the Lease): the other takes over and actuates
                await stacks.pop(id(leader)).aclose()
                await until(follower.elector.is_leader)
                fake.put(deployment("web", 1))
                # the actuator reads the workload from its watch cache: wait until it shows this
                web_ref = Workload("Deployment", "shop", "web")
                await until(
                    lambda: (
                        (s := follower.cache.scale(web_ref)) is not None and s.spec_replicas == 1
                    )
                )
                await follower.actuator.apply({"shop/web": decision})
                assert (fake.get("deployments", "shop", "web") or {})["spec"][
                    "replicas"
                ] == decision.replicas
            finally:
                for stack in stacks.values():
                    if stack is not stack_b:
                        await stack.aclose()
