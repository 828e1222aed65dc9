"""Scaling decisions made visible: ``GET /api/decisions`` and the recommend-only scaler.

* :func:`decision_json` — one :class:`~scaler.decision.Decision` as JSON (replicas, CPU per
  replica, budget share, the rule that fired, the reasons, inputs and the explanation as
  data: steps, clamps, flows), never with NaN or infinity;
* :func:`decisions_route` — ``GET /api/decisions[?service=NAME][&limit=N]``: the scaler
  loop's recent decisions (a bounded ring of those that changed something), newest first,
  plus the latest decision of every service and the budget (with, on the local platform,
  what is lent between ticks: :class:`LendingReport`);
* :class:`RecommendRunner` — ``platform: static``: a :class:`~scaler.loop.ScalerLoop` over
  the gateway's signals with the recommend-only actuator.  Decisions are computed, logged
  (one line per service whose decision changed, with its reason) and exposed; nothing is
  applied.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gateway.settings import Settings
from gateway.telemetry.scaler import TracedEngine
from scaler.actuators.none import RecommendOnlyActuator
from scaler.decision import Decision, ServiceState
from scaler.engine import Engine
from scaler.loop import ScalerLoop, TickEngine

if TYPE_CHECKING:
    from opentelemetry.trace import Tracer

    from gateway.app import Runtime

DEFAULT_LIMIT = 50


@runtime_checkable
class LendingReport(Protocol):
    """A platform runner that can say what CPU is in force and lent between ticks
    (``LocalRunner``)."""

    def lending_report(self) -> dict[str, Any]:
        """``{"lending": bool, "lend_after_idle_s", "idle": [...], "lent_cores": {...},
        "quota_in_force_cores": {...}}`` (per replica; lent: negative = lent out)."""
        ...

    def quotas_in_force(self) -> dict[str, float]:
        """Per service: the CPU quota per replica written to its cgroups now (cores)."""
        ...


def decision_json(d: Decision) -> dict[str, Any]:
    """One decision as JSON: the figures, ``reasons`` (text, for people) and ``explanation``
    (the same as data: rule, inputs, steps, clamps, flows).  No NaN or infinity: JSON has
    none, so a non-finite number is ``null``."""
    explanation = d.explanation.as_json()
    out: dict[str, Any] = finite_json(
        {
            "service": d.service,
            "at": d.at,
            "replicas": d.replicas,
            "cpu_per_replica_cores": d.cpu_per_replica_cores,
            "allocated_cores": d.allocated_cores,
            "rule": d.rule,
            "frozen": d.frozen,
            "wake_concurrency": d.wake_concurrency,
            "reasons": list(d.reasons),
            "inputs": explanation["inputs"],
            "explanation": explanation,
        }
    )
    return out


def finite_json(value: Any) -> Any:
    """``value`` with every float that is not finite replaced by ``None`` (recursively)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_json(v) for v in value]
    return value


def decisions_route(runtime: Runtime) -> Route:
    """``GET /api/decisions``: 404 when this gateway runs no scaler loop."""

    async def decisions(request: Request) -> Response:
        loop = runtime.scaler
        if loop is None:
            return JSONResponse({"error": "no scaler runs in this gateway"}, status_code=404)
        service = request.query_params.get("service")
        raw_limit = request.query_params.get("limit", str(DEFAULT_LIMIT))
        if not raw_limit.isdigit() or int(raw_limit) < 1:
            return JSONResponse(
                {"error": f"limit must be a whole number >= 1, got {raw_limit!r}"},
                status_code=400,
            )
        if service is not None and service not in runtime.services:
            return JSONResponse({"error": f"no service named {service!r}"}, status_code=404)
        recent = [d for d in reversed(loop.recent) if service is None or d.service == service][
            : int(raw_limit)
        ]
        latest = {
            name: decision_json(d)
            for name, d in sorted(loop.last.items())
            if service is None or name == service
        }
        budget = runtime.settings.budget
        platform = runtime.platform
        lending: dict[str, Any] = (
            platform.lending_report() if isinstance(platform, LendingReport) else {"lending": False}
        )
        return JSONResponse(
            finite_json(
                {
                    "at": runtime.now(),
                    "platform": runtime.settings.platform,
                    "applied": runtime.settings.platform != "static",
                    "ticks": loop.ticks,
                    "early_ticks": loop.early_ticks,
                    "budget": {
                        "cpu": budget.cpu,
                        "arbitration": budget.arbitration,
                        "enforcement": budget.enforcement,
                        "allocated_cores": sum(d.allocated_cores for d in loop.last.values()),
                        **lending,
                    },
                    "latest": latest,
                    "recent": [decision_json(d) for d in recent],
                }
            )
        )

    return Route("/api/decisions", decisions)


def early_wakes(
    runtime: Runtime, loop: ScalerLoop, enabled: bool
) -> Callable[[Mapping[str, Decision]], None]:
    """The loop's ``on_decisions`` hook: arm every service's admission with its decision's
    wake level, so the data plane ticks the loop early when a burst reaches it
    (``budget.early_ticks``; disabled: every level is disarmed)."""

    def arm(decisions: Mapping[str, Decision]) -> None:
        services = runtime.services
        for name, decision in decisions.items():
            service = services.get(name)
            if service is not None:
                level = decision.wake_concurrency if enabled else math.inf
                service.admission.arm_early_wake(level, loop.wake)

    return arm


class RecommendRunner:
    """``platform: static``: decisions computed every ``interval_s``, logged and exposed only."""

    def __init__(
        self,
        runtime: Runtime,
        settings: Settings,
        interval_s: float = 1.0,
        tracer: Tracer | None = None,
    ) -> None:
        self.runtime = runtime
        initial = {
            name: ServiceState(
                service=name,
                replicas=len(s.endpoints),
                ready_replicas=len(s.endpoints),
                cpu_per_replica_cores=s.scaling.cpu.request or s.scaling.cpu.min,
            )
            for name, s in settings.services.items()
        }
        self.actuator = RecommendOnlyActuator(initial)
        self.engine = Engine(
            {name: s.scaling for name, s in settings.services.items()}, settings.budget
        )
        ticks: TickEngine = self.engine if tracer is None else TracedEngine(self.engine, tracer)
        self.loop = ScalerLoop(
            ticks,
            runtime.signals,
            self.actuator,
            interval_s=interval_s,
            early_tick_gap_s=settings.budget.early_tick_gap_s,
        )
        self.loop.on_decisions = early_wakes(runtime, self.loop, settings.budget.early_ticks)
        self._task: asyncio.Task[None] | None = None

    def __repr__(self) -> str:
        return f"RecommendRunner({self.loop!r})"

    async def start(self) -> None:
        self.runtime.scaler = self.loop
        self._task = asyncio.create_task(self.loop.run(), name="scaler loop (recommend-only)")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
