"""Scaler tick spans: which decisions get a child span, and what the child says."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gateway.settings import TracesConfig
from gateway.telemetry.provider import Telemetry
from gateway.telemetry.scaler import TracedEngine, changed, decision_attributes
from scaler.decision import Decision, ServiceState
from scaler.engine import Engine
from scaler.explanation import Clamp, Explanation, Flow
from scaler.policy import BudgetConfig, ScalingPolicy
from scaler.signals import ServiceSignals


def policy(**kw: object) -> ScalingPolicy:
    base: dict[str, object] = {"target": 10, "cpu": {"min": 0.1, "max": 1.0, "request": 0.25}}
    base.update(kw)
    return ScalingPolicy.model_validate(base)


@pytest.fixture
def telemetry() -> Iterator[Telemetry]:
    t = Telemetry.start(TracesConfig(enabled=True), env={})
    yield t
    t.shutdown()


def applied(decisions: dict[str, Decision]) -> dict[str, ServiceState]:
    return {
        n: ServiceState(n, d.replicas, d.replicas, d.cpu_per_replica_cores)
        for n, d in decisions.items()
    }


def test_a_reclaim_is_reported_on_the_reclaiming_service(telemetry: Telemetry) -> None:
    assert telemetry.tracer is not None
    engine = TracedEngine(
        Engine(
            {"long": policy(max_replicas=8), "short": policy(min_replicas=0)}, BudgetConfig(cpu=2)
        ),
        telemetry.tracer,
    )
    states: dict[str, ServiceState] = {}
    for t in range(10):
        d = engine.tick(
            float(t),
            {"long": ServiceSignals("long", t, in_flight=200), "short": ServiceSignals("short", t)},
            states,
        )
        states = applied(d)
    d = engine.tick(
        10.0,
        {
            "long": ServiceSignals("long", 10, in_flight=200),
            "short": ServiceSignals("short", 10, in_flight=100),
        },
        states,
    )
    [tick] = telemetry.buffer.query(limit=1)
    assert tick["root"] == "sluice.scaler.tick" and tick["kind"] == "scaler"
    children = {s["attributes"]["sluice.service"]: s["attributes"] for s in tick["spans"][1:]}
    assert set(children) == {"long", "short"}
    short = children["short"]
    assert short["sluice.cpu.reclaimed_cores"] > 0
    assert short["sluice.decision.replicas"] == d["short"].replicas
    assert short["sluice.decision.previous_replicas"] == 0
    assert children["long"]["sluice.cpu.gave_back_cores"] == pytest.approx(
        short["sluice.cpu.reclaimed_cores"], abs=0.011
    )
    assert tick["services"] == ["long", "short"]


def test_only_changed_decisions_get_children(telemetry: Telemetry) -> None:
    assert telemetry.tracer is not None
    engine = TracedEngine(
        Engine({"api": policy(), "web": policy()}, BudgetConfig(cpu=2)), telemetry.tracer
    )
    states: dict[str, ServiceState] = {}
    for t in range(3):
        signals = {n: ServiceSignals(n, float(t)) for n in ("api", "web")}
        states = applied(engine.tick(float(t), signals, states))
    newest_first = telemetry.buffer.query(kind="scaler", limit=10)
    # The first tick decides both services (a tick span and two children); the two ticks
    # after it change nothing and record no span at all.
    assert [t["span_count"] for t in newest_first] == [3]
    assert newest_first[0]["spans"][0]["attributes"]["sluice.scaler.changed"] == 2
    assert engine.policies.keys() == {"api", "web"}  # the wrapper passes attributes through


def test_changed_and_attributes_of_a_decision() -> None:
    a = Decision(
        "api",
        1.0,
        2,
        0.5,
        1.0,
        "stable",
        explanation=Explanation(
            "stable",
            {"concurrency": 3.0},
            (Flow("lent", 0.25, ("web",)), Clamp("cores", 1.1, 1.0, "hysteresis")),
        ),
    )
    assert changed(a, None)
    assert not changed(a, a)
    b = Decision("api", 2.0, 3, 0.5, 1.5, "stable")
    assert changed(b, a)
    attrs = decision_attributes(a, b)
    assert attrs["sluice.decision.input.concurrency"] == 3.0
    assert attrs["sluice.cpu.lent_cores"] == 0.25
    assert attrs["sluice.cpu.reclaimed_cores"] == 0.0
    assert attrs["sluice.decision.clamp_bounds"] == ["hysteresis"]
    assert attrs["sluice.decision.reasons"] == [
        "lends 0.25 cores of its fair share to: web",
        "hysteresis: keeping 1.00 cores (ideal 1.10 is within the band)",
    ]
    assert attrs["sluice.decision.previous_replicas"] == 3
