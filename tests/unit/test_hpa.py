"""The HPA-compatible calculator and behaviour, on the HPA's documented rules and examples."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scaler.explanation import Trace
from scaler.hpa import (
    CpuSample,
    HpaBehaviorState,
    NoMetricsError,
    PodSample,
    Tolerances,
    calculate_replicas,
    calculate_utilization_replicas,
)
from scaler.policy import HpaBehavior, HpaScalingRules


def ready(*values: float | None) -> list[PodSample]:
    return [PodSample(True, v) for v in values]


@pytest.mark.parametrize(
    ("samples", "current", "target", "expected"),
    [
        # docs: metric 200m against a 100m target doubles the replicas ...
        (ready(200, 200), 2, 100, 4),
        # ... and 50m against 100m halves them
        (ready(50, 50, 50, 50), 4, 100, 2),
        # plain per-pod metric, scale up: average 20000 / 15000 × 3 pods -> 4
        (ready(20000, 10000, 30000), 3, 15000, 4),
        # scale down: 12000 / 20000 × 5 pods -> 3
        (ready(12000, 12000, 12000, 12000, 12000), 5, 20000, 3),
        # within the 0.1 tolerance: nothing changes
        (ready(20000, 21000, 21000), 3, 20000, 3),
        # an unready pod scales up less: its value is ignored and it counts as 0
        # (the HPA's "unready pod scales less" case: 300/500/700 mCPU at a 300 target -> 4, not 5)
        ([PodSample(False, 300), *ready(500, 700)], 3, 300, 4),
        # missing metrics at exactly the target: the missing pods are left out, no change
        (ready(20000, 19000, 21000, None, None), 5, 20000, 5),
        # missing on a scale-down count as the target: 3 × 40 + 1 × 50 = 42.5 / 50 -> 0.85 × 4 -> 4
        (ready(40, 40, 40, None), 4, 50, 4),
        # missing on a scale-up count as 0: (90 + 90 + 0) / 3 / 50 = 1.2 -> ceil(1.2 × 3) = 4
        (ready(90, 90, None), 3, 50, 4),
        # filling in flips the direction -> keep current: (60 + 0 + 0) / 3 / 50 = 0.4 after 1.2
        (ready(60, None, None), 3, 50, 3),
        # unready pods on a scale-down are simply ignored: 10 / 50 × 1 -> 1
        ([PodSample(False, None), *ready(10)], 2, 50, 1),
    ],
)
def test_replica_calculation(
    samples: list[PodSample], current: int, target: float, expected: int
) -> None:
    assert calculate_replicas(samples, current, target, 0.1).replicas == expected


def test_no_ready_pod_with_a_metric_is_an_error_the_hpa_does_not_scale_on() -> None:
    with pytest.raises(NoMetricsError, match="did not receive metrics"):
        calculate_replicas([PodSample(False, 5.0), PodSample(True, None)], 2, 10)


def test_from_zero_uses_the_total() -> None:
    assert calculate_replicas([PodSample(True, 35.0)], 0, 10).replicas == 4
    assert calculate_replicas([PodSample(True, 0.0)], 0, 10).replicas == 0


def normalize(
    state: HpaBehaviorState, now: float, current: int, desired: int, lo: int = 1, hi: int = 1000
) -> int:
    return state.normalize(
        now,
        current=current,
        desired=desired,
        min_replicas=lo,
        max_replicas=hi,
        reasons=Trace(),
    )


def run(
    state: HpaBehaviorState, current: int, desired: int, steps: int, every_s: float
) -> list[int]:
    seen = []
    for i in range(steps):
        now = i * every_s
        new = normalize(state, now, current, desired)
        state.record_scale(now, current, new)
        current = new
        seen.append(current)
    return seen


def test_default_scale_up_is_max_of_double_and_plus_four_per_15s() -> None:
    assert run(HpaBehaviorState(HpaBehavior()), 1, 100, 4, 15.0) == [5, 10, 20, 40]
    # within one 15 s period the limit counts what was already added
    state = HpaBehaviorState(HpaBehavior())
    assert normalize(state, 0.0, 10, 100) == 20
    state.record_scale(0.0, 10, 20)
    assert normalize(state, 5.0, 20, 100) == 20, "period start was 10: at most 20 until 15 s"
    assert normalize(state, 15.0, 20, 100) == 40


def test_default_scale_down_waits_for_the_300s_stabilization_window() -> None:
    state = HpaBehaviorState(HpaBehavior())
    assert normalize(state, 0.0, 10, 10) == 10
    for t in range(15, 300, 15):
        assert normalize(state, float(t), 10, 2) == 10, t
    assert normalize(state, 300.0, 10, 2) == 2, "the 10 recommended at t=0 has left the window"


def test_documented_scale_down_policy_example() -> None:
    # docs: Percent 10 and Pods 5 per 60 s, select Max (the bigger change wins):
    # from 80 towards 10 -> 8 first (10 % > 5 pods), later 5 pods once 10 % is smaller.
    behavior = HpaBehavior(
        scale_down=HpaScalingRules(
            stabilization_window_s=0,
            policies=[
                {"type": "Percent", "value": 10, "period_s": 60},  # type: ignore[list-item]
                {"type": "Pods", "value": 5, "period_s": 60},  # type: ignore[list-item]
            ],
        )
    )
    seen = run(HpaBehaviorState(behavior), 80, 10, 14, 60.0)
    assert seen == [72, 64, 57, 51, 45, 40, 35, 30, 25, 20, 15, 10, 10, 10]


def test_select_policy_min_and_disabled() -> None:
    rules = {
        "stabilization_window_s": 0,
        "policies": [
            {"type": "Percent", "value": 10, "period_s": 60},
            {"type": "Pods", "value": 5, "period_s": 60},
        ],
    }
    minimal = HpaBehavior(
        scale_down=HpaScalingRules.model_validate({**rules, "select_policy": "Min"})
    )
    assert run(HpaBehaviorState(minimal), 80, 10, 2, 60.0) == [75, 70]
    disabled = HpaBehavior(
        scale_down=HpaScalingRules.model_validate({**rules, "select_policy": "Disabled"})
    )
    assert run(HpaBehaviorState(disabled), 80, 10, 2, 60.0) == [80, 80]


def test_scale_up_stabilization_uses_the_lowest_recent_recommendation() -> None:
    behavior = HpaBehavior(
        scale_up=HpaScalingRules(
            stabilization_window_s=60,
            policies=[{"type": "Pods", "value": 100, "period_s": 15}],  # type: ignore[list-item]
        )
    )
    state = HpaBehaviorState(behavior)
    assert normalize(state, 0.0, 2, 2) == 2
    assert normalize(state, 15.0, 2, 8) == 2, "2 was recommended within the last 60 s"
    assert normalize(state, 61.0, 2, 8) == 8


def test_bounds_clamp_and_say_so() -> None:
    state = HpaBehaviorState(HpaBehavior())
    reasons = Trace()
    assert (
        state.normalize(0.0, current=3, desired=3, min_replicas=4, max_replicas=10, reasons=reasons)
        == 4
    )
    assert "clamped replicas 3 -> 4 by min_replicas" in reasons.render()


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 20), st.integers(0, 30)), min_size=1, max_size=60),
    st.sampled_from([0, 15, 60]),
    st.sampled_from([0, 30, 300]),
)
def test_stabilization_equals_the_hpa_loop_over_all_recommendations(
    steps: list[tuple[int, int]], up_window: int, down_window: int
) -> None:
    unlimited = [{"type": "Pods", "value": 100_000, "period_s": 15}]
    behavior = HpaBehavior(
        scale_up=HpaScalingRules.model_validate(
            {"stabilization_window_s": up_window, "policies": unlimited}
        ),
        scale_down=HpaScalingRules.model_validate(
            {"stabilization_window_s": down_window, "policies": unlimited}
        ),
    )
    state = HpaBehaviorState(behavior)
    history: list[tuple[float, int]] = []
    now = 0.0
    current = 5
    for gap, desired in steps:
        now += gap
        # the HPA's own loop: min over the up window, max over the down window, then bound
        up = min([desired] + [r for t, r in history if t > now - up_window])
        down = max([desired] + [r for t, r in history if t > now - down_window])
        expected = min(max(current, up), down)
        history.append((now, desired))
        got = normalize(state, now, current, desired, lo=0, hi=1_000_000)
        assert got == expected
        current = got


# -- Kubernetes >= 1.33 tolerances and the CPU-utilisation path (replica_calculator.go) -------


def test_separate_scale_up_and_scale_down_tolerances() -> None:
    down = [PodSample(True, 7.0)] * 4  # ratio 0.7 against target 10
    assert calculate_replicas(down, 4, 10.0, Tolerances(scale_down=0.1, scale_up=0.5)).replicas == 3
    # A wide scale-down tolerance holds it; the scale-up tolerance plays no part.
    assert (
        calculate_replicas(down, 4, 10.0, Tolerances(scale_down=0.35, scale_up=0.0)).replicas == 4
    )
    up = [PodSample(True, 13.0)] * 4  # ratio 1.3
    assert calculate_replicas(up, 4, 10.0, Tolerances(scale_down=0.0, scale_up=0.35)).replicas == 4
    assert calculate_replicas(up, 4, 10.0, Tolerances(scale_down=0.5, scale_up=0.1)).replicas == 6
    # The bounds themselves are within (Kubernetes: 1 - down <= ratio <= 1 + up).
    assert Tolerances(0.25, 0.5).within(0.75) and Tolerances(0.25, 0.5).within(1.5)


def test_utilisation_is_truncated_to_a_whole_percent() -> None:
    # 1 core used of 3 requested is 33 %, not 33.3 %: ratio 0.66 against a 50 % target.
    pods = [CpuSample(True, 1.0 / 3, 1.0)] * 3
    result = calculate_utilization_replicas(pods, 3, 50.0, 0.0)
    assert result.usage_ratio == pytest.approx(0.66)
    assert result.replicas == 2  # ceil(0.66 × 3)


def test_missing_pods_count_as_their_full_request_on_a_scale_down() -> None:
    # Two pods at 20 % of a 1-core request, one ready pod missing its metric, target 50 %:
    # the missing one counts as 100 % of its request (the plain-metric path would use the
    # target, 50 %): (20 + 20 + 100) / 3 = 46 % -> ratio 0.92, within the tolerance: keep 3.
    pods = [CpuSample(True, 0.2, 1.0)] * 2 + [CpuSample(True, None, 1.0)]
    assert calculate_utilization_replicas(pods, 3, 50.0).replicas == 3
    # With the target's value instead (the plain path), it would have scaled down to 2.
    plain = [PodSample(True, 20.0)] * 2 + [PodSample(True, None)]
    assert calculate_replicas(plain, 3, 50.0).replicas == 2


def test_missing_pods_count_as_the_target_when_it_is_above_100_percent() -> None:
    # Target 150 %: a missing pod counts as 150 % of its request on a scale-down.
    pods = [CpuSample(True, 0.3, 1.0)] * 3 + [CpuSample(True, None, 1.0)]
    result = calculate_utilization_replicas(pods, 4, 150.0)
    # (30 × 3 + 150) / 4 = 60 % -> ratio 0.4 -> ceil(0.4 × 4) = 2
    assert result.replicas == 2


def test_missing_and_unready_pods_count_zero_on_a_scale_up() -> None:
    pods = (
        [CpuSample(True, 0.9, 0.5)] * 2  # 180 % each
        + [CpuSample(True, None, 0.5)]
        + [CpuSample(False, None, 0.5)]
    )
    result = calculate_utilization_replicas(pods, 4, 60.0)
    # ratio 3.0 on the two measured; filled: (180 + 180 + 0 + 0) / 4 = 90 % -> 1.5 × 4 = 6
    assert result.usage_ratio == pytest.approx(3.0)
    assert result.replicas == 6


def test_cpu_metric_drives_the_engine_in_hpa_mode() -> None:
    from scaler.decision import ServiceState
    from scaler.engine import Engine
    from scaler.policy import BudgetConfig, ScalingPolicy
    from scaler.signals import ServiceSignals

    policy = ScalingPolicy(
        mode="hpa",
        metric="cpu",
        target=50,
        min_replicas=1,
        max_replicas=10,
        cpu={"min": 0.5, "max": 0.5},
        behavior={
            "scale_up": {
                "stabilization_window_s": 0,
                "policies": [{"type": "Percent", "value": 100, "period_s": 15}],
                "tolerance": 0.2,
            }
        },
    )
    engine = Engine({"api": policy}, BudgetConfig(cpu=8))
    states = {"api": ServiceState("api", 2, 2, 0.5)}
    for t in range(2):  # the first tick has no rate yet
        # 2 replicas of 0.5 core using 0.8 core: 80 % of request against 50 %.
        sig = ServiceSignals("api", float(t), cpu_seconds_total=0.8 * t)
        d = engine.tick(float(t), {"api": sig}, states)["api"]
    assert d.rule == "hpa"
    assert d.replicas == 4  # ceil(1.6 × 2)
    assert any(s.kind == "hpa.utilization" for s in d.explanation.steps)


# -- Kubernetes' own table: replica_calculator_test.go, GetResourceReplicas (CPU utilisation) --
#
# Each pod is (ready, usage in millicores or None when its metric is missing, request in
# millicores).  Kubernetes' fixtures give every pod two containers with the same request and
# level; one container per pod gives the same utilisation.  Failed pods and pods being deleted
# are left out by the caller (they are not in the list), as the HPA ignores them.


def pods(*spec: tuple[bool, int | None, int]) -> list[CpuSample]:
    return [
        CpuSample(ok, None if used is None else used / 1000, request / 1000)
        for ok, used, request in spec
    ]


R = 1000  # a 1-core request


@pytest.mark.parametrize(
    ("name", "samples", "current", "target", "replicas", "utilization"),
    [
        ("scale up", pods((True, 300, R), (True, 500, R), (True, 700, R)), 3, 30, 5, 50),
        (
            "scale up: unready pod scales less",
            pods((False, 300, R), (True, 500, R), (True, 700, R)),
            3,
            30,
            4,
            60,
        ),
        (
            "no scale: unready pods ignored",
            pods((True, 400, R), (False, 500, R), (False, 700, R)),
            3,
            30,
            3,
            40,
        ),
        ("scale up: failed pods ignored", pods((True, 500, R), (True, 700, R)), 2, 30, 4, 60),
        (
            "scale down",
            pods((True, 100, R), (True, 300, R), (True, 500, R), (True, 250, R), (True, 250, R)),
            5,
            50,
            3,
            28,
        ),
        (
            "scale down: exclude unready pods",
            pods((True, 100, R), (True, 300, R), (True, 500, R), (False, 250, R), (False, 250, R)),
            5,
            50,
            2,
            30,
        ),
        (
            "scale down: exclude unscheduled (pending) pods",
            pods(
                (True, 100, R),
                (False, None, R),
                (False, None, R),
                (False, None, R),
                (False, None, R),
            ),
            5,
            50,
            1,
            10,
        ),
        (
            "superfluous metrics",
            pods((True, 4000, R), (True, 9500, R), (True, 3000, R), (True, 7000, R)),
            4,
            100,
            24,
            587,
        ),
        (
            "missing metrics: 100 % of request on a scale-down",
            pods((True, 400, R), (True, 95, R), (True, None, R), (True, None, R)),
            4,
            100,
            3,
            24,
        ),
        (
            "missing metrics, no change: at the target",
            pods((True, 1000, R), (True, None, R)),
            2,
            100,
            2,
            100,
        ),
        (
            "missing metrics, no change: above",
            pods((True, 1900, R), (True, None, R)),
            2,
            100,
            2,
            190,
        ),
        ("missing metrics, no change: below", pods((True, 600, R), (True, None, R)), 2, 100, 2, 60),
        (
            "missing metrics + unready: filling in flips the direction",
            pods((False, 100, R), (True, 450, R), (True, None, R)),
            3,
            50,
            3,
            45,
        ),
        (
            "missing metrics + unready: scale up",
            pods((False, 100, R), (True, 2000, R), (True, None, R)),
            3,
            50,
            4,
            200,
        ),
        (
            "missing metrics + unready: scale down",
            pods((False, 100, R), (True, 100, R), (True, 100, R), (True, None, R)),
            4,
            50,
            3,
            10,
        ),
        (
            "missing metrics on a scale-down, target over 100 %",
            pods((False, 200, R), (True, 100, R), (True, 100, 2 * R), (True, None, 2 * R)),
            4,
            300,
            2,
            6,
        ),
        (
            "rolling update with max surge: 3 pods for 2 replicas",
            pods((True, 100, R), (True, 100, R), (True, None, R)),
            2,
            50,
            2,
            10,
        ),
    ],
)
def test_kubernetes_resource_replica_cases(
    name: str,
    samples: list[CpuSample],
    current: int,
    target: float,
    replicas: int,
    utilization: int,
) -> None:
    result = calculate_utilization_replicas(samples, current, target, 0.1)
    assert result.replicas == replicas, name
    assert round(result.usage_ratio * target) == utilization, name


def test_kubernetes_computed_tolerance_case() -> None:
    # TestReplicaCalcComputedToleranceAlgImplementation: 10 pods using 150m each, requests
    # spread around 300m (3000m in all): utilisation 50 %.  A 56 % target is just past the
    # 0.1 tolerance (ratio 0.893) -> 9 pods; a 55 % target is within it (0.909) -> 10.
    requests = [400, 200, 310, 290, 302, 298, 301, 299, 300, 300]
    samples = pods(*[(True, 150, r) for r in requests])
    assert calculate_utilization_replicas(samples, 10, 56, 0.1).replicas == 9
    assert calculate_utilization_replicas(samples, 10, 55, 0.1).replicas == 10


def test_kubernetes_separate_tolerance_case() -> None:
    # TestReplicaCalcTolerancePerPodCMExternal with Tolerances{0.1, 0.01}: 8600 over 3 pods
    # against 2800 per pod is a ratio of 1.024 -- within the default 0.1, past a 0.01 scale-up
    # tolerance -> ceil(8600 / 2800) = 4.
    samples = [PodSample(True, 8600 / 3)] * 3
    assert calculate_replicas(samples, 3, 2800, Tolerances(0.1, 0.01)).replicas == 4
    assert calculate_replicas(samples, 3, 2800, Tolerances(0.1, 0.1)).replicas == 3
    # The same on the CPU path: 3 pods at 1024m of 1 core against a 100 % target.
    cpu = pods(*[(True, 1024, R)] * 3)
    assert calculate_utilization_replicas(cpu, 3, 100, Tolerances(0.1, 0.01)).replicas == 4
    assert calculate_utilization_replicas(cpu, 3, 100, Tolerances(0.1, 0.1)).replicas == 3


_rate_policies = st.lists(
    st.builds(
        lambda kind, value, period: {"type": kind, "value": value, "period_s": period},
        st.sampled_from(["Pods", "Percent"]),
        st.integers(1, 200),
        st.sampled_from([5, 15, 60, 120]),
    ),
    min_size=1,
    max_size=3,
)


def _period_start(events: list[tuple[float, int]], now: float, current: int, period: float) -> int:
    """Replicas at the start of the period: now's, less those added, plus those removed in it."""
    changes = [c for at, c in events if at > now - period]
    return current - sum(changes)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 40), st.integers(0, 60)), min_size=1, max_size=50),
    _rate_policies,
    _rate_policies,
    st.sampled_from(["Max", "Min"]),
    st.sampled_from(["Max", "Min"]),
)
def test_rate_policies_equal_the_hpa_sums_over_the_whole_event_history(
    steps: list[tuple[int, int]],
    up_policies: list[dict[str, object]],
    down_policies: list[dict[str, object]],
    up_select: str,
    down_select: str,
) -> None:
    """The HPA's rate limit (convertDesiredReplicasWithBehaviorRate): each policy allows a
    change relative to the replica count at the start of its period (now - replicas added +
    replicas removed within it), Max/Min across policies; computed here from every scale
    event ever made, against the state that keeps only the events a period can still see."""
    behavior = HpaBehavior(
        scale_up=HpaScalingRules.model_validate(
            {"stabilization_window_s": 0, "policies": up_policies, "select_policy": up_select}
        ),
        scale_down=HpaScalingRules.model_validate(
            {"stabilization_window_s": 0, "policies": down_policies, "select_policy": down_select}
        ),
    )
    state = HpaBehaviorState(behavior)
    events: list[tuple[float, int]] = []  # (at, +added / -removed), all of them
    now = 0.0
    current = 10
    for gap, desired in steps:
        now += gap

        expected = desired
        if desired > current:
            limits = []
            for p in behavior.scale_up.policies:
                start = _period_start(events, now, current, p.period_s)
                limits.append(
                    start + p.value
                    if p.type == "Pods"
                    else math.ceil(start * (1 + p.value / 100) - 1e-9)
                )
            limit = max(current, max(limits) if up_select == "Max" else min(limits))
            expected = min(desired, limit)
        elif desired < current:
            limits = []
            for p in behavior.scale_down.policies:
                start = _period_start(events, now, current, p.period_s)
                limits.append(
                    start - p.value
                    if p.type == "Pods"
                    else math.floor(start * (1 - p.value / 100) + 1e-9)
                )
            limit = min(current, min(limits) if down_select == "Max" else max(limits))
            expected = max(desired, limit)
        got = normalize(state, now, current, desired, lo=0, hi=1_000_000)
        assert got == expected, (now, current, desired, events)
        state.record_scale(now, current, got)
        if got != current:
            events.append((now, got - current))
        current = got
