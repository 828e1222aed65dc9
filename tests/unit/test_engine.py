"""Engine.tick end to end: horizontal recommendation + budget arbitration, with a stepped clock."""

from __future__ import annotations

import dataclasses
import math
import re

import pytest

from scaler.decision import Decision, ServiceState
from scaler.engine import Engine
from scaler.explanation import Clamp, Explanation, Flow
from scaler.policy import BudgetConfig, ScalingPolicy
from scaler.signals import ServiceSignals


def policy(**kw: object) -> ScalingPolicy:
    base: dict[str, object] = {"target": 10, "cpu": {"min": 0.1, "max": 1.0, "request": 0.25}}
    base.update(kw)
    return ScalingPolicy.model_validate(base)


def applied(decisions: dict[str, Decision]) -> dict[str, ServiceState]:
    return {
        n: ServiceState(n, d.replicas, d.replicas, d.cpu_per_replica_cores)
        for n, d in decisions.items()
    }


def run(engine: Engine, load: dict[str, list[int]], seconds: int) -> list[dict[str, Decision]]:
    states: dict[str, ServiceState] = {}
    history = []
    for t in range(seconds):
        signals = {n: ServiceSignals(n, float(t), in_flight=v[t]) for n, v in load.items()}
        decisions = engine.tick(float(t), signals, states)
        history.append(decisions)
        states = applied(decisions)
    return history


def test_one_busy_service_borrows_the_whole_spare_budget() -> None:
    engine = Engine({"api": policy(max_replicas=8), "idle": policy()}, BudgetConfig(cpu=2))
    history = run(engine, {"api": [100] * 5, "idle": [0] * 5}, 5)
    last = history[-1]
    assert last["api"].allocated_cores == pytest.approx(1.9)
    assert last["idle"].allocated_cores == pytest.approx(0.1)
    assert any("borrows" in r for r in last["api"].reasons)
    assert any("lends" in r for r in last["idle"].reasons)
    # As data: who lent how much to whom.
    assert last["idle"].explanation.flows == (Flow("lent", pytest.approx(0.9), ("api",)),)
    assert last["api"].explanation.flow_cores("borrowed") == pytest.approx(0.9)


def test_a_demanding_service_reclaims_its_fair_share_in_one_tick() -> None:
    engine = Engine(
        {"long": policy(max_replicas=8), "short": policy(min_replicas=0)}, BudgetConfig(cpu=2)
    )
    states: dict[str, ServiceState] = {}
    for t in range(10):
        d = engine.tick(
            float(t),
            {"long": ServiceSignals("long", t, in_flight=200), "short": ServiceSignals("short", t)},
            states,
        )
        states = applied(d)
    assert d["long"].allocated_cores == pytest.approx(2.0)
    before = d["long"].replicas
    d = engine.tick(
        10.0,
        {
            "long": ServiceSignals("long", 10.0, in_flight=200),
            "short": ServiceSignals("short", 10.0, in_flight=500),
        },
        states,
    )
    assert d["short"].allocated_cores == pytest.approx(engine.fair_share("short"))
    assert d["long"].replicas == before, "reclaim shrinks CPU per replica before replicas"
    assert any("reclaimed" in r for r in d["short"].reasons)
    assert sum(x.allocated_cores for x in d.values()) <= 2.0 + 1e-9


def test_stale_signals_freeze_the_service() -> None:
    engine = Engine({"api": policy(max_replicas=8)}, BudgetConfig(cpu=4))
    states = {"api": ServiceState("api", 3, 3, 0.5)}
    d = engine.tick(100.0, {"api": ServiceSignals("api", 90.0)}, states)
    assert d["api"].frozen and d["api"].rule == "frozen: stale signals"
    assert (d["api"].replicas, d["api"].cpu_per_replica_cores) == (3, 0.5)
    d = engine.tick(101.0, {}, states)
    assert d["api"].frozen and d["api"].rule == "frozen: missing signals"
    assert d["api"].replicas == 3


def tick_loop(
    engine: Engine, seconds: range, load: dict[str, int], states: dict[str, ServiceState]
) -> dict[str, Decision]:
    decisions: dict[str, Decision] = {}
    for t in seconds:
        signals = {n: ServiceSignals(n, float(t), in_flight=v) for n, v in load.items()}
        decisions = engine.tick(float(t), signals, states)
        states.clear()
        states.update(applied(decisions))
    return decisions


def test_independent_baseline_leaves_the_latecomer_pending() -> None:
    pols = {
        "long": policy(max_replicas=8, cpu={"min": 0.25, "max": 0.25}),
        "short": policy(min_replicas=0, max_replicas=8, cpu={"min": 0.25, "max": 0.25}),
    }
    for arbitration, short_gets in (("independent", 0.0), ("shared", 1.0)):
        engine = Engine(pols, BudgetConfig(cpu=2, arbitration=arbitration))
        states: dict[str, ServiceState] = {}
        tick_loop(engine, range(10), {"long": 500, "short": 0}, states)
        d = tick_loop(engine, range(10, 12), {"long": 500, "short": 500}, states)
        assert d["short"].allocated_cores == pytest.approx(short_gets), arbitration
        assert sum(x.allocated_cores for x in d.values()) <= 2.0 + 1e-9
    assert any(
        "pending" in r
        for r in tick_loop(
            Engine(pols, BudgetConfig(cpu=2, arbitration="independent")),
            range(3),
            {"long": 500, "short": 500},
            {},
        )["short"].reasons
    )


def test_independent_replicas_at_their_request_scale_down() -> None:
    # One autoscaler per service runs replicas of cpu.request: the KPA's rate limit counts
    # those, not replicas at cpu.max (4 of request 0.25 would read as 16 and never halve).
    engine = Engine({"api": policy(max_replicas=8)}, BudgetConfig(cpu=4, arbitration="independent"))
    states: dict[str, ServiceState] = {}
    busy = tick_loop(engine, range(20), {"api": 70}, states)
    assert (busy["api"].replicas, busy["api"].cpu_per_replica_cores) == (8, 0.25)
    quiet = tick_loop(engine, range(20, 200), {"api": 5}, states)
    assert quiet["api"].replicas == 1


def test_rps_metric_comes_from_the_arrivals_counter() -> None:
    engine = Engine(
        {"api": policy(metric="rps", target=10, target_utilization=1.0)}, BudgetConfig(cpu=4)
    )
    states: dict[str, ServiceState] = {}
    for t in range(70):
        d = engine.tick(
            float(t), {"api": ServiceSignals("api", float(t), arrivals_total=50 * t)}, states
        )
        states = applied(d)
    assert d["api"].inputs["rps"] == pytest.approx(50.0)
    # (the first tick has no rate yet; once it has left the 60 s window: 50 / 10 = 5)
    assert d["api"].inputs["horizontal_replicas"] == 5


def measured_demand(in_flight: int, throttled_s_per_s: float, ready: int = 2) -> float:
    """Demand of a service measured at 0.7 cores, 2 replicas of 0.5 asked, ``ready`` ready."""
    engine = Engine(
        {"api": policy(cpu={"min": 0.1, "max": 2.0, "request": 0.5})}, BudgetConfig(cpu=8)
    )
    states = {"api": ServiceState("api", 2, ready, 0.5)}
    for t in range(3):
        sig = ServiceSignals(
            "api",
            float(t),
            in_flight=in_flight,
            cpu_seconds_total=0.7 * t,
            cpu_throttled_seconds_total=throttled_s_per_s * t,
        )
        d = engine.tick(float(t), {"api": sig}, states)["api"]
    return d.inputs["demand_cores"]


def test_an_hpa_services_measured_demand_is_the_work_at_its_target() -> None:
    # The HPA's rule has no utilisation headroom: 20 in flight at 10 per replica of 0.5 cores.
    engine = Engine(
        {"api": policy(mode="hpa", cpu={"min": 0.1, "max": 2.0, "request": 0.5})},
        BudgetConfig(cpu=8),
    )
    states = {"api": ServiceState("api", 2, 2, 0.5)}
    for t in range(3):
        sig = ServiceSignals("api", float(t), in_flight=20, cpu_seconds_total=0.7 * t)
        d = engine.tick(float(t), {"api": sig}, states)["api"]
    assert d.inputs["demand_cores"] == pytest.approx(20 / 10 * 0.5)


def test_measured_demand_is_the_work_now_at_the_kpa_aim_or_the_use() -> None:
    # 14 in flight at the KPA's aim of 10 × 0.7 per replica of 0.5 cores: the work needs
    # 1.0 core (the headroom once), more than the 0.7 used.
    assert measured_demand(14, 0.0) == pytest.approx(14 / 7 * 0.5)
    # Less work in flight than the use: the use rules (the work between ticks is not seen).
    assert measured_demand(7, 0.0) == pytest.approx(0.7)
    # A throttled use is capped by the quota: it counts with the headroom, once (0.7 / 0.7),
    # never multiplied on top of the work's.
    assert measured_demand(14, 1.0) == pytest.approx(1.0)


def test_a_service_behind_its_target_gets_what_the_work_in_the_system_asks() -> None:
    # 60 in flight: 60 / 7 reference replicas of 0.5 cores now, far more than the 0.7 used.
    assert measured_demand(60, 0.0) == pytest.approx(60 / 7 * 0.5)


def test_measured_demand_does_not_dip_while_replicas_start() -> None:
    # One of two replicas ready: the work in the system is the same, so is the demand.
    assert measured_demand(14, 0.0, ready=1) == pytest.approx(14 / 7 * 0.5)


def test_a_starting_replica_is_never_removed_because_the_estimate_dipped() -> None:
    engine = Engine({"api": policy(max_replicas=8, scale_down_delay_s=0)}, BudgetConfig(cpu=4))
    # 4 asked, 1 ready; the load that asked for them has gone quiet for a moment.
    states = {"api": ServiceState("api", 4, 1, 0.25)}
    for t in range(3):
        d = engine.tick(float(t), {"api": ServiceSignals("api", float(t), in_flight=1)}, states)
        assert d["api"].replicas == 4
    assert any("starting" in r for r in d["api"].reasons)
    # Once they are ready, the scale-down may proceed.
    states = {"api": ServiceState("api", 4, 4, 0.25)}
    d = engine.tick(3.0, {"api": ServiceSignals("api", 3.0, in_flight=1)}, states)
    assert d["api"].replicas <= 4


@pytest.mark.parametrize(
    "bad",
    [
        {"rps": math.inf},
        {"in_flight": -1},
        {"cpu_seconds_total": math.nan},
        {"cpu_throttled_seconds_total": -2.0},
        {"arrivals_total": math.nan},
        {"at": math.nan},
    ],
)
def test_a_bad_figure_freezes_only_its_service(bad: dict[str, float]) -> None:
    engine = Engine(
        {"bad": policy(max_replicas=8), "good": policy(max_replicas=8)}, BudgetConfig(cpu=4)
    )
    states = {
        "bad": ServiceState("bad", 3, 3, 0.25),
        "good": ServiceState("good", 1, 1, 0.25),
    }
    for t in range(5):
        fields: dict[str, object] = {"at": float(t), "in_flight": 20}
        if t == 2:
            fields.update(bad)
        signals = {
            "bad": ServiceSignals("bad", **fields),  # type: ignore[arg-type]
            "good": ServiceSignals("good", float(t), in_flight=40),
        }
        d = engine.tick(float(t), signals, states)
        if t == 2:
            assert d["bad"].rule == "frozen: invalid signals"
            assert d["bad"].frozen and d["bad"].replicas == states["bad"].replicas
            assert any(next(iter(bad)) in r for r in d["bad"].reasons)
            assert not d["good"].frozen
        else:
            assert not d["bad"].frozen
        states = applied(d)
    # The windows were not poisoned: the service decides normally again.
    assert all(math.isfinite(v) for v in d["bad"].inputs.values())
    assert d["bad"].rule in {"stable", "panic"}


def test_missing_signals_keep_replicas_when_another_floor_returns() -> None:
    engine = Engine(
        {
            "long": policy(max_replicas=8, min_replicas=1, guaranteed_cpu=1.0),
            "quiet": policy(max_replicas=8, min_replicas=1),
        },
        BudgetConfig(cpu=2),
    )
    states = {
        "long": ServiceState("long", 1, 1, 0.1),
        "quiet": ServiceState("quiet", 3, 3, 0.5),
    }
    for t in range(5):
        # quiet's signals stop; long's load comes back and claims its floor.
        signals = {"long": ServiceSignals("long", float(t), in_flight=100)}
        d = engine.tick(float(t), signals, states)
        assert d["quiet"].frozen
        assert d["quiet"].replicas == 3, d["quiet"].reasons
        assert d["long"].allocated_cores >= 1.0 - 1e-9
        states = applied(d)


def test_blocked_resize_scales_replicas_instead() -> None:
    engine = Engine(
        {"api": policy(max_replicas=8, cpu={"min": 0.1, "max": 1.0, "request": 0.25})},
        BudgetConfig(cpu=4),
    )
    states = {"api": ServiceState("api", 1, 1, 0.25, resize_blocked=True)}
    d = engine.tick(0.0, {"api": ServiceSignals("api", 0.0, in_flight=30)}, states)["api"]
    assert d.cpu_per_replica_cores == pytest.approx(0.25)
    assert d.replicas > 1
    assert any("resize blocked" in r for r in d.reasons)


def test_hpa_mode_waits_for_the_scale_down_stabilization_window() -> None:
    engine = Engine(
        {
            "api": policy(
                mode="hpa",
                target=10,
                max_replicas=10,
                cpu={"min": 0.1, "max": 0.1},
                scale_down_delay_s=0,
            )
        },
        BudgetConfig(cpu=2),
    )
    states = {"api": ServiceState("api", 4, 4, 0.1)}
    d = tick_loop(engine, range(0, 10), {"api": 40}, states)["api"]
    assert d.replicas == 4 and d.rule == "hpa"
    d = tick_loop(engine, range(10, 300), {"api": 10}, states)["api"]
    assert d.replicas == 4, "scale-down stabilization keeps the highest recommendation for 300 s"
    d = tick_loop(engine, range(300, 320), {"api": 10}, states)["api"]
    assert d.replicas == 1


def test_scale_to_zero_and_back_through_the_engine() -> None:
    engine = Engine(
        {
            "fn": policy(
                min_replicas=0,
                stable_window_s=10,
                panic_window_s=2,
                scale_to_zero_grace_s=5,
                scale_down_delay_s=0,
            )
        },
        BudgetConfig(cpu=2),
    )
    states: dict[str, ServiceState] = {}
    d = tick_loop(engine, range(0, 5), {"fn": 5}, states)["fn"]
    assert d.replicas >= 1
    d = tick_loop(engine, range(5, 19), {"fn": 0}, states)["fn"]
    assert d.replicas == 1 and d.rule == "idle-grace"
    d = tick_loop(engine, range(19, 21), {"fn": 0}, states)["fn"]
    assert d.replicas == 0 and d.rule == "scale-to-zero" and d.allocated_cores == 0.0
    d = tick_loop(engine, range(21, 22), {"fn": 40}, states)["fn"]
    assert d.replicas >= 1


def test_reasons_name_clamps_and_the_budget_line() -> None:
    fixed = policy(max_replicas=2, cpu={"min": 0.25, "max": 0.25})
    engine = Engine({"api": fixed}, BudgetConfig(cpu=4))
    d = engine.tick(0.0, {"api": ServiceSignals("api", 0.0, in_flight=100)}, {})["api"]
    text = "\n".join(d.reasons)
    assert "clamped replicas 15 -> 2 by max_replicas" in text
    assert text.splitlines()[-1] == (
        "budget: demand 0.50 cores (floor 0.25, fair share 0.50 of 4 from budget.cpu) -> "
        "2×0.25 = 0.50 cores"
    )
    # with room to grow vertically the bound is max_replicas replicas at cpu.max
    engine = Engine({"api": policy(max_replicas=2)}, BudgetConfig(cpu=4))
    d = engine.tick(0.0, {"api": ServiceSignals("api", 0.0, in_flight=100)}, {})["api"]
    assert "clamped replicas 15 -> 8 by max_replicas × cpu.max / cpu.request" in d.reasons
    assert (d.replicas, d.cpu_per_replica_cores) == (2, 1.0)
    # The same, as data: the value, the bound and the bound's name.
    assert Clamp("replicas", 15, 8, "max_replicas × cpu.max / cpu.request") in (
        d.explanation.clamps
    )
    assert d.explanation.rule == d.rule == "panic"
    assert d.explanation.steps[-1].kind == "budget"


def test_decisions_are_dataclasses_with_lazy_but_stable_reasons() -> None:
    import dataclasses

    engine = Engine({"api": policy()}, BudgetConfig(cpu=2))
    d = engine.tick(0.0, {"api": ServiceSignals("api", 0.0, in_flight=3)}, {})["api"]
    first = d.reasons
    assert d.reasons is first, "rendered once, then cached"
    as_dict = dataclasses.asdict(d)
    assert as_dict["reasons"] == first and as_dict["inputs"]["concurrency"] == 3.0
    assert set(vars(d)) >= set(
        vars(Decision.explained("x", 0, 1, 0.1, 0.1, "stable", False, _NoSource(), 0))
    )


def test_decisions_pickle_with_their_reasons_not_their_tick() -> None:
    import copy
    import pickle

    engine = Engine({"api": policy()}, BudgetConfig(cpu=2))
    d = engine.tick(0.0, {"api": ServiceSignals("api", 0.0, in_flight=3)}, {})["api"]
    for clone in (pickle.loads(pickle.dumps(d)), copy.deepcopy(d)):
        assert clone == d
        assert "_source" not in vars(clone)
        assert clone.reasons == d.reasons and clone.inputs == d.inputs


class _NoSource:
    def explanation(self, index: int) -> Explanation:
        return Explanation("stable")


def test_floors_over_the_budget_and_bad_staleness_are_refused() -> None:
    with pytest.raises(ValueError, match="exceeds the budget"):
        Engine({"a": policy(min_replicas=3, cpu={"min": 0.5, "max": 1})}, BudgetConfig(cpu=1))
    with pytest.raises(ValueError, match="staleness_s"):
        Engine({"a": policy()}, BudgetConfig(cpu=1), staleness_s=0)


def test_guaranteed_cpu_below_the_minimum_replicas_is_a_config_error() -> None:
    with pytest.raises(
        ValueError, match=re.escape("guaranteed_cpu: must be >= min_replicas × cpu.min")
    ):
        policy(min_replicas=2, cpu={"min": 0.5, "max": 1}, guaranteed_cpu=0.5)


def test_panic_keeps_replicas_but_lends_the_cpu_the_load_no_longer_needs() -> None:
    pols = {"long": policy(max_replicas=8), "short": policy(min_replicas=0, max_replicas=8)}
    engine = Engine(pols, BudgetConfig(cpu=2))
    states: dict[str, ServiceState] = {}
    peak = None
    # 80 in flight is over twice what short's fair share (1 core = 4 replicas' worth of
    # target 7) serves, so it panics even with its CPU raised in place at once.
    for t in range(36):
        load = {"long": 500, "short": 80 if 10 <= t < 20 else 0}
        d = tick_loop(engine, range(t, t + 1), load, states)
        if t == 19:
            peak = d["short"]
    assert peak is not None and peak.allocated_cores == pytest.approx(1.0), "its fair share"
    short, long = d["short"], d["long"]
    assert short.rule == "panic", "a stable window after the burst it is still panicking"
    assert short.replicas >= peak.replicas, "panic never scales replicas down"
    assert short.inputs["held_demand_cores"] > short.inputs["demand_cores"]
    assert short.allocated_cores == pytest.approx(short.inputs["demand_cores"])
    assert long.allocated_cores == pytest.approx(2.0 - short.allocated_cores)
    assert any("served only from spare CPU" in r for r in short.reasons)


def test_cpu_follows_the_instant_load_and_drains_a_backlog() -> None:
    """The tick a burst is seen it gets CPU (not a sixth of it through the panic window),
    and keeps it while the requests are still there."""
    pols = {"long": policy(max_replicas=8), "short": policy(min_replicas=1, max_replicas=4)}
    engine = Engine(pols, BudgetConfig(cpu=2))
    states: dict[str, ServiceState] = {}
    idle = tick_loop(engine, range(30), {"long": 500, "short": 0}, states)
    assert idle["short"].allocated_cores == pytest.approx(0.1), "idle: cpu.min, the rest lent"
    burst = tick_loop(engine, range(30, 31), {"long": 500, "short": 20}, states)
    # 20 in flight at target 10 × 0.7 = 3 replicas' worth of 0.25 cores, at once
    assert burst["short"].allocated_cores == pytest.approx(0.75)
    assert any("CPU follows this tick's concurrency" in r for r in burst["short"].reasons)
    backlog = tick_loop(engine, range(31, 45), {"long": 500, "short": 20}, states)
    assert backlog["short"].allocated_cores == pytest.approx(0.75)


def test_a_burst_after_idleness_panics_the_tick_it_is_seen() -> None:
    """After a whole panic window without load, the window reads a burst's first second as a
    sixth of it; the gateway sees it whole.  A tick whose own concurrency then wants twice
    the ready replicas panics at once.  With load in the window, only the window panics."""
    whole = {"min": 0.1, "max": 1.0, "request": 1.0}
    pols = {
        "long": policy(max_replicas=8, cpu=whole),
        "short": policy(min_replicas=1, max_replicas=4, cpu=whole),
    }
    engine = Engine(pols, BudgetConfig(cpu=8, enforcement="share"))
    states: dict[str, ServiceState] = {}
    tick_loop(engine, range(30), {"long": 500, "short": 0}, states)
    # 7 in flight on one ready replica of target 10 × 0.7: what it serves, no surge
    d = tick_loop(engine, range(30, 31), {"long": 500, "short": 7}, states)["short"]
    assert (d.replicas, d.rule) == (1, "stable")
    # 20 in flight wants 3 replicas now, over twice the 1 ready; the window alone wants 1
    d = tick_loop(engine, range(31, 32), {"long": 500, "short": 20}, states)["short"]
    assert (d.replicas, d.rule) == (3, "panic")
    assert d.inputs["panic"] < 2 * 7, "the panic window alone would not have panicked"
    assert "panic at once: this tick's concurrency wants 3 replicas, >= 2× capacity 1" in "\n".join(
        d.reasons
    )

    steady = Engine(pols, BudgetConfig(cpu=8, enforcement="share"))
    states = {}
    tick_loop(steady, range(30), {"long": 500, "short": 3}, states)
    # the same tick after 30 s at 3 in flight: the window (4.8) wants 1 replica, no panic
    d = tick_loop(steady, range(30, 31), {"long": 500, "short": 14}, states)["short"]
    assert (d.replicas, d.rule) == (1, "stable")

    # Under limit a replica's quota is its CPU: one started beyond what the cores fill at
    # full size would slow the ready ones while it starts, so the window alone panics.
    for budget in (
        BudgetConfig(cpu=8, enforcement="limit"),
        BudgetConfig(cpu=8, enforcement="share", arbitration="independent"),
    ):
        states = {}
        capped = Engine(pols, budget)
        tick_loop(capped, range(30), {"long": 500, "short": 0}, states)
        tick_loop(capped, range(30, 31), {"long": 500, "short": 7}, states)
        d = tick_loop(capped, range(31, 32), {"long": 500, "short": 20}, states)["short"]
        assert d.rule == "stable", budget

    # Under share, a service whose replicas the platform holds at their decided CPU
    # (Kubernetes pods of Guaranteed QoS) is decided as under limit: no surge.
    held = Engine(pols, BudgetConfig(cpu=8, enforcement="share"))
    states = {}
    for t in range(32):
        if "short" in states:
            states["short"] = dataclasses.replace(states["short"], cpu_capped=True)
        load = {"long": 500, "short": 0 if t < 30 else (7 if t == 30 else 20)}
        d = tick_loop(held, range(t, t + 1), load, states)["short"]
    assert d.rule == "stable"
    assert "decided as under limit" in " ".join(d.reasons)


def test_wake_levels_say_when_the_data_plane_should_not_wait_for_the_tick() -> None:
    pols = {
        "long": policy(max_replicas=8),
        "short": policy(min_replicas=1, max_replicas=4),
        "zero": policy(min_replicas=0),
        "rate": policy(metric="rps"),
        "hpa": policy(mode="hpa"),
    }
    engine = Engine(pols, BudgetConfig(cpu=4))
    states: dict[str, ServiceState] = {}
    load = {"long": 500, "short": 0, "zero": 0, "rate": 0, "hpa": 0}
    d = tick_loop(engine, range(20), load, states)
    # short holds 1 replica at cpu.min 0.1 = 0.4 reference replicas, counted as one: the
    # KPA's panic (2×) level of one replica of target 10 × 0.7
    assert d["short"].wake_concurrency == 2 * 7
    assert d["short"].inputs["wake_concurrency"] == d["short"].wake_concurrency
    # long is held by the budget: wake again only if its load doubles
    assert d["long"].wake_concurrency == 1000
    assert d["zero"].replicas == 0 and d["zero"].wake_concurrency == 1, "first request wakes"
    assert d["rate"].wake_concurrency == math.inf and d["hpa"].wake_concurrency == math.inf
    # frozen (no signals for zero any more) and independent services never wake early
    signals = {n: ServiceSignals(n, 20.0, in_flight=0) for n in ("long", "short", "rate", "hpa")}
    assert engine.tick(20.0, signals, states)["zero"].wake_concurrency == math.inf
    for budget in (
        BudgetConfig(cpu=4, arbitration="independent"),
        BudgetConfig(cpu=4, early_ticks=False),
    ):
        d = tick_loop(Engine(pols, budget), range(3), {"long": 500, "short": 0, "zero": 0}, {})
        assert all(x.wake_concurrency == math.inf for x in d.values())


def test_replicas_stay_warm_for_the_scale_down_delay_then_follow_the_recommendation() -> None:
    short = policy(max_replicas=8, stable_window_s=10, panic_window_s=2, scale_down_delay_s=40)
    pols = {"short": short, "long": policy(max_replicas=8)}
    engine = Engine(pols, BudgetConfig(cpu=4))
    states: dict[str, ServiceState] = {}
    d = tick_loop(engine, range(0, 5), {"short": 60, "long": 20}, states)["short"]
    peak = d.replicas
    assert peak >= 2
    # The burst is over: the windows forget it after 10 s, the replicas stay warm for 40 s.
    ds = tick_loop(engine, range(5, 40), {"short": 0, "long": 1000}, states)
    assert ds["short"].replicas == peak
    assert any("scale_down_delay_s" in r for r in ds["short"].reasons)
    # Idle, each holds only cpu.min: the rest of its CPU goes to the busy service.
    assert ds["short"].cpu_per_replica_cores == pytest.approx(0.1)
    assert ds["long"].allocated_cores == pytest.approx(4 - peak * 0.1)
    # After the delay the recommendation rules.
    d = tick_loop(engine, range(40, 75), {"short": 0, "long": 1000}, states)["short"]
    assert d.replicas < peak


def _squeeze(enforcement: str) -> tuple[dict[str, Decision], dict[str, Decision]]:
    """A steady service at 8 replicas (cpu.min 0.4 each: 3.2 cores, above its 2.5-core fair
    share), then another one bursts: the decisions before and in the burst."""
    cpu = {"min": 0.4, "max": 1.0, "request": 0.5}
    engine = Engine(
        {
            "steady": policy(target=1, max_replicas=8, prefer="horizontal", cpu=cpu),
            "burst": policy(target=1, max_replicas=8, prefer="horizontal", cpu=cpu),
        },
        BudgetConfig(cpu=5, enforcement=enforcement),
    )
    states: dict[str, ServiceState] = {}
    before: dict[str, Decision] = {}
    for t in range(70):
        signals = {
            "steady": ServiceSignals("steady", float(t), in_flight=12),
            "burst": ServiceSignals("burst", float(t), in_flight=0 if t < 65 else 400),
        }
        d = engine.tick(float(t), signals, states)
        states = applied(d)
        if t == 64:
            before = d
    return before, d


def test_a_lone_request_wakes_a_service_at_zero_whose_work_reads_below_cpu_min() -> None:
    # CPU measured (a counter at zero replicas, as cgroups keep one): one request in flight
    # at target 10 is 1 / (10 × 0.7) of a core -- below cpu.min.  It used to be decided that
    # much CPU, which fits no replica, so the request waited for a second one to arrive.
    pols = {
        "fn": policy(min_replicas=0, max_replicas=4, target=10, cpu={"min": 0.25, "max": 1.0}),
        "api": policy(max_replicas=8, cpu={"min": 0.25, "max": 1.0}),
    }
    for enforcement in ("share", "limit"):
        engine = Engine(pols, BudgetConfig(cpu=4, enforcement=enforcement))
        states: dict[str, ServiceState] = {}
        d: dict[str, Decision] = {}
        for t in range(6):
            signals = {
                "fn": ServiceSignals("fn", float(t), in_flight=int(t == 5), cpu_seconds_total=0.0),
                "api": ServiceSignals("api", float(t), in_flight=500, cpu_seconds_total=4.0 * t),
            }
            d = engine.tick(float(t), signals, states)
            states = applied(d)
        assert d["fn"].replicas == 1, (enforcement, d["fn"].reasons)
        assert d["fn"].cpu_per_replica_cores >= 0.25, enforcement
        assert sum(x.allocated_cores for x in d.values()) <= 4 + 1e-9


def test_replicas_held_at_cpu_min_never_lock_a_scaled_to_zero_service_out() -> None:
    # "long" runs 8 replicas of 0.25 cores (cpu.min = cpu.max): at cpu.min they hold the
    # whole budget.  "short" (no floor: min_replicas 0) then gets requests: its fair share
    # (1 core, 4 replicas) comes out of long's held replicas (it used to get nothing: short
    # stayed at 0 replicas for good).  Under limit two of long's replicas go; under share
    # long keeps all 8 in place at 0.125 cores each (a weight: the kernel takes the CPU
    # back), so none of them restarts after short's burst.
    pols = {
        "long": policy(max_replicas=8, cpu={"min": 0.25, "max": 0.25}),
        "short": policy(min_replicas=0, max_replicas=8, cpu={"min": 0.25, "max": 0.25}),
    }
    for enforcement, long_gets in (("limit", (4, 0.25)), ("share", (8, 0.125))):
        engine = Engine(pols, BudgetConfig(cpu=2, enforcement=enforcement))
        states: dict[str, ServiceState] = {}
        d = tick_loop(engine, range(10), {"long": 500, "short": 0}, states)
        assert (d["long"].replicas, d["short"].replicas) == (8, 0), enforcement
        d = tick_loop(engine, range(10, 14), {"long": 500, "short": 500}, states)
        assert (d["short"].replicas, d["short"].allocated_cores) == (4, pytest.approx(1.0))
        long = (d["long"].replicas, d["long"].cpu_per_replica_cores)
        assert long == (long_gets[0], pytest.approx(long_gets[1])), enforcement
        assert sum(x.allocated_cores for x in d.values()) <= 2.0 + 1e-9
        assert d["short"].explanation.flows == d["long"].explanation.flows == ()
        in_place = [s for s in d["long"].explanation.steps if s.kind == "split.in_place"]
        assert bool(in_place) == (enforcement == "share"), d["long"].reasons
        if enforcement == "share":
            assert any(
                r.startswith("squeezed in place: keeps its 8 replicas at 0.125")
                for r in d["long"].reasons
            )


def test_a_frozen_service_gives_cpu_to_floors_in_place_under_share() -> None:
    # "long" fills the budget with 8 replicas of a fixed size, then its signals go missing
    # (frozen) as "short" wakes with a 1-core floor: the floor is met from long's hold either
    # way; under limit 4 of long's replicas go, under share all 8 stay at 0.125 cores each.
    pols = {
        "long": policy(max_replicas=8, cpu={"min": 0.25, "max": 0.25}),
        "short": policy(
            min_replicas=0, max_replicas=8, guaranteed_cpu=1.0, cpu={"min": 0.25, "max": 0.25}
        ),
    }
    for enforcement, long_gets in (("limit", (4, 0.25)), ("share", (8, 0.125))):
        engine = Engine(pols, BudgetConfig(cpu=2, enforcement=enforcement))
        states: dict[str, ServiceState] = {}
        d = tick_loop(engine, range(10), {"long": 500, "short": 0}, states)
        assert (d["long"].replicas, d["short"].replicas) == (8, 0), enforcement
        d = tick_loop(engine, range(10, 11), {"short": 500}, states)
        assert d["long"].frozen and d["short"].allocated_cores == pytest.approx(1.0)
        long = (d["long"].replicas, d["long"].cpu_per_replica_cores)
        assert long == (long_gets[0], pytest.approx(long_gets[1])), enforcement
        assert d["long"].explanation.flow_cores("taken_for_floors") == pytest.approx(1.0)
        # and it stays so while frozen: what it runs on is what it holds
        d = tick_loop(engine, range(11, 15), {"short": 500}, states)
        assert (d["long"].replicas, d["long"].allocated_cores) == (long_gets[0], pytest.approx(1.0))


def test_a_frozen_service_squeezed_in_place_keeps_its_replicas_when_its_cpu_becomes_capped() -> (
    None
):
    # Under share "long" runs 8 replicas of a fixed size squeezed in place (0.125 cores each, a
    # weight) while "short" takes its fair share.  Then long's signals go missing and the
    # platform reports its CPU capped (the decided CPU a hard limit, not a weight): a frozen
    # service still keeps every replica on what they hold (found by the engine's property
    # test: it used to shed to what cpu.min fits, 8 -> 4, without a reason).
    pols = {
        "long": policy(max_replicas=8, cpu={"min": 0.25, "max": 0.25}),
        "short": policy(min_replicas=0, max_replicas=8, cpu={"min": 0.25, "max": 0.25}),
    }
    engine = Engine(pols, BudgetConfig(cpu=2, enforcement="share"))
    states: dict[str, ServiceState] = {}
    tick_loop(engine, range(10), {"long": 500, "short": 0}, states)
    d = tick_loop(engine, range(10, 14), {"long": 500, "short": 500}, states)
    assert (d["long"].replicas, d["long"].cpu_per_replica_cores) == (8, pytest.approx(0.125))
    long = states["long"]
    states["long"] = ServiceState(
        "long", long.replicas, long.ready_replicas, long.cpu_per_replica_cores, cpu_capped=True
    )
    signals = {"short": ServiceSignals("short", 14.0, in_flight=500)}
    d = engine.tick(14.0, signals, states)
    assert d["long"].frozen
    assert (d["long"].replicas, d["long"].cpu_per_replica_cores) == (8, pytest.approx(0.125))
    assert sum(x.allocated_cores for x in d.values()) <= 2.0 + 1e-9


def test_under_limit_a_burst_takes_the_cpu_that_held_serving_replicas() -> None:
    before, during = _squeeze("limit")
    assert before["steady"].replicas == 8
    # its fair share (2.5 cores) holds 6 replicas at cpu.min: 2 serving replicas go
    assert during["burst"].allocated_cores == pytest.approx(2.5)
    assert during["steady"].replicas == 6


def test_under_share_serving_replicas_stay_in_place_while_another_service_bursts() -> None:
    # the burst gets its fair share (2.5 cores) as under limit, but the steady service keeps
    # its 8 replicas, squeezed in place below cpu.min (2.5 cores: 0.3125 each, a weight):
    # none of them is removed to restart after the burst
    before, during = _squeeze("share")
    assert before["steady"].replicas == 8
    assert during["burst"].allocated_cores == pytest.approx(2.5)
    assert during["steady"].replicas == 8
    assert during["steady"].cpu_per_replica_cores == pytest.approx(0.3125)
    assert [s.kind for s in during["steady"].explanation.steps if s.kind.startswith("split.")] == [
        "split.in_place"
    ]


def _settle(
    cpu_measured: bool, noisy: bool = False, mode: str = "kpa", arbitration: str = "shared"
) -> Decision:
    """6 replicas of 1 core serving 8 in flight (12 in HPA mode), then the load settles at 2.4
    cores used with 2 in flight (processor sharing: more capacity, less concurrency);
    ``noisy``: a second at 4.4 cores after each at 0.4 (the same mean)."""
    engine = Engine(
        {
            "api": policy(
                mode=mode,
                target=2,
                max_replicas=8,
                cpu={"min": 0.25, "max": 1.0, "request": 1.0},
            )
        },
        BudgetConfig(cpu=8, enforcement="share", arbitration=arbitration),
    )
    states: dict[str, ServiceState] = {}
    used = 0.0
    d: dict[str, Decision] = {}
    # HPA mode: its scale-down stabilization (300 s), then scale_down_delay_s (300 s)
    for t in range(500 if mode == "kpa" else 800):
        used += 4.0 if t < 100 else (2.4 + (2.0 if t % 2 else -2.0)) if noisy else 2.4
        sig = ServiceSignals(
            "api",
            float(t),
            # 6 replicas either way: the KPA aims at 2 × 0.7 per replica, the HPA at 2
            in_flight=(8 if mode == "kpa" else 12) if t < 100 else 2,
            cpu_seconds_total=used if cpu_measured else None,
        )
        d = engine.tick(float(t), {"api": sig}, states)
        states = applied(d)
        if t == 99:
            assert d["api"].replicas == 6
    return d["api"]


def test_scale_down_stops_where_the_measured_cpu_would_pass_the_target_utilisation() -> None:
    # the windows would go to 2 replicas; the measured CPU keeps ceil(2.4 / (1 × 0.7)) = 4
    # (concurrency comes back when capacity is taken away)
    kept = _settle(cpu_measured=True)
    assert kept.replicas == 4
    assert any(
        "the 2.40 cores it used over the panic window need them at the target utilisation" in r
        for r in kept.reasons
    )
    assert _settle(cpu_measured=False).replicas < 4  # without it the windows alone decide


def test_under_shared_arbitration_hpa_mode_scales_down_no_further_than_its_measured_cpu() -> None:
    # HPA mode's ratio counts the reference replicas of the cores granted; a ratio within
    # tolerance can hide replicas that are all busy, so the measured CPU floors it too
    kept = _settle(cpu_measured=True, mode="hpa")
    assert kept.replicas == 4
    assert any("the 2.40 cores it used over the panic window need them" in r for r in kept.reasons)
    # one HPA per service (the baseline) is Kubernetes' HPA as it is: its metric alone
    assert _settle(cpu_measured=True, mode="hpa", arbitration="independent").replicas < 4


def test_the_scale_down_floor_reads_the_panic_window_not_one_tick() -> None:
    # One tick's use peaks at 4.4 cores (7 replicas' worth: all 6 kept, had it ruled); the
    # panic window's mean stays near 2.4 and keeps 4, as the steady load does.
    assert _settle(cpu_measured=True, noisy=True).replicas == 4


def _cpu_bound_backlog(
    enforcement: str,
    seconds: int,
    auth: tuple[int, float] = (40, 1.0),
    *,
    cpu: float = 8,
    max_replicas: int = 4,
    starting: int = 0,
    capped: bool = False,
    backlog: tuple[float, float, float] = (200, 0, 0),
) -> list[Decision]:
    """A CPU-bound service with a backlog (3 replicas of 2 cores, all full) beside a service
    allocated more than it uses (headroom; ``auth``: its requests in flight and the cores it
    uses): by default 1.15 of the 8 cores sit idle.  ``starting``: render also has this many
    replicas starting, and no replica past the first 3 ever becomes ready.  ``capped``: the
    platform reports render's replicas held at their decided CPU (``cpu_capped``).
    ``backlog``: render's requests in the system at t=0, their change per second, and the
    requests it completes per second (0: the source reports no completions)."""
    engine = Engine(
        {
            "render": policy(
                target=1,
                max_replicas=max_replicas,
                cpu={"min": 0.5, "max": 2.0, "request": 2.0},
            ),
            "auth": policy(target=4, max_replicas=8, cpu={"min": 0.1, "max": 0.5, "request": 0.5}),
        },
        BudgetConfig(cpu=cpu, enforcement=enforcement),
    )
    states = {
        "render": ServiceState("render", 3 + starting, 3, 2.0),
        "auth": ServiceState("auth", 8, 8, 0.25),
    }
    used = {"render": 0.0, "auth": 0.0}
    out: list[Decision] = []
    in_system, growth, completing = backlog
    for t in range(seconds):
        used["render"] += 5.85  # its three ready replicas, full
        used["auth"] += auth[1]
        signals = {
            "render": ServiceSignals(
                "render",
                float(t),
                in_flight=max(0, round(in_system + growth * t)),
                completions_total=round(completing * t),
                cpu_seconds_total=used["render"],
            ),
            "auth": ServiceSignals(
                "auth", float(t), in_flight=auth[0], cpu_seconds_total=used["auth"]
            ),
        }
        if capped:
            states["render"] = dataclasses.replace(states["render"], cpu_capped=True)
        d = engine.tick(float(t), signals, states)
        states = applied(d)  # decided replicas are ready at once (unless ``starting``)
        r = d["render"]
        if starting:
            states["render"] = ServiceState("render", r.replicas, 3, r.cpu_per_replica_cores)
        out.append(r)
    return out


def test_under_share_a_service_held_at_its_decided_cpu_is_decided_as_under_limit() -> None:
    # Kubernetes pods of Guaranteed QoS keep requests = limits under share: render's replicas
    # cannot use idle CPU, so starting one into idle CPU (or one more than its cores fill)
    # would only thin the others' caps.  Its decisions are limit's, and say why; auth, whose
    # replicas are weighted, keeps share's.
    capped = _cpu_bound_backlog("share", 20, capped=True)
    limit = _cpu_bound_backlog("limit", 20)
    assert [d.replicas for d in capped] == [d.replicas for d in limit]
    assert [d.cpu_per_replica_cores for d in capped] == pytest.approx(
        [d.cpu_per_replica_cores for d in limit]
    )
    assert {d.replicas for d in capped} == {3}
    assert "decided as under limit" in " ".join(capped[-1].reasons)
    assert any(s.kind == "enforcement.capped" for s in capped[-1].explanation.steps)
    weighted = _cpu_bound_backlog("share", 20)
    assert weighted[-1].replicas == 4
    assert not any(s.kind == "enforcement.capped" for s in weighted[-1].explanation.steps)


def test_under_share_a_cpu_bound_backlog_adds_a_replica_into_idle_cpu() -> None:
    # Share: a starting replica holds a weight, not CPU, so once the replicas have been full
    # for a panic window (6 s from t=1, the first tick with a CPU rate: a cold start's
    # backlog has drained by then) the 4th replica (the KPA wants max_replicas) starts into
    # the node's idle CPU.  Under limit it would hold CPU taken from the serving three while
    # it starts: the cores alone decide.
    share = [d.replicas for d in _cpu_bound_backlog("share", 20)]
    assert share[:7] == [3] * 7
    assert share[7] == 4 and share[-1] == 4
    grown = _cpu_bound_backlog("share", 20)[7]
    assert "starts replicas into idle CPU (4 of the 4 it wants)" in " ".join(grown.reasons)
    assert {d.replicas for d in _cpu_bound_backlog("limit", 70)} == {3}


def test_under_share_a_backlog_that_outlasts_the_panic_window_adds_replicas_at_once() -> None:
    # 200 requests in the system, completed at 30 a second: the three ready replicas would
    # take 6.7 s to drain them, more than the panic window (6 s), so once that rate has been
    # measured over a second of being full (t=2; t=1 is the first tick with a CPU rate) the
    # 4th replica starts into idle CPU -- not at t=7, a whole window of full replicas later.
    # Replicas on their way do not shorten it.  Under limit the cores alone decide.
    decisions = _cpu_bound_backlog("share", 10, backlog=(200, 0, 30))
    share = [d.replicas for d in decisions]
    assert share[:2] == [3, 3] and share[2:] == [4] * 8
    assert (
        "starts replicas into idle CPU (4 of the 4 it wants): its ready replicas have been "
        "full for 1.0 s (it used 5.85 cores), with work in the system they take 6.7 s to "
        "drain at the rate they complete it (panic window 6 s)"
    ) in " ".join(decisions[2].reasons)
    assert {d.replicas for d in _cpu_bound_backlog("limit", 10, backlog=(200, 0, 30))} == {3}
    on_way = _cpu_bound_backlog(
        "share", 6, cpu=10, max_replicas=6, starting=1, backlog=(200, 0, 30)
    )
    assert [d.replicas for d in on_way] == [4, 4, 5, 5, 5, 5]


def test_under_share_a_backlog_that_drains_within_the_panic_window_waits_for_it() -> None:
    # 60 requests in the system, falling by 20 a second while 30 a second complete: a cold
    # start's backlog, drained well within the window.  The replicas stay full here (the
    # harness keeps their CPU use up), so the time rule alone adds the 4th, at t=7, as when
    # no completions are reported.
    share = [d.replicas for d in _cpu_bound_backlog("share", 10, backlog=(60, -20, 30))]
    assert share[:7] == [3] * 7 and share[7:] == [4] * 3
    assert [d.replicas for d in _cpu_bound_backlog("share", 10)] == share


def test_under_share_a_replica_still_starting_does_not_restart_the_full_window() -> None:
    # render has 4 replicas, one of them starting (it never becomes ready here); its 3 ready
    # ones are full.  The starting one is capacity on its way, not a reason to wait: after
    # a panic window of full ready replicas the 5th starts into the idle CPU (used 5.85 +
    # 3.15 idle of 10 fill 5 replicas of 2 cores) -- not one replica per start-up plus a
    # window.  Under limit the cores alone decide.
    def run(enforcement: str) -> list[Decision]:
        return _cpu_bound_backlog(enforcement, 12, cpu=10, max_replicas=6, starting=1)

    share = run("share")
    assert [d.replicas for d in share] == [4] * 7 + [5] * 5
    assert "starts replicas into idle CPU (5 of the 6 it wants)" in " ".join(share[7].reasons)
    assert all(d.replicas * d.cpu_per_replica_cores <= 10 + 1e-9 for d in share)
    assert {d.replicas for d in run("limit")} == {4}


def test_under_share_a_service_its_cores_hold_back_runs_one_replica_more() -> None:
    # auth asks for less: render is granted about 5.9 cores, which fill 3 replicas of 2; it
    # wants 4 (max_replicas).  The node's idle CPU this tick (8 - 5.85 - 1.7 = 0.45) fills
    # no replica, but under share its weight is its cores however many replicas share them,
    # so it runs the 4th: it takes nothing auth is entitled to, and lets render use what
    # auth leaves idle for moments -- once its ready replicas have been full for a panic
    # window (6 s), so a cold start's backlog, drained by then, adds none.  Under limit the
    # cores alone decide.
    share = _cpu_bound_backlog("share", 10, auth=(12, 1.7))
    replicas = [d.replicas for d in share]
    assert replicas[:6] == [3] * 6 and replicas[-1] == 4
    grown = share[replicas.index(4)]
    assert "one more than its cores fill at full size" in " ".join(grown.reasons)
    assert grown.replicas * grown.cpu_per_replica_cores <= 8.0
    assert {d.replicas for d in _cpu_bound_backlog("limit", 70, auth=(12, 1.7))} == {3}


def test_the_kpa_windows_record_the_mean_concurrency_between_snapshots() -> None:
    """Where the gateway integrates concurrency over time, the windows record its mean since
    the previous snapshot (as Knative's queue-proxy reports a mean), not the count at one
    instant; without the integral, the count now.  The surge rule reads the count now."""
    engine = Engine({"api": policy(max_replicas=8)}, BudgetConfig(cpu=8))
    plain = Engine({"api": policy(max_replicas=8)}, BudgetConfig(cpu=8))
    states: dict[str, ServiceState] = {}
    plain_states: dict[str, ServiceState] = {}
    area = 0.0
    for t in range(12):
        # 2 requests in the system on average over each second, sampled at a peak of 10
        area += 2.0
        signals = {
            "api": ServiceSignals("api", float(t), in_flight=10, concurrency_seconds_total=area)
        }
        d = engine.tick(float(t), signals, states)["api"]
        states = applied({"api": d})
        plain_signals = {"api": ServiceSignals("api", float(t), in_flight=10)}
        p = plain.tick(float(t), plain_signals, plain_states)["api"]
        plain_states = applied({"api": p})
    # The first snapshot has no mean yet (its count, 10); then 2 a second.
    assert d.inputs["panic"] == pytest.approx(2.0)
    assert p.inputs["panic"] == pytest.approx(10.0)
    assert d.inputs["stable"] == pytest.approx((10.0 + 2.0 * 11) / 12)
    assert p.inputs["stable"] == pytest.approx(10.0)
    # An integral that goes back (the source restarted) counts the snapshot's count once.
    signals = {"api": ServiceSignals("api", 12.0, in_flight=10, concurrency_seconds_total=1.0)}
    d = engine.tick(12.0, signals, states)["api"]
    assert d.inputs["panic"] == pytest.approx((2.0 * 5 + 10.0) / 6)


def test_a_bad_concurrency_integral_freezes_only_its_service() -> None:
    engine = Engine({"a": policy(), "b": policy()}, BudgetConfig(cpu=2))
    signals = {
        "a": ServiceSignals("a", 1.0, in_flight=5, concurrency_seconds_total=math.nan),
        "b": ServiceSignals("b", 1.0, in_flight=5, concurrency_seconds_total=3.0),
    }
    d = engine.tick(1.0, signals, {})
    assert d["a"].rule == "frozen: invalid signals"
    assert any("concurrency_seconds_total=nan" in r for r in d["a"].reasons)
    assert not d["b"].rule.startswith("frozen")
