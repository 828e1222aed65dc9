"""In-place resize planning keeps the QoS class; quantities; EndpointSlice conditions."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.platforms.kubernetes.actuator import cpu_in_force, plan_resize, resize_refusal
from gateway.platforms.kubernetes.model import (
    KubeError,
    endpoint_slice_from_json,
    format_cpu,
    format_selector,
    parse_cpu_cores,
    pod_from_json,
    selector_matches,
)
from tests.support.fake_kube import qos_class
from tests.support.kube_objects import endpoint_slice, pod


@pytest.mark.parametrize(
    ("q", "cores"),
    [
        ("250m", 0.25),
        ("1", 1.0),
        ("0.5", 0.5),
        ("2500u", 0.0025),
        ("100000000n", 0.1),
        ("1500m", 1.5),
    ],
)
def test_parse_cpu(q: str, cores: float) -> None:
    assert parse_cpu_cores(q) == pytest.approx(cores)


def test_format_cpu() -> None:
    assert [format_cpu(c) for c in (0.25, 1, 1.2345, 0.0)] == ["250m", "1000m", "1234m", "1m"]


RESOURCES = {
    "guaranteed": {
        "requests": {"cpu": "500m", "memory": "1Gi"},
        "limits": {"cpu": "500m", "memory": "1Gi"},
    },
    "burstable-ratio": {"requests": {"cpu": "250m"}, "limits": {"cpu": "1"}},
    "burstable-request-only": {"requests": {"cpu": "300m", "memory": "64Mi"}},
    "burstable-limit-only-mem": {"requests": {"cpu": "200m"}, "limits": {"memory": "1Gi"}},
}


@given(kind=st.sampled_from(sorted(RESOURCES)), millis=st.integers(1, 64_000))
def test_resize_never_changes_qos_and_gives_the_cpu(kind: str, millis: int) -> None:
    raw = pod("p", "app", RESOURCES[kind])
    plan = plan_resize(pod_from_json(raw), millis / 1000)
    if plan.container is None:
        assert plan.blocked is None  # already there
        return
    new = dict(raw)
    new["spec"] = {
        "containers": [
            {
                "name": "app",
                "resources": {
                    "requests": dict(plan.container.requests),
                    "limits": dict(plan.container.limits),
                },
            }
        ]
    }
    assert qos_class(new) == qos_class(raw)
    assert cpu_in_force(plan.container) == pytest.approx(max(millis, 1) / 1000)
    req, lim = plan.container.requests.get("cpu"), plan.container.limits.get("cpu")
    if req and lim:
        assert parse_cpu_cores(req) <= parse_cpu_cores(lim)


def test_burstable_keeps_its_request_to_limit_ratio() -> None:
    plan = plan_resize(pod_from_json(pod("p", "app", RESOURCES["burstable-ratio"])), 2.0)
    assert plan.container is not None
    assert (plan.container.requests["cpu"], plan.container.limits["cpu"]) == ("500m", "2000m")


def test_what_is_never_resized() -> None:
    best_effort = pod_from_json(pod("p", "app", {}))
    assert (
        plan_resize(best_effort, 1.0).blocked
        == "BestEffort pod: giving it CPU would change its QoS class"
    )
    raw = pod("p", "app", RESOURCES["guaranteed"])
    raw["spec"]["containers"][0]["resizePolicy"] = [
        {"resourceName": "cpu", "restartPolicy": "RestartContainer"}
    ]
    assert "would restart it" in (plan_resize(pod_from_json(raw), 1.0).blocked or "")
    mem_only = pod_from_json(pod("p", "app", {"requests": {"memory": "1Gi"}}))
    assert "no cpu request or limit" in (plan_resize(mem_only, 1.0).blocked or "")


def test_endpoint_conditions_nil_semantics() -> None:
    s = endpoint_slice_from_json(
        endpoint_slice(
            "s",
            "web",
            [
                ("10.0.0.1", {}),
                ("10.0.0.2", {"ready": False}),
                ("10.0.0.3", {"ready": False, "serving": True, "terminating": True}),
            ],
            [("http", 80)],
        )
    )
    got = [(e.ready, e.serving, e.terminating) for e in s.endpoints]
    # ready nil = ready; serving nil = same as ready; terminating nil = not terminating
    assert got == [(True, True, False), (False, False, False), (False, True, True)]
    assert s.service_name == "web"


def test_an_endpoint_names_its_pod_only_through_a_pod_target_ref() -> None:
    raw = endpoint_slice(
        "s", "sluice", [("10.0.0.1", {}), ("10.0.0.2", {}), ("10.0.0.3", {})], [("admin", 9901)]
    )
    raw["endpoints"][0]["targetRef"] = {"kind": "Pod", "name": "gw-a", "namespace": "shop"}
    raw["endpoints"][1]["targetRef"] = {"kind": "Node", "name": "node-1"}
    s = endpoint_slice_from_json(raw)
    assert [e.pod for e in s.endpoints] == ["gw-a", None, None]


def shape(raw: dict[str, Any], plan_container: Any) -> dict[str, Any]:
    """The pod as it would be after the plan (first container's resources replaced)."""
    new = dict(raw)
    new["spec"] = {
        "containers": [
            {
                "name": "app",
                "resources": {
                    "requests": dict(plan_container.requests),
                    "limits": dict(plan_container.limits),
                },
            }
        ]
    }
    return new


@given(
    kind=st.sampled_from(sorted(RESOURCES)),
    millis=st.integers(1, 4_000),
    cap_millis=st.integers(1, 4_000),
)
def test_share_keeps_qos_requests_the_decided_cpu_and_limits_the_cap(
    kind: str, millis: int, cap_millis: int
) -> None:
    raw = pod("p", "app", RESOURCES[kind])
    cores, cap = min(millis, cap_millis) / 1000, cap_millis / 1000  # the engine keeps cpu <= max
    plan = plan_resize(pod_from_json(raw), cores, "share", cap)
    if plan.container is None:
        assert plan.blocked is None  # already there
        return
    after = shape(raw, plan.container)
    assert qos_class(after) == qos_class(raw)  # the API server refuses anything else (422)
    req = parse_cpu_cores(plan.container.requests["cpu"])
    lim = plan.container.limits.get("cpu")
    if kind == "guaranteed":
        # requests < limits would make it Burstable: it stays at requests = limits = decided.
        assert req == parse_cpu_cores(lim or "") == pytest.approx(cores)
        assert plan.limited is not None and "Guaranteed pod" in plan.limited
        return
    assert lim is not None
    if plan.limited is None:
        assert req == pytest.approx(cores)
        assert parse_cpu_cores(lim) == pytest.approx(cap)
    else:
        # At the cap with memory requests = limits: 1m apart, or the pod would be Guaranteed.
        assert "1m below" in plan.limited
        assert cores == cap
        got = (round(req * 1000), round(parse_cpu_cores(lim) * 1000))
        assert got in ((cap_millis - 1, cap_millis), (cap_millis, cap_millis + 1))
    assert req < parse_cpu_cores(lim) or plan.limited is None


def test_share_on_a_burstable_pod_sets_request_and_cap() -> None:
    raw = pod("p", "app", RESOURCES["burstable-ratio"])  # 250m / 1
    plan = plan_resize(pod_from_json(raw), 0.4, "share", 1.5)
    assert plan.container is not None and plan.limited is None
    assert (plan.container.requests["cpu"], plan.container.limits["cpu"]) == ("400m", "1500m")
    # A request-only pod gets the cap as its (new) limit: still Burstable.
    only = pod_from_json(pod("p", "app", RESOURCES["burstable-request-only"]))
    plan = plan_resize(only, 0.4, "share", 1.0)
    assert plan.container is not None
    assert (plan.container.requests["cpu"], plan.container.limits["cpu"]) == ("400m", "1000m")
    # No cpu.max known: the container's own limit stays.
    plan = plan_resize(pod_from_json(raw), 0.5, "share", None)
    assert plan.container is not None
    assert (plan.container.requests["cpu"], plan.container.limits["cpu"]) == ("500m", "1")
    # Already there (as quantities): nothing to do.
    done = pod("p", "app", {"requests": {"cpu": "0.4"}, "limits": {"cpu": "1500m"}})
    assert plan_resize(pod_from_json(done), 0.4, "share", 1.5).container is None


def test_share_never_turns_a_burstable_pod_guaranteed() -> None:
    # Memory requests = limits: cpu requests = limits would make the pod Guaranteed.
    res = {
        "requests": {"cpu": "250m", "memory": "64Mi"},
        "limits": {"cpu": "1", "memory": "64Mi"},
    }
    plan = plan_resize(pod_from_json(pod("p", "app", res)), 1.0, "share", 1.0)
    assert plan.container is not None
    assert (plan.container.requests["cpu"], plan.container.limits["cpu"]) == ("999m", "1000m")
    assert plan.limited is not None and "1m below" in plan.limited


def test_share_on_a_guaranteed_pod_falls_back_to_limits_equal_requests() -> None:
    raw = pod("p", "app", RESOURCES["guaranteed"])
    plan = plan_resize(pod_from_json(raw), 0.25, "share", 2.0)
    assert plan.container is not None
    assert plan.container.requests["cpu"] == plan.container.limits["cpu"] == "250m"
    assert plan.limited is not None
    assert "QoS class cannot change in place" in plan.limited
    # Already at the decided CPU: nothing to write, but still said.
    again = plan_resize(pod_from_json(raw), 0.5, "share", 2.0)
    assert again.container is None and again.limited is not None


def test_only_node_capacity_and_missing_resize_support_count_as_refusals() -> None:
    capacity = KubeError(
        403,
        "Forbidden",
        'pods "web-1" is forbidden: Pod resize rejected: node node-a didn\'t have enough '
        "allocatable resources: cpu",
    )
    unsupported = KubeError(
        422,
        "Invalid",
        'Pod "web-1" is invalid: spec: Forbidden: Pod running on node without support for resize',
    )
    rbac = KubeError(403, "Forbidden", 'pods "web-1" is forbidden: User cannot patch resource')
    qos = KubeError(422, "Invalid", "Pod QOS Class may not change as a result of resizing")
    assert resize_refusal(capacity) is not None and "NodeCapacity" in str(resize_refusal(capacity))
    assert resize_refusal(unsupported) is not None
    assert resize_refusal(rbac) is None  # e.g. right after an API-server restart: transient
    assert resize_refusal(qos) is None


def test_selectors_match_like_the_api_server() -> None:
    labels = {"app": "web", "tier": "front"}
    assert selector_matches("app=web", labels)
    assert selector_matches("app==web,tier", labels)
    assert not selector_matches("app=web,tier!=front", labels)
    assert selector_matches("tier in (back,front),!canary", labels)
    assert not selector_matches("tier notin (front)", labels)
    assert not selector_matches("canary", labels)
    expr = {
        "matchLabels": {"app": "web"},
        "matchExpressions": [
            {"key": "tier", "operator": "In", "values": ["front", "back"]},
            {"key": "canary", "operator": "DoesNotExist"},
        ],
    }
    assert format_selector(expr) == "app=web,tier in (back,front),!canary"
    assert selector_matches(format_selector(expr), labels)
