"""``scaling.metrics``: the steps table, the max-of-metrics rule, the config and the engine hook."""

from __future__ import annotations

import math
from collections.abc import Mapping

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.settings import ConfigError, parse_settings
from scaler.decision import Decision, ServiceState
from scaler.engine import Engine
from scaler.metrics import MetricAnswer, combine, histogram_quantile, steps_replicas
from scaler.policy import BudgetConfig, MetricStep, MetricStepsThen, ScalingPolicy
from scaler.signals import ServiceSignals

ISSUE_STEPS = [MetricStep(below=1000, replicas=2), MetricStep(below=10000, replicas=3)]
ISSUE_THEN = MetricStepsThen(every=20000, add=1)


@pytest.mark.parametrize(
    ("value", "replicas"),
    [
        (0, 2),
        (999, 2),
        (999.999, 2),
        (1000, 3),
        (9999, 3),
        (10000, 3),
        (29999, 3),
        (30000, 4),
        (49999, 4),
        (50000, 5),
        (1_010_000, 53),
    ],
)
def test_the_issues_steps_table_at_its_boundaries(value: float, replicas: int) -> None:
    assert steps_replicas(value, ISSUE_STEPS, ISSUE_THEN) == replicas


def test_without_then_the_last_row_holds_beyond_the_table() -> None:
    assert steps_replicas(10000, ISSUE_STEPS, None) == 3
    assert steps_replicas(1e9, ISSUE_STEPS, None) == 3


@given(
    st.lists(st.integers(min_value=1, max_value=10**6), min_size=1, max_size=6, unique=True),
    st.lists(st.integers(min_value=0, max_value=20), min_size=6, max_size=6),
    st.integers(min_value=1, max_value=10**5),
    st.integers(min_value=1, max_value=3),
    st.floats(min_value=0, max_value=2e6, allow_nan=False),
    st.floats(min_value=0, max_value=2e6, allow_nan=False),
)
def test_a_steps_table_never_gives_fewer_replicas_for_a_larger_value(
    belows: list[int], adds: list[int], every: int, add: int, a: float, b: float
) -> None:
    belows.sort()
    replicas = [sum(adds[: k + 1]) for k in range(len(belows))]  # non-decreasing
    steps = [MetricStep(below=x, replicas=r) for x, r in zip(belows, replicas, strict=False)]
    then = MetricStepsThen(every=every, add=add)
    low, high = min(a, b), max(a, b)
    assert steps_replicas(low, steps, then) <= steps_replicas(high, steps, then)
    for row in steps:  # a row's replicas from its previous row's below up to its own
        assert steps_replicas(row.below - 1e-3, steps, then) <= row.replicas


answers = st.builds(
    MetricAnswer,
    name=st.sampled_from(["a", "b", "c", "d"]),
    type=st.sampled_from(["concurrency", "rps", "app", "cpu_utilization"]),
    value=st.one_of(st.none(), st.floats(min_value=0, max_value=1e6)),
    replicas=st.one_of(st.none(), st.integers(min_value=0, max_value=100)),
)


@given(st.integers(min_value=0, max_value=100), st.lists(answers, max_size=6))
def test_the_largest_answer_wins_and_missing_data_never_scales_down(
    current: int, items: list[MetricAnswer]
) -> None:
    # (an answer with a value but no replicas is "no opinion"; with neither, "no data")
    replicas, winner, held = combine(current, items)
    decided = [a.replicas for a in items if a.replicas is not None]
    missing = [a.name for a in items if a.replicas is None and a.value is None]
    if not decided:
        assert (replicas, winner) == (current, "")
        return
    largest = max(decided)
    if missing and largest < current:
        assert (replicas, winner) == (current, "")
        assert held == tuple(missing)
    else:
        assert replicas == largest
        assert winner == next(a.name for a in items if a.replicas == largest)
        assert held == ()
    assert replicas >= largest


def test_latency_without_requests_does_not_hold_the_others() -> None:
    items = [
        MetricAnswer("concurrency", "concurrency", 1.0, 1),
        MetricAnswer("p95", "latency", None, None),
    ]
    assert combine(5, items) == (1, "concurrency", ())


def test_histogram_quantile_interpolates_in_a_bucket() -> None:
    assert histogram_quantile([0, 10, 0], 0.5, (0.1, 0.2)) == pytest.approx(0.15)
    assert histogram_quantile([0, 0, 5], 0.95, (0.1, 0.2)) == 0.2
    assert histogram_quantile([0, 0, 0], 0.95, (0.1, 0.2)) is None


# -- config ------------------------------------------------------------------------------------


def problems(scaling: dict[str, object]) -> list[str]:
    with pytest.raises(ConfigError) as e:
        parse_settings({"services": {"api": {"scaling": scaling}}}, "sluice.yaml")
    return e.value.problems


APP = {
    "type": "app",
    "name": "active_users",
    "source": {"header": "X-Active-Users", "aggregate": "max"},
    "steps": [{"below": 1000, "replicas": 2}, {"below": 10000, "replicas": 3}],
    "then": {"every": 20000, "add": 1},
}


def test_the_issues_yaml_is_a_valid_policy_and_the_shorthand_stays_valid() -> None:
    s = parse_settings({"services": {"api": {"scaling": {"metrics": [APP]}}}}, "sluice.yaml")
    policy = s.services["api"].scaling
    assert not policy.primary_listed
    assert [m.key for m in policy.extra_metrics] == ["active_users"]
    short = parse_settings({"services": {"api": {"scaling": {"metric": "rps", "target": 5}}}})
    assert short.services["api"].scaling.primary_listed
    listed = ScalingPolicy.model_validate(
        {"metrics": [{"type": "rps", "target": 5}, APP], "mode": "hpa"}
    )
    assert (listed.metric, listed.target, listed.primary_listed) == ("rps", 5, True)
    again = ScalingPolicy.model_validate(listed.model_dump())  # a dump loads back
    assert again == listed


@pytest.mark.parametrize(
    ("scaling", "problem"),
    [
        (
            {
                "metrics": [
                    {
                        **APP,
                        "steps": [{"below": 1000, "replicas": 2}, {"below": 500, "replicas": 3}],
                    }
                ]
            },
            "services.api.scaling.metrics[0].steps[1].below: must be > the previous row's below (1000), got 500",
        ),
        (
            {
                "metrics": [
                    {
                        **APP,
                        "steps": [{"below": 1000, "replicas": 3}, {"below": 5000, "replicas": 2}],
                    }
                ]
            },
            "services.api.scaling.metrics[0].steps[1].replicas: must be >= the previous row's replicas (3), got 2",
        ),
        (
            {"metrics": [{**APP, "target": 100}]},
            "services.api.scaling.metrics[0].target: give exactly one of target (per replica) or steps",
        ),
        (
            {"metrics": [{**APP, "source": {"header": "X-A", "push": True}}]},
            "services.api.scaling.metrics[0].source.header: give exactly one source: header: NAME or push: true",
        ),
        (
            {"metrics": [{**APP, "source": {"header": "X A"}}]},
            "services.api.scaling.metrics[0].source.header: not a valid header name: 'X A'",
        ),
        (
            {"metrics": [{"type": "latency", "percentile": 95}]},
            "services.api.scaling.metrics[0].target_s: is required for type: latency",
        ),
        (
            {"metrics": [{"type": "rps"}]},
            "services.api.scaling.metrics[0].target: is required for type: rps",
        ),
        (
            {"metrics": [{"type": "rps", "target": 3, "steps": [{"below": 1, "replicas": 1}]}]},
            "services.api.scaling.metrics[0].steps: only for type: app, not rps",
        ),
        (
            {"metrics": [{"type": "app", "source": {"push": True}, "target": 3}]},
            "services.api.scaling.metrics[0].name: is required for type: app",
        ),
        (
            {"metrics": [APP, APP]},
            "services.api.scaling.metrics[1].name: 'active_users' is already the name of metrics[0] (names must differ)",
        ),
        (
            {"metric": "rps", "metrics": [APP]},
            "services.api.scaling.metric: give metric/target or metrics, not both (list it as an entry of metrics)",
        ),
        (
            {"metrics": [{"type": "cpu_utilization", "target": 70}], "min_replicas": 0},
            "services.api.scaling.min_replicas: must be >= 1 with cpu_utilization (no CPU is measured at zero)",
        ),
        (
            {"metrics": [{"type": "bogus"}]},
            "services.api.scaling.metrics[0].type: must be one of concurrency, rps, cpu_utilization, latency, app, got 'bogus'",
        ),
    ],
)
def test_config_errors_name_the_key_path(scaling: dict[str, object], problem: str) -> None:
    assert f"sluice.yaml: {problem}" in problems(scaling)


# -- the engine -------------------------------------------------------------------------------


def policy(metrics: list[dict[str, object]], **kw: object) -> ScalingPolicy:
    base: dict[str, object] = {
        "metrics": metrics,
        "prefer": "horizontal",
        "max_replicas": 20,
        "cpu": {"min": 0.1, "max": 0.1},
        "stable_window_s": 10,
        "panic_window_s": 2,
        # The metrics' own stabilisation is under test here, not the replicas' warm delay.
        "scale_down_delay_s": 0,
    }
    base.update(kw)
    return ScalingPolicy.model_validate(base)


def step(engine: Engine, t: float, states: dict[str, ServiceState], **signals: object) -> Decision:
    sig = ServiceSignals("api", t, **signals)  # type: ignore[arg-type]
    d = engine.tick(t, {"api": sig}, states)["api"]
    states["api"] = ServiceState("api", d.replicas, d.replicas, d.cpu_per_replica_cores)
    return d


def test_an_app_steps_table_decides_replicas_and_the_decision_names_it() -> None:
    engine = Engine({"api": policy([{**APP, "stabilization_window_s": 0}])}, BudgetConfig(cpu=4))
    states: dict[str, ServiceState] = {}
    d = step(engine, 0.0, states, in_flight=50, app_metrics={"active_users": 15000.0})
    # concurrency is not listed: 50 in flight does not count, the table says 3
    assert d.replicas == 3
    steps = [s for s in d.explanation.steps if s.kind.startswith("metrics.")]
    assert steps[0].values["name"] == "active_users"
    assert steps[0].values["replicas"] == 3
    assert steps[-1].kind == "metrics.won"
    assert steps[-1].values == {"name": "active_users", "replicas": 3}
    assert d.inputs["metric.active_users"] == 15000.0
    assert any("active_users wins with 3 replicas" in r for r in d.reasons)
    for t in range(1, 4):
        d = step(engine, float(t), states, app_metrics={"active_users": 35000.0})
    assert d.replicas == 4


def test_the_largest_metric_wins_over_the_primary_and_the_primary_over_it() -> None:
    metrics = [{"type": "concurrency", "target": 10}, {**APP, "stabilization_window_s": 0}]
    engine = Engine({"api": policy(metrics)}, BudgetConfig(cpu=4))
    states: dict[str, ServiceState] = {}
    d = step(engine, 0.0, states, in_flight=0, app_metrics={"active_users": 500.0})
    assert d.replicas == 2
    assert d.explanation.steps[-2].kind == "metrics.won" or any(
        s.kind == "metrics.won" and s.values["name"] == "active_users" for s in d.explanation.steps
    )
    for t in range(1, 6):
        d = step(engine, float(t), states, in_flight=140, app_metrics={"active_users": 500.0})
    won = [s for s in d.explanation.steps if s.kind == "metrics.won"]
    assert won[0].values["name"] == "concurrency"
    assert d.replicas == won[0].values["replicas"] > 2  # 140 / (10 × 0.7) = 20


def test_a_metric_without_data_never_scales_the_service_down() -> None:
    metrics = [{"type": "concurrency", "target": 10}, {**APP, "stabilization_window_s": 0}]
    engine = Engine({"api": policy(metrics, min_replicas=1)}, BudgetConfig(cpu=4))
    states = {"api": ServiceState("api", 6, 6, 0.1)}
    d = step(engine, 0.0, states, in_flight=0)  # no app value at all
    assert d.replicas == 6
    held = [s for s in d.explanation.steps if s.kind == "metrics.held"]
    assert held and held[0].values["missing"] == "active_users"
    assert any("active_users has no data" in r for r in d.reasons)
    for t in range(1, 4):  # the value arrives: the table (2) may now win the way down
        d = step(engine, float(t), states, in_flight=0, app_metrics={"active_users": 10.0})
    assert d.replicas < 6


def test_a_lower_answer_waits_for_its_stabilization_window() -> None:
    engine = Engine({"api": policy([{**APP, "stabilization_window_s": 5}])}, BudgetConfig(cpu=4))
    states: dict[str, ServiceState] = {}
    step(engine, 0.0, states, app_metrics={"active_users": 35000.0})
    seen = [
        step(engine, float(t), states, app_metrics={"active_users": 10.0}).replicas
        for t in range(1, 12)
    ]
    assert seen[0] == 4  # the window still holds the high value and its answer
    assert seen[-1] == 2


def test_cpu_utilization_follows_the_measured_cpu_over_the_cpu_held() -> None:
    metrics = [{"type": "cpu_utilization", "target": 50, "stabilization_window_s": 0}]
    engine = Engine({"api": policy(metrics, min_replicas=1)}, BudgetConfig(cpu=4))
    states = {"api": ServiceState("api", 2, 2, 0.1)}
    d = step(engine, 0.0, states, cpu_seconds_total=0.0)
    for t in range(1, 6):  # 0.2 cores used of 0.2 held: 100 % against 50 % -> 4 replicas
        d = step(engine, float(t), states, cpu_seconds_total=0.2 * t)
        states["api"] = ServiceState("api", 2, 2, 0.1)  # recommend-only: held at 2
    assert d.replicas == 4
    assert d.inputs["metric.cpu_utilization"] == pytest.approx(100.0)


def test_cpu_utilization_without_a_measure_says_so() -> None:
    metrics = [{"type": "cpu_utilization", "target": 50}]
    engine = Engine({"api": policy(metrics, min_replicas=1)}, BudgetConfig(cpu=4))
    states = {"api": ServiceState("api", 3, 3, 0.1)}
    d = step(engine, 0.0, states)
    assert d.replicas == 3
    assert any("CPU not measured (local: cgroup usage; kubernetes:" in r for r in d.reasons)


BOUNDS = (0.1, 0.2, 0.4, 0.8)


def counts_after(fast: int, slow: int) -> tuple[int, ...]:
    """Cumulative histogram: ``fast`` requests under 0.1 s, ``slow`` ones in (0.4, 0.8]."""
    return (fast, 0, 0, slow, 0)


def test_latency_above_target_asks_for_capacity_in_proportion_and_is_damped() -> None:
    metrics = [
        {"type": "concurrency", "target": 10},
        {
            "type": "latency",
            "percentile": 95,
            "target_s": 0.3,
            "window_s": 5,
            "stabilization_window_s": 0,
        },
    ]
    engine = Engine({"api": policy(metrics)}, BudgetConfig(cpu=4))
    states = {"api": ServiceState("api", 2, 2, 0.1)}
    fast = slow = 0
    d = step(
        engine, 0.0, states, in_flight=7, latency_counts=counts_after(0, 0), latency_bounds_s=BOUNDS
    )
    history = []
    for t in range(1, 20):
        slow += 20  # every request is slow: p95 ~0.78 s against 0.3 s
        d = step(
            engine,
            float(t),
            states,
            in_flight=7,
            latency_counts=counts_after(fast, slow),
            latency_bounds_s=BOUNDS,
        )
        history.append(d.replicas)
    # (tick 0 had no latency yet: concurrency alone took it to 1)
    # in proportion, at most 2x per step: 1 -> 2, held a whole window (5 s), then 2 -> 4 ...
    assert history[:6] == [2, 2, 2, 2, 2, 4]
    assert max(history) <= 16
    won = [
        s
        for s in d.explanation.steps
        if s.kind == "metrics.answer" and s.values["name"] == "latency"
    ]
    assert won and won[0].values["replicas"] != "-"
    # latency never answers below the others: with concurrency asking 20, latency says >= 20
    # (the replicas follow the windows: two ticks fill the 2 s panic window)
    fast += 1000
    for t in (20.0, 21.0):
        d = step(
            engine,
            t,
            states,
            in_flight=140,
            latency_counts=counts_after(fast, slow),
            latency_bounds_s=BOUNDS,
        )
    assert d.replicas >= 20


def test_fast_latency_has_no_opinion() -> None:
    metrics = [
        {"type": "concurrency", "target": 10},
        {"type": "latency", "percentile": 95, "target_s": 0.3, "window_s": 5},
    ]
    engine = Engine({"api": policy(metrics)}, BudgetConfig(cpu=4))
    states: dict[str, ServiceState] = {}
    d = None
    for t in range(6):
        d = step(
            engine,
            float(t),
            states,
            in_flight=7,
            latency_counts=counts_after(100 * t, 0),
            latency_bounds_s=BOUNDS,
        )
    assert d is not None
    assert d.replicas == 1
    latency = [
        s
        for s in d.explanation.steps
        if s.kind == "metrics.answer" and s.values["name"] == "latency"
    ]
    assert latency[0].values["replicas"] == "-"
    assert "<= 0.3s" in str(latency[0].values["note"])
    assert not math.isnan(d.allocated_cores)


# -- sluice simulate ----------------------------------------------------------------------------


def test_a_simulated_workload_carries_an_app_metric_that_drives_the_replicas() -> None:
    from scaler.simulate.baselines import EngineController
    from scaler.simulate.runner import build_scenario, run
    from scaler.simulate.workload import WorkloadError, parse_workload

    workload = parse_workload(
        {
            "duration_s": 90,
            "services": {
                "api": {
                    "slo_s": 1.0,
                    "load": [{"at_s": 0, "rps": 2, "cpu_s": 0.01}],
                    "app": {
                        "active_users": [
                            {"at_s": 0, "value": 500},
                            {"at_s": 30, "value": 15000},
                            {"at_s": 60, "value": 35000},
                        ]
                    },
                }
            },
        }
    )
    policies = {"api": policy([{**APP, "window_s": 1, "stabilization_window_s": 0}])}
    budget = BudgetConfig(cpu=4)
    controller = EngineController("sluice", policies, budget)
    decided: dict[float, int] = {}
    engine_tick = controller.engine.tick

    def tick(
        now: float, signals: Mapping[str, ServiceSignals], states: Mapping[str, ServiceState]
    ) -> dict[str, Decision]:
        decisions = engine_tick(now, signals, states)
        decided[now] = decisions["api"].replicas
        return decisions

    controller.engine.tick = tick  # type: ignore[method-assign]
    run(build_scenario(workload, policies), "sluice", policies, budget, controller=controller)
    assert {decided[float(t)] for t in range(1, 30)} == {2}
    assert {decided[float(t)] for t in range(31, 60)} == {3}
    assert {decided[float(t)] for t in range(61, 90)} == {4}
    with pytest.raises(WorkloadError) as e:
        parse_workload(
            {
                "services": {
                    "api": {
                        "slo_s": 1,
                        "load": [{"at_s": 0, "rps": 1, "cpu_s": 0.1}],
                        "app": {"u": [{"at_s": 0, "value": 1}, {"at_s": 0, "value": 2}]},
                    }
                }
            },
            "w.yaml",
        )
    assert e.value.problems == [
        "w.yaml: services.api.app.u[1].at_s: must be > the previous value's at_s (0), got 0"
    ]


@given(
    st.floats(min_value=0, max_value=30),
    st.lists(
        st.tuples(st.floats(min_value=0.01, max_value=10), st.integers(min_value=0, max_value=50)),
        min_size=1,
        max_size=60,
    ),
)
def test_a_metrics_answer_is_the_largest_of_its_stabilization_window(
    window_s: float, steps: list[tuple[float, int]]
) -> None:
    from scaler.metrics import MetricTrack

    spec = {**APP, "stabilization_window_s": window_s}
    track = MetricTrack(policy([spec]).metrics[0], policy([spec]), 100)
    now = 0.0
    seen: list[tuple[float, int]] = []
    for dt, raw in steps:
        now += dt
        seen.append((now, raw))
        expected = max(r for t, r in seen if t >= now - window_s - 1e-9)
        assert track._stabilized(now, raw) == expected
