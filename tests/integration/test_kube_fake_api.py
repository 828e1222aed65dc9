"""The fake API server speaks the real API's semantics, as the official client understands them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import kubernetes
import pytest

from gateway.platforms.kubernetes.api import KubeApi
from gateway.platforms.kubernetes.model import ContainerResources, KubeError
from tests.support.fake_kube import FakeKube
from tests.support.fake_kube_rules import ApiError
from tests.support.kube_objects import deployment, endpoint_slice, ingress, pod, tls_secret


@pytest.fixture
def fake() -> Iterator[FakeKube]:
    with FakeKube(bookmark_interval_s=0.1) as f:
        yield f


@pytest.fixture
def api(fake: FakeKube) -> Iterator[KubeApi]:
    a = KubeApi.connect(host=fake.url)
    yield a
    a.client.close()


def test_the_official_watch_helper_sees_events_bookmarks_and_410(
    fake: FakeKube, api: KubeApi
) -> None:
    fake.put(ingress("a", [("a.test", "/", "Prefix", "a", 80)]))
    listed = api.networking.list_namespaced_ingress("shop")
    rv = listed.metadata.resource_version
    fake.put(ingress("b", [("b.test", "/", "Prefix", "b", 80)]))
    w = kubernetes.watch.Watch()
    seen = []
    for ev in w.stream(
        api.networking.list_namespaced_ingress,
        "shop",
        resource_version=rv,
        allow_watch_bookmarks=True,
        timeout_seconds=2,
    ):
        seen.append(ev["type"])
        if ev["type"] == "BOOKMARK":
            w.stop()
    assert seen[0] == "ADDED" and "BOOKMARK" in seen
    assert ev["raw_object"]["metadata"]["resourceVersion"]

    fake.compact()
    with pytest.raises(kubernetes.client.ApiException) as info:
        for _ in kubernetes.watch.Watch().stream(
            api.networking.list_namespaced_ingress, "shop", resource_version=rv, timeout_seconds=2
        ):
            pass
    assert info.value.status == 410


def test_conflict_not_found_and_invalid(fake: FakeKube, api: KubeApi) -> None:
    fake.put(deployment("web", 1))
    stale = fake.get("deployments", "shop", "web")
    assert stale is not None
    api.apps.patch_namespaced_deployment_scale(
        "web", "shop", {"spec": {"replicas": 2}}, _content_type="application/merge-patch+json"
    )
    with pytest.raises(kubernetes.client.ApiException) as info:
        api.apps.patch_namespaced_deployment(
            "web",
            "shop",
            {
                "metadata": {"resourceVersion": stale["metadata"]["resourceVersion"]},
                "spec": {"replicas": 5},
            },
            _content_type="application/merge-patch+json",
        )
    assert info.value.status == 409
    with pytest.raises(kubernetes.client.ApiException) as info:
        api.apps.read_namespaced_deployment_scale("nope", "shop")
    assert info.value.status == 404
    with pytest.raises(kubernetes.client.ApiException) as info:
        api.apps.patch_namespaced_deployment_scale(
            "web", "shop", {"spec": {"replicas": -1}}, _content_type="application/merge-patch+json"
        )
    assert info.value.status == 422
    scale = api.apps.read_namespaced_deployment_scale("web", "shop")
    assert (scale.spec.replicas, scale.status.selector) == (2, "app=web")


async def test_kubeconfig_is_honoured(fake: FakeKube, tmp_path: Path) -> None:
    kubeconfig = tmp_path / "config"
    kubeconfig.write_text(
        f"""
apiVersion: v1
kind: Config
clusters: [{{name: fake, cluster: {{server: "{fake.url}"}}}}]
users: [{{name: sluice, user: {{token: s3cr3t-token}}}}]
contexts: [{{name: fake, context: {{cluster: fake, user: sluice}}}}]
current-context: fake
"""
    )
    fake.put(deployment("web", 3))
    api = KubeApi.connect(kubeconfig=str(kubeconfig))
    try:
        scale = await api.read_scale("Deployment", "shop", "web")
        assert scale.spec_replicas == 3
        assert fake.requests[-1].authorization == "Bearer s3cr3t-token"
    finally:
        await api.close()


@pytest.mark.parametrize("address", ["127.0.0.1", "169.254.1.1", "0.0.0.0", "::1", "fe80::1"])
def test_endpoint_slices_refuse_loopback_link_local_and_unspecified(
    fake: FakeKube, address: str
) -> None:
    with pytest.raises(ApiError) as info:
        fake.put(endpoint_slice("web-1", "web", [(address, {})], [("http", 80)]))
    assert info.value.code == 422 and f'Invalid value: "{address}"' in info.value.message
    fake.put(endpoint_slice("web-2", "web", [("192.0.2.1", {})], [("http", 80)]))
    fake.put(endpoint_slice("web-3", "web", [("localhost", {})], [("http", 80)]))  # FQDN


async def test_a_resize_bumps_generation_and_admission_refuses_what_does_not_fit(
    fake: FakeKube, api: KubeApi
) -> None:
    fake.put(pod("web-1", "web", {"requests": {"cpu": "500m"}, "limits": {"cpu": "500m"}}))
    fake.node_cpu["node-a"] = "1"
    assert (fake.get("pods", "shop", "web-1") or {})["metadata"]["generation"] == 1
    await api.resize_pod(
        "shop", "web-1", {"app": ContainerResources("app", {"cpu": "1"}, {"cpu": "1"})}
    )
    assert (fake.get("pods", "shop", "web-1") or {})["metadata"]["generation"] == 2
    with pytest.raises(KubeError) as info:
        await api.resize_pod(
            "shop", "web-1", {"app": ContainerResources("app", {"cpu": "2"}, {"cpu": "2"})}
        )
    assert info.value.status == 403 and info.value.reason == "Forbidden"
    assert "didn't have enough allocatable resources" in info.value.message
    await api.close()


async def test_right_after_a_restart_requests_are_forbidden_then_served(
    fake: FakeKube, api: KubeApi
) -> None:
    fake.put(deployment("web", 1))
    fake.restart(forbidden_requests=2)
    for _ in range(2):
        with pytest.raises(KubeError) as info:
            await api.read_scale("Deployment", "shop", "web")
        assert info.value.status == 403
    assert (await api.read_scale("Deployment", "shop", "web")).spec_replicas == 1
    await api.close()


def test_secrets_as_the_api_server_keeps_them(fake: FakeKube, api: KubeApi) -> None:
    core = api.core
    tls = tls_secret("web-tls", b"CERT", b"KEY")
    created = core.create_namespaced_secret("shop", tls)
    assert created.type == "kubernetes.io/tls"
    assert created.data == {"tls.crt": "Q0VSVA==", "tls.key": "S0VZ"}  # base64 on the wire
    # the type is immutable; data is not (unless immutable: true)
    with pytest.raises(kubernetes.client.ApiException) as e:
        core.patch_namespaced_secret("web-tls", "shop", {"type": "Opaque"})
    assert e.value.status == 422
    assert "type: Invalid value" in e.value.body and "field is immutable" in e.value.body
    core.patch_namespaced_secret("web-tls", "shop", {"data": {"tls.crt": "TkVX"}})
    # stringData is merged into data, base64, and never read back; type defaults to Opaque
    opaque = core.create_namespaced_secret(
        "shop", {"metadata": {"name": "o"}, "stringData": {"a": "b"}, "immutable": True}
    )
    assert (opaque.type, opaque.data, opaque.string_data) == ("Opaque", {"a": "Yg=="}, None)
    with pytest.raises(kubernetes.client.ApiException) as e:
        core.patch_namespaced_secret("o", "shop", {"data": {"a": "Yw=="}})
    assert e.value.status == 422 and "immutable" in e.value.body
    # a TLS Secret needs both keys; data must be base64
    with pytest.raises(kubernetes.client.ApiException) as e:
        core.create_namespaced_secret(
            "shop",
            {
                "metadata": {"name": "half"},
                "type": "kubernetes.io/tls",
                "data": {"tls.crt": "Yg=="},
            },
        )
    assert e.value.status == 422 and "data[tls.key]: Required value" in e.value.body
    with pytest.raises(kubernetes.client.ApiException) as e:
        core.create_namespaced_secret(
            "shop", {"metadata": {"name": "bad"}, "data": {"a": "not base64!"}}
        )
    assert e.value.status == 400
    # field selectors: type (Secrets only), metadata.name/namespace; anything else is a 400
    listed = core.list_secret_for_all_namespaces(field_selector="type=kubernetes.io/tls")
    assert [s.metadata.name for s in listed.items] == ["web-tls"]
    with pytest.raises(kubernetes.client.ApiException) as e:
        core.list_namespaced_pod("shop", field_selector="type=kubernetes.io/tls")
    assert e.value.status == 400 and "field label not supported" in e.value.body


def test_pod_metrics_as_metrics_server_serves_them(fake: FakeKube, api: KubeApi) -> None:
    custom = api.custom
    args = ("metrics.k8s.io", "v1beta1", "shop", "pods")
    res = {"requests": {"cpu": "500m"}, "limits": {"cpu": "500m"}}
    fake.put(pod("web-0", "web", res))
    fake.put(pod("web-1", "web", res))  # new: not measured yet
    fake.put(pod("db-0", "db", res))
    fake.pod_cpu = {("shop", "web-0"): {"app": "250m"}, ("shop", "db-0"): {"app": "1500000n"}}
    # no metrics-server: the group is not served
    with pytest.raises(kubernetes.client.ApiException) as e:
        custom.list_namespaced_custom_object(*args)
    assert e.value.status == 404
    fake.metrics_server = "down"  # the APIService is registered, metrics-server does not answer
    with pytest.raises(kubernetes.client.ApiException) as e:
        custom.list_namespaced_custom_object(*args)
    assert e.value.status == 503
    fake.metrics_server = "up"
    listed = custom.list_namespaced_custom_object(*args)
    assert listed["kind"] == "PodMetricsList"
    assert sorted(i["metadata"]["name"] for i in listed["items"]) == ["db-0", "web-0"]
    web = custom.list_namespaced_custom_object(*args, label_selector="app=web")["items"]
    assert [(i["metadata"]["name"], i["containers"][0]["usage"]["cpu"]) for i in web] == [
        ("web-0", "250m")
    ]
    assert web[0]["window"] and web[0]["timestamp"]
    assert custom.get_namespaced_custom_object(*args, "web-0")["kind"] == "PodMetrics"
    with pytest.raises(kubernetes.client.ApiException) as e:
        custom.get_namespaced_custom_object(*args, "web-1")
    assert e.value.status == 404
    with pytest.raises(kubernetes.client.ApiException) as e:
        custom.list_namespaced_custom_object(*args, watch=True)
    assert e.value.status == 405
