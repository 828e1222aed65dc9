"""cpu_utilization on Kubernetes through the fake API server's metrics.k8s.io (answering as
metrics-server does): missing while the API is not served (said once, never scaling down),
then the leader's engine scales the Deployment on the pods' measured CPU over the CPU they
hold; a Ready pod metrics-server has not measured yet does not count as idle."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from gateway.platforms.kubernetes.api import KubeApi
from gateway.platforms.kubernetes.platform import KubernetesControl
from gateway.settings import Settings, parse_settings
from scaler.decision import Decision
from scaler.engine import Engine
from scaler.loop import ScalerLoop
from scaler.signals import ServiceSignals
from tests.support.fake_kube import FakeKube
from tests.support.kube_objects import deployment, endpoint_slice, ingress, pod

TIMEOUT_S = 20
RES = {"requests": {"cpu": "500m"}, "limits": {"cpu": "500m"}}
POLICY = {
    "metrics": [{"type": "cpu_utilization", "target": 50, "stabilization_window_s": 0}],
    "min_replicas": 1,
    "max_replicas": 6,
    "cpu": {"min": 0.5, "max": 0.5},  # CPU per pod pinned: only the replica count moves
}


@pytest.fixture
def fake() -> Iterator[FakeKube]:
    with FakeKube() as f:
        yield f


def settings() -> Settings:
    return parse_settings(
        {
            "platform": "kubernetes",
            "budget": {"cpu": 8},
            "kubernetes": {
                "identity": "gw-a",
                "status_addresses": ["203.0.113.9"],
                "scaling_policies": False,
                "pod_metrics_interval_s": 1,
                "lease": {"duration_s": 2, "renew_deadline_s": 1.0, "retry_period_s": 0.1},
            },
        }
    )


def put_web(fake: FakeKube, policy: dict[str, Any]) -> None:
    """An Ingress for shop/web with ``policy`` in its annotation, a Deployment of 2 pods."""
    fake.put(
        ingress(
            "web",
            [("shop.test", "/", "Prefix", "web", 80)],
            annotations={"sluice.io/scaling": json.dumps(policy)},
        )
    )
    fake.put(deployment("web", 2))
    for i in range(2):
        fake.put(pod(f"web-{i}", "web", RES))
    fake.put(endpoint_slice("web-1", "web", [("10.0.0.1", {"ready": True})], [("http", 8080)]))


async def until(pred: Any) -> None:
    async with asyncio.timeout(TIMEOUT_S):
        while not pred():
            await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def leading(fake: FakeKube) -> AsyncIterator[tuple[KubernetesControl, ScalerLoop]]:
    """A gateway's Kubernetes control, once it leads and knows shop/web, and its scaler loop
    (its own signals: shop/web at 1 req/s)."""

    def own(at: float) -> dict[str, ServiceSignals]:
        return {"shop/web": ServiceSignals("shop/web", at, rps=1.0)}

    async with (
        httpx.AsyncClient() as http,
        KubernetesControl(
            settings(), http, api=KubeApi.connect(host=fake.url), own_signals=own
        ) as control,
    ):
        await until(
            lambda: control.elector.is_leader() and "shop/web" in control.discovery.policies()
        )
        engine = Engine(control.discovery.policies(), settings().budget)
        yield control, ScalerLoop(engine, control.signals, control.actuator)


def web_replicas(fake: FakeKube) -> int:
    return int((fake.get("deployments", "shop", "web") or {})["spec"]["replicas"])


async def tick_until(fake: FakeKube, loop: ScalerLoop, replicas: int) -> Decision:
    """Tick until shop/web's Deployment asks for ``replicas`` (at most 200 ticks)."""
    for _ in range(200):
        decision = (await loop.tick())["shop/web"]
        if web_replicas(fake) == replicas:
            break
        await asyncio.sleep(0.05)
    assert web_replicas(fake) == replicas, decision
    return decision


async def test_a_cpu_utilization_policy_scales_on_pod_metrics(
    fake: FakeKube, caplog: pytest.LogCaptureFixture
) -> None:
    put_web(fake, POLICY)
    caplog.set_level(logging.INFO, "gateway.platforms.kubernetes.pod_metrics")

    async with leading(fake) as (control, loop):
        # metrics.k8s.io not served (no metrics-server): the metric is missing, never scales
        await until(lambda: control.pod_metrics.polls >= 2)
        for _ in range(3):
            decision = (await loop.tick())["shop/web"]
            await asyncio.sleep(0.05)
        assert decision.replicas == 2 and web_replicas(fake) == 2
        assert any("cpu_utilization has no data" in r for r in decision.reasons), decision
        said = [r for r in caplog.records if "metrics.k8s.io API is not served" in r.message]
        assert len(said) == 1
        assert control.pod_metrics.report()["absent"]

        # metrics-server up: 450m used of 500m held per pod = 90 % against 50 % -> 4 pods
        fake.pod_cpu = {("shop", "web-0"): {"app": "450m"}, ("shop", "web-1"): {"app": "450m"}}
        fake.metrics_server = "up"
        decision = await tick_until(fake, loop, 4)
        assert decision.inputs["metric.cpu_utilization"] == pytest.approx(90.0, abs=1.0)
        assert any("answers again" in r.message for r in caplog.records)

        # the new pods are Ready but not measured yet (absent from the list): they count at
        # the measured pods' average, not as idle, so nothing scales down
        for i in range(2, 4):
            fake.put(pod(f"web-{i}", "web", RES))
        await until(lambda: len(control.cache.pods("shop", "app=web")) == 4)
        for _ in range(3):
            await asyncio.sleep(1.0)  # a new poll each time
            decision = (await loop.tick())["shop/web"]
        report = control.pod_metrics.report()["services"]["shop/web"]
        assert report == {"cores": pytest.approx(1.8), "measured_pods": 2, "ready_pods": 4}
        assert decision.replicas >= 4 and web_replicas(fake) >= 4

    # one list per namespace per poll, with the workload's selector (one workload there)
    lists = [c for c in fake.requests if c.api_group == "metrics.k8s.io"]
    assert lists and {(c.verb, c.resource, c.namespace) for c in lists} == {
        ("list", "pods", "shop")
    }


async def test_the_hpa_shorthand_metric_cpu_is_measured_from_pod_metrics_too(
    fake: FakeKube,
) -> None:
    # mode: hpa, metric: cpu (what sluice.io/mode + sluice.io/metric annotations write) is the
    # same CPU utilisation as a cpu_utilization entry: polled, not left missing for good.
    policy = {
        "mode": "hpa",
        "metric": "cpu",
        "target": 50,
        "min_replicas": 1,
        "max_replicas": 6,
        "cpu": {"min": 0.5, "max": 0.5},
    }
    put_web(fake, policy)
    fake.pod_cpu = {("shop", "web-0"): {"app": "450m"}, ("shop", "web-1"): {"app": "450m"}}
    fake.metrics_server = "up"

    async with leading(fake) as (control, loop):
        assert control.cpu_measured_services() == ["shop/web"]

        # 450m used of 500m held per pod = 90 % against 50 % -> 4 pods
        decision = await tick_until(fake, loop, 4)
        assert decision.inputs["cpu_used_cores"] == pytest.approx(0.9, abs=0.05)  # 2 × 450m
        assert control.pod_metrics.report()["services"]["shop/web"]["measured_pods"] == 2


async def test_a_service_not_scaled_on_cpu_has_its_cpu_use_measured_too(fake: FakeKube) -> None:
    # the default KPA policy: the scaler sizes its CPU from what its pods use and starts
    # replicas into idle CPU on it, as on the local platform; PodMetrics are its only source
    put_web(fake, {"min_replicas": 1, "max_replicas": 6})
    fake.pod_cpu = {("shop", "web-0"): {"app": "300m"}, ("shop", "web-1"): {"app": "200m"}}
    fake.metrics_server = "up"

    async with leading(fake) as (control, loop):
        assert control.cpu_measured_services() == ["shop/web"]
        await until(lambda: control.pod_metrics.polls >= 1)
        for _ in range(3):  # the rate needs two ticks of the counter
            decision = (await loop.tick())["shop/web"]
            await asyncio.sleep(0.05)
        assert decision.inputs["cpu_used_cores"] == pytest.approx(0.5, abs=0.05)
        assert control.pod_metrics.report()["services"]["shop/web"]["measured_pods"] == 2
