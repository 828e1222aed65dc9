"""Share enforcement in the simulator: the node's CPU shared by weight (GPS), exactly.

Hand-computed cases for the water-filling and the event-driven model, a fine time-stepped
reference, invariants at many instants of random runs, conservation per tick, early ticks.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Iterator, Mapping

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scaler.policy import BudgetConfig, ScalingPolicy
from scaler.simulate.arrivals import Arrivals
from scaler.simulate.baselines import RunName
from scaler.simulate.early import next_early_tick
from scaler.simulate.loop import EventLoop, water_fill
from scaler.simulate.model import Node, ServiceModel
from scaler.simulate.runner import build_scenario, run
from scaler.simulate.workload import Workload, parse_workload
from tests.support.sim_scenarios import BURSTY, POLICIES, placed, requests, service

SHARE = BudgetConfig(cpu=2, enforcement="share")
EPS = 1e-9


# ---- the water-filling, by hand --------------------------------------------------------------


def test_water_fill_gives_every_demand_when_it_fits() -> None:
    assert water_fill(2.0, [0.5, 0.3, 1.0], [0.25, 1.0, 0.5]) == [0.5, 0.3, 1.0]


def test_water_fill_splits_by_weight_when_every_demand_is_above_the_fair_level() -> None:
    # three busy replicas wanting a core each on 2 cores, weights 0.875, 0.875, 0.25: lambda = 1
    assert water_fill(2.0, [1.0, 1.0, 1.0], [0.875, 0.875, 0.25]) == pytest.approx(
        [0.875, 0.875, 0.25]
    )
    # weights 1 : 4, demands 1 and 2 on 2 cores: lambda = 2 / 1.25 = 1.6 -> 0.4 and 1.6
    assert water_fill(2.0, [1.0, 2.0], [0.25, 1.0]) == pytest.approx([0.4, 1.6])


def test_water_fill_gives_what_a_small_demand_leaves_to_the_others_by_weight() -> None:
    # lambda = 2/2 = 1: 0.3 (d/w 0.6) is met; then lambda = 1.7/1.5: 1.0 (d/w 1) is met;
    # the last gets the remaining 0.7 (less than its demand 1, more than its weight 0.5)
    assert water_fill(2.0, [0.3, 1.0, 1.0], [0.5, 0.5, 1.0]) == pytest.approx([0.3, 0.7, 1.0])


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.floats(0.01, 1.0),  # weight (guaranteed cores)
            st.one_of(st.just(1.0), st.floats(0.01, 2.0)),  # demand
        ),
        min_size=1,
        max_size=12,
    ),
    st.floats(1.0, 1.5),
)
def test_water_fill_invariants(replicas: list[tuple[float, float]], headroom: float) -> None:
    weights = [w for w, _ in replicas]
    demands = [d for _, d in replicas]
    capacity = math.fsum(weights) * headroom  # the guarantees fit, as on the node
    xs = water_fill(capacity, demands, weights)
    assert math.fsum(xs) <= capacity + EPS
    assert math.fsum(xs) == pytest.approx(min(capacity, math.fsum(demands)))
    for x, d, w in zip(xs, demands, weights, strict=True):
        assert min(d, w) - EPS <= x <= d + EPS  # the guarantee held, never above demand
    # max-min fair: whoever gets less than its demand has the highest x / w of all
    capped = [x / w for x, d, w in zip(xs, demands, weights, strict=True) if x < d - EPS]
    if capped:
        top = max(x / w for x, w in zip(xs, weights, strict=True))
        assert all(c == pytest.approx(top) for c in capped)


# ---- the event-driven model, by hand -------------------------------------------------------


def on_node(
    capacity: float, targets: Mapping[ServiceModel, tuple[int, float]]
) -> tuple[EventLoop, Node]:
    node = placed(capacity, targets)
    return EventLoop(capacity, node.services, rule="share"), node


def test_a_lone_busy_replica_uses_the_idle_cpu_up_to_cpu_max() -> None:
    a = service("a", requests((0.0, 1.0), (0.0, 1.0)), cores_max=1.0)
    b = service("b", requests())  # idle: its guaranteed core is lent
    cpu, _ = on_node(2.0, {a: (1, 0.25), b: (1, 1.0)})
    cpu.run(10.0)
    # two requests on a replica guaranteed 0.25 but capped at cpu.max = 1: 0.5 core each
    assert a.latencies == [pytest.approx(2.0), pytest.approx(2.0)]
    assert a.cpu_seconds_total == pytest.approx(2.0)
    assert a.throttled_seconds_total == pytest.approx(2.0)  # held at cpu.max, wanting 2 cores


def test_a_replica_never_gets_more_than_its_requests_can_use() -> None:
    a = service("a", requests((0.5, 0.3)), cores_max=2.0, request_cores_max=1.0)
    cpu, _ = on_node(4.0, {a: (1, 0.25)})
    cpu.run(2.0)
    assert a.latencies == [pytest.approx(0.3)]  # one single-threaded request: one core
    assert a.throttled_seconds_total == 0.0


def test_both_busy_the_guarantees_hold_and_the_rest_follows_the_weights() -> None:
    a = service("a", requests((0.0, 0.4)), cores_max=2.0)
    b = service("b", requests((0.0, 3.6)), cores_max=2.0, request_cores_max=2.0)
    cpu, _ = on_node(2.0, {a: (1, 0.25), b: (1, 1.0)})
    cpu.run(0.5)
    # demands 1 and 2 on 2 cores, weights 1 : 4 -> 0.4 and 1.6
    assert cpu.rates() == {"a": [pytest.approx(0.4)], "b": [pytest.approx(1.6)]}
    assert a.cpu_seconds_total == pytest.approx(0.2)
    assert b.cpu_seconds_total == pytest.approx(0.8)
    cpu.run(5.0)
    # a done at 1.0 (0.4 CPU-s at 0.4); then b alone at its 2 cores: 1.6 + 2 * 1.0 -> done at 2.0
    assert a.latencies == [pytest.approx(1.0)]
    assert b.latencies == [pytest.approx(2.0)]
    assert a.cpu_seconds_total + b.cpu_seconds_total == pytest.approx(4.0)
    # less than its demand by weight is not throttling: neither reached its own cpu.max
    assert a.throttled_seconds_total == b.throttled_seconds_total == 0.0


def test_a_replica_that_becomes_busy_takes_back_its_guarantee_at_once() -> None:
    # b idle until 1.0: a uses 1 core (its cpu.max); then b's request competes, 1 : 1 by weight
    a = service("a", requests((0.0, 10.0)), cores_max=1.0)
    b = service("b", requests((1.0, 0.5)), cores_max=1.0)
    cpu, _ = on_node(1.0, {a: (1, 0.5), b: (1, 0.5)})
    cpu.run(1.0)
    assert a.cpu_seconds_total == pytest.approx(1.0)
    cpu.run(1.5)
    assert cpu.rates() == {"a": [pytest.approx(0.5)], "b": [pytest.approx(0.5)]}
    cpu.run(5.0)
    assert b.latencies == [pytest.approx(1.0)]  # 0.5 CPU-s at 0.5 core
    assert a.cpu_seconds_total == pytest.approx(1.0 + 0.5 + 3.0)


def test_entitlements_weigh_services_not_their_decided_cpu() -> None:
    # Sluice's share: a service weighs its entitlement, whatever CPU it was last decided;
    # a (decided 0.9 per replica, 2 busy replicas) and b (decided 0.1, 1 busy replica) on one
    # core, entitlements 0.25 : 0.75 -> a 0.25 (0.125 per replica), b 0.75
    a = service("a", requests((0.0, 10.0), (0.0, 10.0)), cores_max=1.0)
    b = service("b", requests((0.0, 10.0)), cores_max=1.0)
    node = placed(1.0, {a: (2, 0.45), b: (1, 0.1)})
    cpu = EventLoop(1.0, node.services, rule="share", entitlements={"a": 0.25, "b": 0.75})
    cpu.run(1.0)
    assert cpu.rates() == {
        "a": [pytest.approx(0.125), pytest.approx(0.125)],
        "b": [pytest.approx(0.75)],
    }
    # without entitlements each replica weighs its decided CPU: 0.45, 0.45 : 0.1
    a2 = service("a", requests((0.0, 10.0), (0.0, 10.0)), cores_max=1.0)
    b2 = service("b", requests((0.0, 10.0)), cores_max=1.0)
    cpu2, _ = on_node(1.0, {a2: (2, 0.45), b2: (1, 0.1)})
    cpu2.run(1.0)
    assert cpu2.rates() == {
        "a": [pytest.approx(0.45), pytest.approx(0.45)],
        "b": [pytest.approx(0.1)],
    }


def test_entitlements_lend_what_a_service_cannot_use_and_take_it_back_at_once() -> None:
    # a's one single-threaded request can use 1 core of its 1.5 entitlement: b gets the rest;
    # b idle: a uses its cpu.max; a service that becomes busy gets its entitlement at once
    a = service("a", requests((0.0, 10.0)), cores_max=2.0, request_cores_max=1.0)
    b = service("b", requests((0.0, 10.0), (0.0, 10.0), (0.0, 10.0)), cores_max=1.0)
    node = placed(2.0, {a: (1, 0.1), b: (3, 0.1)})
    cpu = EventLoop(2.0, node.services, rule="share", entitlements={"a": 1.5, "b": 0.5})
    cpu.run(1.0)
    assert cpu.rates() == {"a": [pytest.approx(1.0)], "b": [pytest.approx(1 / 3)] * 3}
    c = service("c", requests((1.0, 1.0)), cores_max=2.0, request_cores_max=2.0)
    d = service("d", requests((0.0, 10.0)), cores_max=2.0, request_cores_max=2.0)
    node2 = placed(2.0, {c: (1, 0.1), d: (1, 0.1)})
    cpu2 = EventLoop(2.0, node2.services, rule="share", entitlements={"c": 1.0, "d": 1.0})
    cpu2.run(1.0)
    assert cpu2.rates() == {"c": [0.0], "d": [pytest.approx(2.0)]}
    cpu2.run(1.5)
    assert cpu2.rates() == {"c": [pytest.approx(1.0)], "d": [pytest.approx(1.0)]}


def test_entitlements_only_with_share_and_positive() -> None:
    a = service("a", requests())
    node = placed(1.0, {a: (1, 0.5)})
    with pytest.raises(ValueError, match="share enforcement's weights"):
        EventLoop(1.0, node.services, rule="limit", entitlements={"a": 1.0})
    with pytest.raises(ValueError, match="must be > 0"):
        EventLoop(1.0, node.services, rule="share", entitlements={"a": 0.0})


def random_arrivals(seed: int, services: int, each: int) -> list[Arrivals]:
    """``each`` requests per service, arriving within 4 s, of 0.1-0.8 CPU-seconds."""
    rnd = np.random.default_rng(seed)
    out = []
    for _ in range(services):
        times = np.sort(rnd.uniform(0.0, 4.0, each))
        out.append(Arrivals(times, rnd.uniform(0.1, 0.8, each)))
    return out


def test_the_event_model_matches_a_fine_time_stepped_reference() -> None:
    specs = [(0.25, 1.0, 1.0), (0.5, 1.0, 1.0), (0.75, 2.0, 2.0)]  # weight, cpu.max, req max
    arrivals = random_arrivals(5, len(specs), 6)
    models = [
        service(f"s{j}", a, cores_max=cmax, request_cores_max=req)
        for j, (a, (_, cmax, req)) in enumerate(zip(arrivals, specs, strict=True))
    ]
    cpu, _ = on_node(1.5, {m: (1, w) for m, (w, _, _) in zip(models, specs, strict=True)})
    cpu.run(30.0)
    # one replica per service: weighing services is weighing replicas
    ref = fluid_by_service(
        1.5, [(a, *spec, 1) for a, spec in zip(arrivals, specs, strict=True)], 30.0, 1e-4
    )
    for m, expected in zip(models, ref, strict=True):
        assert len(m.latencies) == len(expected) == 6
        assert sorted(m.latencies) == pytest.approx(sorted(expected), abs=2e-3)


def fluid_by_service(
    capacity: float,
    services: list[tuple[Arrivals, float, float, float, int]],
    end_s: float,
    dt: float,
) -> list[list[float]]:
    """Time-stepped share by entitlement: (arrivals, entitlement, cpu.max, request max,
    replicas) per service.  An arrival goes to the replica with the fewest requests (ties:
    the first).  Per step: the node's cores water-filled over the busy services by
    entitlement (demand: their replicas' together), each service's cores over its busy
    replicas equally up to each one's demand, each request its replica's rate / n."""
    pending = [list(zip(a.times_s.tolist(), a.cpu_s.tolist(), strict=True)) for a, *_ in services]
    present = [[[] for _ in range(spec[4])] for spec in services]  # [[remaining, arrived]]
    out: list[list[float]] = [[] for _ in services]
    t = 0.0
    while t < end_s:
        for j, p in enumerate(pending):
            while p and p[0][0] <= t:
                arrived, work = p.pop(0)
                to = min(range(len(present[j])), key=lambda k: len(present[j][k]))
                present[j][to].append([work, arrived])
        busy = [j for j in range(len(services)) if any(present[j])]
        demands = {
            (j, k): min(len(reqs) * services[j][3], services[j][2])
            for j in busy
            for k, reqs in enumerate(present[j])
            if reqs
        }
        totals = [math.fsum(d for (i, _), d in demands.items() if i == j) for j in busy]
        got = water_fill(capacity, totals, [services[j][1] for j in busy])
        for j, g in zip(busy, got, strict=True):
            ks = [k for k, reqs in enumerate(present[j]) if reqs]
            xs = water_fill(g, [demands[j, k] for k in ks], [1.0] * len(ks))
            for k, x in zip(ks, xs, strict=True):
                reqs = present[j][k]
                per = x / len(reqs)
                for req in reqs:
                    req[0] -= per * dt
                for req in [q for q in reqs if q[0] <= 0]:
                    reqs.remove(req)
                    out[j].append(t + dt - req[1])
        t += dt
    return out


def test_by_entitlement_the_event_model_matches_a_fine_time_stepped_reference() -> None:
    """Several replicas per service, requests that use less than a replica's cpu.max: each
    service's level moves with the others' demand while its replicas keep their schedules."""
    specs = [(1.0, 1.0, 0.5, 2), (2.0, 2.0, 1.0, 2), (1.0, 1.5, 0.5, 3)]
    arrivals = random_arrivals(11, len(specs), 8)
    models = [
        service(f"s{j}", a, cores_max=cmax, request_cores_max=req)
        for j, (a, (_, cmax, req, _)) in enumerate(zip(arrivals, specs, strict=True))
    ]
    node = placed(2.0, {m: (spec[3], 0.1) for m, spec in zip(models, specs, strict=True)})
    entitled = {m.name: spec[0] for m, spec in zip(models, specs, strict=True)}
    cpu = EventLoop(2.0, node.services, rule="share", entitlements=entitled)
    for cut in (0.7, 1.3, 2.2, 30.0):  # runs in pieces, as between ticks
        cpu.run(cut)
    ref = fluid_by_service(2.0, [(a, *s) for a, s in zip(arrivals, specs, strict=True)], 30.0, 1e-4)
    for m, expected in zip(models, ref, strict=True):
        assert len(m.latencies) == len(expected) == 8
        assert sorted(m.latencies) == pytest.approx(sorted(expected), abs=2e-3)
    work = sum(float(a.cpu_s.sum()) for a in arrivals)
    assert sum(m.cpu_seconds_total for m in models) == pytest.approx(work)


def by_entitlement(
    capacity: float, models: Mapping[str, ServiceModel], entitled: Mapping[str, float]
) -> dict[str, list[float]]:
    """The rule's definition, at one instant: the rates each replica should have."""
    busy = [m for m in models.values() if any(r.tags for r in m.replicas)]
    demand = {r: min(len(r.tags) * m.cap, m.cores_max) for m in busy for r in m.replicas if r.tags}
    totals = [math.fsum(demand[r] for r in m.replicas if r.tags) for m in busy]
    got = water_fill(capacity, totals, [entitled[m.name] for m in busy])
    out = {m.name: [0.0] * len(m.replicas) for m in models.values()}
    for m, g in zip(busy, got, strict=True):
        ks = [k for k, r in enumerate(m.replicas) if r.tags]
        xs = water_fill(g, [demand[m.replicas[k]] for k in ks], [1.0] * len(ks))
        for k, x in zip(ks, xs, strict=True):
            out[m.name][k] = x
    return out


# ---- invariants at many instants of random runs ---------------------------------------------


def random_workload(rnd: random.Random, names: list[str]) -> dict[str, object]:
    services = {}
    for name in names:
        services[name] = {
            "slo_s": 1,
            "cpu_cv": rnd.choice([0, 0.5, 1]),
            "startup_s": rnd.choice([0, 1, 3]),
            "request_cores_max": rnd.choice([0.5, 1, 2]),
            "load": [
                {"at_s": 0, "rps": rnd.uniform(0, 12), "cpu_s": rnd.uniform(0.02, 0.2)},
                {"at_s": 30, "rps": rnd.uniform(0, 12), "cpu_s": rnd.uniform(0.02, 0.2)},
            ],
            "bursts": [
                {
                    "every_s": rnd.choice([20, 40]),
                    "for_s": 5,
                    "start_s": rnd.uniform(0, 10),
                    "rps": rnd.uniform(5, 30),
                    "cpu_s": 0.05,
                }
            ],
        }
    return {"duration_s": 60, "seed": rnd.randint(0, 1000), "services": services}


def random_policies(rnd: random.Random, names: list[str]) -> dict[str, ScalingPolicy]:
    out = {}
    for name in names:
        low = rnd.choice([0.1, 0.25, 0.5])
        out[name] = ScalingPolicy(
            target=rnd.choice([1, 2, 5]),
            max_replicas=rnd.randint(1, 5),
            cpu={"min": low, "max": rnd.choice([low, 1.0, 2.0]), "request": low},
        )
    return out


def random_node(seed: int) -> tuple[random.Random, dict[str, ServiceModel], float]:
    """Three services of a random workload, each with a random ``cpu.max``, and a random
    node capacity; the generator, to draw the rest from."""
    rnd = random.Random(seed)
    names = ["a", "b", "c"]
    scenario = build_scenario(
        parse_workload(random_workload(rnd, names)), random_policies(rnd, names)
    )
    capacity = rnd.uniform(1.0, 3.0)
    models = {
        s: ServiceModel(
            s,
            scenario.arrivals[s],
            startup_s=scenario.loads[s].startup_s,
            request_cores_max=scenario.loads[s].request_cores_max,
            cores_max=rnd.choice([0.5, 1.0, 2.0]),
        )
        for s in names
    }
    return rnd, models, capacity


def random_cuts(
    rnd: random.Random, models: dict[str, ServiceModel], capacity: float, cpu: EventLoop
) -> Iterator[tuple[int, float]]:
    """60 ticks of random targets, each run in random pieces: yields (tick, cut) after each."""
    node = Node(capacity, models)
    claims = node.claims()
    for k in range(60):
        for m in models.values():
            m.set_target(rnd.randint(1, 4), min(rnd.uniform(0.1, 1.0), m.cores_max), claims)
        node.schedule(float(k))
        assert node.reserved_cores() <= capacity + EPS
        for cut in [*sorted(rnd.uniform(k, k + 1) for _ in range(5)), k + 1.0]:
            cpu.run(cut)
            yield k, cut
        for m in models.values():
            m.close_tick()


@pytest.mark.parametrize("seed", range(6))
def test_rates_keep_every_bound_at_every_instant(seed: int) -> None:
    """Random targets, run in random pieces: at every cut the rates in force are checked."""
    rnd, models, capacity = random_node(seed)
    cpu = EventLoop(capacity, models, rule="share")
    checked = 0
    for _ in random_cuts(rnd, models, capacity, cpu):
        total = 0.0
        for m in models.values():
            for r in m.replicas:
                n = len(r.tags)
                if not n:
                    continue
                checked += 1
                demand = min(n * m.cap, m.cores_max)
                assert r.x <= demand + EPS, "never above cpu.max nor n * request_cores_max"
                assert r.x >= min(demand, r.cores) - EPS, "the guarantee held"
                total += r.x
        assert total <= capacity + EPS
    assert checked > 100


@pytest.mark.parametrize("seed", range(6))
def test_by_entitlement_the_rates_follow_the_rule_at_every_instant(seed: int) -> None:
    """Random targets, run in random pieces: at every cut each replica's rate is what the
    two-level rule gives for the requests it holds then."""
    rnd, models, capacity = random_node(seed)
    entitled = {s: rnd.uniform(0.2, 1.0) for s in models}
    cpu = EventLoop(capacity, models, rule="share", entitlements=entitled)
    checked = 0
    for k, cut in random_cuts(rnd, models, capacity, cpu):
        expected = by_entitlement(capacity, models, entitled)
        rates = cpu.rates()
        for s in models:
            assert rates[s] == pytest.approx(expected[s], abs=1e-9), (k, cut, s)
        checked += sum(1 for m in models.values() for r in m.replicas if r.tags)
    assert checked > 100


def random_run_inputs(seed: int) -> tuple[Workload, dict[str, ScalingPolicy], BudgetConfig]:
    rnd = random.Random(100 + seed)
    names = ["a", "b", "c", "d"][: rnd.randint(2, 4)]
    policies = random_policies(rnd, names)
    floors = sum(p.floor_cores for p in policies.values())
    budget = BudgetConfig(cpu=round(max(floors, rnd.uniform(1.0, 4.0)), 2), enforcement="share")
    return parse_workload(random_workload(rnd, names)), policies, budget


@pytest.mark.parametrize("name", ["sluice", "independent", "static"])
@pytest.mark.parametrize("seed", range(4))
def test_cpu_used_per_tick_never_exceeds_the_budget(seed: int, name: RunName) -> None:
    workload, policies, budget = random_run_inputs(seed)
    scenario = build_scenario(workload, policies)
    result = run(scenario, name, policies, budget)
    used = sum(result.series[s]["used_cores"] for s in scenario.services)
    assert (used <= budget.cpu + EPS).all()
    for s in scenario.services:
        series = result.series[s]
        assert result.completed[s] + result.unfinished[s] == result.arrivals[s]
        assert abs(result.cpu_seconds[s] - series["used_cores"].sum() * scenario.tick_s) < 1e-6
    allocated = sum(result.series[s]["allocated_cores"] for s in scenario.services)
    assert (allocated <= budget.cpu + EPS).all()


@pytest.mark.parametrize("name", ["sluice", "independent", "static"])
def test_share_lends_idle_cpu_that_limit_leaves_unused(name: str) -> None:
    scenario = build_scenario(parse_workload(BURSTY), POLICIES)
    share = run(scenario, name, POLICIES, SHARE)  # type: ignore[arg-type]
    limit = run(scenario, name, POLICIES, SHARE.model_copy(update={"enforcement": "limit"}))  # type: ignore[arg-type]
    used = {r.enforcement: sum(r.series[s]["used_cores"] for s in POLICIES) for r in (share, limit)}
    assert (used["share"] <= SHARE.cpu + EPS).all()
    assert used["share"].sum() >= used["limit"].sum() - 1e-6
    if name != "static":  # static: 1 x 1.0 core each, which is cpu.max: nothing to lend
        over = [
            share.series[s]["used_cores"] > share.series[s]["allocated_cores"] + 1e-6
            for s in POLICIES
        ]
        assert np.logical_or(*over).any(), "some service used more than its guaranteed CPU"


# ---- early ticks under share enforcement ----------------------------------------------------

SHORT = ScalingPolicy(
    target=10, min_replicas=1, max_replicas=4, cpu={"min": 0.1, "max": 1.0, "request": 0.25}
)
LONG_HPA = ScalingPolicy(
    mode="hpa", target=2, max_replicas=4, cpu={"min": 0.25, "max": 1.0, "request": 0.5}
)


def test_early_ticks_land_on_the_arrival_that_reaches_the_level_and_every_model_is_there() -> None:
    policies = {"long": LONG_HPA, "short": SHORT}
    workload = parse_workload(
        {
            "services": {
                "long": {"slo_s": 1, "load": [{"at_s": 0, "rps": 8, "cpu_s": 0.1}]},
                "short": {"slo_s": 1, "load": [{"at_s": 0, "rps": 0, "cpu_s": 0.1}]},
            }
        }
    )
    scenario = build_scenario(workload, policies, duration_s=14, seed=5)
    times = 10.3 + 0.01 * np.arange(30, dtype=np.float64)
    burst = Arrivals(times, np.full(30, 5.0))  # long requests: none completes meanwhile
    scenario.arrivals["short"] = burst
    ticks: list[float] = []
    concurrency: dict[float, int] = {}

    def check(now: float, models: Mapping[str, ServiceModel], node: Node) -> None:
        ticks.append(now)
        concurrency[now] = models["short"].concurrency
        assert node.reserved_cores() <= node.capacity_cores + EPS
        for m in models.values():
            assert m.clock == now
            assert all(r.t == now for r in m.replicas)

    result = run(scenario, "sluice", policies, SHARE, on_tick=check)
    assert result.enforcement == "share"
    assert result.early_ticks > 0
    first = result.early_ticks_at[0]
    # the first early tick is exactly an arrival of the burst, and the short service's
    # concurrency then is the number of burst requests so far (idle before)
    k = int(np.flatnonzero(times == first)[0])
    assert concurrency[first] == k + 1
    regular = [t for t in ticks if t not in set(result.early_ticks_at)]
    assert regular == [float(k) for k in range(14)], "regular ticks stay on their grid"
    for previous, t in itertools.pairwise(ticks):
        if t in result.early_ticks_at:
            assert t >= previous + SHARE.early_tick_gap_s - EPS
            assert t < math.floor(previous) + 1.0
    for s in scenario.services:
        assert result.completed[s] + result.unfinished[s] == result.arrivals[s]


def test_next_early_tick_holds_back_for_the_gap_and_leaves_late_wakes_to_the_tick() -> None:
    a = service("a", requests((0.2, 5.0), (0.3, 5.0), (0.9, 5.0)))
    cpu, _ = on_node(2.0, {a: (1, 0.5)})
    levels = {"a": 2.0}
    assert next_early_tick(cpu, levels, 1.0, not_before=0.5) == 0.5  # reached at 0.3
    assert levels == {} and a.clock == 0.5 and a.concurrency == 2
    levels = {"a": 3.0}  # reached at 0.9, but the gap ends at the next regular tick
    assert next_early_tick(cpu, levels, 1.0, not_before=1.0) is None
    assert levels == {} and a.clock == 0.9 and a.concurrency == 3
    cpu.run(1.0)
    levels = {"a": 9.0}  # never reached: the models run to the end of the tick
    assert next_early_tick(cpu, levels, 2.0, not_before=1.1) is None
    assert levels == {"a": 9.0} and a.clock == 2.0
