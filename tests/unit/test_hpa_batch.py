"""The HPA calculation and ``behavior`` on many workloads at once answer as each one alone."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from scaler.explanation import Trace
from scaler.hpa import (
    CpuSample,
    NoMetricsError,
    PodGroups,
    PodSample,
    Tolerances,
    calculate,
    calculate_replicas,
    calculate_utilization_replicas,
)
from scaler.hpa_behavior import HpaBehaviorBatch
from scaler.policy import HpaBehavior, HpaScalingRules

_values = st.one_of(st.none(), st.integers(0, 4000).map(lambda m: m / 1000))
_pods = st.lists(
    st.tuples(st.booleans(), _values, st.sampled_from([0.1, 0.25, 0.5, 1.0])),
    min_size=0,
    max_size=8,
)
_workloads = st.lists(
    st.tuples(
        _pods,
        st.integers(0, 8),  # current replicas
        st.sampled_from([0.5, 1.0, 2.5, 50.0, 100.0, 150.0]),  # target
        st.sampled_from([0.0, 0.05, 0.1, 0.3]),  # scale-down tolerance
        st.sampled_from([0.0, 0.05, 0.1, 0.3]),  # scale-up tolerance
        st.booleans(),  # CPU utilisation path
    ),
    min_size=1,
    max_size=6,
)


Pod = tuple[bool, float | None, float]
Spec = tuple[list[Pod], int, float, float, float, bool]


def _alone(spec: Spec) -> tuple[int, str] | None:
    pods, current, target, down, up, cpu = spec
    tol = Tolerances(down, up)
    try:
        if cpu:
            samples = [CpuSample(ok, used, req) for ok, used, req in pods]
            result = calculate_utilization_replicas(samples, current, target, tol)
        else:
            plain = [PodSample(ok, used) for ok, used, _ in pods]
            result = calculate_replicas(plain, current, target, tol)
    except NoMetricsError:
        return None
    return result.replicas, result.step.kind


@settings(max_examples=200, deadline=None)
@given(_workloads)
def test_one_batch_answers_as_each_workload_alone(workloads: list[Spec]) -> None:
    rows = [(j, pod) for j, (pods, *_) in enumerate(workloads) for pod in pods]
    groups = PodGroups(
        workload=np.array([j for j, _ in rows], dtype=np.int64),
        count=np.ones(len(rows), dtype=np.int64),
        ready=np.array([p[0] for _, p in rows], dtype=bool),
        total=np.array([np.nan if p[1] is None else p[1] for _, p in rows], dtype=np.float64),
        request_cores=np.array([p[2] for _, p in rows], dtype=np.float64),
    )
    calc = calculate(
        groups,
        current=np.array([w[1] for w in workloads], dtype=np.int64),
        target=np.array([w[2] for w in workloads], dtype=np.float64),
        tolerance_down=np.array([w[3] for w in workloads], dtype=np.float64),
        tolerance_up=np.array([w[4] for w in workloads], dtype=np.float64),
        utilization=np.array([w[5] for w in workloads], dtype=bool),
    )
    for j, spec in enumerate(workloads):
        alone = _alone(spec)
        if alone is None:
            assert calc.step(j).kind == "hpa.no_ready_pods"
            assert calc.replicas[j] == spec[1]
        else:
            assert (int(calc.replicas[j]), calc.step(j).kind) == alone


def test_a_group_of_identical_pods_counts_as_that_many_pods() -> None:
    # 3 ready pods sharing 0.9 cores (300m each of 500m: 60 %) and 1 unready, target 50 %:
    # the same answer as the 4 pods listed one by one.
    groups = PodGroups(
        workload=np.array([0, 0], dtype=np.int64),
        count=np.array([3, 1], dtype=np.int64),
        ready=np.array([True, False]),
        total=np.array([0.9, np.nan]),
        request_cores=np.array([0.5, 0.5]),
    )
    calc = calculate(
        groups,
        current=np.array([4], dtype=np.int64),
        target=np.array([50.0]),
        tolerance_down=np.array([0.1]),
        tolerance_up=np.array([0.1]),
        utilization=np.array([True]),
    )
    pods = [CpuSample(True, 0.3, 0.5)] * 3 + [CpuSample(False, None, 0.5)]
    alone = calculate_utilization_replicas(pods, 4, 50.0)
    assert int(calc.replicas[0]) == alone.replicas
    assert calc.step(0) == alone.step


_rules = st.builds(
    lambda window, policies, select, tol: HpaScalingRules.model_validate(
        {
            "stabilization_window_s": window,
            "policies": policies,
            "select_policy": select,
            "tolerance": tol,
        }
    ),
    st.sampled_from([0, 3, 15, 60, 300]),
    st.lists(
        st.builds(
            lambda kind, value, period: {"type": kind, "value": value, "period_s": period},
            st.sampled_from(["Pods", "Percent"]),
            st.integers(1, 200),
            st.sampled_from([1, 5, 15, 60]),
        ),
        min_size=0,
        max_size=3,
    ),
    st.sampled_from(["Max", "Min", "Disabled"]),
    st.none(),
)


class _Reference:
    """The HPA controller's own loop for one workload, over its whole history."""

    def __init__(self, behavior: HpaBehavior) -> None:
        self.behavior = behavior
        self.recommendations: list[tuple[float, int]] = []
        self.events: list[tuple[float, int]] = []  # (at, +added / -removed)

    def _limit(self, rules: HpaScalingRules, now: float, current: int, up: bool) -> int:
        if rules.select_policy == "Disabled" or not rules.policies:
            return current
        limits = []
        for p in rules.policies:
            start = current - sum(c for at, c in self.events if at > now - p.period_s)
            if up:
                limits.append(
                    start + p.value
                    if p.type == "Pods"
                    else int(np.ceil(start * (1 + p.value / 100) - 1e-9))
                )
            else:
                limits.append(
                    start - p.value
                    if p.type == "Pods"
                    else int(np.floor(start * (1 - p.value / 100) + 1e-9))
                )
        biggest = max(limits) if up else min(limits)
        smallest = min(limits) if up else max(limits)
        limit = smallest if rules.select_policy == "Min" else biggest
        return max(current, limit) if up else min(current, limit)

    def normalize(
        self, now: float, current: int, desired: int, lo: int, hi: int
    ) -> tuple[int, list[tuple[int, int, str]]]:
        """The answer and its clamps, as (value, bound, name) tuples."""
        b = self.behavior
        up_w, down_w = b.scale_up.stabilization_window_s, b.scale_down.stabilization_window_s
        up = min([desired] + [r for at, r in self.recommendations if at > now - up_w])
        down = max([desired] + [r for at, r in self.recommendations if at > now - down_w])
        self.recommendations.append((now, desired))
        clamps: list[tuple[int, int, str]] = []
        result = min(max(current, up), down)
        if result != desired:
            clamps.append((desired, result, "stabilization"))
        if result > current:
            limit = self._limit(b.scale_up, now, current, up=True)
            if limit < hi and result > limit:
                clamps.append((result, limit, "behavior.scale_up"))
                result = limit
        elif result < current:
            limit = self._limit(b.scale_down, now, current, up=False)
            if limit > lo and result < limit:
                clamps.append((result, limit, "behavior.scale_down"))
                result = limit
        if result > hi:
            clamps.append((result, hi, "max_replicas"))
            result = hi
        elif result < lo:
            clamps.append((result, lo, "min_replicas"))
            result = lo
        return result, clamps

    def record(self, now: float, old: int, new: int) -> None:
        if new != old:
            self.events.append((now, new - old))


def _drive(
    behaviors: list[HpaBehavior], ticks: list[tuple[float, list[int], list[bool]]]
) -> HpaBehaviorBatch:
    """The batch and one reference per workload, ticked together; every answer and clamp equal."""
    m = len(behaviors)
    batch = HpaBehaviorBatch(behaviors)
    references = [_Reference(b) for b in behaviors]
    current = np.full(m, 10, dtype=np.int64)
    lo = np.array([j % 3 for j in range(m)], dtype=np.int64)
    hi = np.full(m, 30, dtype=np.int64)
    now = 0.0
    for gap, wanted, flags in ticks:
        now += gap
        desired = np.array(wanted[:m], dtype=np.int64)
        on = np.array(flags[:m], dtype=bool)
        out = batch.normalize(
            now, on, current=current, desired=desired, min_replicas=lo, max_replicas=hi
        )
        new = current.copy()
        for j in range(m):
            if not on[j]:
                assert out.replicas[j] == current[j]
                continue
            expected, clamps = references[j].normalize(
                now, int(current[j]), int(desired[j]), int(lo[j]), int(hi[j])
            )
            trace = Trace()
            out.explain(j, trace)
            assert int(out.replicas[j]) == expected, (now, j)
            assert [(c.value, c.bound, c.name) for c in trace.parts] == clamps  # type: ignore[union-attr]
            new[j] = expected
        batch.record(now, on, current, new)
        for j in range(m):
            if on[j]:
                references[j].record(now, int(current[j]), int(new[j]))
        current = new
    return batch


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.builds(HpaBehavior, scale_up=_rules, scale_down=_rules), min_size=1, max_size=5),
    st.lists(
        st.tuples(
            st.sampled_from([0.25, 1.0, 1.0, 7.0, 40.0]),  # seconds to the next tick
            st.lists(st.integers(0, 40), min_size=5, max_size=5),  # recommendations
            st.lists(st.booleans(), min_size=5, max_size=5),  # evaluated this tick
        ),
        min_size=1,
        max_size=80,
    ),
)
def test_behavior_batch_equals_the_hpa_loop_for_each_workload(
    behaviors: list[HpaBehavior], ticks: list[tuple[float, list[int], list[bool]]]
) -> None:
    """Different windows, periods and policies per workload, ticks at uneven times, some
    workloads skipped on some ticks: each answers as the HPA's loop over its whole history."""
    _drive(behaviors, ticks)


def test_behavior_keeps_every_tick_of_its_windows_when_ticks_come_fast() -> None:
    # 10 ticks a second for 40 s against windows of 5 s and 300 s and periods of 5 s and 15 s
    # (the third workload moves every tick): more columns in use than either ring starts with.
    rules = HpaScalingRules.model_validate(
        {
            "stabilization_window_s": 5,
            "policies": [{"type": "Pods", "value": 3, "period_s": 5}],
        }
    )
    free = HpaScalingRules.model_validate(
        {
            "stabilization_window_s": 0,
            "policies": [{"type": "Pods", "value": 100, "period_s": 15}],
        }
    )
    behaviors = [
        HpaBehavior(scale_up=rules, scale_down=rules),
        HpaBehavior(),
        HpaBehavior(scale_up=free, scale_down=free),
    ]
    wave = [[(t // 7) % 25, 40 - (t // 3) % 30, 5 + 10 * (t % 2)] for t in range(400)]
    batch = _drive(behaviors, [(0.1, w, [True, True, True]) for w in wave])
    assert "recommendations=400/604 columns" in repr(batch)
    assert "events=150/272 columns" in repr(batch)


def test_the_engine_explains_each_hpa_service_from_the_ticks_arrays() -> None:
    """KPA and HPA services side by side: each HPA decision's rule, inputs, steps and clamps
    are its own, whether it had data, had none (CPU utilisation, CPU not measured), or was
    frozen."""
    from scaler.decision import ServiceState
    from scaler.engine import Engine
    from scaler.policy import BudgetConfig, ScalingPolicy
    from scaler.signals import ServiceSignals

    hpa = {"mode": "hpa", "target": 10, "max_replicas": 8, "cpu": {"min": 0.1, "max": 0.1}}
    engine = Engine(
        {
            "kpa": ScalingPolicy(target=10, cpu={"min": 0.1, "max": 0.1}),
            "busy": ScalingPolicy.model_validate(hpa),
            "unmeasured": ScalingPolicy.model_validate({**hpa, "metric": "cpu", "target": 50}),
            "gone": ScalingPolicy.model_validate(hpa),
        },
        BudgetConfig(cpu=4),
    )
    states = {n: ServiceState(n, 2, 2, 0.1) for n in ("kpa", "busy", "unmeasured", "gone")}
    for t in range(3):
        now = float(t)
        signals = {n: ServiceSignals(n, now, in_flight=5) for n in ("kpa", "unmeasured", "gone")}
        signals["busy"] = ServiceSignals("busy", now, in_flight=60)
        if t == 2:
            del signals["gone"]
        decisions = engine.tick(now, signals, states)
    busy = decisions["busy"]
    assert busy.rule == "hpa"
    # 60 over 2 ready replicas against 10 each: ceil(3.0 × 2) = 6, within the default
    # scale-up policies (max(2×, +4) per 15 s).
    assert busy.replicas == 6
    assert [s.kind for s in busy.explanation.steps][:2] == ["hpa.inputs", "hpa.ratio"]
    assert busy.explanation.steps[1].values == {"ratio": 3.0, "pods": 2}
    assert busy.inputs["average"] == 60.0 and busy.inputs["capacity_replicas"] == 2.0
    unmeasured = decisions["unmeasured"]
    assert unmeasured.rule == "frozen: no data" and unmeasured.replicas == 2
    assert unmeasured.explanation.steps[0].kind == "hpa.no_metric"
    assert "average" not in unmeasured.inputs
    gone = decisions["gone"]
    assert gone.rule == "frozen: missing signals" and gone.replicas == 2
    assert not any(s.kind.startswith("hpa.") for s in gone.explanation.steps)
    assert decisions["kpa"].explanation.steps[0].kind == "kpa.windows"
