"""Ingress and EndpointSlice discovery against the fake API server, through the real client."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from gateway.dataplane.updates import EndpointInfo, EndpointUpdate, RouteRule, RoutesUpdate
from gateway.platforms.kubernetes.api import KubeApi
from gateway.platforms.kubernetes.discovery import KubernetesDiscovery
from gateway.platforms.kubernetes.model import ObjectRef
from gateway.settings import Settings, parse_settings
from tests.support.certs import make_ca
from tests.support.fake_kube import FakeKube
from tests.support.kube_objects import endpoint_slice, ingress, service, tls_secret

T = TypeVar("T")
TIMEOUT_S = 10


async def next_matching(it: AsyncIterator[T], pred: Callable[[T], bool]) -> T:
    async with asyncio.timeout(TIMEOUT_S):
        async for item in it:
            if pred(item):
                return item
    raise AssertionError("stream ended")


async def wait_for(pred: Callable[[], bool]) -> None:
    async with asyncio.timeout(TIMEOUT_S):
        while not pred():
            await asyncio.sleep(0.02)


@pytest.fixture
def fake() -> Iterator[FakeKube]:
    with FakeKube(bookmark_interval_s=0.2) as f:
        yield f


def settings(**kube: Any) -> Settings:
    return parse_settings(
        {
            "platform": "kubernetes",
            "kubernetes": {"status_addresses": ["203.0.113.7"], **kube},
            "services": {"shop/api": {"scaling": {"min_replicas": 2, "max_replicas": 6}}},
        }
    )


async def test_ingress_add_modify_delete_change_routes(fake: FakeKube) -> None:
    fake.put(ingress("web", [("shop.test", "/", "Prefix", "web", 80)]))
    fake.put(ingress("other", [("x.test", "/", "Prefix", "x", 80)], ingress_class="nginx"))
    legacy = ingress(
        "legacy", [("*.shop.test", "/api", "Exact", "api", "http")], ingress_class=None
    )
    legacy["metadata"]["annotations"] = {"kubernetes.io/ingress.class": "sluice"}
    fake.put(legacy)
    api = KubeApi.connect(host=fake.url)
    try:
        async with KubernetesDiscovery(api, settings()) as disco:
            routes = disco.routes()
            first = await next_matching(routes, lambda u: True)
            assert first == RoutesUpdate(
                (
                    RouteRule("shop/api", "*.shop.test", "/api", "Exact"),
                    RouteRule("shop/web", "shop.test", "/", "Prefix"),
                )
            )
            # config file's policy for shop/api; shop/web has none: routed, not scaled
            assert disco.policies()["shop/api"].min_replicas == 2
            assert "shop/web" not in disco.policies()

            fake.put(
                ingress(
                    "web",
                    [
                        ("shop.test", "/", "Prefix", "web", 80),
                        ("shop.test", "/static", "Prefix", "static", 8080),
                    ],
                    default_backend=("web", 80),
                )
            )
            second = await next_matching(routes, lambda u: len(u.rules) == 3)
            assert RouteRule("shop/static", "shop.test", "/static", "Prefix") in second.rules
            assert second.default_backend == "shop/web"

            fake.remove("ingresses", "shop", "legacy")
            third = await next_matching(routes, lambda u: len(u.rules) == 2)
            assert all(r.service != "shop/api" for r in third.rules)

            # status.loadBalancer written to ours, never to another class's Ingress
            def lb(name: str) -> Any:
                obj = fake.get("ingresses", "shop", name) or {}
                return obj.get("status", {}).get("loadBalancer", {}).get("ingress")

            await wait_for(lambda: lb("web") == [{"ip": "203.0.113.7"}])
            assert lb("other") is None
    finally:
        await api.close()


async def test_bad_annotations_are_reported_and_other_routes_survive(fake: FakeKube) -> None:
    fake.put(
        ingress(
            "bad",
            [("bad.test", "/", "Prefix", "bad", 80)],
            annotations={
                "sluice.io/min-replicas": "3",
                "sluice.io/max-replicas": "1",
                "sluice.io/colour": "red",
            },
        )
    )
    fake.put(
        ingress(
            "good",
            [("good.test", "/", "Prefix", "good", 80)],
            annotations={
                "sluice.io/target": "25",
                "sluice.io/cpu-max": "2",
                "sluice.io/metric": "rps",
            },
        )
    )
    api = KubeApi.connect(host=fake.url)
    try:
        async with KubernetesDiscovery(api, settings()) as disco:
            update = await next_matching(disco.routes(), lambda u: True)
            assert {r.service for r in update.rules} == {"shop/bad", "shop/good"}
            good = disco.policies()["shop/good"]
            assert (good.target, good.metric, good.cpu.max) == (25, "rps", 2)
            assert "shop/bad" not in disco.policies()

            def events() -> list[dict[str, Any]]:
                return [e for e in fake.list("events") if e["involvedObject"]["name"] == "bad"]

            await wait_for(lambda: len(events()) == 2)
            messages = sorted(e["message"] for e in events())
            assert messages[0].startswith("annotation sluice.io/colour: unknown")
            assert (
                messages[1]
                == "annotation sluice.io/max-replicas: must be >= min_replicas (3), got 1"
            )
            assert {e["type"] for e in events()} == {"Warning"}
            assert {e["involvedObject"]["kind"] for e in events()} == {"Ingress"}
    finally:
        await api.close()


async def test_endpoint_churn_with_ready_and_terminating(fake: FakeKube) -> None:
    fake.put(ingress("web", [("shop.test", "/", "Prefix", "web", 80)]))
    fake.put(service("web", [("http", 80), ("metrics", 9090)]))
    ready = {"ready": True, "serving": True, "terminating": False}
    draining = {"ready": False, "serving": True, "terminating": True}
    fake.put(
        endpoint_slice(
            "web-abc",
            "web",
            [("10.1.0.1", ready), ("10.1.0.2", ready)],
            [("metrics", 9090), ("http", 8080)],
        )
    )
    api = KubeApi.connect(host=fake.url)
    try:
        async with KubernetesDiscovery(api, settings()) as disco:
            updates = disco.updates()
            first = await next_matching(updates, lambda u: True)
            # port.number 80 -> Service port name 'http' -> the slice's 'http' port (8080)
            assert first == EndpointUpdate(
                "shop/web",
                (EndpointInfo("10.1.0.1:8080"), EndpointInfo("10.1.0.2:8080")),
            )
            fake.put(
                endpoint_slice(
                    "web-abc",
                    "web",
                    [
                        ("10.1.0.1", draining),
                        ("10.1.0.2", ready),
                        ("10.1.0.3", {"ready": False, "serving": False}),
                    ],
                    [("metrics", 9090), ("http", 8080)],
                )
            )
            second = await next_matching(updates, lambda u: True)
            assert second.endpoints == (
                EndpointInfo("10.1.0.1:8080", ready=False, serving=True, terminating=True),
                EndpointInfo("10.1.0.2:8080"),
                EndpointInfo("10.1.0.3:8080", ready=False, serving=False),
            )
            # a second slice for the same service joins; nil conditions mean ready
            fake.put(endpoint_slice("web-def", "web", [("10.1.0.4", {})], [("http", 8080)]))
            third = await next_matching(updates, lambda u: len(u.endpoints) == 4)
            assert EndpointInfo("10.1.0.4:8080") in third.endpoints
            fake.remove("endpointslices", "shop", "web-abc")
            fake.remove("endpointslices", "shop", "web-def")
            gone = await next_matching(updates, lambda u: u.endpoints == ())
            assert gone.service == "shop/web"
            # the Ingress goes away: its service gets nothing more and no error
            fake.remove("ingresses", "shop", "web")
            await wait_for(lambda: not disco.table.backends)
    finally:
        await api.close()


async def test_watch_survives_a_dropped_connection_and_410(fake: FakeKube) -> None:
    a_rv = int(
        fake.put(ingress("a", [("a.test", "/", "Prefix", "a", 80)]))["metadata"]["resourceVersion"]
    )
    api = KubeApi.connect(host=fake.url)
    try:
        async with KubernetesDiscovery(api, settings(namespaces=["shop"])) as disco:
            routes = disco.routes()
            await next_matching(routes, lambda u: len(u.rules) == 1)

            def calls(verb: str) -> list[Any]:
                return [c for c in fake.requests if c.verb == verb and c.resource == "ingresses"]

            await wait_for(lambda: fake.open_watches("ingresses") == 1)
            lists_before = len(calls("list"))
            fake.drop_watches()
            fake.put(ingress("b", [("b.test", "/", "Prefix", "b", 80)]))
            await next_matching(routes, lambda u: len(u.rules) == 2)
            # resumed from the last resourceVersion seen, no relist
            assert len(calls("list")) == lists_before
            first, resumed = calls("watch")[:2]
            assert int(first.resource_version or 0) >= a_rv
            assert int(resumed.resource_version or 0) >= int(first.resource_version or 0)

            fake.compact()  # history gone: the open watch gets 410 Expired -> relist
            fake.put(ingress("c", [("c.test", "/", "Prefix", "c", 80)]))
            await next_matching(routes, lambda u: len(u.rules) == 3)
            assert len(calls("list")) == lists_before + 1
            assert all(c.namespace == "shop" for c in calls("watch"))
    finally:
        await api.close()


async def test_peers_come_from_the_gateway_endpointslice(fake: FakeKube) -> None:
    ok = {"ready": True}
    fake.put(
        endpoint_slice(
            "sluice-1",
            "sluice",
            [
                ("10.9.0.1", ok),
                ("10.9.0.2", ok),
                ("10.9.0.3", {"ready": False, "terminating": True}),
            ],
            [("http", 8080), ("admin", 9901)],
            namespace="sluice",
        )
    )
    api = KubeApi.connect(host=fake.url)
    try:
        async with KubernetesDiscovery(api, settings()) as disco:
            await wait_for(lambda: len(disco.peer_admin_addresses()) == 2)
            assert disco.peer_admin_addresses() == ["10.9.0.1:9901", "10.9.0.2:9901"]
    finally:
        await api.close()


async def test_an_unreadable_service_never_drains_its_endpoints(fake: FakeKube) -> None:
    fake.put(ingress("web", [("shop.test", "/", "Prefix", "web", 80)]))
    fake.put(service("web", [("http", 80), ("metrics", 9090)]))
    slice_ports = [("metrics", 9090), ("http", 8080)]
    fake.put(endpoint_slice("web-abc", "web", [("10.1.0.1", {"ready": True})], slice_ports))
    api = KubeApi.connect(host=fake.url)
    try:
        async with KubernetesDiscovery(api, settings()) as disco:
            updates = disco.updates()
            first = await next_matching(updates, lambda u: True)
            assert first.endpoints == (EndpointInfo("10.1.0.1:8080"),)
            # the Ingress changes (port cache dropped) while reading the Service fails
            fake.fail("get", "services", 500, times=1)
            fake.put(
                ingress(
                    "web",
                    [("shop.test", "/", "Prefix", "web", 80), ("w.test", "/", "Prefix", "web", 80)],
                )
            )
            await wait_for(lambda: len(disco.table.routes.rules) == 2)
            fake.put(
                endpoint_slice(
                    "web-abc",
                    "web",
                    [("10.1.0.1", {"ready": True}), ("10.1.0.2", {"ready": True})],
                    slice_ports,
                )
            )
            seen: list[EndpointUpdate] = []
            second = await next_matching(
                updates, lambda u: seen.append(u) is None and len(u.endpoints) == 2
            )
            assert all(u.endpoints for u in seen), "an API error drained the service"
            assert second.endpoints[1] == EndpointInfo("10.1.0.2:8080")
            gets = [c for c in fake.requests if c.verb == "get" and c.resource == "services"]
            assert len(gets) >= 3  # first read, the failed one, the retry
    finally:
        await api.close()


async def test_only_the_leader_records_an_ingress_problem_once_and_repeats_aggregate(
    fake: FakeKube,
) -> None:
    bad = ingress(
        "bad", [("bad.test", "/", "Prefix", "bad", 80)], annotations={"sluice.io/colour": "red"}
    )
    fake.put(bad)
    fake.put(
        service("sluice", [("http", 80), ("admin", 9901)], namespace="sluice", lb=["192.0.2.7"])
    )
    api_a, api_b = KubeApi.connect(host=fake.url), KubeApi.connect(host=fake.url)
    leading = {"a": False, "b": False}
    try:
        async with (
            KubernetesDiscovery(api_a, settings()) as a,
            KubernetesDiscovery(api_b, settings()) as b,
        ):
            a.is_leader, b.is_leader = (lambda: leading["a"]), (lambda: leading["b"])
            # both see the problem and write the Ingress status; neither leads: no Event
            await wait_for(lambda: bool((fake.get("ingresses", "shop", "bad") or {}).get("status")))
            await next_matching(a.routes(), lambda u: True)
            await next_matching(b.routes(), lambda u: True)
            await a.report_problems()
            await b.report_problems()
            assert fake.list("events") == []
            # a becomes leader: one Event, not again after the status patch or an edit
            leading["a"] = True
            await a.report_problems()
            await b.report_problems()
            assert len(fake.list("events")) == 1
            fake.put({**bad, "metadata": {**bad["metadata"], "labels": {"team": "x"}}})
            await wait_for(lambda: any(i.meta.labels for i in a._ingresses[0].values()))
            await a.report_problems()
            (event,) = fake.list("events")
            assert event["reason"] == "InvalidIngress" and event["count"] == 1

            # the same Event recorded again updates the first one's count
            ref = ObjectRef("Ingress", "networking.k8s.io/v1", "shop", "bad")
            for _ in range(2):
                await api_a.create_event(ref, "Warning", "Again", "the same thing")
            (again,) = [e for e in fake.list("events") if e["reason"] == "Again"]
            assert again["count"] == 2 and again["lastTimestamp"]
            assert {c.verb for c in fake.requests if c.resource == "events"} == {
                "create",
                "patch",
            }
    finally:
        await api_a.close()
        await api_b.close()


async def test_a_caller_returns_only_once_a_concurrent_callers_recording_is_done(
    fake: FakeKube,
) -> None:
    # the discovery's own watch tasks report too: a caller that found the problem already
    # claimed by one of them must not return before that one's Event is written
    bad = ingress(
        "bad", [("bad.test", "/", "Prefix", "bad", 80)], annotations={"sluice.io/colour": "red"}
    )
    fake.put(bad)
    api = KubeApi.connect(host=fake.url)
    leading = False
    try:
        async with KubernetesDiscovery(api, settings()) as d:
            d.is_leader = lambda: leading
            await next_matching(d.routes(), lambda u: True)
            await d.report_problems()
            assert fake.list("events") == []
            real, started = api.create_event, asyncio.Event()

            async def slow_create_event(*args: Any, **kwargs: Any) -> None:
                started.set()
                await asyncio.sleep(0.2)
                await real(*args, **kwargs)

            api.create_event = slow_create_event  # type: ignore[method-assign]
            leading = True
            first = asyncio.create_task(d.report_problems())
            await started.wait()
            await d.report_problems()
            assert [e["reason"] for e in fake.list("events")] == ["InvalidIngress"]
            await first
            assert len(fake.list("events")) == 1
    finally:
        await api.close()


async def test_tls_fallbacks_are_recorded_by_the_leader_once_and_again_when_back(
    fake: FakeKube, tmp_path: Path
) -> None:
    ca = make_ca(tmp_path)
    issued = ca.issue(tmp_path, "shop", ["shop.test"])
    fake.put(
        ingress("web", [("shop.test", "/", "Prefix", "web", 80)], tls=[(["shop.test"], "web-tls")])
    )
    tls = {"tls": {"certificates": [{"cert_file": "unused.pem", "key_file": "unused.key"}]}}
    config = parse_settings(
        {**tls, "platform": "kubernetes", "kubernetes": {"status_addresses": ["203.0.113.7"]}}
    )
    api_a, api_b = KubeApi.connect(host=fake.url), KubeApi.connect(host=fake.url)
    leading = {"a": False, "b": False}

    def warnings() -> list[dict[str, Any]]:
        return [e for e in fake.list("events") if e["reason"] == "TLSCertificate"]

    try:
        async with KubernetesDiscovery(api_a, config) as a, KubernetesDiscovery(api_b, config) as b:
            a.is_leader, b.is_leader = (lambda: leading["a"]), (lambda: leading["b"])
            assert a.tls is not None and b.tls is not None
            await wait_for(lambda: bool(a.tls and a.tls.resolution.problems))
            await wait_for(lambda: bool(b.tls and b.tls.resolution.problems))
            await a.report_problems()
            await b.report_problems()
            assert warnings() == []  # nobody leads: nothing recorded
            leading["a"] = True
            await a.report_problems()
            await a.report_problems()
            await b.report_problems()
            (event,) = warnings()
            assert event["message"] == (
                "host shop.test: secret shop/web-tls not found; served with the default certificate"
            )
            assert event["count"] == 1
            # solved: the Secret appears; then gone again: recorded again (the same Event)
            fake.put(
                tls_secret("web-tls", issued.cert_file.read_bytes(), issued.key_file.read_bytes())
            )
            await wait_for(lambda: bool(a.tls and not a.tls.resolution.problems))
            assert a.tls.resolution.hosts == {"shop.test": "secret shop/web-tls"}
            fake.remove("secrets", "shop", "web-tls")
            await wait_for(lambda: bool(a.tls and a.tls.resolution.problems))
            await a.report_problems()
            (event,) = warnings()
            assert event["count"] == 2
            assert {c.verb for c in fake.requests if c.resource == "events"} == {"create", "patch"}
    finally:
        await api_a.close()
        await api_b.close()
