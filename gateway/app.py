"""Composition root: the shared :class:`Runtime` and ``run`` (what ``sluice run`` does).

The runtime is the state one gateway process shares between the data plane (reads routes
and services per request), the admin plane, the discovery sources (apply endpoint and route
updates) and, later, the scaler loop (reads signals).  Platforms call:

* :meth:`Runtime.apply_endpoints` with an ``EndpointUpdate`` (new endpoints join, removed
  ones drain);
* :meth:`Runtime.apply_routes` with a ``RoutesUpdate`` (a new ``RouteTable`` swapped whole);
* :meth:`Runtime.wait_drained` before stopping a replica that was removed.

Hot reload (issue 4, ``gateway.admin.reload``) calls :meth:`Runtime.apply_settings`: one
synchronous step on the event loop, so every request sees either the old or the new
config, never a mix.  SIGTERM: ``/readyz`` turns 503, the listener closes, in-flight (and
queued) requests get up to ``shutdown.drain_s`` to finish, then the process exits 0.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING

from gateway.admin.decisions import RecommendRunner, decisions_route
from gateway.admin.reload import Reloader
from gateway.admin.server import AdminServer
from gateway.dataplane import DataPlane
from gateway.dataplane.endpoints import Endpoint
from gateway.dataplane.limits import HeadLimits
from gateway.dataplane.outlier import HealthChecker
from gateway.dataplane.routing import RouteTable
from gateway.dataplane.service import Service
from gateway.dataplane.updates import EndpointUpdate, RoutesUpdate
from gateway.platforms.static import endpoints_from_settings, routes_from_settings
from gateway.settings import ServiceConfig, Settings, load_runtime_settings
from gateway.telemetry.api import traces_route
from gateway.telemetry.provider import Telemetry, TelemetryError
from scaler.loop import ScalerLoop
from scaler.signals import ServiceSignals

if TYPE_CHECKING:
    from gateway.platforms.kubernetes.runner import KubernetesRunner
    from gateway.platforms.local.runner import LocalRunner

log = logging.getLogger(__name__)

DRAIN_POLL_S = 0.05


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
        self.reloader: Reloader | None = None
        """Set by ``serve`` when the config came from a file (``POST /api/reload``)."""
        self._checkers: dict[str, HealthChecker] = {}
        self.scaler: ScalerLoop | None = None
        self.platform: object | None = None
        """The platform runner ``serve`` started (LocalRunner, KubernetesRunner, RecommendRunner)."""
        """The scaler loop of this gateway (local: applied; static: recommend-only), read by
        ``GET /api/decisions`` and ``/metrics``."""

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
        self.add_service(update.service).endpoints.apply(update)

    def apply_routes(self, update: RoutesUpdate) -> None:
        table = RouteTable.from_update(update)  # validates before anything changes
        for name in table.services:
            self.add_service(name)
        self.routes = table

    def is_drained(self, service: str, address: str) -> bool:
        s = self.services.get(service)
        return s is None or s.endpoints.is_drained(address)

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

    def _sync_checkers(self) -> None:
        """Run an active health checker for every service that configures one."""
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

    def signals_of(self, name: str, now: float) -> ServiceSignals:
        service = self.services[name]
        return service.stats.snapshot(now, ready_replicas=len(service.endpoints.routable))

    def signals(self, now: float | None = None) -> dict[str, ServiceSignals]:
        at = self.now() if now is None else now
        return {name: self.signals_of(name, at) for name in self.services}

    def __repr__(self) -> str:
        return f"Runtime({len(self.services)} services, {self.routes!r}, ready={self.ready})"


def _url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


async def serve(
    settings: Settings,
    stop: asyncio.Event | None = None,
    on_ready: Callable[[Runtime], Awaitable[None]] | None = None,
    config_path: Path | None = None,
) -> int:
    """Run the data and admin planes until ``stop`` is set (or SIGINT/SIGTERM); return 0."""
    loop = asyncio.get_running_loop()
    runtime = Runtime(settings)
    runtime.apply_routes(routes_from_settings(settings))
    for update in endpoints_from_settings(settings):
        runtime.apply_endpoints(update)
    try:
        telemetry = Telemetry.start(settings.telemetry.traces)
    except TelemetryError as e:
        print(f"sluice: telemetry: {e}", file=sys.stderr, flush=True)
        return 2
    runner: LocalRunner | KubernetesRunner | RecommendRunner | None = None
    if settings.platform == "local":
        from gateway.platforms.local.runner import LocalRunner

        runner = LocalRunner(runtime, settings, tracer=telemetry.tracer)
        await runner.start()
    elif settings.platform == "kubernetes":
        from gateway.platforms.kubernetes.runner import KubernetesRunner

        runner = KubernetesRunner(runtime, settings, tracer=telemetry.tracer)
        await runner.start()
    else:
        runner = RecommendRunner(runtime, settings, tracer=telemetry.tracer)
        await runner.start()
    runtime.platform = runner
    stop = stop or asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    dataplane = DataPlane(
        runtime,
        settings.trusted_proxies,
        loop,
        tracing=telemetry.requests,
        limits=HeadLimits.from_settings(settings.limits),
    )
    admin = AdminServer(
        runtime,
        extra_routes=[
            traces_route(telemetry.buffer, telemetry.tracer is not None),
            decisions_route(runtime),
        ],
    )
    if config_path is not None:

        def apply(new: Settings) -> None:
            runtime.apply_settings(new)
            dataplane.configure(new.trusted_proxies, HeadLimits.from_settings(new.limits))

        runtime.reloader = Reloader(config_path, settings, apply, load=load_runtime_settings)
    try:
        data_host, data_port = await dataplane.start(settings.listen.host, settings.listen.port)
        admin_host, admin_port = await admin.start(settings.admin.host, settings.admin.port)
    except OSError as e:
        print(f"sluice: cannot listen: {e}", file=sys.stderr, flush=True)
        await dataplane.stop(0)
        if runner is not None:
            await runner.stop()
        await asyncio.to_thread(telemetry.shutdown)
        return 1
    runtime._sync_checkers()
    if runtime.reloader is not None:  # SIGHUP is handled before anyone learns we are up
        runtime.reloader.start(settings.reload.interval_s, settings.reload.watch)
    runtime.ready = True
    # One parseable line (tests and scripts read the bound ports from it; port 0 works).
    print(
        f"sluice listening data={_url(data_host, data_port)} admin={_url(admin_host, admin_port)}",
        flush=True,
    )
    log.info(
        "serving %d service(s) on %s, admin on %s",
        len(runtime.services),
        _url(data_host, data_port),
        _url(admin_host, admin_port),
    )
    if on_ready is not None:
        await on_ready(runtime)
    await stop.wait()
    # Graceful shutdown: not ready first, then stop accepting and drain.
    runtime.ready = False
    drain_s = runtime.settings.shutdown.drain_s
    log.info("stopping: draining in-flight requests for up to %gs", drain_s)
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.remove_signal_handler(sig)
    if runtime.reloader is not None:
        await runtime.reloader.stop()
    await dataplane.stop(drain_s)
    await runtime.stop_checkers()
    if runner is not None:
        await runner.stop()
    await admin.stop()
    await asyncio.to_thread(
        telemetry.shutdown
    )  # flushes pending spans (bounded by the export timeout)
    log.info("stopped")
    return 0


def _event_loop_factory() -> Callable[[], asyncio.AbstractEventLoop]:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux/macOS
        return asyncio.new_event_loop
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def run(settings: Settings, config_path: Path | None = None) -> int:
    """Run the gateway until SIGINT/SIGTERM; return the process exit code."""
    if not logging.getLogger().handlers:
        logging.basicConfig(
            level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
        )
    if config_path is not None:
        log.info("config %s", config_path)
    with asyncio.Runner(loop_factory=_event_loop_factory()) as runner:
        return runner.run(serve(settings, config_path=config_path))
