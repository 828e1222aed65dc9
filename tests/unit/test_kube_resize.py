"""In-place resize planning keeps the QoS class; quantities; EndpointSlice conditions."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scaler.actuators.kubernetes import cpu_in_force, plan_resize
from scaler.kube_model import endpoint_slice_from_json, format_cpu, parse_cpu_cores, pod_from_json
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
