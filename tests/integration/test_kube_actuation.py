"""/scale and in-place /resize through the real client against the fake API server."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from gateway.platforms.kubernetes.actuator import KubernetesActuator
from gateway.platforms.kubernetes.api import KubeApi
from gateway.platforms.kubernetes.cache import WorkloadCache
from gateway.platforms.kubernetes.model import ContainerResources, KubeError, Workload
from scaler.decision import Decision
from tests.support.fake_kube import FakeKube, qos_class
from tests.support.kube_objects import deployment, pod

WEB = Workload("Deployment", "shop", "web")


@pytest.fixture
def fake() -> Iterator[FakeKube]:
    with FakeKube() as f:
        yield f


def decision(replicas: int, cpu: float, rule: str = "stable") -> Decision:
    return Decision(
        service="shop/web",
        at=1.0,
        replicas=replicas,
        cpu_per_replica_cores=cpu,
        allocated_cores=replicas * cpu,
        rule=rule,
        reasons=("concurrency 14 over target 7 per replica",),
    )


def events(fake: FakeKube, reason: str) -> list[dict[str, Any]]:
    return [e for e in fake.list("events") if e["reason"] == reason]


def cpu_of(fake: FakeKube, name: str, where: str = "spec") -> dict[str, Any]:
    p = fake.get("pods", "shop", name)
    assert p is not None
    if where == "spec":
        return p["spec"]["containers"][0]["resources"]
    return p["status"]["containerStatuses"][0]["resources"]


async def test_scale_and_resize_applied_only_when_status_shows_it(fake: FakeKube) -> None:
    guaranteed = {
        "requests": {"cpu": "500m", "memory": "128Mi"},
        "limits": {"cpu": "500m", "memory": "128Mi"},
    }
    burstable = {"requests": {"cpu": "250m"}, "limits": {"cpu": "500m"}}
    fake.put(deployment("web", 2))
    fake.put(pod("web-1", "web", guaranteed))
    fake.put(pod("web-2", "web", burstable))
    fake.put(pod("other", "other", guaranteed))
    api = KubeApi.connect(host=fake.url)
    try:
        act = KubernetesActuator(api, lambda: {"shop/web": WEB})
        before = (await act.current())["shop/web"]
        assert (before.replicas, before.ready_replicas, before.cpu_per_replica_cores) == (2, 2, 0.5)

        await act.apply({"shop/web": decision(3, 1.0)})
        assert fake.get("deployments", "shop", "web")["spec"]["replicas"] == 3  # type: ignore[index]
        # desired resources changed in place, QoS kept
        assert cpu_of(fake, "web-1") == {
            "requests": {"cpu": "1000m", "memory": "128Mi"},
            "limits": {"cpu": "1000m", "memory": "128Mi"},
        }
        assert cpu_of(fake, "web-2") == {"requests": {"cpu": "500m"}, "limits": {"cpu": "1000m"}}
        assert qos_class(fake.get("pods", "shop", "web-1") or {}) == "Guaranteed"
        assert cpu_of(fake, "other")["limits"]["cpu"] == "500m"
        # not applied until the kubelet reports it
        state = (await act.current())["shop/web"]
        assert state.replicas == 3
        assert state.cpu_per_replica_cores == 0.5
        fake.kubelet_resize("shop", "web-1")
        assert (await act.current())["shop/web"].cpu_per_replica_cores == 0.5  # web-2 still old
        fake.kubelet_resize("shop", "web-2")
        state = (await act.current())["shop/web"]
        assert state.cpu_per_replica_cores == 1.0
        assert not state.resize_blocked
        assert not state.cpu_capped  # limit: every service is decided as under limit anyway

        (scaled,) = events(fake, "Scaled")
        assert scaled["involvedObject"] == {
            "kind": "Deployment",
            "apiVersion": "apps/v1",
            "namespace": "shop",
            "name": "web",
        }
        assert "replicas 2 -> 3" in scaled["message"]
        assert "concurrency 14 over target 7 per replica" in scaled["message"]
        (resized,) = events(fake, "Resized")
        assert "cpu per replica -> 1000m on 2 pod(s)" in resized["message"]

        # the same decision again changes nothing and records nothing
        writes = len([c for c in fake.requests if c.verb == "patch"])
        await act.apply({"shop/web": decision(3, 1.0)})
        assert len([c for c in fake.requests if c.verb == "patch"]) == writes
        # resize went through pods/resize only, as strategic merge patches
        patches = {(c.resource, c.content_type) for c in fake.requests if c.verb == "patch"}
        assert patches == {
            ("deployments/scale", "application/merge-patch+json"),
            ("pods/resize", "application/strategic-merge-patch+json"),
        }
    finally:
        await api.close()


@pytest.mark.parametrize("reason", ["Infeasible", "Deferred"])
async def test_resize_pending_blocks_and_is_reported(fake: FakeKube, reason: str) -> None:
    res = {"requests": {"cpu": "500m"}, "limits": {"cpu": "500m"}}
    fake.put(deployment("web", 1))
    fake.put(pod("web-1", "web", res))
    api = KubeApi.connect(host=fake.url)
    try:
        act = KubernetesActuator(api, lambda: {"shop/web": WEB})
        await act.apply({"shop/web": decision(1, 4.0)})
        fake.kubelet_resize("shop", "web-1", outcome=reason)
        state = (await act.current())["shop/web"]
        assert state.resize_blocked
        assert state.cpu_per_replica_cores == 0.5
        (warning,) = events(fake, "ResizeBlocked")
        assert warning["type"] == "Warning"
        assert f"resize {reason}" in warning["message"]
        await act.current()
        assert len(events(fake, "ResizeBlocked")) == 1  # reported once
    finally:
        await api.close()


async def test_besteffort_pods_are_never_resized(fake: FakeKube) -> None:
    fake.put(deployment("web", 1))
    fake.put(pod("web-1", "web", {}))
    api = KubeApi.connect(host=fake.url)
    try:
        act = KubernetesActuator(api, lambda: {"shop/web": WEB})
        await act.apply({"shop/web": decision(1, 1.0)})
        assert cpu_of(fake, "web-1") == {}
        assert not [c for c in fake.requests if c.resource == "pods/resize"]
        assert (await act.current())["shop/web"].resize_blocked
    finally:
        await api.close()


async def test_statefulset_scale_and_frozen_decisions_untouched(fake: FakeKube) -> None:
    fake.put(deployment("db", 1, kind="StatefulSet"))
    api = KubeApi.connect(host=fake.url)
    try:
        target = Workload("StatefulSet", "shop", "db")
        act = KubernetesActuator(api, lambda: {"shop/web": target})
        frozen = Decision("shop/web", 1.0, 0, 0.1, 0.0, "frozen: stale signals", frozen=True)
        await act.apply({"shop/web": frozen})
        assert fake.get("statefulsets", "shop", "db")["spec"]["replicas"] == 1  # type: ignore[index]
        await act.apply({"shop/web": decision(4, 0.5)})
        assert fake.get("statefulsets", "shop", "db")["spec"]["replicas"] == 4  # type: ignore[index]
    finally:
        await api.close()


async def test_a_plain_pod_patch_of_resources_is_rejected_by_the_api(fake: FakeKube) -> None:
    """The fake enforces what the real API does, so the actuator cannot cheat."""
    import kubernetes

    guaranteed = {
        "requests": {"cpu": "500m", "memory": "64Mi"},
        "limits": {"cpu": "500m", "memory": "64Mi"},
    }
    fake.put(pod("web-1", "web", guaranteed))
    api = KubeApi.connect(host=fake.url)
    try:
        body = {
            "spec": {
                "containers": [
                    {"name": "app", "resources": {"limits": {"cpu": "1"}, "requests": {"cpu": "1"}}}
                ]
            }
        }
        with pytest.raises(kubernetes.client.ApiException) as info:
            await asyncio.to_thread(
                api.core.patch_namespaced_pod,
                "web-1",
                "shop",
                body,
                _content_type="application/strategic-merge-patch+json",
            )
        assert info.value.status == 422
        # and the resize subresource refuses to change the QoS class
        body = {
            "spec": {
                "containers": [
                    {
                        "name": "app",
                        "resources": {"limits": {"cpu": "1"}, "requests": {"cpu": "500m"}},
                    }
                ]
            }
        }
        with pytest.raises(kubernetes.client.ApiException) as info:
            await asyncio.to_thread(
                api.core.patch_namespaced_pod_resize,
                "web-1",
                "shop",
                body,
                _content_type="application/strategic-merge-patch+json",
            )
        assert info.value.status == 422
        assert "QOS" in (info.value.body or "")
    finally:
        await api.close()


async def test_share_sets_requests_to_the_decision_and_limits_to_cpu_max(fake: FakeKube) -> None:
    burstable = {
        "requests": {"cpu": "250m", "memory": "64Mi"},
        "limits": {"cpu": "500m", "memory": "128Mi"},
    }
    fake.put(deployment("web", 2))
    fake.put(pod("web-1", "web", burstable))
    fake.put(pod("web-2", "web", burstable))
    api = KubeApi.connect(host=fake.url)
    try:
        act = KubernetesActuator(
            api, lambda: {"shop/web": WEB}, enforcement="share", cpu_max=lambda: {"shop/web": 1.5}
        )
        await act.apply({"shop/web": decision(2, 0.4)})
        for name in ("web-1", "web-2"):
            assert cpu_of(fake, name) == {
                "requests": {"cpu": "400m", "memory": "64Mi"},
                "limits": {"cpu": "1500m", "memory": "128Mi"},
            }
            assert qos_class(fake.get("pods", "shop", name) or {}) == "Burstable"
        (resized,) = events(fake, "Resized")
        assert "cpu request per replica -> 400m (limit 1500m) on 2 pod(s)" in resized["message"]
        # In force once the kubelet says so: the request is the guaranteed CPU, the limit the cap.
        assert (await act.current())["shop/web"].cpu_per_replica_cores == 0.25
        fake.kubelet_resize("shop", "web-1")
        fake.kubelet_resize("shop", "web-2")
        state = (await act.current())["shop/web"]
        assert (state.cpu_per_replica_cores, state.cpu_cap_per_replica_cores) == (0.4, 1.5)
        assert not state.resize_blocked and act.limited == {}
        assert not state.cpu_capped  # Burstable: the engine decides for it as under share
        # Reclaimed: only the request moves.
        await act.apply({"shop/web": decision(2, 0.1)})
        assert cpu_of(fake, "web-1")["requests"]["cpu"] == "100m"
        assert cpu_of(fake, "web-1")["limits"]["cpu"] == "1500m"
    finally:
        await api.close()


async def test_share_on_guaranteed_pods_keeps_limits_equal_to_requests_and_says_so(
    fake: FakeKube,
) -> None:
    guaranteed = {
        "requests": {"cpu": "500m", "memory": "64Mi"},
        "limits": {"cpu": "500m", "memory": "64Mi"},
    }
    fake.put(deployment("web", 1))
    fake.put(pod("web-1", "web", guaranteed))
    api = KubeApi.connect(host=fake.url)
    try:
        # What share would ask of a Guaranteed pod, the API server refuses (its QoS class would
        # become Burstable): 422 Invalid, so the actuator never sends it.
        wanted = ContainerResources(
            "app", {"cpu": "250m", "memory": "64Mi"}, {"cpu": "2000m", "memory": "64Mi"}
        )
        with pytest.raises(KubeError) as info:
            await api.resize_pod("shop", "web-1", {"app": wanted})
        assert info.value.status == 422
        assert "Pod QOS Class may not change as a result of resizing" in info.value.message
        assert 'Invalid value: "Guaranteed"' in info.value.message  # the pod's old class

        act = KubernetesActuator(
            api, lambda: {"shop/web": WEB}, enforcement="share", cpu_max=lambda: {"shop/web": 2.0}
        )
        await act.apply({"shop/web": decision(1, 0.25)})
        assert cpu_of(fake, "web-1") == {
            "requests": {"cpu": "250m", "memory": "64Mi"},
            "limits": {"cpu": "250m", "memory": "64Mi"},
        }
        assert act.errors == {}
        (limited,) = events(fake, "ResizeLimited")
        assert limited["type"] == "Warning"
        assert "Guaranteed pod" in limited["message"] and "web-1" in limited["message"]
        assert "shop/web-1" in act.limited
        await act.apply({"shop/web": decision(1, 0.3)})
        assert len(events(fake, "ResizeLimited")) == 1  # said once per pod
        fake.kubelet_resize("shop", "web-1")
        state = (await act.current())["shop/web"]
        assert (state.cpu_per_replica_cores, state.cpu_cap_per_replica_cores) == (0.3, 0.3)
        # held at its decided CPU: the engine decides for the service as under limit
        assert state.cpu_capped
        # Replaced by Burstable pods (web-2: cpu requests = limits but no memory limit, so
        # Burstable): the old pod's reason goes, the new pods get request + cpu.max.
        fake.remove("pods", "shop", "web-1")
        fake.put(pod("web-2", "web", {"requests": {"cpu": "300m"}, "limits": {"cpu": "300m"}}))
        fake.put(pod("web-3", "web", {"requests": {"cpu": "100m"}, "limits": {"cpu": "1"}}))
        await act.apply({"shop/web": decision(1, 0.3)})
        assert act.limited == {}
        for name in ("web-2", "web-3"):
            assert cpu_of(fake, name) == {
                "requests": {"cpu": "300m"},
                "limits": {"cpu": "2000m"},
            }
        assert not (await act.current())["shop/web"].cpu_capped
    finally:
        await api.close()


async def synced_cache(api: KubeApi) -> WorkloadCache:
    cache = WorkloadCache(api)
    cache.start()
    async with asyncio.timeout(10):
        while not cache.synced():
            await asyncio.sleep(0.02)
    return cache


def requests_but_watches(fake: FakeKube) -> list[tuple[str, str]]:
    return [(c.verb, c.resource) for c in fake.requests if c.verb not in ("list", "watch")]


async def test_with_watch_caches_steady_state_makes_no_request_and_a_change_one_write(
    fake: FakeKube,
) -> None:
    res = {"requests": {"cpu": "500m"}, "limits": {"cpu": "500m"}}
    fake.put(deployment("web", 2))
    fake.put(pod("web-1", "web", res))
    fake.put(pod("web-2", "web", res))
    fake.put(pod("other-1", "other", res))
    api = KubeApi.connect(host=fake.url)
    try:
        act = KubernetesActuator(api, lambda: {"shop/web": WEB}, cache=await synced_cache(api))
        before = len(requests_but_watches(fake))
        for _ in range(5):
            state = (await act.current())["shop/web"]
            assert (state.replicas, state.cpu_per_replica_cores) == (2, 0.5)
            await act.apply({"shop/web": decision(2, 0.5)})
        assert requests_but_watches(fake)[before:] == []  # nothing changes: nothing asked

        # one change: one /scale write (and its event), however often it is decided again
        # while the watch has not shown it yet
        for _ in range(3):
            await act.apply({"shop/web": decision(3, 0.5)})
        assert requests_but_watches(fake)[before:] == [
            ("patch", "deployments/scale"),
            ("create", "events"),
        ]
        async with asyncio.timeout(10):
            while (await act.current())["shop/web"].replicas != 3:
                await asyncio.sleep(0.02)
        await act.apply({"shop/web": decision(3, 0.5)})
        assert len(requests_but_watches(fake)[before:]) == 2
        # someone else scales it back: the next decision writes again
        fake.put(deployment("web", 2))
        async with asyncio.timeout(10):
            while (await act.current())["shop/web"].replicas != 2:
                await asyncio.sleep(0.02)
        await act.apply({"shop/web": decision(3, 0.5)})
        assert requests_but_watches(fake)[before:].count(("patch", "deployments/scale")) == 2
        assert fake.get("deployments", "shop", "web")["spec"]["replicas"] == 3  # type: ignore[index]
    finally:
        await api.close()


async def test_every_write_names_sluice_as_its_field_manager(fake: FakeKube) -> None:
    res = {"requests": {"cpu": "500m"}, "limits": {"cpu": "500m"}}
    fake.put(deployment("web", 1))
    fake.put(pod("web-1", "web", res))
    api = KubeApi.connect(host=fake.url)
    try:
        act = KubernetesActuator(api, lambda: {"shop/web": WEB})
        await act.apply({"shop/web": decision(2, 1.0)})
    finally:
        await api.close()
    writes = [c for c in fake.requests if c.verb in ("create", "update", "patch")]
    assert {c.resource for c in writes} == {"deployments/scale", "pods/resize", "events"}
    assert {c.field_manager for c in writes} == {"sluice"}


@pytest.mark.parametrize("refusal", ["node capacity", "no resize support"])
async def test_a_refused_resize_blocks_that_pod_says_so_once_and_backs_off(
    fake: FakeKube, refusal: str
) -> None:
    res = {"requests": {"cpu": "500m"}, "limits": {"cpu": "500m"}}
    fake.put(deployment("web", 2))
    fake.put(pod("web-1", "web", res, node="node-a"))
    fake.put(pod("web-2", "web", res, node="node-b"))
    if refusal == "node capacity":
        fake.node_cpu["node-a"] = "1"  # web-1 alone fits up to 1 core; 2 cores do not
    else:
        # a node whose kubelet does not report container resources: no in-place resize
        blocked = fake.get("pods", "shop", "web-1") or {}
        del blocked["status"]["containerStatuses"][0]["resources"]
        fake.put(blocked)
    now = [100.0]
    api = KubeApi.connect(host=fake.url)
    try:
        act = KubernetesActuator(api, lambda: {"shop/web": WEB}, clock=lambda: now[0])
        await act.apply({"shop/web": decision(2, 2.0)})
        assert act.errors == {}  # not a failure of the service
        assert cpu_of(fake, "web-1")["limits"]["cpu"] == "500m"  # refused
        assert cpu_of(fake, "web-2")["limits"]["cpu"] == "2000m"  # the other pod still resized
        fake.kubelet_resize("shop", "web-2")
        state = (await act.current())["shop/web"]
        assert state.resize_blocked  # the scaler keeps CPU per replica and scales out instead
        (blocked_event,) = events(fake, "ResizeBlocked")
        assert blocked_event["type"] == "Warning"
        assert "web-1" in blocked_event["message"] and "resize refused" in blocked_event["message"]
        want = "403 NodeCapacity" if refusal == "node capacity" else "without support for resize"
        assert want in blocked_event["message"]

        # backing off: no new attempt, no new event, while the back-off lasts
        resizes = sum(1 for c in fake.requests if c.resource == "pods/resize")
        for _ in range(3):
            await act.apply({"shop/web": decision(2, 2.0)})
            await act.current()
        assert sum(1 for c in fake.requests if c.resource == "pods/resize") == resizes
        assert len(events(fake, "ResizeBlocked")) == 1
        # after the back-off one more try; refused again, the next wait is twice as long
        now[0] += 31.0
        assert not (await act.current())["shop/web"].resize_blocked
        await act.apply({"shop/web": decision(2, 2.0)})
        assert sum(1 for c in fake.requests if c.resource == "pods/resize") == resizes + 1
        assert act.refused["shop/web-1"].backoff_s == 60.0
        assert len(events(fake, "ResizeBlocked")) == 1
    finally:
        await api.close()
