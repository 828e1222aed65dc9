"""``platform: local`` inside ``sluice run``: the pool, its endpoints and the scaler loop.

:class:`LocalRunner` wires the pieces to one gateway :class:`~gateway.app.Runtime`:

* the :class:`~gateway.platforms.local.pool.LocalPool` starts every service's replicas (each in
  its own CPU cgroup; the parent cgroup capped at ``budget.cpu``; a replica's decided CPU is
  its cgroup weight under a quota of ``cpu.max`` with ``budget.enforcement: share``, its
  quota with ``limit``);
* ready replicas flow into the runtime's endpoint sets (``Runtime.apply_endpoints``), and a
  replica being retired is drained through ``Runtime.wait_drained`` before its SIGTERM;
* a service with no ready replica holds its requests in its admission queue (bounded, with
  its timeout) and wakes the loop at once; the first ready replica gets them;
* a :class:`~scaler.loop.ScalerLoop` (its engine wrapped in ``TracedEngine`` when tracing
  is on) ticks every ``interval_s``: the runtime's signals, with
  the replicas' measured cgroup CPU added, go to the engine; its decisions go to the
  :class:`~gateway.platforms.local.actuator.LocalActuator` (replicas and CPU per replica, in place);
* with ``budget.enforcement: limit`` and ``budget.lending`` a
  :class:`~gateway.platforms.local.lender.QuotaLender` lends the quota of services idle for
  ``budget.lend_after_idle_s`` to the busy ones between ticks: every service's admission
  tells it when the service becomes busy or idle (``Admission.watch_busy``), and the first
  request of an idle service takes its quota back before it is forwarded.

``stop()`` stops the loop, then every replica (no orphans) and removes the cgroups.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from typing import TYPE_CHECKING, Any

from gateway.admin.decisions import early_wakes
from gateway.platforms.local.discovery import LocalPlatform, local_platform
from gateway.platforms.local.lender import QuotaLender
from gateway.platforms.local.pool import LocalPool
from gateway.settings import Settings
from gateway.telemetry.scaler import TracedEngine
from scaler.engine import Engine
from scaler.loop import ScalerLoop, TickEngine
from scaler.signals import ServiceSignals

if TYPE_CHECKING:
    from opentelemetry.trace import Tracer

    from gateway.app import Runtime

log = logging.getLogger(__name__)


class LocalRunner:
    """Runs the local platform for one gateway process (start once, stop once)."""

    def __init__(
        self,
        runtime: Runtime,
        settings: Settings,
        interval_s: float = 1.0,
        tracer: Tracer | None = None,
    ) -> None:
        self.runtime = runtime
        self.platform: LocalPlatform = local_platform(settings, drain=runtime.wait_drained)
        self.engine = Engine(
            {name: s.scaling for name, s in settings.services.items()}, settings.budget
        )
        ticks: TickEngine = self.engine if tracer is None else TracedEngine(self.engine, tracer)
        self.loop = ScalerLoop(
            ticks,
            self.signals,
            self.platform.actuator,
            interval_s=interval_s,
            early_tick_gap_s=settings.budget.early_tick_gap_s,
        )
        self.loop.on_decisions = early_wakes(runtime, self.loop, settings.budget.early_ticks)
        self._settings = settings
        self.lender: QuotaLender | None = None
        """Lends idle services' quotas between ticks (limit enforcement with lending)."""
        self._tasks: list[asyncio.Task[None]] = []

    def __repr__(self) -> str:
        return f"LocalRunner({self.platform.pool!r}, {self.loop!r})"

    def signals(self) -> dict[str, ServiceSignals]:
        """The gateway's live signals plus the replicas' measured CPU (cgroup counters)."""
        return self.platform.actuator.add_cpu_signals(self.runtime.signals())

    async def start(self) -> None:
        self.runtime.scaler = self.loop
        # Scale from zero: a service without a ready replica holds its requests in its
        # admission queue and wakes the scaler at once (not at the next tick).
        for name, service in self.runtime.services.items():
            service.admission.hold_at_zero(functools.partial(self._wake_for, name))
        await self.platform.pool.start()
        self.lender = start_lending(self.runtime, self.platform.pool, self._settings)
        self._tasks = [
            asyncio.create_task(self._feed_endpoints(), name="local endpoints"),
            asyncio.create_task(self.loop.run(), name="scaler loop"),
        ]

    def lending_report(self) -> dict[str, Any]:
        """What ``GET /api/decisions`` shows in its budget block about lending."""
        return lending_report(self.platform.pool, self.lender, self._settings)

    def quotas_in_force(self) -> dict[str, float]:
        """Per service: the quota per replica in force now (decided, or the lender's overlay)."""
        return quotas_in_force(self.platform.pool)

    def _wake_for(self, service: str) -> None:
        """A request is held for ``service`` (no ready replica): tick now, unless the scaler
        has already decided to run a replica (it is starting; more ticks would not help)."""
        last = self.loop.last.get(service)
        if last is None or last.replicas == 0:
            self.loop.wake()

    async def _feed_endpoints(self) -> None:
        async for update in self.platform.endpoints.updates():
            try:
                self.runtime.apply_endpoints(update)
            except Exception:
                log.exception("cannot apply endpoints of %s", update.service)

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        if self.lender is not None:
            stop_lending(self.runtime, self.lender)
            self.lender = None
        # The data plane has stopped taking requests: replicas stop without waiting to drain.
        await self.platform.pool.close(drain=False)


def start_lending(runtime: Runtime, pool: LocalPool, settings: Settings) -> QuotaLender | None:
    """With ``budget.enforcement: limit``, ``budget.lending`` and shared arbitration (and
    cgroups in use): a :class:`QuotaLender` on the started ``pool``, told by every service's
    admission when the service becomes busy or idle.  None when lending does not apply
    (``arbitration: independent`` is the one-autoscaler-per-service baseline: nothing lent)."""
    budget = settings.budget
    if (
        budget.enforcement != "limit"
        or not budget.lending
        or budget.arbitration != "shared"
        or not pool.cpu_limits_applied
    ):
        return None
    lender = QuotaLender(
        pool,
        {name: s.scaling for name, s in settings.services.items()},
        budget.lend_after_idle_s,
        asyncio.get_running_loop(),
    )
    lender.start()
    for name, service in runtime.services.items():
        if name in lender.policies:
            admission = service.admission
            admission.watch_busy(functools.partial(lender.set_busy, name))
            lender.set_busy(name, admission.busy)
    log.info("lending idle CPU between ticks after %gs idle", budget.lend_after_idle_s)
    return lender


def stop_lending(runtime: Runtime, lender: QuotaLender) -> None:
    """Unhook the admissions and put every quota back to the decided CPU."""
    for name in lender.policies:
        service = runtime.services.get(name)
        if service is not None:
            service.admission.watch_busy(None)
    lender.stop()


def quotas_in_force(pool: LocalPool) -> dict[str, float]:
    """Per service whose CPU is enforced: the quota per replica in force now (cores)."""
    out = {}
    for name, status in pool.statuses().items():
        if status.cpu_applied and status.quota_in_force_cores is not None:
            out[name] = status.quota_in_force_cores
    return out


def lending_report(
    pool: LocalPool, lender: QuotaLender | None, settings: Settings
) -> dict[str, Any]:
    """The lending part of ``GET /api/decisions``' budget block: whether CPU is lent between
    ticks, the services marked idle, per service the cores lent (negative) or borrowed
    (positive) over all its replicas, and the quota per replica in force."""
    return {
        "lending": lender is not None,
        "lend_after_idle_s": settings.budget.lend_after_idle_s,
        "idle": sorted(lender.idle) if lender is not None else [],
        "lent_cores": lender.lent_cores() if lender is not None else {},
        "quota_in_force_cores": quotas_in_force(pool),
    }
