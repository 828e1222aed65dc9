"""RBAC_RULES is exactly what Sluice asks of the API server: drive every feature, compare."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import yaml

from gateway.platforms.kubernetes.actuator import KubernetesActuator
from gateway.platforms.kubernetes.api import RBAC_RULES, KubeApi
from gateway.platforms.kubernetes.cache import WorkloadCache
from gateway.platforms.kubernetes.capacity import ClusterCapacity
from gateway.platforms.kubernetes.discovery import KubernetesDiscovery
from gateway.platforms.kubernetes.leader import LeaderElector
from gateway.platforms.kubernetes.model import Conflict, Workload
from gateway.settings import parse_settings
from scaler.decision import Decision
from tests.support.fake_kube import FakeKube
from tests.support.kube_objects import deployment, endpoint_slice, ingress, node, pod, service

CHART_CRD = (
    Path(__file__).resolve().parents[2] / "charts/sluice/crds/scalingpolicies.sluice.io.yaml"
)


async def test_every_call_is_covered_by_rbac_rules_and_every_rule_is_used() -> None:
    with FakeKube() as fake:
        fake.put(
            ingress(
                "web",
                [("shop.test", "/", "Prefix", "web", 80)],
                annotations={"sluice.io/max-replicas": "0"},
                tls=[(["shop.test"], "missing-tls")],  # a GET tells why it is not watched
            )
        )
        fake.put(service("web", [("http", 80), ("metrics", 9090)]))
        fake.put(
            service(
                "sluice", [("http", 80), ("admin", 9901)], namespace="sluice", lb=["198.51.100.1"]
            )
        )
        fake.put(
            endpoint_slice(
                "web-1", "web", [("10.0.0.1", {"ready": True})], [("http", 8080), ("metrics", 9090)]
            )
        )
        fake.put(deployment("web", 1))
        fake.put(deployment("db", 1, kind="StatefulSet"))
        fake.put(pod("web-1", "web", {"requests": {"cpu": "100m"}, "limits": {"cpu": "200m"}}))
        fake.put(pod("db-1", "db", {"requests": {"cpu": "100m"}, "limits": {"cpu": "200m"}}))
        fake.put(node("node-a", "4"))
        fake.put(yaml.safe_load(CHART_CRD.read_text()))
        fake.put(
            {
                "apiVersion": "sluice.io/v1alpha1",
                "kind": "ScalingPolicy",
                "metadata": {"name": "web", "namespace": "shop"},
                "spec": {"targetRef": {"service": "web"}, "target": 3},
            }
        )
        settings = parse_settings(
            {
                "platform": "kubernetes",
                "tls": {"certificates": [{"cert_file": "unused.pem", "key_file": "unused.key"}]},
            }
        )
        api = KubeApi.connect(host=fake.url)
        try:
            async with KubernetesDiscovery(api, settings) as disco:
                updates = disco.updates()
                async with asyncio.timeout(10):
                    first = await anext(updates)
                    assert first.endpoints
                    while (
                        not any(c.resource == "ingresses/status" for c in fake.requests)
                        or not fake.list("events")
                        or not disco.policy_objects.verdicts
                        or disco.tls is None
                        or not disco.tls.resolution.problems
                    ):
                        await asyncio.sleep(0.02)
                    assert fake.open_watches("scalingpolicies") == 1
                # the leader's status writes: a PUT of the status subresource, a GET after a
                # conflict
                seen = disco.policy_objects_by_key()["shop/web"]
                written = await api.update_scaling_policy_status(seen, {"observedGeneration": 1})
                await api.update_scaling_policy_status(written, {"observedGeneration": 1})
                with pytest.raises(Conflict):
                    await api.update_scaling_policy_status(seen, {"observedGeneration": 1})
                await api.get_scaling_policy("shop", "web")
            targets = {
                "shop/web": Workload("Deployment", "shop", "web"),
                "shop/db": Workload("StatefulSet", "shop", "db"),
            }
            leader = LeaderElector(api, "sluice", "sluice-scaler", "gw-a")
            assert await leader.try_acquire_or_renew()
            assert await leader.try_acquire_or_renew()
            act = KubernetesActuator(api, lambda: targets, leader=leader)
            await act.apply({s: Decision(s, 0.0, 2, 0.5, 1.0, "stable") for s in targets})
            await act.current()
            # the platform's actuator reads from watch caches of workloads and pods
            cache = WorkloadCache(api)
            cache.start()
            async with asyncio.timeout(10):
                while not cache.synced():
                    await asyncio.sleep(0.02)
            cached = KubernetesActuator(api, lambda: targets, leader=leader, cache=cache)
            await cached.current()
            # budget.cpu: auto watches the nodes (and every pod, through the cache)
            capacity = ClusterCapacity(api, cache, lambda: targets)
            capacity.start()
            async with asyncio.timeout(10):
                while capacity.budget_cpu().source.startswith("auto: waiting"):
                    await asyncio.sleep(0.02)
            # cpu_utilization reads metrics.k8s.io PodMetrics (metrics-server)
            fake.metrics_server = "up"
            fake.pod_cpu[("shop", "web-1")] = {"app": "50m"}
            assert [m.meta.name for m in await api.list_pod_metrics("shop", "app=web")] == ["web-1"]
            # a repeated Event updates the first one's count
            for _ in range(2):
                await api.create_event(targets["shop/web"].ref(), "Warning", "Same", "again")
        finally:
            await api.close()
        used = {(c.api_group, c.resource, c.verb) for c in fake.requests}
    allowed = {(r.api_group, r.resource, v) for r in RBAC_RULES for v in r.verbs}
    assert used == allowed
