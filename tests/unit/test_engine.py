"""Engine.tick end to end: horizontal recommendation + budget arbitration, with a stepped clock."""

from __future__ import annotations

import pytest

from scaler.decision import Decision, ServiceState
from scaler.engine import Engine
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
