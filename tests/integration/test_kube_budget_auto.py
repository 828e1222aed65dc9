"""``budget.cpu: auto`` on Kubernetes against the HTTP-level fake API server: the budget follows
nodes and pods through watches (one list, then a watch each: no polling), and the platform's
scaler sees it with its source."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from gateway.platforms.kubernetes.api import KubeApi
from gateway.platforms.kubernetes.cache import WorkloadCache
from gateway.platforms.kubernetes.capacity import ClusterCapacity
from gateway.platforms.kubernetes.model import Workload
from gateway.platforms.kubernetes.platform import KubernetesPlatform
from gateway.runtime import Runtime
from gateway.settings import parse_settings
from scaler.policy import BudgetCpu
from tests.support.fake_kube import FakeKube
from tests.support.kube_objects import deployment, node, pod

TIMEOUT_S = 15
WEB = {"shop/web": Workload("Deployment", "shop", "web")}


@pytest.fixture
def fake() -> Iterator[FakeKube]:
    with FakeKube() as f:
        yield f


async def until(pred: Callable[[], Any]) -> Any:
    async with asyncio.timeout(TIMEOUT_S):
        while not (value := pred()):
            await asyncio.sleep(0.02)
        return value


def cluster(fake: FakeKube) -> None:
    fake.put(node("node-a", "4"))
    fake.put(node("node-b", "2"))
    fake.put(node("node-c", "8"))  # runs no managed pod: not counted
    fake.put(deployment("web", 2))
    for i, where in enumerate(("node-a", "node-b")):
        fake.put(pod(f"web-{i}", "web", {"requests": {"cpu": "500m"}}, node=where))
    fake.put(pod("dns", "dns", {"requests": {"cpu": "250m"}}, namespace="kube-system"))
    fake.put(pod("big", "batch", {"requests": {"cpu": "3"}}, namespace="jobs", node="node-c"))


@pytest.mark.parametrize("namespaces", [[], ["shop"]], ids=["all-namespaces", "one-namespace"])
async def test_budget_follows_nodes_and_pods_through_watches(
    fake: FakeKube, namespaces: list[str]
) -> None:
    cluster(fake)
    api = KubeApi.connect(host=fake.url)
    try:
        cache = WorkloadCache(api, namespaces)
        capacity = ClusterCapacity(api, cache, lambda: WEB, reserved=0.5)
        assert capacity.budget_cpu().source.startswith("auto: waiting for the first list")
        cache.start()
        capacity.start()

        def cores() -> float:
            return capacity.budget_cpu().cores

        # node-a + node-b (6) minus dns on node-a (0.25) minus reserved 0.5
        assert await until(lambda: cores() == pytest.approx(5.25))
        assert capacity.budget_cpu().source == (
            "auto: 2 node(s), the nodes running managed pods, 6 allocatable minus 0.25 "
            "requested by 1 other pod(s) minus reserved 0.5"
        )
        # someone else's pod lands on node-b: less for the managed workloads
        fake.put(pod("cron", "cron", {"requests": {"cpu": "1"}}, namespace="jobs", node="node-b"))
        assert await until(lambda: cores() == pytest.approx(4.25))
        # it finishes: its request no longer counts
        done = pod("cron", "cron", {"requests": {"cpu": "1"}}, namespace="jobs", node="node-b")
        done["status"]["phase"] = "Succeeded"
        fake.put(done)
        assert await until(lambda: cores() == pytest.approx(5.25))
        # a managed replica is scheduled on node-c: its 8 cores and the batch pod's 3 count
        fake.put(pod("web-2", "web", {"requests": {"cpu": "500m"}}, node="node-c"))
        assert await until(lambda: cores() == pytest.approx(5.25 + 8 - 3))
        # node-b is resized (allocatable changes)
        fake.put(node("node-b", "6"))
        assert await until(lambda: cores() == pytest.approx(14.25))
        # a node goes NotReady: its CPU is gone
        fake.put(node("node-c", "8", ready=False))
        assert await until(lambda: cores() == pytest.approx(9.25))
    finally:
        await api.close()
    # watched, not polled: one list of nodes, and of all pods, however many changes
    lists = [c for c in fake.requests if c.verb == "list"]
    assert sum(c.resource == "nodes" for c in lists) == 1
    cluster_pod_lists = [c for c in lists if c.resource == "pods" and c.namespace is None]
    assert len(cluster_pod_lists) == 1
    assert not [c for c in fake.requests if c.verb == "get"]


async def test_the_platform_reports_the_measured_budget(fake: FakeKube) -> None:
    cluster(fake)
    settings = parse_settings(
        {
            "platform": "kubernetes",
            "budget": {"cpu": "auto"},
            "kubernetes": {"identity": "gw-a"},
        }
    )
    runtime = Runtime(settings)
    platform = KubernetesPlatform(settings, runtime, api=KubeApi.connect(host=fake.url))
    assert platform.budget_cpu() == BudgetCpu(
        0.0, "auto: waiting for the first list of nodes and pods"
    )
    await platform.control.__aenter__()
    try:
        budget = await until(lambda: platform.budget_cpu().cores and platform.budget_cpu())
        # no Ingress names a workload yet: every schedulable node (14) minus every pod (4.25)
        assert budget.cores == pytest.approx(9.75)
        assert "3 node(s), every schedulable node (no managed pod is scheduled yet)" in (
            budget.source
        )
    finally:
        await platform.stop()
