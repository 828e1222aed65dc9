"""Property tests: random configs and workloads, closed loop, invariants checked every tick.

Everything is drawn by hypothesis through strategies (policies, budgets, and each service's
workload as a list of segments: how long, what load, what the signals look like -- fine,
missing, stale, NaN, infinite, negative -- whether CPU is measured, whether readiness lags,
whether resizes are blocked, whether the platform holds the replicas at their decided CPU
under share), so a failure shrinks to a small readable case.  Invariants on
every tick: no exception; bounds; budget never exceeded; floors; fair shares reached in one
tick; a service short of its fair share is told who holds it and is never locked out; a
frozen service never scales down on missing, stale or refused data (unless other services'
floors need its CPU); refused figures freeze only their service.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scaler.arbiter import WEIGHT_MIN_CORES
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
    mode = draw(st.sampled_from(["kpa", "kpa", "hpa"]))
    metrics = ["concurrency", "rps"] + (["cpu"] if mode == "hpa" else [])
    metric = draw(st.sampled_from(metrics))
    if metric == "cpu":  # CPU utilisation needs a replica to measure
        min_replicas = max(1, min_replicas)
        max_replicas = max(max_replicas, min_replicas)
        if guaranteed is not None:
            guaranteed = max(guaranteed, min_replicas * cpu_min)
    return ScalingPolicy(
        mode=mode,
        metric=metric,
        target=draw(st.sampled_from([30.0, 60.0, 90.0] if metric == "cpu" else [1.0, 5.0, 10.0])),
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


QUALITIES = ("ok", "ok", "ok", "missing", "stale", "nan", "inf", "negative")
INVALID = ("nan", "inf", "negative")
BAD_FIELDS = (
    "auto",  # the CPU counter when CPU is measured, else rps
    "at",
    "in_flight",
    "queued",
    "arrivals_total",
    "completions_total",
    "rps",
    "cpu_seconds_total",
    "cpu_throttled_seconds_total",
)


@dataclass(frozen=True)
class Segment:
    """A stretch of one service's workload: ``ticks`` ticks at ``load`` in flight."""

    ticks: int
    load: float
    quality: str
    """How the signals look: ok, missing, stale, or one figure NaN / infinite / negative."""
    lagging: bool
    """Replicas become ready one tick late."""
    blocked: bool
    """In-place resizes are refused."""
    bad_field: str = "auto"
    """Which figure is NaN / infinite / negative when the quality says so."""
    capped: bool = False
    """The platform holds the replicas at their decided CPU (``cpu_capped``: Kubernetes pods
    of Guaranteed QoS under share)."""


segments = st.builds(
    Segment,
    ticks=st.integers(1, 30),
    load=st.one_of(st.just(0.0), st.floats(0, 10), st.floats(0, 300)),
    quality=st.sampled_from(QUALITIES),
    lagging=st.booleans(),
    blocked=st.booleans(),
    bad_field=st.sampled_from(BAD_FIELDS),
    capped=st.booleans(),
)


@dataclass(frozen=True)
class Workload:
    segments: tuple[Segment, ...]
    cpu_per_request: float | None
    """CPU seconds per request when the platform measures CPU, else None."""

    def at(self, t: int) -> Segment:
        left = t % sum(s.ticks for s in self.segments)
        for seg in self.segments:
            if left < seg.ticks:
                return seg
            left -= seg.ticks
        raise AssertionError("unreachable")


workloads = st.builds(
    Workload,
    segments=st.lists(segments, min_size=1, max_size=4).map(tuple),
    cpu_per_request=st.one_of(st.none(), st.floats(0.001, 0.2)),
)

Scenario = tuple[dict[str, ScalingPolicy], BudgetConfig, dict[str, Workload]]


@st.composite
def scenarios(draw: st.DrawFn, least: int = 1, most: int = 5) -> Scenario:
    n = draw(st.integers(least, most))
    # A handful of distinct policies and workloads shared out over the services keeps
    # generation cheap.
    distinct = draw(st.lists(policies(), min_size=1, max_size=min(n, 6)))
    loads = draw(st.lists(workloads, min_size=1, max_size=min(n, 6)))
    picks = draw(
        st.lists(
            st.tuples(st.integers(0, len(distinct) - 1), st.integers(0, len(loads) - 1)),
            min_size=n,
            max_size=n,
        )
    )
    pols = {f"s{i}": distinct[k] for i, (k, _) in enumerate(picks)}
    work = {f"s{i}": loads[w] for i, (_, w) in enumerate(picks)}
    floors = sum(p.floor_cores for p in pols.values())
    budget = max(0.05, floors + draw(st.floats(0.0, 6.0)) * max(1.0, n / 5))
    arbitration = draw(st.sampled_from(["shared", "shared", "independent"]))
    enforcement = draw(st.sampled_from(["limit", "share"]))
    config = BudgetConfig(cpu=budget, arbitration=arbitration, enforcement=enforcement)
    return pols, config, work


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
    if budget.arbitration == "shared":
        used = sum(d.replicas * d.cpu_per_replica_cores for d in decisions.values())
        assert used <= budget.cpu + 1e-9, f"replicas × CPU exceed the budget: {used} > {budget.cpu}"
    for name, d in decisions.items():
        p = engine.policies[name]
        assert p.min_replicas <= d.replicas <= p.max_replicas, (name, d.replicas)
        assert abs(d.allocated_cores - d.replicas * d.cpu_per_replica_cores) < EPS
        if d.replicas:
            assert d.cpu_per_replica_cores <= p.cpu.max + EPS, d
            if d.cpu_per_replica_cores < p.cpu.min - EPS:
                # below cpu.min only under share: replicas it already ran, kept in place at
                # a weight (the kernel takes the CPU back), and the decision says so
                prev = before.get(name)
                assert budget.enforcement == "share" and budget.arbitration == "shared", d
                assert prev is not None and d.replicas <= prev.replicas, (prev, d)
                assert d.cpu_per_replica_cores >= WEIGHT_MIN_CORES - EPS, d
                assert any(s.kind == "split.in_place" for s in d.explanation.steps), d.reasons
        if d.frozen:
            prev = before.get(name)
            held = prev.replicas if prev else 0
            held = min(max(held, p.min_replicas), p.max_replicas)
            # replicas are kept; only when other services' floors need the CPU may it shed
            # the replicas that no longer fit at cpu.min
            assert d.replicas >= held or held * p.cpu.min > d.inputs["allocation_cores"] + EPS, (
                f"{name} scaled down on stale data: {held} -> {d.replicas}: {d.reasons} {d.inputs}"
            )
            if d.replicas < held:
                # ... and then it says so: the cores taken back for the floors are a flow
                assert d.explanation.flow_cores("taken_for_floors") > 0, (
                    f"{name} shed {held} -> {d.replicas} replicas without saying why: {d.reasons}"
                )
        if budget.arbitration == "shared":
            demand = d.inputs["demand_cores"]
            cores = d.inputs["allocation_cores"]
            floor = max(p.floor_cores, p.min_replicas * p.cpu.min)
            assert cores >= min(demand, floor) - EPS, f"{name}: floor not honoured"
            fair = engine.fair_share(name)
            # A service with work (demand) runs a replica, as far as its fair share fits one
            # at cpu.min and no frozen service holds more than its share
            if not any_frozen and demand > EPS and fair >= p.cpu.min - EPS and name not in blocked:
                assert d.replicas >= 1, f"{name} has work and no replica: {d.reasons} {d.inputs}"
            # Frozen services keep their replicas at cpu.min, which may eat into fair shares;
            # under share so do serving replicas (the kernel's weights, not the decided CPU,
            # then give a busy service its entitlement) -- but only holds at cpu.min: no service
            # above its own min(demand, fair share) holds more than cpu.min per replica then.
            if not any_frozen and cores < min(demand, fair) - EPS:
                assert budget.enforcement == "share", (
                    f"{name}: got {cores}, demand {demand}, fair share {fair}"
                )
                for other, o in decisions.items():
                    q = engine.policies[other]
                    entitled = min(o.inputs["demand_cores"], engine.fair_share(other))
                    if o.inputs["allocation_cores"] > entitled + EPS:
                        assert o.replicas and o.cpu_per_replica_cores <= q.cpu.min + EPS, (
                            f"{name} short of its fair share ({cores} < min({demand}, {fair}))"
                            f" while {other} holds more than cpu.min per replica: {o}"
                        )
                # ... it says who holds it (it lends only what it does not want), and is never
                # locked out: the holds yield it at least one replica's worth
                if cores < min(demand, fair) - 0.01:
                    held_from = d.explanation.flow_cores("held_from")
                    assert held_from == pytest.approx(min(demand, fair) - cores), d.reasons
                    assert d.explanation.flow_cores("lent") <= fair - min(demand, fair) + EPS
                if demand > 0 and fair >= p.cpu.min and p.max_replicas > 0:
                    assert cores >= p.cpu.min - EPS, f"{name} locked out: {d.reasons}"
            # A blocked resize keeps the CPU per replica, so its allocation may go unused; so
            # may cores granted to replicas not started yet (held back until the service
            # surely keeps the CPU: the decision says so).
            held_back = any(
                s.kind in ("split.held_back", "split.one_more", "split.into_idle")
                for s in d.explanation.steps
            )
            assert name in blocked or held_back or d.allocated_cores >= cores - p.cpu.min - EPS, (
                f"split lost more than one replica: {name} {cores} -> {d}, {p.cpu}, frozen={d.frozen}"
            )


def signals_of(
    name: str, t: int, seg: Segment, work: Workload, counters: dict[str, float]
) -> ServiceSignals | None:
    """This tick's snapshot of one service, as ``seg`` says it looks."""
    now = float(t)
    load = seg.load
    counters["arrivals"] += int(load)
    counters["done"] += int(load) // 2  # completions lag arrivals: a backlog that drains slowly
    if work.cpu_per_request is not None:
        counters["cpu"] += load * work.cpu_per_request
    cpu = counters["cpu"] if work.cpu_per_request is not None else None
    fields: dict[str, object] = {
        "at": now,
        "in_flight": int(load),
        "queued": int(load) % 4,
        "arrivals_total": int(counters["arrivals"]),
        "completions_total": int(counters["done"]),
        "rps": load,
        "cpu_seconds_total": cpu,
    }
    if seg.quality == "missing":
        return None
    if seg.quality == "stale":
        fields["at"] = now - 10.0
    elif seg.quality in INVALID:
        bad = {"nan": math.nan, "inf": math.inf, "negative": -1.0}[seg.quality]
        field = seg.bad_field
        if field == "auto":
            field = "rps" if cpu is None else "cpu_seconds_total"
        if field == "at" and bad < 0:
            # a negative time is only an old one (and -inf: see the test below)
            bad = math.nan
        fields[field] = bad
    return ServiceSignals(name, **fields)  # type: ignore[arg-type]


def run_closed_loop(scenario: Scenario) -> None:
    """The drawn workloads through the engine; the platform applies every decision (replicas
    lagging one tick into readiness where the segment says so); invariants every tick."""
    pols, budget, work = scenario
    engine = Engine(pols, budget)
    states: dict[str, ServiceState] = {}
    counters = {name: {"arrivals": 0.0, "done": 0.0, "cpu": 0.0} for name in pols}
    for t in range(TICKS):
        segs = {name: work[name].at(t) for name in pols}
        signals = {}
        for name in pols:
            sig = signals_of(name, t, segs[name], work[name], counters[name])
            if sig is not None:
                signals[name] = sig
        blocked = {name for name in states if segs[name].blocked}
        states = {
            name: ServiceState(
                name,
                s.replicas,
                s.ready_replicas,
                s.cpu_per_replica_cores,
                name in blocked,
                cpu_capped=segs[name].capped,
            )
            for name, s in states.items()
        }
        decisions = engine.tick(float(t), signals, states)
        check_tick(engine, decisions, states, blocked)
        for name, d in decisions.items():
            if segs[name].quality in INVALID:
                assert d.frozen and d.rule == "frozen: invalid signals", d
            elif segs[name].quality in ("missing", "stale"):
                assert d.frozen, d
            else:  # an invalid figure elsewhere never freezes this one
                assert d.rule != "frozen: invalid signals", d
            assert all(math.isfinite(v) for v in d.inputs.values()), d.inputs
        previous = states
        states = {}
        for name, d in decisions.items():
            before = previous.get(name)
            ready = d.replicas
            if segs[name].lagging and before is not None:
                ready = min(d.replicas, before.ready_replicas)
            states[name] = ServiceState(name, d.replicas, ready, d.cpu_per_replica_cores)


@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(scenarios(least=35, most=50))
def test_invariants_hold_on_every_tick_for_many_services(scenario: Scenario) -> None:
    run_closed_loop(scenario)


@settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(scenarios(least=1, most=3))
def test_invariants_hold_on_every_tick_for_a_few_services(scenario: Scenario) -> None:
    run_closed_loop(scenario)


@settings(max_examples=30, deadline=None)
@given(scenarios(), st.data())
def test_a_demanding_service_gets_its_fair_share_in_one_tick(
    scenario: Scenario, data: st.DataObject
) -> None:
    pols, budget, _ = scenario
    budget = BudgetConfig(cpu=budget.cpu, arbitration="shared")
    engine = Engine(pols, budget)
    names = list(pols)
    quiet = data.draw(st.sampled_from(names))
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


@st.composite
def crowded(draw: st.DrawFn) -> tuple[dict[str, ScalingPolicy], BudgetConfig, set[str]]:
    """Services whose replicas at ``cpu.min`` can fill the budget (``cpu.max`` close to
    ``cpu.min``, many replicas), some of them busy from the start (``first``), on a small
    budget: the shape in which held replicas crowd out a service that wakes later."""
    n = draw(st.integers(2, 5))
    pols = {}
    for i in range(n):
        cpu_min = draw(st.sampled_from([0.1, 0.25, 0.5]))
        pols[f"s{i}"] = ScalingPolicy(
            target=draw(st.sampled_from([1.0, 10.0])),
            min_replicas=draw(st.integers(0, 1)),
            max_replicas=draw(st.integers(1, 16)),
            stable_window_s=6.0,
            panic_window_s=2.0,
            scale_to_zero_grace_s=0.0,
            cpu={"min": cpu_min, "max": cpu_min * draw(st.sampled_from([1.0, 1.5, 2.0]))},
            weight=draw(st.sampled_from([1.0, 1.0, 2.0])),
            prefer=draw(st.sampled_from(["vertical", "horizontal"])),
        )
    floors = sum(p.floor_cores for p in pols.values())
    most = sum(p.max_replicas * p.cpu.min for p in pols.values())
    cpu = max(floors + 0.05, most * draw(st.floats(0.2, 1.0)))
    budget = BudgetConfig(cpu=cpu, enforcement=draw(st.sampled_from(["limit", "share"])))
    first = draw(st.sets(st.sampled_from(sorted(pols)), min_size=1, max_size=n - 1))
    return pols, budget, first


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(crowded(), st.sampled_from([1, 2, 500, 900]), st.booleans())
def test_held_replicas_never_lock_a_waking_service_out(
    case: tuple[dict[str, ScalingPolicy], BudgetConfig, set[str]], load: int, measured: bool
) -> None:
    """Some services fill the budget with replicas, the others idle (to zero where they may),
    then everyone has work (``load`` in flight: a lone request, or a crowd), with CPU measured
    or not: every tick keeps the invariants of :func:`check_tick` (a service with work runs a
    replica; one short of what it wants of its fair share is told who holds it, never that it
    lends it, and gets at least one replica at ``cpu.min``), and once they all have work every
    service runs a replica."""
    pols, budget, first = case
    engine = Engine(pols, budget)
    states: dict[str, ServiceState] = {}
    used = dict.fromkeys(pols, 0.0)
    for t in range(30):
        busy = first if t < 20 else set(pols)
        signals = {}
        for n in pols:
            if measured:  # the busy ones use all they have; a counter at zero replicas too
                s = states.get(n)
                used[n] += s.replicas * s.cpu_per_replica_cores if s and n in first else 0.0
            work = (500 if n in first else load) if n in busy else 0
            signals[n] = ServiceSignals(
                n, float(t), in_flight=work, cpu_seconds_total=used[n] if measured else None
            )
        decisions = engine.tick(float(t), signals, states)
        check_tick(engine, decisions, states, set())
        states = applied_now(decisions)
    for name, d in decisions.items():
        if engine.fair_share(name) >= pols[name].cpu.min:
            assert d.replicas >= 1, (name, d.reasons)


def applied_now(decisions: dict[str, Decision]) -> dict[str, ServiceState]:
    """Every decision applied at once, every replica ready."""
    return {
        n: ServiceState(n, d.replicas, d.replicas, d.cpu_per_replica_cores)
        for n, d in decisions.items()
    }


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(scenarios(least=2, most=6), st.data())
def test_an_invalid_figure_freezes_only_its_service(
    scenario: Scenario, data: st.DataObject
) -> None:
    """On the ticks where one service reports a NaN / infinite / negative figure, every
    decision is the one the same engine makes that tick with the service's signals missing
    instead: the others decide normally, and the service itself only holds (frozen with its
    own reason).  And afterwards nothing is poisoned: the run goes on without exceptions and
    with finite inputs."""
    pols, budget, work = scenario
    names = list(pols)
    victim = data.draw(st.sampled_from(names), label="victim")
    bad_ticks = data.draw(st.sets(st.integers(0, 39), min_size=1, max_size=8), label="bad ticks")
    bad_field = data.draw(st.sampled_from(BAD_FIELDS[1:]), label="field")
    bad_value = data.draw(st.sampled_from([math.nan, math.inf, -1.0]), label="value")
    if bad_field == "at" and bad_value == -1.0:
        bad_value = math.nan  # a negative time is merely old
    engine = Engine(pols, budget)
    states: dict[str, ServiceState] = {}
    counters = {name: {"arrivals": 0.0, "done": 0.0, "cpu": 0.0} for name in pols}
    for t in range(40):
        signals: dict[str, ServiceSignals] = {}
        for name in names:
            seg = work[name].at(t)
            if t in bad_ticks and name == victim:
                seg = replace(seg, quality="ok")
            sig = signals_of(name, t, seg, work[name], counters[name])
            if sig is not None:
                signals[name] = sig
        if t not in bad_ticks:
            decisions = engine.tick(float(t), signals, states)
        else:
            twin = copy.deepcopy(engine)
            corrupt = dict(signals)
            corrupt[victim] = replace(signals[victim], **{bad_field: bad_value})
            without = {n: s for n, s in signals.items() if n != victim}
            decisions = engine.tick(float(t), corrupt, states)
            expected = twin.tick(float(t), without, states)
            assert decisions[victim].frozen
            assert decisions[victim].rule == "frozen: invalid signals", decisions[victim]
            for name in names:
                got, want = decisions[name], expected[name]
                assert got.replicas == want.replicas, (name, got.reasons, want.reasons)
                assert got.cpu_per_replica_cores == pytest.approx(
                    want.cpu_per_replica_cores, rel=1e-12, abs=1e-12
                ), (name, got.reasons, want.reasons)
                if name != victim:
                    assert (got.rule, got.frozen) == (want.rule, want.frozen), name
                    assert got.wake_concurrency == want.wake_concurrency, name
        for d in decisions.values():
            assert all(math.isfinite(v) for v in d.inputs.values()), d.inputs
        states = {
            n: ServiceState(n, d.replicas, d.replicas, d.cpu_per_replica_cores)
            for n, d in decisions.items()
        }


def test_a_snapshot_timed_at_minus_infinity_is_refused_as_invalid() -> None:
    engine = Engine({"a": ScalingPolicy(), "b": ScalingPolicy()}, BudgetConfig(cpu=4))
    states: dict[str, ServiceState] = {}
    for t in range(3):
        at = -math.inf if t == 2 else float(t)
        signals = {
            "a": ServiceSignals("a", at, in_flight=5),
            "b": ServiceSignals("b", float(t), in_flight=5),
        }
        decisions = engine.tick(float(t), signals, states)
        states = {
            n: ServiceState(n, d.replicas, d.replicas, d.cpu_per_replica_cores)
            for n, d in decisions.items()
        }
    assert decisions["a"].frozen
    assert decisions["a"].rule == "frozen: invalid signals", decisions["a"].rule
