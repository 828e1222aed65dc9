"""Early ticks in the simulator: when they fall, their rate limit, and that nothing else moves."""

from __future__ import annotations

import dataclasses
import itertools
import math
import random
from collections.abc import Mapping

import numpy as np
import pytest

from scaler.decision import Decision, ServiceState
from scaler.policy import BudgetConfig, ScalingPolicy
from scaler.signals import ServiceSignals
from scaler.simulate.arrivals import Arrivals, draw_arrivals
from scaler.simulate.baselines import EngineController, RunName, Target
from scaler.simulate.loop import EventLoop
from scaler.simulate.model import PENDING, READY, Node, ServiceModel
from scaler.simulate.runner import SERIES, RunResult, Scenario, build_scenario, run
from scaler.simulate.workload import parse_workload

SHORT = ScalingPolicy(
    target=10, min_replicas=1, max_replicas=4, cpu={"min": 0.1, "max": 1.0, "request": 0.25}
)
LONG = ScalingPolicy(
    target=2, min_replicas=1, max_replicas=4, cpu={"min": 0.25, "max": 1.0, "request": 0.5}
)
LONG_HPA = LONG.model_copy(update={"mode": "hpa"})
POLICIES = {"long": LONG_HPA, "short": SHORT}
"""``long`` as an HPA (never wakes early), so every early tick here is ``short``'s."""
BOTH_KPA = {"long": LONG, "short": SHORT}
BUDGET = BudgetConfig(cpu=2, enforcement="limit")
"""Limit enforcement, which these tests pin bit for bit (share: tests/unit/test_simulate_share.py)."""


class RecordingController(EngineController):
    """The real engine, with every tick's decisions kept (time, decisions)."""

    def __init__(
        self, policies: Mapping[str, ScalingPolicy], budget: BudgetConfig, name: RunName = "sluice"
    ) -> None:
        super().__init__(name, policies, budget)
        self.ticks: list[tuple[float, dict[str, Decision]]] = []
        tick = self.engine.tick

        def recording(
            now: float, signals: Mapping[str, ServiceSignals], states: Mapping[str, ServiceState]
        ) -> dict[str, Decision]:
            decisions = tick(now, signals, states)
            self.ticks.append((now, decisions))
            return decisions

        self.engine.tick = recording  # type: ignore[method-assign]


def scenario_with(arrivals: dict[str, Arrivals], duration_s: float) -> Scenario:
    """A scenario whose arrivals are exactly ``arrivals`` (steady ``long`` load otherwise)."""
    workload = parse_workload(
        {
            "services": {
                # long keeps the budget busy: an idle short holds only cpu.min, no spare CPU
                "long": {"slo_s": 1, "load": [{"at_s": 0, "rps": 25, "cpu_s": 0.1}]},
                "short": {"slo_s": 1, "load": [{"at_s": 0, "rps": 0, "cpu_s": 0.1}]},
            }
        }
    )
    scenario = build_scenario(workload, POLICIES, duration_s=duration_s, seed=5)
    return dataclasses.replace(scenario, arrivals={**scenario.arrivals, **arrivals})


def burst(start_s: float, count: int, spacing_s: float, cpu_s: float) -> Arrivals:
    times = start_s + spacing_s * np.arange(count, dtype=np.float64)
    return Arrivals(times, np.full(count, cpu_s))


def test_a_burst_into_an_idle_service_ticks_early_at_the_arrival_that_reaches_the_level() -> None:
    arrivals = burst(10.3, 30, 0.01, cpu_s=5.0)  # long requests: nothing completes meanwhile
    scenario = scenario_with({"short": arrivals}, duration_s=14)
    ctl = RecordingController(POLICIES, BUDGET)
    result = run(scenario, "sluice", POLICIES, BUDGET, controller=ctl)
    at_10 = dict(ctl.ticks)[10.0]["short"]
    level = at_10.wake_concurrency
    assert 1 <= level < 30 and level == int(level)
    # idle before: concurrency 0, so the level-th arrival of the burst reaches it, exactly then
    first_early = result.early_ticks_at[0]
    assert first_early == arrivals.times_s[int(level) - 1]
    early = dict(ctl.ticks)[first_early]["short"]
    assert early.inputs["concurrency"] == level
    assert early.allocated_cores > at_10.allocated_cores, "the early tick gives CPU at once"
    # the new decision re-armed the level higher; no early tick before the burst
    assert early.wake_concurrency > level
    assert all(t > 10.3 for t in result.early_ticks_at)


def test_early_ticks_keep_the_gap_and_never_replace_a_regular_tick() -> None:
    gap = 0.1
    budget = BUDGET.model_copy(update={"early_tick_gap_s": gap})
    # 400 requests in a second: the level is reached again well within the gap every time
    scenario = scenario_with({"short": burst(20.05, 400, 0.0025, cpu_s=0.2)}, duration_s=25)
    ticks: list[float] = []
    result = run(
        scenario, "sluice", POLICIES, budget, on_tick=lambda now, models, node: ticks.append(now)
    )
    assert result.early_ticks >= 3
    early = set(result.early_ticks_at)
    regular = [t for t in ticks if t not in early]
    assert regular == [float(k) for k in range(25)], "regular ticks stay on their grid"
    held_back = 0
    for previous, t in itertools.pairwise(ticks):
        if t in early:
            assert t >= previous + gap, (
                f"early tick at {t} only {t - previous:g} s after {previous}"
            )
            assert math.floor(t) == math.floor(previous), "after the regular tick of its second"
            held_back += t == previous + gap
    assert held_back >= 1, "some early tick waited for the gap"
    for t in early:
        assert t < math.floor(t) + 1.0  # before the next regular tick, which would cover it


@pytest.mark.parametrize("lending", [False, True])
def test_every_model_is_exactly_at_the_tick_and_the_budget_holds_at_every_step(
    lending: bool,
) -> None:
    workload = parse_workload(
        {
            "services": {
                "long": {"slo_s": 1, "cpu_cv": 0.5, "load": [{"at_s": 0, "rps": 16, "cpu_s": 0.1}]},
                "short": {
                    "slo_s": 0.5,
                    "cpu_cv": 1,
                    "startup_s": 2,
                    "load": [{"at_s": 0, "rps": 0, "cpu_s": 0.05}],
                    "bursts": [
                        {"every_s": 40, "for_s": 10, "start_s": 15, "rps": 30, "cpu_s": 0.05}
                    ],
                },
            }
        }
    )
    scenario = build_scenario(workload, BOTH_KPA, duration_s=120, seed=2)
    steps = 0

    def check(now: float, models: Mapping[str, ServiceModel], node: Node) -> None:
        nonlocal steps
        steps += 1
        assert node.reserved_cores() <= node.capacity_cores + 1e-9
        for m in models.values():
            assert m.clock == now
            # settled: every scheduled replica's CPU is accounted up to now, none beyond
            assert all(r.t == now for r in m.replicas)

    budget = BUDGET.model_copy(update={"lending": lending})
    result = run(scenario, "sluice", BOTH_KPA, budget, on_tick=check)
    assert result.early_ticks > 0
    assert steps == scenario.ticks + result.early_ticks
    for s in scenario.services:
        series = result.series[s]
        assert result.completed[s] + result.unfinished[s] == result.arrivals[s]
        assert series["arrivals"].sum() == result.arrivals[s]
        if not lending:  # each service within its own quota
            assert (series["used_cores"] <= series["allocated_cores"] + 1e-9).all()
    total = sum(result.series[s]["allocated_cores"] for s in scenario.services)
    assert (total <= BUDGET.cpu + 1e-9).all()
    # lending moves quota between services, never more than the decisions hold together
    used = sum(result.series[s]["used_cores"] for s in scenario.services)
    assert (used <= total + 1e-9).all()
    borrowed = result.series["long"]["used_cores"] > result.series["long"]["allocated_cores"] + 1e-6
    assert borrowed.any() == lending


def test_a_tick_in_pieces_gives_what_one_whole_run_gives() -> None:
    """Early ticks cut a tick's traffic into pieces: the event loop resumes where it stopped."""
    w = parse_workload(
        {
            "services": {
                "a": {"slo_s": 1, "cpu_cv": 1, "load": [{"at_s": 0, "rps": 12, "cpu_s": 0.1}]}
            }
        }
    )
    arrivals = draw_arrivals("a", w.services["a"], 20.0, seed=3)

    def model() -> tuple[ServiceModel, EventLoop]:
        m = ServiceModel("a", arrivals, startup_s=0.0, request_cores_max=1.0)
        node = Node(4.0, {"a": m})
        m.set_target(2, 0.6, node.claims())
        node.schedule(0.0)
        for r in m.replicas:
            r.phase = READY
        return m, EventLoop(4.0, {"a": m}, rule="limit")

    (whole, whole_loop), (pieces, pieces_loop) = model(), model()
    rnd = random.Random(1)
    for k in range(20):
        whole_loop.run(float(k + 1))
        for cut in sorted(rnd.uniform(k, k + 1) for _ in range(rnd.randint(0, 6))):
            assert pieces_loop.run(cut, levels={"a": 1e9}) is None
        pieces_loop.run(float(k + 1))
        assert pieces.tick_latencies == pytest.approx(whole.tick_latencies, abs=1e-9)
        assert pieces.tick_arrivals == whole.tick_arrivals
        assert pieces.cpu_seconds_total == pytest.approx(whole.cpu_seconds_total, abs=1e-9)
        assert pieces.throttled_seconds_total == pytest.approx(
            whole.throttled_seconds_total, abs=1e-9
        )
        whole.close_tick()
        pieces.close_tick()
    assert len(whole.latencies) > 100


def reference_run(
    scenario: Scenario, policies: Mapping[str, ScalingPolicy], budget: BudgetConfig
) -> tuple[dict[str, dict[str, list[float]]], dict[str, list[float]]]:
    """The tick loop without early ticks, written plainly: each tick, decide, then one run."""
    ctl = EngineController("sluice", policies, budget)
    models = {
        s: ServiceModel(
            s,
            scenario.arrivals[s],
            startup_s=scenario.loads[s].startup_s,
            request_cores_max=scenario.loads[s].request_cores_max,
            tick_s=scenario.tick_s,
        )
        for s in scenario.services
    }
    node = Node(budget.cpu, models)
    claims = node.claims()
    for s, target in ctl.initial().items():
        models[s].set_target(target.replicas, target.cpu_per_replica_cores, claims)
    node.schedule(0.0)
    for m in models.values():
        for r in m.replicas:
            if r.phase != PENDING:
                r.phase, r.ready_at = READY, 0.0
    loop = EventLoop(budget.cpu, models, rule=budget.enforcement)
    out: dict[str, dict[str, list[float]]] = {s: {"cpu": [], "arrivals": []} for s in models}
    for k in range(scenario.ticks):
        t0 = k * scenario.tick_s
        signals = {s: m.signals(t0) for s, m in models.items()}
        states = {s: m.state() for s, m in models.items()}
        targets: dict[str, Target] = ctl.decide(t0, signals, states)
        for s, target in targets.items():
            models[s].set_target(target.replicas, target.cpu_per_replica_cores, claims)
        node.schedule(t0)
        loop.run(t0 + scenario.tick_s)
        for s, m in models.items():
            out[s]["cpu"].append(m.cpu_seconds_total)
            out[s]["arrivals"].append(m.tick_arrivals)
            m.close_tick()
    return out, {s: m.latencies for s, m in models.items()}


def test_early_ticks_off_is_the_plain_tick_loop_bit_for_bit() -> None:
    scenario = scenario_with({"short": burst(10.3, 30, 0.01, cpu_s=0.3)}, duration_s=30)
    # the reference is plain limit enforcement, no lending
    off = BUDGET.model_copy(update={"early_ticks": False, "lending": False})
    result = run(scenario, "sluice", POLICIES, off)
    assert result.early_ticks == 0
    reference, latencies = reference_run(scenario, POLICIES, off)
    for s in scenario.services:
        assert result.latencies_s[s][: len(latencies[s])].tolist() == latencies[s]
        assert result.series[s]["arrivals"].tolist() == reference[s]["arrivals"]
        used = np.diff(np.array([0.0, *reference[s]["cpu"]])) / scenario.tick_s
        assert result.series[s]["used_cores"].tolist() == used.tolist()
    on = run(scenario, "sluice", POLICIES, BUDGET)
    # the burst starts at 10.3 s: with early ticks it gets its CPU within that tick
    first = int(10.3 // scenario.tick_s)
    assert on.early_ticks > 0
    assert on.series["short"]["used_cores"][first] > 2 * result.series["short"]["used_cores"][first]


@pytest.mark.parametrize("name", ["independent", "static"])
def test_baselines_never_tick_early(name: RunName) -> None:
    scenario = scenario_with({"short": burst(10.3, 30, 0.01, cpu_s=0.3)}, duration_s=20)
    on = run(scenario, name, POLICIES, BUDGET)
    off = run(scenario, name, POLICIES, BUDGET.model_copy(update={"early_ticks": False}))
    assert on.early_ticks == 0
    assert_same(on, off)


def assert_same(a: RunResult, b: RunResult) -> None:
    for s in a.series:
        for key in SERIES:
            assert np.array_equal(a.series[s][key], b.series[s][key], equal_nan=True), (s, key)
        assert a.latencies_s[s].tolist() == b.latencies_s[s].tolist()
