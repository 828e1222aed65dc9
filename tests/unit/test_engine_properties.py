"""Property tests: random configs and workloads, closed loop, invariants checked every tick.

Steps per run: the wide test checks 15 examples × 100 ticks × 35-50 services, so at least
52,500 service decisions; the narrow one (1-3 services, where one service's quirks dominate)
and the one-tick fair-share test add a few thousand more.
"""

from __future__ import annotations

import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scaler.decision import Decision, ServiceState
from scaler.engine import Engine
from scaler.policy import BudgetConfig, ScalingPolicy
from scaler.signals import ServiceSignals

TICKS = 100
EPS = 1e-6


@st.composite
def policies(draw: st.DrawFn) -> ScalingPolicy:
    cpu_min = draw(st.sampled_from([0.05, 0.1, 0.25, 0.5]))
    cpu_max = cpu_min * draw(st.sampled_from([1.0, 1.5, 2.0, 4.0, 8.0]))
    request = draw(st.one_of(st.none(), st.floats(cpu_min, cpu_max)))
    min_replicas = draw(st.integers(0, 3))
    max_replicas = draw(st.integers(max(1, min_replicas), 12))
    guaranteed = draw(
        st.one_of(st.none(), st.floats(min_replicas * cpu_min, min_replicas * cpu_min + 1.0))
    )
    stable = draw(st.sampled_from([6.0, 20.0, 60.0]))
    return ScalingPolicy(
        mode=draw(st.sampled_from(["kpa", "kpa", "hpa"])),
        metric=draw(st.sampled_from(["concurrency", "rps"])),
        target=draw(st.sampled_from([1.0, 5.0, 10.0])),
        min_replicas=min_replicas,
        max_replicas=max_replicas,
        stable_window_s=stable,
        panic_window_s=min(stable, draw(st.sampled_from([2.0, 6.0]))),
        scale_to_zero_grace_s=draw(st.sampled_from([0.0, 5.0, 30.0])),
        max_scale_down_rate=draw(st.sampled_from([1.5, 2.0, 10.0])),
        cpu={"min": cpu_min, "max": cpu_max, "request": request},
        weight=draw(st.sampled_from([0.5, 1.0, 2.0, 3.0])),
        guaranteed_cpu=guaranteed,
        prefer=draw(st.sampled_from(["vertical", "horizontal"])),
    )


@st.composite
def scenarios(
    draw: st.DrawFn, least: int = 1, most: int = 5
) -> tuple[dict[str, ScalingPolicy], BudgetConfig, int]:
    n = draw(st.integers(least, most))
    # A handful of distinct policies shared out over the services keeps generation cheap.
    distinct = [draw(policies()) for _ in range(draw(st.integers(1, min(n, 6))))]
    picks = draw(st.lists(st.integers(0, len(distinct) - 1), min_size=n, max_size=n))
    pols = {f"s{i}": distinct[k] for i, k in enumerate(picks)}
    floors = sum(p.floor_cores for p in pols.values())
    budget = max(0.05, floors + draw(st.floats(0.0, 6.0)) * max(1.0, n / 5))
    arbitration = draw(st.sampled_from(["shared", "shared", "independent"]))
    return pols, BudgetConfig(cpu=budget, arbitration=arbitration), draw(st.integers(0, 2**32))


def check_tick(
    engine: Engine,
    decisions: dict[str, Decision],
    before: dict[str, ServiceState],
    blocked: set[str],
) -> None:
    budget = engine.budget
    total = sum(d.allocated_cores for d in decisions.values())
    any_frozen = any(d.frozen for d in decisions.values())
    assert total <= budget.cpu + EPS, f"budget exceeded: {total} > {budget.cpu}"
    for name, d in decisions.items():
        p = engine.policies[name]
        assert p.min_replicas <= d.replicas <= p.max_replicas, (name, d.replicas)
        assert abs(d.allocated_cores - d.replicas * d.cpu_per_replica_cores) < EPS
        if d.replicas and name not in blocked:
            assert p.cpu.min - EPS <= d.cpu_per_replica_cores <= p.cpu.max + EPS, d
        if d.frozen:
            prev = before.get(name)
            held = prev.replicas if prev else 0
            held = min(max(held, p.min_replicas), p.max_replicas)
            # replicas are kept; only when other services' floors need the CPU may it shed
            # the replicas that no longer fit at cpu.min
            assert d.replicas >= held or held * p.cpu.min > d.inputs["allocation_cores"] + EPS, (
                f"{name} scaled down on stale data: {held} -> {d.replicas}: {d.reasons} {d.inputs}"
            )
        if budget.arbitration == "shared":
            demand = d.inputs["demand_cores"]
            cores = d.inputs["allocation_cores"]
            floor = max(p.floor_cores, p.min_replicas * p.cpu.min)
            assert cores >= min(demand, floor) - EPS, f"{name}: floor not honoured"
            fair = engine.fair_share(name)
            # (frozen services keep their replicas at cpu.min, which may eat into fair shares)
            assert any_frozen or cores >= min(demand, fair) - EPS, (
                f"{name}: got {cores}, demand {demand}, fair share {fair}"
            )
            # A blocked resize keeps the CPU per replica, so its allocation may go unused.
            assert name in blocked or d.allocated_cores >= cores - p.cpu.min - EPS, (
                f"split lost more than one replica: {name} {cores} -> {d}, {p.cpu}, frozen={d.frozen}"
            )


def run_closed_loop(scenario: tuple[dict[str, ScalingPolicy], BudgetConfig, int]) -> None:
    """Random loads, missing and stale signals, lagging readiness and blocked resizes; the
    platform applies every decision; the invariants are checked on every tick."""
    pols, budget, seed = scenario
    rnd = random.Random(seed)
    engine = Engine(pols, budget)
    states: dict[str, ServiceState] = {}
    arrivals = dict.fromkeys(pols, 0)
    level = {name: rnd.uniform(0, 50) for name in pols}
    for t in range(TICKS):
        now = float(t)
        signals: dict[str, ServiceSignals] = {}
        for name in pols:
            if rnd.random() < 0.1:
                level[name] = rnd.choice([0.0, rnd.uniform(0, 10), rnd.uniform(0, 200)])
            load = max(0.0, level[name] * rnd.uniform(0.8, 1.2))
            arrivals[name] += int(load)
            roll = rnd.random()
            if roll < 0.03:
                continue  # missing
            at = now - rnd.uniform(4.0, 30.0) if roll < 0.08 else now
            signals[name] = ServiceSignals(
                name,
                at,
                in_flight=int(load),
                queued=rnd.randint(0, 3),
                arrivals_total=arrivals[name],
            )
        blocked = {name for name in states if rnd.random() < 0.05}
        states = {
            name: ServiceState(
                name, s.replicas, s.ready_replicas, s.cpu_per_replica_cores, name in blocked
            )
            for name, s in states.items()
        }
        decisions = engine.tick(now, signals, states)
        check_tick(engine, decisions, states, blocked)
        states = {
            name: ServiceState(
                name,
                d.replicas,
                d.replicas if rnd.random() < 0.9 else rnd.randint(0, d.replicas),
                d.cpu_per_replica_cores,
            )
            for name, d in decisions.items()
        }


@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(scenarios(least=35, most=50))
def test_invariants_hold_on_every_tick_for_many_services(
    scenario: tuple[dict[str, ScalingPolicy], BudgetConfig, int],
) -> None:
    run_closed_loop(scenario)


@settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(scenarios(least=1, most=3))
def test_invariants_hold_on_every_tick_for_a_few_services(
    scenario: tuple[dict[str, ScalingPolicy], BudgetConfig, int],
) -> None:
    run_closed_loop(scenario)


@settings(max_examples=30, deadline=None)
@given(scenarios())
def test_a_demanding_service_gets_its_fair_share_in_one_tick(
    scenario: tuple[dict[str, ScalingPolicy], BudgetConfig, int],
) -> None:
    pols, budget, seed = scenario
    budget = BudgetConfig(cpu=budget.cpu, arbitration="shared")
    rnd = random.Random(seed)
    engine = Engine(pols, budget)
    names = list(pols)
    quiet = rnd.choice(names)
    states: dict[str, ServiceState] = {}
    # Everyone else saturates the budget for a while; the quiet one idles.
    for t in range(30):
        signals = {
            n: ServiceSignals(n, float(t), in_flight=0 if n == quiet else 10_000) for n in names
        }
        decisions = engine.tick(float(t), signals, states)
        states = {
            n: ServiceState(n, d.replicas, d.replicas, d.cpu_per_replica_cores)
            for n, d in decisions.items()
        }
    # The quiet one's demand jumps: within this very tick it gets min(demand, fair share).
    signals = {n: ServiceSignals(n, 30.0, in_flight=10_000) for n in names}
    d = engine.tick(30.0, signals, states)[quiet]
    want = min(d.inputs["demand_cores"], engine.fair_share(quiet))
    assert d.inputs["allocation_cores"] >= want - EPS
