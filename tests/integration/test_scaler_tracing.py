"""Scaler tick spans from the real scaler loop, exported over OTLP/HTTP."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from gateway.settings import TracesConfig
from gateway.telemetry.provider import Telemetry
from gateway.telemetry.scaler import TracedEngine
from scaler.actuators.none import RecommendOnlyActuator
from scaler.engine import Engine
from scaler.loop import ScalerLoop
from scaler.policy import BudgetConfig, ScalingPolicy
from scaler.signals import ServiceSignals
from tests.support.otlp_receiver import otlp_receiver


def policy(**kw: object) -> ScalingPolicy:
    base: dict[str, object] = {"target": 10, "cpu": {"min": 0.1, "max": 1.0, "request": 0.25}}
    base.update(kw)
    return ScalingPolicy.model_validate(base)


def test_the_scaler_loop_exports_a_span_per_tick_that_changed_a_decision() -> None:
    now = [0.0]

    def tick_clock() -> float:
        return now[0]

    async def no_wait(event: asyncio.Event, timeout_s: float) -> None:
        """Instead of sleeping: jump the clock."""
        now[0] += timeout_s

    def signals() -> Mapping[str, ServiceSignals]:
        return {
            "api": ServiceSignals("api", now[0], in_flight=100),
            "batch": ServiceSignals("batch", now[0]),
        }

    with otlp_receiver() as receiver:
        config = TracesConfig.model_validate(
            {"enabled": True, "exporter": "otlp_http", "endpoint": receiver.endpoint}
        )
        telemetry = Telemetry.start(config, env={})
        try:
            assert telemetry.tracer is not None
            engine = Engine({"api": policy(max_replicas=8), "batch": policy()}, BudgetConfig(cpu=2))
            loop = ScalerLoop(
                TracedEngine(engine, telemetry.tracer),
                signals,
                RecommendOnlyActuator(),
                clock=tick_clock,
                wait=no_wait,
            )
            asyncio.run(loop.run(max_ticks=4))
            telemetry.force_flush()
            # The ticks that changed a decision (what the loop keeps in ``recent``).
            changing = sorted({d.at for d in loop.recent})
            spans = receiver.wait_for(
                lambda s: sum(x.name == "sluice.scaler.tick" for x in s) >= len(changing)
            )
        finally:
            telemetry.shutdown()
    ticks = sorted((s for s in spans if s.name == "sluice.scaler.tick"), key=lambda s: s.start_ns)
    assert loop.ticks == 4
    assert 1 <= len(changing) < 4  # steady load: the later ticks change nothing, leave no span
    assert [t.attributes["sluice.scaler.now_s"] for t in ticks] == changing
    assert ticks[0].resource["service.name"] == "sluice"
    decisions = [s for s in spans if s.name == "sluice.scaler.decision"]
    first = [d for d in decisions if d.parent_span_id == ticks[0].span_id]
    assert {d.attributes["sluice.service"] for d in first} == {"api", "batch"}
    api = next(d for d in first if d.attributes["sluice.service"] == "api")
    logged = next(r for r in loop.recent if r.service == "api")  # what the loop logged
    assert api.attributes["sluice.decision.replicas"] == logged.replicas
    assert api.attributes["sluice.decision.cpu_per_replica_cores"] == logged.cpu_per_replica_cores
    assert api.attributes["sluice.decision.rule"] == logged.rule
    assert list(api.attributes["sluice.decision.reasons"]) == list(logged.reasons)
    assert api.attributes["sluice.decision.input.concurrency"] == 100.0
    assert api.attributes["sluice.cpu.borrowed_cores"] > 0
    batch = next(d for d in first if d.attributes["sluice.service"] == "batch")
    assert batch.attributes["sluice.cpu.lent_cores"] > 0
    for tick in ticks:
        children = [d for d in decisions if d.parent_span_id == tick.span_id]
        assert len(children) == tick.attributes["sluice.scaler.changed"]
