"""The ScalingPolicy resource against the HTTP-level fake API server: the chart's CRD installed,
policies created as kubectl would (the API server validating them from the generated schema),
the leader writing each policy's status through the status subresource, on change only, and
the printer columns ``kubectl get scalingpolicies`` shows."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from gateway.platforms.kubernetes.api import KubeApi
from gateway.platforms.kubernetes.model import format_cpu
from gateway.platforms.kubernetes.platform import KubernetesPlatform
from gateway.runtime import Runtime
from gateway.settings import Settings, parse_settings
from scaler.engine import Engine
from scaler.loop import ScalerLoop
from scaler.signals import ServiceSignals
from tests.support.fake_kube import FakeKube
from tests.support.kube_objects import deployment, endpoint_slice, ingress, pod

ROOT = Path(__file__).resolve().parents[2]
CHART_CRD = ROOT / "charts" / "sluice" / "crds" / "scalingpolicies.sluice.io.yaml"
POLICIES = "/apis/sluice.io/v1alpha1/namespaces/shop/scalingpolicies"
TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"
TIMEOUT_S = 15


@pytest.fixture
def fake() -> Iterator[FakeKube]:
    with FakeKube() as f:
        yield f


async def until(pred: Callable[[], Any]) -> Any:
    async with asyncio.timeout(TIMEOUT_S):
        while not (value := pred()):
            await asyncio.sleep(0.02)
        return value


def install_crd(http: httpx.Client) -> None:
    """As ``kubectl apply -f charts/sluice/crds/`` (Helm installs crds/ the same way)."""
    crd = yaml.safe_load(CHART_CRD.read_text())
    r = http.post("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", json=crd)
    assert r.status_code == 201, r.text


def policy(name: str, service: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "sluice.io/v1alpha1",
        "kind": "ScalingPolicy",
        "metadata": {"name": name, "namespace": "shop"},
        "spec": {"targetRef": {"service": service}, **spec},
    }


def test_the_api_server_enforces_the_generated_schema(fake: FakeKube) -> None:
    with httpx.Client(base_url=fake.url, timeout=10) as http:
        install_crd(http)
        ok = policy("web", "web", target=4, max_replicas=8, cpu={"max": 0.5}, bogus=1)
        ok["status"] = {"desiredReplicas": 99}
        created = http.post(POLICIES, json=ok)
        assert created.status_code == 201, created.text
        body = created.json()
        assert "bogus" not in body["spec"], "unknown fields are pruned"
        assert "status" not in body, "status is set only through the status subresource"
        assert body["metadata"]["generation"] == 1
        refused = {
            "min > max (CEL)": policy("a", "web", min_replicas=5, max_replicas=2),
            "min > default max (CEL)": policy("b", "web", min_replicas=20),
            "cpu.min > cpu.max (CEL)": policy("c", "web", cpu={"min": 2, "max": 1}),
            "enum": policy("d", "web", mode="fast"),
            "bound": policy("e", "web", target=0),
            "type": policy("f", "web", max_replicas="many"),
            "pattern": policy("g", "Web_1"),
            "required": {**policy("h", "web"), "spec": {"target": 3}},
        }
        for why, obj in refused.items():
            r = http.post(POLICIES, json=obj)
            assert r.status_code == 422, (why, r.text)
            assert r.json()["reason"] == "Invalid", why
        assert (
            "max_replicas must be >= min_replicas"
            in http.post(POLICIES, json=refused["min > max (CEL)"]).json()["message"]
        )
        # an update that breaks the rule is refused too; the object keeps its spec
        current = http.get(f"{POLICIES}/web").json()
        current["spec"]["min_replicas"] = 9
        assert http.put(f"{POLICIES}/web", json=current).status_code == 422


async def test_leader_writes_status_and_conflicts_are_reported(fake: FakeKube) -> None:
    with httpx.Client(base_url=fake.url, timeout=10) as http:
        install_crd(http)
        for obj in (
            policy("web", "web", target=4, max_replicas=3, cpu={"max": 0.5}),
            policy("web-again", "web", target=9),  # newer, same Service: conflicts
            policy("nowhere", "nope", target=2),  # no Ingress routes to it
            policy("hpa-cpu", "api", metric="cpu", mode="kpa"),  # valid for the API server only
        ):
            assert http.post(POLICIES, json=obj).status_code == 201
    fake.put(ingress("web", [("shop.test", "/", "Prefix", "web", 80)]))
    fake.put(ingress("api", [("api.test", "/", "Prefix", "api", 80)]))
    fake.put(deployment("web", 1))
    fake.put(pod("web-1", "web", {"requests": {"cpu": "100m"}, "limits": {"cpu": "100m"}}))
    fake.put(endpoint_slice("web-1", "web", [("10.0.0.1", {"ready": True})], [("http", 8080)]))

    platform, follower = gateway(fake, "gw-a"), None
    control = platform.control
    load = {"in_flight": 40.0}

    def signals() -> dict[str, ServiceSignals]:
        now = asyncio.get_running_loop().time()
        return {"shop/web": ServiceSignals("shop/web", now, in_flight=load["in_flight"])}

    loop = ScalerLoop(Engine({}, platform.settings.budget), signals, platform.actuator)
    await platform.start(loop)
    try:
        await until(lambda: control.elector.is_leader() and "shop/web" in platform.policies())
        in_force = platform.policies()["shop/web"]
        assert (in_force.target, in_force.max_replicas) == (4, 3), "the ScalingPolicy's fields"
        assert "shop/api" not in platform.policies(), "an invalid policy is not used"
        loop.engine = Engine(platform.policies(), platform.settings.budget)
        decision = (await loop.tick())["shop/web"]
        assert decision.replicas == 3  # 40 in flight / 4 per replica, held to max_replicas

        def status(name: str) -> dict[str, Any]:
            return (fake.get("scalingpolicies", "shop", name) or {}).get("status") or {}

        written = await until(lambda: status("web").get("desiredReplicas") and status("web"))
        assert written["service"] == "shop/web"
        assert written["currentReplicas"] == 1
        assert written["cpuPerReplica"] == format_cpu(decision.cpu_per_replica_cores)
        assert written["metric"] == "concurrency" and written["rule"] == decision.rule
        assert written["reasons"] and written["observedGeneration"] == 1
        assert written["budget"] == "4 cores (budget.cpu)"
        conditions = {c["type"]: c for c in written["conditions"]}
        assert conditions["Ready"]["status"] == "True"
        assert conditions["Active"]["status"] == "True", written
        assert conditions["Limited"]["status"] == "True", (written["reasons"], conditions)
        assert conditions["Limited"]["reason"] == "MaxReplicas"
        assert conditions["ResizeBlocked"]["status"] == "False"

        verdicts = {
            "web-again": "Conflict",
            "nowhere": "NotRouted",
            "hpa-cpu": "InvalidSpec",
        }
        for name, reason in verdicts.items():
            got = await until(lambda name=name: status(name).get("conditions") and status(name))
            ready = got["conditions"][0]
            assert (ready["type"], ready["status"], ready["reason"]) == ("Ready", "False", reason)
        warnings = {
            (e["involvedObject"]["name"], e["reason"])
            for e in fake.list("events")
            if e["type"] == "Warning" and e["involvedObject"]["kind"] == "ScalingPolicy"
        }
        assert warnings == {(n, r) for n, r in verdicts.items()}
        assert (
            "metric: cpu utilisation is an HPA metric"
            in status("hpa-cpu")["conditions"][0]["message"]
        )

        # only on change: more rounds with the same decision write nothing
        assert platform.status_writer is not None
        puts = len([c for c in fake.requests if c.resource == "scalingpolicies/status"])
        for _ in range(3):
            await loop.tick()
            assert await platform.status_writer.sync() == 0
        assert len([c for c in fake.requests if c.resource == "scalingpolicies/status"]) == puts

        # a follower writes no status at all
        follower = gateway(fake, "gw-b")
        await follower.start(
            ScalerLoop(Engine({}, follower.settings.budget), dict, follower.actuator)
        )
        await until(lambda: "shop/web" in follower.policies())
        assert not follower.control.elector.is_leader()
        assert follower.status_writer is not None and await follower.status_writer.sync() == 0

        # the policy changes: the engine picks it up on the next tick, the status follows
        with httpx.Client(base_url=fake.url, timeout=10) as http:
            current = http.get(f"{POLICIES}/web").json()
            current["spec"]["max_replicas"] = 6
            assert http.put(f"{POLICIES}/web", json=current).status_code == 200
        await until(lambda: platform.policies()["shop/web"].max_replicas == 6)
        await until(lambda: status("web").get("observedGeneration") == 2)

        # kubectl get scalingpolicies: the printer columns
        with httpx.Client(base_url=fake.url, timeout=10) as http:
            table = http.get(POLICIES, headers={"Accept": TABLE}).json()
        names = [c["name"] for c in table["columnDefinitions"]]
        assert names == [
            "Name",
            "Target",
            "Metric",
            "Value",
            "Replicas",
            "Desired",
            "CPU",
            "Ready",
            "Age",
        ]
        row = next(r["cells"] for r in table["rows"] if r["cells"][0] == "web")
        assert row[1:4] == ["web", "concurrency", written["metricValue"]]
        assert row[5] == status("web")["desiredReplicas"] and row[7] == "True"
    finally:
        if follower is not None:
            await follower.stop()
        await platform.stop()


def gateway(fake: FakeKube, identity: str) -> KubernetesPlatform:
    settings: Settings = parse_settings(
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
    return KubernetesPlatform(settings, Runtime(settings), api=KubeApi.connect(host=fake.url))
