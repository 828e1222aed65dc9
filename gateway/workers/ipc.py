"""The messages between the main process and a data-plane worker, and the channel (a Unix
socket pair, length-prefixed pickles: both ends are this program) that carries them."""

from __future__ import annotations

import asyncio
import pickle
import socket
import struct
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gateway.dataplane.app_metrics import AppState
from gateway.dataplane.stats import StatsState
from gateway.dataplane.updates import CertificatesUpdate, EndpointUpdate, RoutesUpdate

if TYPE_CHECKING:
    from gateway.settings import Settings

MAX_FRAME_BYTES = 64 * 1024 * 1024
_HEADER = struct.Struct("!I")


@dataclass(frozen=True, slots=True)
class Hooks:
    """What the main process wants to hear from a worker's admissions, per service."""

    wake_levels: dict[str, float] = field(default_factory=dict)
    """Per-worker early-wake level (``Decision.wake_concurrency`` / N); absent = disarmed."""
    hold: frozenset[str] = frozenset()
    """Services that hold requests while they have no endpoint (scale from zero)."""
    busy: frozenset[str] = frozenset()
    """Services whose busy/idle edges are wanted (CPU lending on ``local``)."""
    replica_busy: frozenset[str] = frozenset()
    """Services whose endpoints' busy/idle edges are wanted (CPU lending per replica)."""


@dataclass(frozen=True, slots=True)
class Start:
    """The first message to a worker: everything it needs to serve."""

    index: int
    settings: Settings
    routes: RoutesUpdate
    endpoints: tuple[EndpointUpdate, ...]
    hooks: Hooks
    seq: int
    listen: tuple[str, int]
    tls_listen: tuple[str, int] | None
    log_level: str = "info"
    log_format: str = "text"
    certificates: CertificatesUpdate = field(default_factory=CertificatesUpdate)
    """The platform's TLS certificates (Kubernetes: the Ingresses' TLS Secrets)."""
    shared_fd: int = -1
    """The shared admission file (``gateway.dataplane.shared_admission``); -1: none."""
    wake_fds: tuple[tuple[int, int], ...] = ()
    """Per worker index, (read, write) ends of its wake pipe (a slot was granted to it)."""


@dataclass(frozen=True, slots=True)
class Update:
    """A change the main process applied, to apply the same way (``seq`` orders them)."""

    seq: int
    change: Settings | RoutesUpdate | EndpointUpdate | CertificatesUpdate | Hooks


@dataclass(frozen=True, slots=True)
class Collect:
    """Send a :class:`Report` now (the admin plane is about to answer)."""

    token: int


@dataclass(frozen=True, slots=True)
class Stop:
    """Stop accepting, drain in-flight requests for up to ``drain_s``, exit."""

    drain_s: float


@dataclass(frozen=True, slots=True)
class Ready:
    """The worker listens."""

    pid: int


@dataclass(frozen=True, slots=True)
class AdmissionState:
    """A worker's admission, retry and ejection figures for one service (beside its
    :class:`~gateway.dataplane.stats.StatsState`)."""

    in_use: int
    queued: int
    rejected: dict[str, int]
    wait_counts: list[int]
    wait_sum_s: float
    retries_started: int
    retries_denied: int
    ejections_total: int

    def retired(self) -> AdmissionState:
        """Of a worker that is gone: the counts kept, nothing in use or queued."""
        return AdmissionState(
            0,
            0,
            self.rejected,
            self.wait_counts,
            self.wait_sum_s,
            self.retries_started,
            self.retries_denied,
            self.ejections_total,
        )


def sum_admission(parts: list[AdmissionState]) -> AdmissionState:
    """Several workers' figures as one (counts and gauges summed)."""
    rejected: dict[str, int] = {}
    waits: list[int] = []
    for a in parts:
        for code, n in a.rejected.items():
            rejected[code] = rejected.get(code, 0) + n
        if len(waits) < len(a.wait_counts):
            waits.extend([0] * (len(a.wait_counts) - len(waits)))
        for i, n in enumerate(a.wait_counts):
            waits[i] += n
    return AdmissionState(
        sum(a.in_use for a in parts),
        sum(a.queued for a in parts),
        rejected,
        waits,
        sum(a.wait_sum_s for a in parts),
        sum(a.retries_started for a in parts),
        sum(a.retries_denied for a in parts),
        sum(a.ejections_total for a in parts),
    )


@dataclass(frozen=True, slots=True)
class Report:
    """A worker's counters: only the services that changed since its last report."""

    applied: int
    """The ``seq`` of the last update applied."""
    stats: dict[str, StatsState]
    admission: dict[str, AdmissionState]
    endpoints_in_flight: dict[tuple[str, str], int]
    """(service, address) -> requests in flight, for every endpoint with any (complete)."""
    unmatched_total: int
    token: int = 0
    """The :class:`Collect` this answers (0: a periodic report)."""
    app: dict[str, AppState] = field(default_factory=dict)
    """``scaling.metrics`` app metrics read from response headers, per service that has any."""


@dataclass(frozen=True, slots=True)
class Event:
    """An admission edge: ``wake`` (early tick), ``hold`` (scale from zero), ``busy``/``idle``;
    or an endpoint's (``address``): ``busy``/``idle`` when its in-flight count leaves or
    returns to 0 in this worker."""

    kind: str
    service: str
    address: str | None = None


Message = Start | Update | Collect | Stop | Ready | Report | Event


class Channel:
    """One end of a worker's socket pair."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def open(cls, sock: socket.socket) -> Channel:
        reader, writer = await asyncio.open_unix_connection(sock=sock)
        return cls(reader, writer)

    def send(self, message: Message) -> None:
        """Queue ``message`` (written by the event loop; a closed peer is not an error here)."""
        if self.writer.is_closing():
            return
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        self.writer.write(_HEADER.pack(len(data)) + data)

    async def receive(self) -> Message:
        """The next message; EOFError when the peer closed."""
        try:
            (size,) = _HEADER.unpack(await self.reader.readexactly(_HEADER.size))
            if size > MAX_FRAME_BYTES:
                raise EOFError(f"frame of {size} bytes")
            message: Message = pickle.loads(await self.reader.readexactly(size))
        except (asyncio.IncompleteReadError, ConnectionError) as e:
            raise EOFError(str(e)) from None
        return message

    def close(self) -> None:
        self.writer.close()

    def __repr__(self) -> str:
        return f"Channel(closing={self.writer.is_closing()})"
