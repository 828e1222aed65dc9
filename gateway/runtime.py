"""The state one gateway process shares: routes, services, readiness, the scaler loop, the platform.

The data plane reads routes and services per request; platforms hand it whole endpoint and
route sets (:meth:`Runtime.apply_endpoints`, :meth:`Runtime.apply_routes`) and wait for a
removed endpoint to drain (:meth:`Runtime.wait_drained`); hot reload swaps the config in
one synchronous step (:meth:`Runtime.apply_settings`); the admin plane reads it all.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Protocol

from gateway.dataplane.endpoints import Endpoint, EndpointState
from gateway.dataplane.outlier import HealthChecker
from gateway.dataplane.routing import RouteTable
from gateway.dataplane.service import Service
from gateway.dataplane.updates import (
    CertificatesUpdate,
    EndpointUpdate,
    RoutesUpdate,
    endpoints_from_settings,
    routes_from_settings,
)
from gateway.settings import ServiceConfig, Settings
from scaler.decision import Decision
from scaler.loop import ScalerLoop
from scaler.policy import BudgetCpu
from scaler.signals import ServiceSignals

if TYPE_CHECKING:
    from gateway.platforms import Platform

log = logging.getLogger(__name__)

DRAIN_POLL_S = 0.05


class WorkerView(Protocol):
    """What the main process knows of its data-plane workers (``workers: N``,
    ``gateway.workers.supervisor.Workers``)."""

    def drained(self, service: str, address: str) -> bool:
        """No worker may still send to or wait on ``address``."""
        ...

    def endpoint_in_flight(self, service: str, address: str) -> int:
        """Requests in flight to ``address`` across the workers."""
        ...

    async def collect(self) -> None:
        """Fresh counters from every worker."""
        ...

    def sync_hooks(self) -> None:
        """Send the workers the hooks this process's admissions now carry (scale-from-zero
        holds, busy edges)."""
        ...


class Runtime:
    """Routes, services (endpoints, balancer, stats) and readiness of one gateway process."""

    def __init__(self, settings: Settings, clock: Callable[[], float] | None = None) -> None:
        self.settings = settings
        self._clock = clock
        self.services: dict[str, Service] = {}
        for name, config in settings.services.items():
            self.add_service(name, config)
        self.routes = RouteTable()
        self.ready = False
        self._drained: dict[tuple[str, str], list[asyncio.Future[None]]] = {}
        self._checkers: dict[str, HealthChecker] = {}
        self.scaler: ScalerLoop | None = None
        """The one scaler loop of this gateway (applied, or recommend-only on static), read by
        ``GET /api/decisions`` and ``/metrics``."""
        self.platform: Platform | None = None
        """The platform ``serve`` opened (static, local or kubernetes)."""
        self.on_update: (
            Callable[[Settings | RoutesUpdate | EndpointUpdate | CertificatesUpdate], None] | None
        ) = None
        """Told every change applied (``workers: N``: the main process sends it on)."""
        self.certificates = CertificatesUpdate()
        """The platform's TLS certificates now (Kubernetes: the Ingresses' TLS Secrets)."""
        self.on_certificates: Callable[[CertificatesUpdate], None] | None = None
        """The TLS listener, told each new set of platform certificates."""
        self.workers: WorkerView | None = None
        """The data-plane workers when they serve instead of this process (``workers: N``)."""
        self.budget: BudgetCpu | None = settings.budget.fixed()
        """The CPU budget in force and where it came from (the scaler sets it before every
        tick; None until then with ``budget.cpu: auto``)."""

    def budget_cores(self) -> float:
        """The budget in force in cores (0 before ``budget.cpu: auto`` is first measured)."""
        return 0.0 if self.budget is None else self.budget.cores

    def now(self) -> float:
        """The injected clock, else the running event loop's."""
        if self._clock is not None:
            return self._clock()
        return asyncio.get_running_loop().time()

    def add_service(self, name: str, config: ServiceConfig | None = None) -> Service:
        """The service called ``name``, created with ``config`` (or defaults) if new."""
        service = self.services.get(name)
        if service is None:
            service = Service.from_config(name, config or ServiceConfig())
            service.endpoints.on_drained = lambda ep, name=name: self._on_drained(name, ep)
            self.services[name] = service
        return service

    # -- what platforms call ------------------------------------------------------------------

    def apply_endpoints(self, update: EndpointUpdate) -> None:
        service = self.add_service(update.service)
        down = {
            ep.address for ep in service.endpoints.endpoints if ep.state is not EndpointState.READY
        }
        service.endpoints.apply(update)
        for ep in service.endpoints.endpoints:
            if ep.ejected and ep.address in down and ep.state is EndpointState.READY:
                service.outlier.readmit(ep.address)  # restarted: its failures are old news
        if self.on_update is not None:
            self.on_update(update)

    def apply_routes(self, update: RoutesUpdate) -> None:
        table = RouteTable.from_update(update)  # validates before anything changes
        for name in table.services:
            self.add_service(name)
        self.routes = table
        if self.on_update is not None:
            self.on_update(update)

    def apply_certificates(self, update: CertificatesUpdate) -> None:
        """A new whole set of platform certificates: new TLS handshakes use it."""
        self.certificates = update
        if self.on_certificates is not None:
            self.on_certificates(update)
        if self.on_update is not None:
            self.on_update(update)

    def is_drained(self, service: str, address: str) -> bool:
        s = self.services.get(service)
        here = s is None or s.endpoints.is_drained(address)
        return here and (self.workers is None or self.workers.drained(service, address))

    def endpoint_in_flight(self, service: str, address: str) -> int:
        """Requests in flight to ``address`` (summed over the workers when they serve)."""
        if self.workers is not None:
            return self.workers.endpoint_in_flight(service, address)
        s = self.services.get(service)
        ep = None if s is None else s.endpoints.get(address)
        return 0 if ep is None else ep.in_flight

    async def wait_drained(
        self, service: str, address: str, timeout_s: float | None = None
    ) -> bool:
        """Wait until ``address`` gets no new requests and has none in flight; False on timeout."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout_s is None else loop.time() + timeout_s
        while not self.is_drained(service, address):
            wait_s = DRAIN_POLL_S if deadline is None else min(DRAIN_POLL_S, deadline - loop.time())
            if wait_s <= 0:
                return False
            fut: asyncio.Future[None] = loop.create_future()
            waiters = self._drained.setdefault((service, address), [])
            waiters.append(fut)
            try:
                await asyncio.wait_for(asyncio.shield(fut), wait_s)
            except TimeoutError:
                pass
            finally:
                if fut in waiters:
                    waiters.remove(fut)
                if not waiters:
                    self._drained.pop((service, address), None)
        return True

    def _on_drained(self, service: str, ep: Endpoint) -> None:
        log.info("endpoint %s of %s drained", ep.address, service)
        s = self.services.get(service)
        if s is not None:
            s.outlier.forget(ep.address)
        for fut in self._drained.pop((service, ep.address), []):
            if not fut.done():
                fut.set_result(None)

    # -- issue 4: hot reload and active health checks -------------------------------------------

    def apply_settings(self, new: Settings) -> None:
        """Swap to a validated config in one step: services reconfigured in place (their
        endpoints, stats, slots and queued requests kept), new ones added, routes swapped
        whole; on the static platform the endpoint lists are applied (removed ones drain)."""
        old = self.settings
        # On kubernetes the routes come from Ingresses (the platform swaps them), not the file.
        file_routes = new.platform != "kubernetes"
        table = RouteTable.from_update(routes_from_settings(new)) if file_routes else self.routes
        for name, config in new.services.items():
            existing = self.services.get(name)
            if existing is None:
                self.add_service(name, config)
            else:
                existing.configure(config)
        if file_routes:
            for name in table.services:
                self.add_service(name)
            self.routes = table
        if new.platform == "static":
            for update in endpoints_from_settings(new):
                self.apply_endpoints(update)
        for name in set(old.services) - set(new.services):
            if file_routes and name not in table.services:
                service = self.services.pop(name, None)
                if service is not None:
                    service.outlier.close()
        self.settings = new
        self._sync_checkers()
        if self.on_update is not None:
            self.on_update(new)

    def _sync_checkers(self) -> None:
        """Run an active health checker for every service that configures one (in the
        workers when they serve: each checks for itself)."""
        if self.workers is not None:
            return
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return
        wanted = {
            name
            for name, s in self.services.items()
            if s.config.outlier_detection.health_check is not None
        }
        for name in set(self._checkers) - wanted:
            checker = self._checkers.pop(name)
            asyncio.get_running_loop().create_task(checker.stop())
        for name in wanted - set(self._checkers):
            checker = self._checkers[name] = HealthChecker(self.services[name].outlier)
            checker.start()

    async def stop_checkers(self) -> None:
        checkers, self._checkers = self._checkers, {}
        for checker in checkers.values():
            await checker.stop()

    # -- what the scaler and the admin plane read -----------------------------------------------

    async def refresh(self) -> None:
        """Bring the counters up to date before the admin plane answers (with workers: a
        fresh report from each; otherwise nothing to do)."""
        if self.workers is not None:
            await self.workers.collect()

    def signals_of(self, name: str, now: float) -> ServiceSignals:
        service = self.services[name]
        routable = service.endpoints.routable
        app = service.app_metrics
        return service.stats.snapshot(
            now,
            ready_replicas=len(routable),
            app_metrics=None if app is None else app.values(now, {ep.address for ep in routable}),
            latency_histogram=service.wants_latency_histogram,
        )

    def signals(self, now: float | None = None) -> dict[str, ServiceSignals]:
        at = self.now() if now is None else now
        return {name: self.signals_of(name, at) for name in self.services}

    def arm_early_wakes(
        self, decisions: Mapping[str, Decision], wake: Callable[[], None], enabled: bool
    ) -> None:
        """Arm every decided service's admission with its decision's wake level, so the data
        plane ticks the scaler early when a burst reaches it (``budget.early_ticks``; disabled:
        every level is disarmed)."""
        for name, decision in decisions.items():
            service = self.services.get(name)
            if service is not None:
                level = decision.wake_concurrency if enabled else math.inf
                service.admission.arm_early_wake(level, wake)

    def __repr__(self) -> str:
        return f"Runtime({len(self.services)} services, {self.routes!r}, ready={self.ready})"
