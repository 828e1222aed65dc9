"""Scaler tick spans, added from outside the pure scaler: ``TracedEngine`` wraps ``Engine.tick``.

One root span ``sluice.scaler.tick`` per tick that changed a decision (or failed), with a child
``sluice.scaler.decision`` for each service whose decision changed since the previous tick
(replicas, CPU per replica or rule; every service on the first tick).  A tick that changed
nothing records no span, so an idle scaler does not push request traces out of the buffer.  The child carries what a person needs to trust the decision:

* ``sluice.service``, ``sluice.decision.rule``, ``sluice.decision.frozen``;
* ``sluice.decision.replicas`` / ``.previous_replicas``, ``sluice.decision.cpu_per_replica_cores`` /
  ``.previous_cpu_per_replica_cores``, ``sluice.decision.allocated_cores``;
* ``sluice.decision.input.<name>``: every numeric input the engine reported (concurrency,
  demand_cores, fair_share_cores, ...);
* ``sluice.decision.clamps``: the reason line of each clamp (min/max replicas, rate limits,
  the budget, hysteresis, ...), and ``sluice.decision.clamp_bounds`` their bounds' names; ``sluice.decision.reasons``: all reason lines;
* ``sluice.cpu.lent_cores``, ``.borrowed_cores``, ``.reclaimed_cores``, ``.gave_back_cores``,
  ``.taken_for_floors_cores`` (0 when none), from the explanation's flows.

Everything is read from the decision's explanation fields (``scaler.explanation``), never
parsed back from its text.

The scaler never imports ``gateway``; the composition root hands the scaler loop a
``TracedEngine(engine, tracer)`` wherever it would hand it the engine.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, Protocol

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanKind, Tracer

from scaler.decision import Decision, ServiceState
from scaler.explanation import FLOW_KINDS, render_part
from scaler.signals import ServiceSignals

_EMPTY = Context()


class TickFunction(Protocol):
    def tick(
        self,
        now: float,
        signals: Mapping[str, ServiceSignals],
        states: Mapping[str, ServiceState],
    ) -> dict[str, Decision]: ...


def decision_attributes(
    decision: Decision, previous: Decision | None
) -> dict[str, str | bool | int | float | list[str]]:
    """The attributes of one ``sluice.scaler.decision`` span."""
    explanation = decision.explanation
    attrs: dict[str, str | bool | int | float | list[str]] = {
        "sluice.service": decision.service,
        "sluice.decision.rule": decision.rule,
        "sluice.decision.frozen": decision.frozen,
        "sluice.decision.replicas": decision.replicas,
        "sluice.decision.cpu_per_replica_cores": decision.cpu_per_replica_cores,
        "sluice.decision.allocated_cores": decision.allocated_cores,
        "sluice.decision.reasons": list(decision.reasons),
        "sluice.decision.clamps": [render_part(c) for c in explanation.clamps],
        "sluice.decision.clamp_bounds": [c.name for c in explanation.clamps],
    }
    if previous is not None:
        attrs["sluice.decision.previous_replicas"] = previous.replicas
        attrs["sluice.decision.previous_cpu_per_replica_cores"] = previous.cpu_per_replica_cores
        attrs["sluice.decision.previous_rule"] = previous.rule
    for name, value in explanation.inputs.items():
        attrs[f"sluice.decision.input.{name}"] = float(value)
    for kind in FLOW_KINDS:
        attrs[f"sluice.cpu.{kind}_cores"] = explanation.flow_cores(kind)
    return attrs


def changed(decision: Decision, previous: Decision | None) -> bool:
    return (
        previous is None
        or decision.replicas != previous.replicas
        or abs(decision.cpu_per_replica_cores - previous.cpu_per_replica_cores) > 1e-9
        or decision.rule != previous.rule
    )


class TracedEngine:
    """Anything with ``tick(now, signals, states)``, plus a span per tick (see module doc)."""

    def __init__(self, engine: TickFunction, tracer: Tracer) -> None:
        self.engine = engine
        self._tracer = tracer
        self._last: dict[str, Decision] = {}

    def __repr__(self) -> str:
        return f"TracedEngine({self.engine!r})"

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)

    def _tick_span(self, now: float, services: int, start_ns: int) -> Span:
        return self._tracer.start_span(
            "sluice.scaler.tick",
            context=_EMPTY,
            kind=SpanKind.INTERNAL,
            attributes={"sluice.scaler.now_s": now, "sluice.scaler.services": services},
            start_time=start_ns,
        )

    def tick(
        self,
        now: float,
        signals: Mapping[str, ServiceSignals],
        states: Mapping[str, ServiceState],
    ) -> dict[str, Decision]:
        start_ns = time.time_ns()
        try:
            decisions = self.engine.tick(now, signals, states)
        except BaseException as e:
            span = self._tick_span(now, len(states), start_ns)
            span.record_exception(e)
            span.set_status(trace.Status(trace.StatusCode.ERROR, type(e).__name__))
            span.end()
            raise
        moved = [d for name, d in decisions.items() if changed(d, self._last.get(name))]
        if moved:  # a tick that changed nothing leaves no trace (the buffer keeps requests)
            span = self._tick_span(now, len(decisions), start_ns)
            span.set_attribute("sluice.scaler.changed", len(moved))
            span.set_attribute("sluice.scaler.changed_services", [d.service for d in moved])
            if span.is_recording():
                context = trace.set_span_in_context(span, _EMPTY)
                for decision in moved:
                    child = self._tracer.start_span(
                        "sluice.scaler.decision",
                        context=context,
                        kind=SpanKind.INTERNAL,
                        attributes=decision_attributes(decision, self._last.get(decision.service)),
                    )
                    child.end()
            span.end()
        self._last = dict(decisions)
        return decisions
