"""``platform: local`` inside ``sluice run``: the pool, its endpoints and the scaler loop.

:class:`LocalRunner` wires the pieces to one gateway :class:`~gateway.app.Runtime`:

* the :class:`~scaler.localpool.pool.LocalPool` starts every service's replicas (each in
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
  :class:`~scaler.actuators.local.LocalActuator` (replicas and CPU per replica, in place).

``stop()`` stops the loop, then every replica (no orphans) and removes the cgroups.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from typing import TYPE_CHECKING

from gateway.decisions import early_wakes
from gateway.discovery.local import LocalPlatform, local_platform
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
        self._tasks = [
            asyncio.create_task(self._feed_endpoints(), name="local endpoints"),
            asyncio.create_task(self.loop.run(), name="scaler loop"),
        ]

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
        # The data plane has stopped taking requests: replicas stop without waiting to drain.
        await self.platform.pool.close(drain=False)
