"""The queueing model: nothing lost, CPU within what was decided, processor sharing as theory says."""

from __future__ import annotations

import numpy as np
import pytest

from scaler.policy import BudgetConfig, ScalingPolicy
from scaler.simulate.arrivals import Arrivals, draw_arrivals
from scaler.simulate.baselines import static_split
from scaler.simulate.loop import EventLoop
from scaler.simulate.model import DRAINING, PENDING, READY, STARTING, Node, ServiceModel
from scaler.simulate.report import direction_changes, offered_direction_changes
from scaler.simulate.runner import build_scenario, lends, run
from scaler.simulate.workload import parse_workload
from tests.support.sim_scenarios import BURSTY, POLICIES

BUDGET = BudgetConfig(cpu=2, enforcement="limit")
"""Limit enforcement: each replica's decided CPU is a hard cap (share: tests/unit/test_simulate_share.py)."""


def one_service(arrivals: Arrivals, cores: float, replicas: int = 1) -> tuple[ServiceModel, Node]:
    m = ServiceModel("a", arrivals, startup_s=0.0, request_cores_max=1.0)
    node = Node(8.0, {"a": m})
    m.set_target(replicas, cores, node.claims())
    node.schedule(0.0)
    return m, node


def limit_loop(node: Node) -> EventLoop:
    """The simulator's event loop over the node's services, under limit enforcement."""
    return EventLoop(node.capacity_cores, node.services, rule="limit")


@pytest.mark.parametrize("enforcement", ["limit", "share"])
@pytest.mark.parametrize("name", ["static", "sluice", "independent"])
def test_every_arrival_is_completed_or_still_in_the_system(name: str, enforcement: str) -> None:
    scenario = build_scenario(parse_workload(BURSTY), POLICIES)
    budget = BUDGET.model_copy(update={"enforcement": enforcement})
    result = run(scenario, name, POLICIES, budget)  # type: ignore[arg-type]
    assert result.enforcement == enforcement
    for s in scenario.services:
        assert result.arrivals[s] == len(scenario.arrivals[s]) > 0
        assert result.completed[s] + result.unfinished[s] == result.arrivals[s]
        assert result.latencies_s[s].size == result.arrivals[s]
        assert result.series[s]["completions"].sum() == result.completed[s]
        assert (result.latencies_s[s] >= 0).all()


@pytest.mark.parametrize("name", ["static", "sluice", "independent"])
def test_cpu_used_never_exceeds_cpu_given_nor_the_budget(name: str) -> None:
    scenario = build_scenario(parse_workload(BURSTY), POLICIES)
    result = run(scenario, name, POLICIES, BUDGET)  # type: ignore[arg-type]
    total_allocated = np.zeros(scenario.ticks)
    total_used = np.zeros(scenario.ticks)
    for s in scenario.services:
        series = result.series[s]
        if not lends(name, BUDGET):  # Sluice's run lends quota between services between ticks
            assert (series["used_cores"] <= series["allocated_cores"] + 1e-9).all()
        total_allocated += series["allocated_cores"]
        total_used += series["used_cores"]
        assert abs(result.cpu_seconds[s] - series["used_cores"].sum() * scenario.tick_s) < 1e-6
    assert (total_used <= total_allocated + 1e-9).all()
    assert (total_allocated <= BUDGET.cpu + 1e-9).all()


def test_a_replica_uses_at_most_its_limit_and_the_node_its_capacity() -> None:
    times = np.linspace(0, 5, 200, endpoint=False)
    m, node = one_service(Arrivals(times, np.full(200, 0.2)), cores=0.5)
    loop = limit_loop(node)
    for k in range(10):
        loop.run(float(k + 1))
        assert m.cpu_seconds_total <= 0.5 * (k + 1) + 1e-9
    assert m.cpu_seconds_total == pytest.approx(5.0)  # saturated from t=0 to t=10


def test_processor_sharing_matches_theory() -> None:
    """M/G/1-PS: mean response time = s / (1 - rho), whatever the service-time distribution."""
    w = parse_workload(
        {
            "services": {
                "a": {"slo_s": 1, "cpu_cv": 1, "load": [{"at_s": 0, "rps": 5, "cpu_s": 0.1}]}
            }
        }
    )
    arrivals = draw_arrivals("a", w.services["a"], 3000.0, seed=7)
    m, node = one_service(arrivals, cores=1.0)
    loop = limit_loop(node)
    for k in range(3000):
        loop.run(float(k + 1))
    mean = float(np.mean(m.latencies))
    assert mean == pytest.approx(0.1 / (1 - 0.5), rel=0.1)


def test_a_request_alone_runs_at_one_core_even_on_a_bigger_replica() -> None:
    m, node = one_service(Arrivals(np.array([0.5]), np.array([0.3])), cores=2.0)
    limit_loop(node).run(1.0)
    assert m.latencies == [pytest.approx(0.3)]


def test_cpu_shrinks_in_place_and_removed_replicas_drain() -> None:
    times = np.zeros(4)
    m, node = one_service(Arrivals(times, np.full(4, 1.0)), cores=1.0, replicas=2)
    for r in m.replicas:
        r.phase = READY
    loop = limit_loop(node)
    loop.run(1.0)  # 2 requests per replica, each half done
    assert m.in_flight == 4
    m.set_target(1, 0.5, node.claims())
    assert [r.phase for r in m.replicas].count(DRAINING) == 1
    assert all(r.cores == 0.5 for r in m.replicas)  # in place, at once
    for k in range(1, 6):
        node.schedule(float(k))
        loop.run(float(k + 1))
    assert m.completions_total == 4
    assert len(m.replicas) == 1  # the drained one left once empty


def test_new_replicas_wait_for_capacity_then_for_start_up() -> None:
    a = ServiceModel("a", Arrivals(np.zeros(0), np.zeros(0)), startup_s=3.0, request_cores_max=1.0)
    b = ServiceModel("b", Arrivals(np.zeros(0), np.zeros(0)), startup_s=3.0, request_cores_max=1.0)
    node = Node(2.0, {"a": a, "b": b})
    claims = node.claims()
    a.set_target(3, 0.5, claims)  # 1.5 cores: fits
    b.set_target(2, 0.5, claims)  # only one of these fits
    node.schedule(0.0)
    assert [r.phase for r in b.replicas] == [STARTING, PENDING]
    a.set_target(2, 0.5, claims)  # frees 0.5 (a starting replica is cancelled at once)
    node.schedule(1.0)
    assert [r.phase for r in b.replicas] == [STARTING, STARTING]
    loop = limit_loop(node)
    loop.run(2.0)
    assert b.state().ready_replicas == 0
    loop.run(4.0)
    assert [r.phase for r in b.replicas] == [READY, STARTING]
    assert node.reserved_cores() == pytest.approx(2.0)


def test_requests_wait_in_the_gateway_while_no_replica_is_ready() -> None:
    m = ServiceModel(
        "a",
        Arrivals(np.array([0.1, 0.2]), np.array([0.1, 0.1])),
        startup_s=1.5,
        request_cores_max=1.0,
    )
    node = Node(1.0, {"a": m})
    m.set_target(1, 1.0, node.claims())
    node.schedule(0.0)
    loop = limit_loop(node)
    loop.run(1.0)
    assert m.signals(1.0).queued == 2
    loop.run(2.0)  # ready at 1.5: both requests then share the core
    assert m.completions_total == 2
    assert sorted(m.latencies) == [pytest.approx(1.5), pytest.approx(1.6)]  # both done at 1.7


def test_static_split_is_equal_and_within_bounds() -> None:
    targets = static_split(POLICIES, 2.0)
    assert {s: t.replicas * t.cpu_per_replica_cores for s, t in targets.items()} == {
        "api": pytest.approx(1.0),
        "reports": pytest.approx(1.0),
    }
    small = {"a": ScalingPolicy(cpu={"min": 0.1, "max": 0.25}, max_replicas=3)}
    assert static_split(small, 2.0)["a"].replicas == 3  # max_replicas caps it
    assert static_split(small, 2.0)["a"].cpu_per_replica_cores == 0.25


def test_static_baseline_never_scales() -> None:
    scenario = build_scenario(parse_workload(BURSTY), POLICIES)
    result = run(scenario, "static", POLICIES, BUDGET)
    for s in scenario.services:
        assert set(result.series[s]["replicas"]) == {1.0}
        assert set(result.series[s]["allocated_cores"]) == {1.0}


def test_runs_replay_the_same_arrivals() -> None:
    a = build_scenario(parse_workload(BURSTY), POLICIES)
    b = build_scenario(parse_workload(BURSTY), POLICIES)
    assert np.array_equal(a.arrivals["api"].times_s, b.arrivals["api"].times_s)
    c = build_scenario(parse_workload(BURSTY), POLICIES, seed=99)
    assert not np.array_equal(a.arrivals["api"].times_s, c.arrivals["api"].times_s)


def test_flapping_counters_count_reversals_and_replicas_removed_while_starting() -> None:
    m = ServiceModel("a", Arrivals(np.zeros(0), np.zeros(0)), startup_s=3.0, request_cores_max=1.0)
    node = Node(8.0, {"a": m})
    claims = node.claims()
    m.set_target(1, 0.5, claims)
    node.schedule(0.0)
    loop = limit_loop(node)
    loop.run(4.0)  # the first replica is ready
    m.set_target(3, 0.5, claims)  # up
    node.schedule(4.0)
    m.set_target(3, 1.0, claims)  # CPU only: no direction
    m.set_target(2, 1.0, claims)  # down: one starting replica goes
    assert (m.replica_reversals, m.removed_while_starting) == (1, 1)
    loop.run(8.0)  # the other starting one becomes ready
    m.set_target(1, 1.0, claims)  # down again: no reversal, and it was ready
    m.set_target(4, 1.0, claims)  # up: a reversal
    assert (m.replica_reversals, m.removed_while_starting) == (2, 1)


def test_direction_changes_of_a_series() -> None:
    assert direction_changes(np.array([1.0, 1, 2, 2, 3, 1, 1, 4, 4])) == 2
    assert direction_changes(np.array([5.0, 5, 5])) == 0
    assert direction_changes(np.array([1.0, 0, 1, 0])) == 2


def test_the_offered_load_is_counted_from_the_idle_start() -> None:
    # The replicas start at min_replicas: a load that starts high has first risen from none.
    assert offered_direction_changes(np.array([50.0, 50, 25, 25, 50])) == 2
    assert offered_direction_changes(np.array([20.0, 20, 20])) == 0  # a steady load: none
    assert offered_direction_changes(np.array([0.0, 0, 40, 0, 40])) == 2  # bursts from idle


def test_static_split_by_given_shares() -> None:
    targets = static_split(POLICIES, 2.0, {"api": 1.5, "reports": 0.5})
    assert targets["api"].replicas * targets["api"].cpu_per_replica_cores == pytest.approx(1.5)
    assert targets["reports"].replicas * targets["reports"].cpu_per_replica_cores == pytest.approx(
        0.5
    )


def test_a_service_whose_cpu_the_platform_does_not_measure_gets_no_cpu_figures() -> None:
    # Scenario.cpu_measured (as on Kubernetes: only services scaled on CPU utilisation are
    # measured): the others' signals carry no CPU, so the engine sizes them from their
    # concurrency; the measured ones keep their cgroup-like counters.
    from dataclasses import replace

    from scaler.simulate.baselines import make_controller

    scenario = build_scenario(parse_workload(BURSTY), POLICIES)
    measured = sorted(scenario.services)[:1]
    seen: dict[str, set[bool]] = {s: set() for s in scenario.services}
    ctl = make_controller("sluice", POLICIES, BUDGET)
    decide = ctl.decide

    def recording(now, signals, states):  # type: ignore[no-untyped-def]
        for s, sig in signals.items():
            seen[s].add(sig.cpu_seconds_total is not None)
        return decide(now, signals, states)

    ctl.decide = recording  # type: ignore[method-assign]
    one = replace(scenario, cpu_measured=frozenset(measured))
    result = run(one, "sluice", POLICIES, BUDGET, controller=ctl)
    for s in scenario.services:
        assert seen[s] == {s in measured}, s
        # what the run reports is still the CPU the model used
        assert result.cpu_seconds[s] > 0


def test_metrics_server_cpu_is_late_averaged_and_held_between_polls() -> None:
    # One service using 1 core until t = 30, then 3 cores; polled every 10 s.  The poll at
    # k * 10 brings the mean use over [10k - 15, 10k - 5]; the figure holds until the next.
    from scaler.signals import ServiceSignals
    from scaler.simulate.runner import MetricsServerCpu

    def true_total(t: float) -> float:
        return t if t <= 30 else 30 + 3 * (t - 30)

    ms = MetricsServerCpu(10.0)
    rates: dict[float, float | None] = {}
    last: tuple[float, float] | None = None
    for t in range(0, 61):
        sig = ServiceSignals(
            "api", float(t), cpu_seconds_total=true_total(t), cpu_throttled_seconds_total=5.0
        )
        (out,) = ms.signals(float(t), {"api": sig}).values()
        assert out.cpu_throttled_seconds_total is None  # PodMetrics report no throttling
        total = out.cpu_seconds_total
        if total is None:
            rates[t], last = None, None
            continue
        rates[t] = None if last is None else (total - last[1]) / (t - last[0])
        last = (t, total)
    assert all(rates[t] is None for t in range(0, 20))  # nothing until a full window scraped
    assert rates[21] == pytest.approx(1.0)  # poll at 20: [5, 15]
    assert rates[39] == pytest.approx(1.0)  # poll at 30: [15, 25], still 1 core at t = 39
    assert rates[41] == pytest.approx(2.0)  # poll at 40: [25, 35], half the window at 3
    assert rates[51] == pytest.approx(3.0)  # poll at 50: [35, 45]
    assert len(ms._times) <= 2 * 10 + 2  # a few windows of history, however long the run
