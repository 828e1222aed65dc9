"""The main process's side of ``workers: N``: starts N data-plane workers (``python -m gateway.workers``)
on ports it reserves (``SO_REUSEPORT``), sends them every change the main runtime applies,
merges their reports into the main runtime (each worker's counters summed, a worker that
died kept as retired counts so totals never go back), relays their admission edges to the
scaler and the platform, restarts a worker that dies, and drains them all on stop."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import signal
import socket
import sys
from collections.abc import Callable, Mapping
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gateway.dataplane.app_metrics import AppState
from gateway.dataplane.shared_admission import (
    SharedLimits,
    create_file,
    create_pipes,
    pipe_notifier,
)
from gateway.dataplane.stats import ServiceStats, StatsState
from gateway.dataplane.updates import CertificatesUpdate, EndpointUpdate, RoutesUpdate
from gateway.runtime import Runtime
from gateway.settings import Settings
from gateway.workers.ipc import (
    AdmissionState,
    Channel,
    Collect,
    Event,
    Hooks,
    Ready,
    Report,
    Start,
    Stop,
    Update,
    sum_admission,
)
from scaler.decision import Decision

log = logging.getLogger(__name__)

START_TIMEOUT_S = 30.0
COLLECT_TIMEOUT_S = 1.0
RESTART_BACKOFF_S = (0.1, 0.5, 1.0, 2.0, 5.0)
STOP_GRACE_S = 5.0
"""How long past ``drain_s`` a worker may take to exit before it is killed."""


def worker_argv(fd: int) -> list[str]:
    """The command that runs one worker, its channel on ``fd``."""
    return [sys.executable, "-m", "gateway.workers", str(fd)]


def reserve(host: str, port: int) -> tuple[socket.socket, tuple[str, int]]:
    """Bind (without listening) ``host:port`` with ``SO_REUSEPORT``: the port is held (port 0
    picks one) while the workers listen on it beside this socket, which takes no connection."""
    family, kind, proto, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(address)
    except OSError:
        sock.close()
        raise
    bound = sock.getsockname()
    return sock, (str(bound[0]), int(bound[1]))


class WorkerProcess:
    """One worker slot: its current process and what it last reported."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.process: asyncio.subprocess.Process | None = None
        self.channel: Channel | None = None
        self.ready = False
        self.restarts = 0
        self.applied = -1
        self.token = 0
        self.stats: dict[str, StatsState] = {}
        self.admission: dict[str, AdmissionState] = {}
        self.app: dict[str, AppState] = {}
        """``scaling.metrics`` app metrics read from headers, per service."""
        self.in_flight: dict[tuple[str, str], int] = {}
        self.unmatched = 0
        self.busy: set[str] = set()
        self.replicas_busy: set[tuple[str, str]] = set()
        """(service, address) this worker has requests in flight to (its endpoint edges)."""

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    def __repr__(self) -> str:
        return f"WorkerProcess({self.index}, pid={self.pid}, ready={self.ready})"


class Workers:
    """N data-plane worker processes serving for ``runtime`` (the main process's view)."""

    def __init__(
        self,
        runtime: Runtime,
        count: int,
        argv: Callable[[int], list[str]] = worker_argv,
        log_setup: tuple[str, str] = ("info", "text"),
    ) -> None:
        if count < 2:
            raise ValueError(f"workers must be >= 2 to run worker processes, got {count}")
        self.runtime = runtime
        self.count = count
        self.argv = argv
        self.log_setup = log_setup
        """(level, format) the workers log with: the main process's."""
        self.slots = [WorkerProcess(i) for i in range(count)]
        self.seq = 0
        self.routes = RoutesUpdate(rules=())
        self.endpoints: dict[str, EndpointUpdate] = {}
        self.hooks = Hooks()
        self.levels: dict[str, float] = {}
        self.wake: Callable[[], None] | None = None
        self.listen: tuple[str, int] = ("127.0.0.1", 0)
        self.tls_listen: tuple[str, int] | None = None
        self.stopping = False
        self._reserved: list[socket.socket] = []
        self._retired: dict[str, StatsState] = {}
        self._retired_admission: dict[str, AdmissionState] = {}
        self._retired_unmatched = 0
        self._busy: dict[str, bool] = {}
        self._replicas_busy: set[tuple[str, str]] = set()
        """(service, address) with a request in flight in some worker."""
        self._tokens = itertools.count(1)
        self._collecting: dict[int, tuple[set[int], asyncio.Future[None]]] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self.shared_fd = create_file(count)
        self.wake_pipes = create_pipes(count)
        self.shared = SharedLimits(self.shared_fd, count, -1, pipe_notifier(self.wake_pipes))
        """Admission shared by the workers; this process frees a dead worker's slots."""
        runtime.on_update = self.forward
        runtime.workers = self

    def __repr__(self) -> str:
        return f"Workers({self.count}, seq={self.seq}, {self.slots!r})"

    # -- main -> workers ----------------------------------------------------------------

    def forward(
        self, change: Settings | RoutesUpdate | EndpointUpdate | CertificatesUpdate
    ) -> None:
        """The main runtime applied ``change``: remember it (for workers started later) and
        send it to every worker."""
        if isinstance(change, RoutesUpdate):
            self.routes = change
        elif isinstance(change, EndpointUpdate):
            self.endpoints[change.service] = change
        self._send_update(change)

    def _send_update(
        self, change: Settings | RoutesUpdate | EndpointUpdate | CertificatesUpdate | Hooks
    ) -> None:
        self.seq += 1
        message = Update(self.seq, change)
        for w in self.slots:
            # a starting worker too: it reads its Start first, then this (the channel keeps
            # the order), so nothing applied between its Start and its Ready is lost
            if w.channel is not None:
                w.channel.send(message)

    def arm_early_wakes(
        self, decisions: Mapping[str, Decision], wake: Callable[[], None], enabled: bool
    ) -> None:
        """Each worker is armed at 1/N of a decision's wake level (``SO_REUSEPORT`` spreads
        the connections evenly): the first worker whose share reaches it wakes the scaler."""
        self.wake = wake
        for name, decision in decisions.items():
            level = decision.wake_concurrency
            if enabled and level != float("inf"):
                self.levels[name] = level / self.count
            else:
                self.levels.pop(name, None)
        # Sent after every decision even when unchanged: a worker's wake fires once, and
        # each decision re-arms it (as one process re-arms its admissions).
        self.sync_hooks(rearm=bool(self.levels))

    def sync_hooks(self, rearm: bool = False) -> None:
        """Send the hooks the main runtime's admissions carry (set by the platform) when they
        changed (or ``rearm``): scale-from-zero holds, busy edges, early-wake levels."""
        services = self.runtime.services
        hooks = Hooks(
            wake_levels={n: v for n, v in self.levels.items() if n in services},
            hold=frozenset(n for n, s in services.items() if s.admission.hold_when_empty),
            busy=frozenset(n for n, s in services.items() if s.admission.on_busy_change),
            replica_busy=frozenset(n for n, s in services.items() if s.endpoints.on_busy),
        )
        if rearm or hooks != self.hooks:
            self.hooks = hooks
            self._send_update(hooks)

    # -- lifecycle ------------------------------------------------------------------------

    async def start(
        self, listen: tuple[str, int], tls_listen: tuple[str, int] | None
    ) -> tuple[tuple[str, int], tuple[str, int] | None]:
        """Reserve the ports, start every worker and wait until each listens; return the
        bound addresses. OSError when a port is taken or a worker cannot start."""
        sock, self.listen = reserve(*listen)
        self._reserved.append(sock)
        if tls_listen is not None:
            sock, self.tls_listen = reserve(*tls_listen)
            self._reserved.append(sock)
        self.sync_hooks()
        started = await asyncio.gather(
            *(self._spawn(w) for w in self.slots), return_exceptions=True
        )
        failed = [e for e in started if isinstance(e, BaseException)]
        if failed:
            await self.stop(0)
            raise OSError(f"a data-plane worker did not start: {failed[0]}")
        self._tasks = [
            asyncio.create_task(self._supervise(w), name=f"worker {w.index}") for w in self.slots
        ]
        log.info("%d data-plane workers serving (pids %s)", self.count, self.pids())
        return self.listen, self.tls_listen

    def pids(self) -> list[int]:
        return [w.pid for w in self.slots if w.pid is not None]

    async def _spawn(self, w: WorkerProcess) -> None:
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        shared = (self.shared_fd, *(fd for pipe in self.wake_pipes for fd in pipe))
        try:
            w.process = await asyncio.create_subprocess_exec(
                *self.argv(child.fileno()), pass_fds=(child.fileno(), *shared)
            )
        finally:
            child.close()
        w.channel = channel = await Channel.open(parent)
        w.applied = self.seq
        channel.send(
            Start(
                w.index,
                self.runtime.settings,
                self.routes,
                tuple(self.endpoints.values()),
                self.hooks,
                self.seq,
                self.listen,
                self.tls_listen,
                *self.log_setup,
                certificates=self.runtime.certificates,
                shared_fd=self.shared_fd,
                wake_fds=tuple(self.wake_pipes),
            )
        )
        message = await self._until_ready(w, channel)
        if not isinstance(message, Ready):
            channel.close()
            with contextlib.suppress(ProcessLookupError):
                w.process.kill()
            code = await w.process.wait()
            raise OSError(f"worker {w.index} exited with {code} before listening")
        w.ready = True

    async def _until_ready(self, w: WorkerProcess, channel: Channel) -> Ready | None:
        """Wait for ``w``'s Ready (what it sends before, e.g. its first busy/idle edges, is
        taken as usual); None when it exits or ``START_TIMEOUT_S`` passes first."""
        try:
            async with asyncio.timeout(START_TIMEOUT_S):
                while True:
                    message = await channel.receive()
                    if isinstance(message, Ready):
                        return message
                    if isinstance(message, Report):
                        self._absorb(w, message)
                    elif isinstance(message, Event):
                        self._relay(w, message)
        except (EOFError, TimeoutError):
            return None

    async def _supervise(self, w: WorkerProcess) -> None:
        failures = 0
        while True:
            if w.ready:
                failures = 0
                await self._read(w)
            process = w.process
            code = None if process is None else await process.wait()
            self._retire(w)
            if self.stopping:
                return
            delay = RESTART_BACKOFF_S[min(failures, len(RESTART_BACKOFF_S) - 1)]
            log.warning(
                "data-plane worker %d (pid %s) exited with %s: restarting it in %gs",
                w.index,
                w.pid,
                code,
                delay,
            )
            await asyncio.sleep(delay)
            if self.stopping:
                return
            w.restarts += 1
            try:
                await self._spawn(w)
            except OSError as e:
                failures += 1
                log.error("data-plane worker %d did not restart: %s", w.index, e)
                continue
            log.info("data-plane worker %d restarted (pid %s)", w.index, w.pid)

    async def _read(self, w: WorkerProcess) -> None:
        assert w.channel is not None
        while True:
            try:
                message = await w.channel.receive()
            except EOFError:
                return
            if isinstance(message, Report):
                self._absorb(w, message)
            elif isinstance(message, Event):
                self._relay(w, message)

    def _retire(self, w: WorkerProcess) -> None:
        """``w`` is gone: its requests in flight are over, its counts stay in the totals."""
        w.ready = False
        if w.channel is not None:
            w.channel.close()
            w.channel = None
        now = asyncio.get_running_loop().time()
        for name, state in w.stats.items():
            old = self._retired.get(name)
            parts = [state.retired(now)] if old is None else [old, state.retired(now)]
            self._retired[name] = ServiceStats.merged(name, parts).state()
        for name, a in w.admission.items():
            kept = self._retired_admission.get(name)
            self._retired_admission[name] = sum_admission(
                [a.retired()] if kept is None else [kept, a.retired()]
            )
        self._retired_unmatched += w.unmatched
        # Its slots, queue places and grants in the shared admission are free again (a
        # worker killed with requests in flight never gave them back itself).
        self.shared.reset_worker(
            w.index, [(n, s.admission.capacity) for n, s in self.runtime.services.items()]
        )
        names = set(w.stats) | set(w.admission) | w.busy
        w.stats, w.admission, w.in_flight, w.unmatched = {}, {}, {}, 0
        busy, w.busy = w.busy, set()
        replicas, w.replicas_busy = w.replicas_busy, set()
        for name in names:
            self._merge(name)
        for name in busy:
            self._busy_edge(name)
        for name, address in replicas:
            self._replica_edge(name, address)
        for token, (waiting, done) in list(self._collecting.items()):
            waiting.discard(w.index)
            if not waiting and not done.done():
                done.set_result(None)
                del self._collecting[token]

    async def stop(self, drain_s: float) -> None:
        """Every worker stops accepting and drains for up to ``drain_s`` (killed
        ``STOP_GRACE_S`` later), then the reserved ports are released."""
        self.stopping = True
        for w in self.slots:
            if w.channel is not None:
                w.channel.send(Stop(drain_s))
        for w in self.slots:
            if w.process is None:
                continue
            try:
                await asyncio.wait_for(w.process.wait(), drain_s + STOP_GRACE_S)
            except TimeoutError:
                log.warning("data-plane worker %d did not exit: killing it", w.index)
                with contextlib.suppress(ProcessLookupError):
                    w.process.kill()
                await w.process.wait()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        for w in self.slots:
            if w.process is not None and w.process.returncode is None:  # caught restarting
                with contextlib.suppress(ProcessLookupError):
                    w.process.kill()
                await w.process.wait()
            if w.channel is not None:
                w.channel.close()
                w.channel = None
        for sock in self._reserved:
            sock.close()
        self._reserved = []

    def close(self) -> None:
        """Release the shared admission file and the wake pipes (after :meth:`stop`)."""
        self.shared.close()
        for fd in (self.shared_fd, *(fd for pipe in self.wake_pipes for fd in pipe)):
            with contextlib.suppress(OSError):
                os.close(fd)
        self.wake_pipes = []

    def signal(self, sig: signal.Signals) -> None:
        """Send ``sig`` to every worker (SIGUSR1: reopen the access log)."""
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)

    # -- workers -> main ----------------------------------------------------------------

    def _absorb(self, w: WorkerProcess, report: Report) -> None:
        w.applied = report.applied
        w.in_flight = report.endpoints_in_flight
        w.unmatched = report.unmatched_total
        w.stats.update(report.stats)
        w.admission.update(report.admission)
        w.app.update(report.app)
        for name in report.stats.keys() | report.admission.keys():
            self._merge(name)
        if report.token:
            w.token = max(w.token, report.token)
            for token, (waiting, done) in list(self._collecting.items()):
                if token <= report.token:
                    waiting.discard(w.index)
                    if not waiting:
                        if not done.done():
                            done.set_result(None)
                        del self._collecting[token]

    def _merge(self, name: str) -> None:
        """The main runtime's view of ``name``: every worker's counters summed."""
        service = self.runtime.services.get(name)
        if service is None:
            return
        states = [w.stats[name] for w in self.slots if name in w.stats]
        retired = self._retired.get(name)
        if retired is not None:
            states.append(retired)
        old = service.stats
        service.stats = ServiceStats.merged(name, states, old.rate_window_s, old.latency_window_s)
        if service.app_headers is not None:
            service.app_headers.absorb([w.app[name] for w in self.slots if name in w.app])
        parts = [w.admission[name] for w in self.slots if name in w.admission]
        kept = self._retired_admission.get(name)
        if kept is not None:
            parts.append(kept)
        total = sum_admission(parts)
        admission = service.admission
        admission.in_use = total.in_use
        admission.queued = total.queued
        for code in admission.rejected:
            admission.rejected[code] = total.rejected.get(code, 0)
        if len(total.wait_counts) == len(admission.wait_counts):
            admission.wait_counts = total.wait_counts
        admission.wait_sum_s = total.wait_sum_s
        service.retry_budget.started_total = total.retries_started
        service.retry_budget.denied_total = total.retries_denied
        service.outlier.ejections_total = total.ejections_total

    def _relay(self, w: WorkerProcess, event: Event) -> None:
        name = event.service
        service = self.runtime.services.get(name)
        if service is None:
            return
        admission = service.admission
        if event.kind == "wake":
            if self.wake is not None:
                self.wake()
        elif event.kind == "hold":
            if admission.on_hold is not None:
                admission.on_hold()
        elif event.kind in ("busy", "idle") and event.address is not None:
            key = (name, event.address)
            if event.kind == "busy":
                w.replicas_busy.add(key)
            else:
                w.replicas_busy.discard(key)
            # a worker reports an endpoint idle once it has been idle there for the hold
            self._replica_edge(name, event.address, held=event.kind == "idle")
        elif event.kind in ("busy", "idle"):
            if event.kind == "busy":
                w.busy.add(name)
            else:
                w.busy.discard(name)
            self._busy_edge(name)

    def _busy_edge(self, name: str) -> None:
        busy = any(name in w.busy for w in self.slots)
        if self._busy.get(name, False) == busy:
            return
        self._busy[name] = busy
        service = self.runtime.services.get(name)
        if service is not None and service.admission.on_busy_change is not None:
            service.admission.on_busy_change(busy)

    def _replica_edge(self, name: str, address: str, *, held: bool = False) -> None:
        """An endpoint is busy while any worker has a request in flight to it (as far as the
        workers report: each one only around gaps of ``budget.lend_after_idle_s``); ``held``:
        an idle edge whose hold has passed already."""
        key = (name, address)
        busy = any(key in w.replicas_busy for w in self.slots)
        if (key in self._replicas_busy) == busy:
            return
        if busy:
            self._replicas_busy.add(key)
        else:
            self._replicas_busy.discard(key)
        service = self.runtime.services.get(name)
        if service is not None and service.endpoints.on_busy is not None:
            service.endpoints.on_busy(address, busy, held)

    # -- what the main runtime and the admin plane read ---------------------------------

    async def collect(self) -> None:
        """Fresh reports from every worker (up to ``COLLECT_TIMEOUT_S``): what the admin plane
        shows right after requests finished counts them."""
        live = {w.index for w in self.slots if w.ready and w.channel is not None}
        if not live:
            return
        token = next(self._tokens)
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._collecting[token] = (live, done)
        for w in self.slots:
            if w.index in live and w.channel is not None:
                w.channel.send(Collect(token))
        try:
            await asyncio.wait_for(asyncio.shield(done), COLLECT_TIMEOUT_S)
        except TimeoutError:
            log.warning("workers %s did not report in time", sorted(live))
        finally:
            self._collecting.pop(token, None)

    def drained(self, service: str, address: str) -> bool:
        """Every worker applied every update sent so far and has no request in flight to
        ``address`` (the main runtime's endpoint set drains at once: it sends none)."""
        return all(
            w.applied >= self.seq and (service, address) not in w.in_flight
            for w in self.slots
            if w.ready
        )

    def endpoint_in_flight(self, service: str, address: str) -> int:
        return sum(w.in_flight.get((service, address), 0) for w in self.slots)

    @property
    def unmatched_total(self) -> int:
        return self._retired_unmatched + sum(w.unmatched for w in self.slots)

    def report(self) -> list[dict[str, Any]]:
        return [
            {
                "index": w.index,
                "pid": w.pid,
                "ready": w.ready,
                "restarts": w.restarts,
                "arrivals_total": sum(s.arrivals_total for s in w.stats.values()),
            }
            for w in self.slots
        ]

    def route(self) -> Route:
        """``GET /api/workers``: each worker's index, pid, readiness, restarts and requests
        (fresh: every worker reports first, as for ``/api/services``)."""

        async def workers(request: Request) -> Response:
            await self.collect()
            return JSONResponse({"workers": self.report()})

        return Route("/api/workers", workers)
