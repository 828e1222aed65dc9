"""Composition root: what ``sluice run`` does (``run``/``serve``).

Builds the shared :class:`~gateway.runtime.Runtime`, opens the platform the config names,
builds the ONE scaler loop from it (:class:`Scaling`), starts the data plane and the admin
plane, and on SIGINT/SIGTERM drains: ``/readyz`` turns 503, the listener closes, in-flight
(and queued) requests get up to ``shutdown.drain_s`` to finish, then the process exits 0.
Nothing imports this module but the CLI.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import signal
import socket
import ssl
import sys
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from gateway.admin.app_metrics import push_route
from gateway.admin.decisions import decisions_route
from gateway.admin.metrics import TlsCollector
from gateway.admin.reload import Reloader
from gateway.admin.server import AdminServer
from gateway.admin.wake import wake_route
from gateway.dataplane.access_log import AccessLog
from gateway.dataplane.limits import HeadLimits
from gateway.dataplane.server import DataPlane
from gateway.dataplane.shared_admission import SharedLimits, drain_then, pipe_notifier
from gateway.dataplane.tls import (
    Certificate,
    CertificateSet,
    TlsError,
    TlsListener,
    check_upstream_tls,
    expiry_warnings,
    load_certificates,
    load_pem_certificate,
)
from gateway.dataplane.updates import (
    CertificatesUpdate,
    PemCertificate,
    endpoints_from_settings,
    routes_from_settings,
)
from gateway.platforms import Platform
from gateway.platforms.static import StaticPlatform
from gateway.runtime import Runtime
from gateway.settings import ConfigError, Settings, load_runtime_settings
from gateway.telemetry.api import traces_route
from gateway.telemetry.logs import JsonFormatter, configure
from gateway.telemetry.provider import Telemetry, TelemetryError
from gateway.telemetry.scaler import TracedEngine
from gateway.workers.ipc import Channel, Ready, Start
from gateway.workers.supervisor import Workers
from gateway.workers.worker import WorkerLink
from scaler.engine import Engine
from scaler.loop import ScalerLoop, TickEngine
from scaler.policy import BudgetCpu, ScalingPolicy, within_floors
from scaler.signals import ServiceSignals

if TYPE_CHECKING:
    from opentelemetry.trace import Tracer

log = logging.getLogger(__name__)


def _url(host: str, port: int, scheme: str = "http") -> str:
    return f"{scheme}://[{host}]:{port}" if ":" in host else f"{scheme}://{host}:{port}"


class TlsTermination:
    """The TLS listener's certificates across reloads (files re-read on every reload) and
    the platform's own (:meth:`apply_certificates`), which take precedence for their hosts;
    the config file's first certificate stays the default."""

    def __init__(
        self, dataplane: DataPlane, settings: Settings, runtime: Runtime | None = None
    ) -> None:
        assert settings.tls is not None
        self.dataplane = dataplane
        self.config = settings.tls
        if settings.tls.http2:
            dataplane.offer_h2()
        alpn = list(dataplane.tls_protocols)
        certificates = load_certificates(settings.tls, alpn)  # TlsError: refuse to start
        for line in expiry_warnings(certificates.certificates, time.time()):
            log.warning("tls: %s", line)
        self.files = certificates
        """The config file's certificates."""
        self.platform: list[Certificate] = []
        """The platform's certificates, loaded."""
        self._platform_pem = CertificatesUpdate()
        self._loaded: dict[tuple[PemCertificate, str, tuple[str, ...]], Certificate] = {}
        """Platform certificates loaded, by (PEM, version floor, ALPN): one Secret rotated
        among a thousand loads one context, not a thousand."""
        self.listener = TlsListener(certificates, settings.tls.min_version, alpn)
        self.port = settings.tls.listen.port
        if runtime is not None:
            runtime.on_certificates = self.apply_certificates
            if runtime.certificates.certificates:
                self.apply_certificates(runtime.certificates)

    def _combined(self) -> CertificateSet:
        return CertificateSet(
            [*self.platform, *self.files.certificates],
            self.files.reject_unknown,
            default=self.files.default,
        )

    def _load_platform(
        self, update: CertificatesUpdate, min_version: str | None = None
    ) -> list[Certificate]:
        floor = min_version or self.config.min_version
        alpn = tuple(self.listener.alpn)
        loaded, kept = [], {}
        for pem in update.certificates:
            key = (pem, floor, alpn)
            cert = self._loaded.get(key)
            if cert is None:
                try:
                    cert = load_pem_certificate(
                        pem.source,
                        pem.cert_pem,
                        pem.key_pem,
                        hosts=pem.hosts,
                        min_version=floor,
                        alpn=alpn,
                    )
                except TlsError as e:  # the platform checked it: only a race gets here
                    log.warning("tls: %s; its hosts get the default certificate", e)
                    continue
                for line in expiry_warnings([cert], time.time()):
                    log.warning("tls: %s", line)
            kept[key] = cert
            loaded.append(cert)
        self._loaded = kept
        return loaded

    def apply_certificates(self, update: CertificatesUpdate) -> None:
        """The platform's certificates changed: new handshakes use them at once."""
        self._platform_pem = update
        self.platform = self._load_platform(update)
        self.listener.swap(self._combined())
        log.info("tls: %d certificate(s) from the platform", len(self.platform))

    def expiries(self) -> list[tuple[str, float]]:
        """(host, notAfter) per host served, for ``sluice_tls_certificate_expiry_seconds``."""
        return [(h, c.not_after_s) for h, c in self.listener.certificates.hosts()]

    def reload(self, new: Settings, source: str) -> None:
        """Re-read the certificate files (new handshakes use them); ConfigError if any fails
        or the listener itself changed (restart-only)."""
        if new.tls is None or new.tls.listen != self.config.listen:
            raise ConfigError(
                [f"{source}: tls.listen: cannot change while running (restart Sluice)"]
            )
        alpn = [p for p in self.listener.alpn if p != "h2"]
        if new.tls.http2:
            alpn.insert(0, "h2")
        try:
            certificates = load_certificates(new.tls, alpn)
        except TlsError as e:
            raise ConfigError(
                [f"{source}: tls.certificates: {line}" for line in str(e).splitlines()]
            ) from None
        for line in expiry_warnings(certificates.certificates, time.time()):
            log.warning("tls: %s", line)
        changed = alpn != self.listener.alpn or new.tls.min_version != self.config.min_version
        self.files = certificates
        self.listener.update(certificates, new.tls.min_version, alpn)
        if changed:  # each certificate's context carries the version floor and ALPN
            self.platform = self._load_platform(self._platform_pem, new.tls.min_version)
        self.listener.swap(self._combined())
        if new.tls.http2 != self.config.http2:
            if new.tls.http2:
                self.dataplane.offer_h2()
            else:
                self.dataplane.withdraw_h2()
        self.config = new.tls
        self.dataplane.redirect_to_https(self.port if new.tls.redirect_http else None)
        log.info("tls: %d certificate(s) loaded", len(certificates.certificates))


def open_platform(settings: Settings, runtime: Runtime) -> Platform:
    """The platform ``settings.platform`` names (kubernetes imported only when asked for)."""
    if settings.platform == "local":
        from gateway.platforms.local.platform import LocalPlatform

        return LocalPlatform(settings, runtime)
    if settings.platform == "kubernetes":
        from gateway.platforms.kubernetes.platform import KubernetesPlatform

        return KubernetesPlatform(settings, runtime)
    return StaticPlatform(settings, runtime)


class Scaling:
    """The gateway's ONE scaler loop, built from a platform: the engine over the platform's
    policies (rebuilt when they change), its signals and actuator; each decision arms the
    services' early wakes; the platform's routes and endpoints feed the runtime."""

    def __init__(
        self,
        runtime: Runtime,
        platform: Platform,
        settings: Settings,
        tracer: Tracer | None = None,
        interval_s: float = 1.0,
    ) -> None:
        self.runtime = runtime
        self.platform = platform
        self.tracer = tracer
        self._budget = settings.budget
        self._policies: dict[str, ScalingPolicy] = {}
        self._core: Engine | None = None
        self.loop = ScalerLoop(
            self._engine(),
            self._signals,
            platform.actuator,
            interval_s=interval_s,
            early_tick_gap_s=settings.budget.early_tick_gap_s,
        )
        enabled = settings.budget.early_ticks
        self.loop.on_decisions = lambda d: runtime.arm_early_wakes(d, self.loop.wake, enabled)
        self._tasks: list[asyncio.Task[None]] = []

    def __repr__(self) -> str:
        return f"Scaling({self.platform!r}, {self.loop!r})"

    def _engine(self) -> TickEngine:
        self._policies = dict(self.platform.policies())
        cpu = self._budget_cpu()
        engine = Engine(self._policies, self._budget, cpu=cpu)
        self._core = engine
        self.runtime.budget = cpu
        return engine if self.tracer is None else TracedEngine(engine, self.tracer)

    def _hold_at_zero(self) -> None:
        """Give every service the scale-from-zero hold its platform asks for
        (:meth:`Platform.holds_at_zero`), and send a change on to the workers."""
        changed = False
        for name, service in self.runtime.services.items():
            hold = self.platform.holds_at_zero(name, self._policies.get(name))
            admission = service.admission
            if hold != admission.hold_when_empty:
                admission.hold_at_zero(functools.partial(self._wake_for, name) if hold else None)
                changed = True
        if changed and self.runtime.workers is not None:
            self.runtime.workers.sync_hooks()

    def _wake_for(self, service: str) -> None:
        """A request is held for ``service`` (no ready endpoint): tick now (:meth:`wake`) and
        tell the platform (on Kubernetes a follower tells the leader)."""
        self.wake(service, "held")
        self.platform.on_held(service)

    def wake(self, service: str, reason: str) -> bool:
        """Tick now for a request held for ``service``, unless the last decision already runs
        a replica of it (it is starting; more ticks would not help).  Whether it ticks."""
        last = self.loop.last.get(service)
        if last is None or last.replicas == 0:
            self.loop.wake(reason)
            return True
        return False

    def _budget_cpu(self) -> BudgetCpu:
        """The platform's budget, held at the services' floors when it is smaller."""
        return within_floors(self.platform.budget_cpu(), self._policies)

    def _signals(self) -> Mapping[str, ServiceSignals] | Awaitable[Mapping[str, ServiceSignals]]:
        """The platform's signals, after bringing the engine's budget up to date (with
        ``budget.cpu: auto`` the platform re-measures it as machines, nodes and pods change)."""
        if dict(self.platform.policies()) != self._policies:
            # e.g. a ScalingPolicy object changed (no route changed with it)
            log.info("scaling policies changed: rebuilding the engine")
            try:
                self.loop.engine = self._engine()
            except ValueError:
                log.exception("the new scaling policies are not usable; keeping the old ones")
            self._hold_at_zero()
        cpu = self._budget_cpu()
        if self._core is not None and cpu != self._core.cpu:
            log.info("budget: %g cores (%s)", cpu.cores, cpu.source)
            self._core.set_cpu(cpu)
            self.runtime.budget = cpu
        return self.platform.signals()

    async def start(self) -> None:
        self.runtime.scaler = self.loop
        self.runtime.platform = self.platform
        await self.platform.start(self.loop)
        self._hold_at_zero()
        self._tasks = [
            asyncio.create_task(self._feed_routes(), name=f"{self.platform.name} routes"),
            asyncio.create_task(self._feed_endpoints(), name=f"{self.platform.name} endpoints"),
            asyncio.create_task(
                self._feed_certificates(), name=f"{self.platform.name} certificates"
            ),
            asyncio.create_task(self.loop.run(), name="scaler loop"),
        ]

    async def _feed_routes(self) -> None:
        async for update in self.platform.routes():
            try:
                self.runtime.apply_routes(update)
            except Exception:
                log.exception("cannot apply the routes from the %s platform", self.platform.name)
            if dict(self.platform.policies()) != self._policies:
                log.info("scaling policies changed: rebuilding the engine")
                try:
                    self.loop.engine = self._engine()
                except ValueError:
                    log.exception("the new scaling policies are not usable; keeping the old ones")
            self._hold_at_zero()  # the new services', and those whose policy changed

    async def _feed_endpoints(self) -> None:
        async for update in self.platform.endpoints():
            try:
                self.runtime.apply_endpoints(update)
            except Exception:
                log.exception("cannot apply endpoints of %s", update.service)

    async def _feed_certificates(self) -> None:
        async for update in self.platform.certificates():
            try:
                self.runtime.apply_certificates(update)
            except Exception:
                log.exception(
                    "cannot apply the TLS certificates of the %s platform", self.platform.name
                )

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        await self.platform.stop()


async def serve(
    settings: Settings,
    stop: asyncio.Event | None = None,
    on_ready: Callable[[Runtime], Awaitable[None]] | None = None,
    config_path: Path | None = None,
) -> int:
    """Run the data and admin planes until ``stop`` is set (or SIGINT/SIGTERM); return 0."""
    loop = asyncio.get_running_loop()
    problems = check_upstream_tls(settings, str(config_path or "<config>"))
    if problems:
        for line in problems:
            print(f"sluice: {line}", file=sys.stderr, flush=True)
        return 2
    access_log: AccessLog | None = None
    if settings.access_log.enabled:
        try:
            access_log = AccessLog(loop, settings.access_log.format, settings.access_log.path)
        except OSError as e:
            print(f"sluice: access_log.path: cannot open it: {e}", file=sys.stderr, flush=True)
            return 2
    runtime = Runtime(settings)
    workers: Workers | None = None
    if settings.worker_count > 1:
        # The data plane runs in worker processes; this one keeps the scaler, the admin
        # plane and the platform, and sends the workers what it applies.
        workers = Workers(runtime, settings.worker_count, log_setup=_log_setup())
        if access_log is not None:
            access_log.close()  # each worker opens its own (the path was checked)
            access_log = None
    runtime.apply_routes(routes_from_settings(settings))
    for update in endpoints_from_settings(settings):
        runtime.apply_endpoints(update)
    try:
        telemetry = Telemetry.start(settings.telemetry.traces)
    except TelemetryError as e:
        print(f"sluice: telemetry: {e}", file=sys.stderr, flush=True)
        return 2
    scaling = Scaling(runtime, open_platform(settings, runtime), settings, telemetry.tracer)
    if workers is not None:
        early = settings.budget.early_ticks
        scaling.loop.on_decisions = lambda d: workers.arm_early_wakes(d, scaling.loop.wake, early)
    await scaling.start()
    stop = stop or asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    dataplane = DataPlane(
        runtime,
        settings.trusted_proxies,
        loop,
        tracing=telemetry.requests,
        limits=HeadLimits.from_settings(settings.limits),
        h2c=settings.listen.h2c,
    )
    if access_log is not None:
        dataplane.access_log = access_log
        loop.add_signal_handler(signal.SIGUSR1, access_log.reopen)
    elif workers is not None and settings.access_log.enabled:
        loop.add_signal_handler(signal.SIGUSR1, workers.signal, signal.SIGUSR1)
    tls: TlsTermination | None = None
    if settings.tls is not None:
        try:
            tls = TlsTermination(dataplane, settings, runtime)
        except (TlsError, ssl.SSLError, OSError) as e:
            print(f"sluice: tls: {e}", file=sys.stderr, flush=True)
            await scaling.stop()
            await asyncio.to_thread(telemetry.shutdown)
            return 2
    reloader: Reloader | None = None
    if config_path is not None:
        source = str(config_path)

        def apply(new: Settings) -> None:
            problems = check_upstream_tls(new, source)
            if problems:
                raise ConfigError(problems)
            if new.worker_count != settings.worker_count:
                raise ConfigError(
                    [f"{source}: workers: cannot change while running (restart Sluice)"]
                )
            if tls is not None:
                tls.reload(new, source)  # first: a bad certificate rejects the whole reload
            elif new.tls is not None:
                raise ConfigError(
                    [f"{source}: tls: cannot be added while running (restart Sluice)"]
                )
            runtime.apply_settings(new)
            dataplane.configure(new.trusted_proxies, HeadLimits.from_settings(new.limits))
            if new.listen.h2c != dataplane.h2c:
                dataplane.serve_h2c(new.listen.h2c)

        def refresh(new: Settings) -> None:
            if tls is not None:
                tls.reload(new, source)

        reloader = Reloader(
            config_path, settings, apply, load=load_runtime_settings, refresh=refresh
        )
    admin = AdminServer(
        runtime,
        extra_routes=[
            traces_route(telemetry.buffer, telemetry.tracer is not None),
            decisions_route(runtime),
            push_route(runtime),
            wake_route(runtime, scaling.wake),
            *([] if workers is None else [workers.route()]),
        ],
        reloader=reloader,
        unmatched=lambda: dataplane.unmatched_total if workers is None else workers.unmatched_total,
        collectors=[] if tls is None else [TlsCollector(tls.expiries, time.time)],
    )
    tls_url = ""
    try:
        if workers is not None:
            tls_at = None if settings.tls is None else settings.tls.listen
            (data_host, data_port), tls_bound = await workers.start(
                (settings.listen.host, settings.listen.port),
                None if tls_at is None else (tls_at.host, tls_at.port),
            )
            if tls is not None and tls_bound is not None:
                tls.port = tls_bound[1]
                tls_url = " tls=" + _url(*tls_bound, "https")
        else:
            data_host, data_port = await dataplane.start(settings.listen.host, settings.listen.port)
        if workers is None and tls is not None and settings.tls is not None:
            tls_host, tls.port = await dataplane.start_tls(
                settings.tls.listen.host, settings.tls.listen.port, tls.listener
            )
            tls_url = " tls=" + _url(tls_host, tls.port, "https")
            if settings.tls.redirect_http:
                dataplane.redirect_to_https(tls.port)
        admin_host, admin_port = await admin.start(settings.admin.host, settings.admin.port)
    except OSError as e:
        print(f"sluice: cannot listen: {e}", file=sys.stderr, flush=True)
        if workers is not None:
            await workers.stop(0)
            workers.close()
        await dataplane.stop(0)
        if access_log is not None:
            access_log.close()
        await scaling.stop()
        await asyncio.to_thread(telemetry.shutdown)
        return 1
    runtime._sync_checkers()
    if reloader is not None:  # SIGHUP is handled before anyone learns we are up
        reloader.start(settings.reload.interval_s, settings.reload.watch)
    runtime.ready = True
    # One parseable line (tests and scripts read the bound ports from it; port 0 works).
    print(
        f"sluice listening data={_url(data_host, data_port)} admin={_url(admin_host, admin_port)}"
        f"{tls_url}",
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
    if reloader is not None:
        await reloader.stop()
    if workers is not None:
        await workers.stop(drain_s)
        workers.close()
    await dataplane.stop(drain_s)
    if access_log is not None:
        loop.remove_signal_handler(signal.SIGUSR1)
        access_log.close()
    await runtime.stop_checkers()
    await scaling.stop()
    await admin.stop()
    await asyncio.to_thread(
        telemetry.shutdown
    )  # flushes pending spans (bounded by the export timeout)
    log.info("stopped")
    return 0


def _log_setup() -> tuple[str, str]:
    """(level, format) of this process's logging, for its workers."""
    root = logging.getLogger()
    level = logging.getLevelName(root.getEffectiveLevel()).lower()
    json = any(isinstance(h.formatter, JsonFormatter) for h in root.handlers)
    return level, "json" if json else "text"


async def serve_worker(fd: int) -> int:
    """One data-plane worker (``workers: N``): serve on the ports the main process reserved,
    apply what it sends, report the counters, drain when it says stop (or goes away)."""
    loop = asyncio.get_running_loop()
    # A signal to the whole process group (Ctrl-C, a closed terminal, kill -USR1 -PGID) is
    # the main process's to act on: it stops, reloads or reopens the logs of every worker.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1):
        loop.add_signal_handler(sig, lambda: None)
    channel = await Channel.open(socket.socket(fileno=fd))
    try:
        start = await channel.receive()
    except EOFError:
        return 1
    if not isinstance(start, Start):
        return 2
    configure(start.log_level, "json" if start.log_format == "json" else "text")
    settings = start.settings
    runtime = Runtime(settings)
    runtime.apply_routes(start.routes)
    for update in start.endpoints:
        runtime.apply_endpoints(update)
    try:
        telemetry = Telemetry.start(settings.telemetry.traces)
    except TelemetryError as e:
        log.error("worker %d: telemetry: %s", start.index, e)
        return 2
    dataplane = DataPlane(
        runtime,
        settings.trusted_proxies,
        loop,
        tracing=telemetry.requests,
        limits=HeadLimits.from_settings(settings.limits),
        h2c=settings.listen.h2c,
    )
    access_log: AccessLog | None = None
    if settings.access_log.enabled:
        access_log = dataplane.access_log = AccessLog(
            loop, settings.access_log.format, settings.access_log.path
        )
        loop.add_signal_handler(signal.SIGUSR1, access_log.reopen)
    tls = None if settings.tls is None else TlsTermination(dataplane, settings, runtime)
    runtime.apply_certificates(start.certificates)

    def apply(new: Settings) -> None:
        if tls is not None:
            tls.reload(new, "reload")
        runtime.apply_settings(new)
        dataplane.configure(new.trusted_proxies, HeadLimits.from_settings(new.limits))

    shared = None
    if start.shared_fd >= 0:
        shared = SharedLimits(
            start.shared_fd, len(start.wake_fds), start.index, pipe_notifier(start.wake_fds)
        )
    link = WorkerLink(
        channel,
        runtime,
        apply,
        lambda: dataplane.unmatched_total,
        applied=start.seq,
        hooks=start.hooks,
        shared=shared,
    )
    if shared is not None:
        wake_fd = start.wake_fds[start.index][0]
        loop.add_reader(wake_fd, drain_then, wake_fd, link.wake)
    await dataplane.start(*start.listen, reuse_port=True)
    if tls is not None and settings.tls is not None and start.tls_listen is not None:
        _, tls.port = await dataplane.start_tls(*start.tls_listen, tls.listener, reuse_port=True)
        if settings.tls.redirect_http:
            dataplane.redirect_to_https(tls.port)
    runtime._sync_checkers()
    runtime.ready = True
    channel.send(Ready(os.getpid()))
    drain_s = await link.run()
    runtime.ready = False
    await dataplane.stop(drain_s)
    if access_log is not None:
        access_log.close()
    await runtime.stop_checkers()
    await asyncio.to_thread(telemetry.shutdown)
    channel.close()
    return 0


def run_worker(fd: int) -> int:
    """A data-plane worker process (``python -m gateway.workers FD``); its exit code."""
    with asyncio.Runner(loop_factory=_event_loop_factory()) as runner:
        return runner.run(serve_worker(fd))


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
