"""A data-plane worker's side of its channel: applies what the main process sends to the
worker's own :class:`~gateway.runtime.Runtime` and reports its counters back (every
``REPORT_S`` when they changed, at once after an update or on :class:`~.ipc.Collect`)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import os
from collections.abc import Callable

from gateway.dataplane.app_metrics import AppState
from gateway.dataplane.shared_admission import SharedLimits
from gateway.dataplane.updates import CertificatesUpdate, EndpointUpdate, RoutesUpdate
from gateway.runtime import Runtime
from gateway.settings import Settings
from gateway.workers.ipc import (
    AdmissionState,
    Channel,
    Collect,
    Event,
    Hooks,
    Report,
    Stop,
    Update,
)

log = logging.getLogger(__name__)

REPORT_S = 0.05
"""How often a worker reports counters that changed."""
HEARTBEAT_S = 1.0
"""How often it reports when nothing changed."""


class WorkerLink:
    """Applies updates to ``runtime`` (``apply_settings`` does a reload's whole work) and
    reports the runtime's counters; :meth:`run` returns the drain time of the Stop received
    (or ``shutdown.drain_s`` when the main process went away)."""

    def __init__(
        self,
        channel: Channel,
        runtime: Runtime,
        apply_settings: Callable[[Settings], None],
        unmatched: Callable[[], int],
        *,
        applied: int,
        hooks: Hooks,
        shared: SharedLimits | None = None,
    ) -> None:
        self.channel = channel
        self.runtime = runtime
        self.apply_settings = apply_settings
        self.unmatched = unmatched
        self.applied = applied
        self.hooks = hooks
        self.shared = shared
        """Admission shared with the other workers (limits hold for the whole gateway)."""
        self._unshared: set[str] = set()
        self._sent: dict[str, tuple[int, ...]] = {}
        self._reporter: asyncio.TimerHandle | None = None
        self._last_report_s = -math.inf
        self._reported_busy: set[tuple[str, str]] = set()
        """Endpoints (service, address) this worker last reported busy to the main process."""
        self._quiet_since: dict[tuple[str, str], float] = {}
        self._quiet_armed: set[tuple[str, str]] = set()
        self.apply_hooks()

    def __repr__(self) -> str:
        return f"WorkerLink(pid={os.getpid()}, applied={self.applied})"

    # -- main -> worker -----------------------------------------------------------------

    def apply(
        self, change: Settings | RoutesUpdate | EndpointUpdate | CertificatesUpdate | Hooks
    ) -> None:
        if isinstance(change, Hooks):
            self.hooks = change
        elif isinstance(change, CertificatesUpdate):
            self.runtime.apply_certificates(change)
        elif isinstance(change, RoutesUpdate):
            self.runtime.apply_routes(change)
        elif isinstance(change, EndpointUpdate):
            self.runtime.apply_endpoints(change)
        else:
            self.apply_settings(change)
        self.apply_hooks()  # new services get theirs

    def apply_hooks(self) -> None:
        hooks = self.hooks
        shared = self.shared
        for name, service in self.runtime.services.items():
            admission = service.admission
            if shared is not None and admission.shared is None and name not in self._unshared:
                index = shared.index_of(name)
                if index is None:
                    self._unshared.add(name)
                    log.warning("%s: no shared admission row left: limits apply per worker", name)
                else:
                    admission.share(shared.row(index))
            level = hooks.wake_levels.get(name)
            if level is None:
                admission.arm_early_wake(math.inf, None)
            elif admission.early_wake_at != level or admission.on_early_wake is None:
                admission.arm_early_wake(level, functools.partial(self._event, "wake", name))
            held = name in hooks.hold
            if held != admission.hold_when_empty:
                admission.hold_at_zero(
                    functools.partial(self._event, "hold", name) if held else None
                )
            if name in hooks.busy:
                if admission.on_busy_change is None:
                    admission.watch_busy(functools.partial(self._busy, name))
                    self._busy(name, admission.busy)
            elif admission.on_busy_change is not None:
                admission.watch_busy(None)
            endpoints = service.endpoints
            if name in hooks.replica_busy:
                if endpoints.on_busy is None:
                    endpoints.on_busy = functools.partial(self._replica_busy, name)
                    for ep in endpoints.endpoints:
                        if ep.in_flight:
                            self._replica_busy(name, ep.address, True)
            elif endpoints.on_busy is not None:
                endpoints.on_busy = None
                for key in [k for k in self._reported_busy if k[0] == name]:
                    self._reported_busy.discard(key)
                    self._quiet_since.pop(key, None)

    def wake(self) -> None:
        """Another worker granted slots to this one's queues (its wake pipe was written)."""
        for service in self.runtime.services.values():
            service.admission.wake_shared()

    def _event(self, kind: str, service: str) -> None:
        self.channel.send(Event(kind, service))

    def _busy(self, service: str, busy: bool) -> None:
        self.channel.send(Event("busy" if busy else "idle", service))

    def _replica_busy(self, service: str, address: str, busy: bool, held: bool = False) -> None:
        """An endpoint's in-flight count in this worker left 0 (``busy``) or came back to it.

        Relayed only around gaps the lender acts on: ``idle`` once the endpoint has stayed
        idle here for ``budget.lend_after_idle_s`` (the main process then lends at once), and
        ``busy`` only after such an ``idle``, so a replica whose gaps are shorter sends
        nothing per request.  ``held`` is for the main process's side of the hook."""
        key = (service, address)
        if busy:
            self._quiet_since.pop(key, None)
            if key not in self._reported_busy:
                self._reported_busy.add(key)
                self.channel.send(Event("busy", service, address))
            return
        loop = asyncio.get_running_loop()
        self._quiet_since[key] = loop.time()
        if key not in self._quiet_armed:
            self._quiet_armed.add(key)
            loop.call_later(self.runtime.settings.budget.lend_after_idle_s, self._quiet, key)

    def _quiet(self, key: tuple[str, str]) -> None:
        """The hold may be over for ``key``: report it idle if it stayed idle all along."""
        self._quiet_armed.discard(key)
        since = self._quiet_since.get(key)
        if since is None:
            return
        loop = asyncio.get_running_loop()
        left_s = since + self.runtime.settings.budget.lend_after_idle_s - loop.time()
        if left_s > 1e-9:
            self._quiet_armed.add(key)
            loop.call_later(left_s, self._quiet, key)
            return
        del self._quiet_since[key]
        if key in self._reported_busy:
            self._reported_busy.discard(key)
            self.channel.send(Event("idle", key[0], key[1]))

    async def run(self) -> float:
        loop = asyncio.get_running_loop()
        self._reporter = loop.call_later(REPORT_S, self._tick)
        try:
            while True:
                try:
                    message = await self.channel.receive()
                except EOFError:
                    log.warning("the main process is gone: stopping")
                    return self.runtime.settings.shutdown.drain_s
                if isinstance(message, Update):
                    try:
                        self.apply(message.change)
                    except Exception:
                        log.exception("cannot apply %s", type(message.change).__name__)
                    self.applied = message.seq
                    self.report(full=True)
                elif isinstance(message, Collect):
                    self.report(token=message.token)
                elif isinstance(message, Stop):
                    return message.drain_s
        finally:
            if self._reporter is not None:
                self._reporter.cancel()

    # -- worker -> main -----------------------------------------------------------------

    def _tick(self) -> None:
        loop = asyncio.get_running_loop()
        self._reporter = loop.call_later(REPORT_S, self._tick)
        with contextlib.suppress(ConnectionError):
            self.report(heartbeat=loop.time() - self._last_report_s >= HEARTBEAT_S)

    def report(self, token: int = 0, full: bool = False, heartbeat: bool = True) -> None:
        """Send the counters of the services that changed since the last report (all with
        ``full``); nothing when none did, unless ``token`` or ``heartbeat``."""
        stats = {}
        admission = {}
        app: dict[str, AppState] = {}
        in_flight: dict[tuple[str, str], int] = {}
        for name, service in self.runtime.services.items():
            s = service.stats
            a = service.admission
            key = (
                s.arrivals_total,
                s.completions_total,
                s.in_flight,
                s.upgraded,
                a.queued,
                sum(a.rejected.values()),
                service.retry_budget.started_total + service.retry_budget.denied_total,
                service.outlier.ejections_total,
            )
            for ep in service.endpoints.endpoints:
                if ep.in_flight:
                    in_flight[(name, ep.address)] = ep.in_flight
            if full or self._sent.get(name) != key:
                self._sent[name] = key
                stats[name] = s.state()
                admission[name] = AdmissionState(
                    a.in_use,
                    a.queued,
                    dict(a.rejected),
                    list(a.wait_counts),
                    a.wait_sum_s,
                    service.retry_budget.started_total,
                    service.retry_budget.denied_total,
                    service.outlier.ejections_total,
                )
                if service.app_headers is not None:
                    app[name] = service.app_headers.state()
        if not (stats or token or full or heartbeat):
            return
        self._last_report_s = asyncio.get_running_loop().time()
        self.channel.send(
            Report(self.applied, stats, admission, in_flight, self.unmatched(), token, app)
        )
