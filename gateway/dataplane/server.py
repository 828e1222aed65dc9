"""Inbound HTTP/1.1: the data plane's listener and one :class:`ClientConnection` per client.

A client connection is an ``asyncio.Protocol`` driving an ``httptools.HttpRequestParser``;
each parsed request becomes an :class:`~gateway.dataplane.forward.Exchange`.  Keep-alive
and pipelining are supported: a request that arrives while the previous response is still
going out waits (its body buffered up to a bound, then reading pauses) and starts when the
previous exchange ends, so responses leave in request order.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import socket
from collections import deque
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Protocol, cast

import httptools

from gateway.dataplane.errors import Cause, HttpDate, error_response
from gateway.dataplane.forward import PAUSE_BACKPRESSURE, PAUSE_BUFFER, Exchange
from gateway.dataplane.upstream import WRITE_BUFFER_HIGH, WRITE_BUFFER_LOW
from gateway.routing import RouteTable
from gateway.service import Service

if TYPE_CHECKING:
    from gateway.telemetry.requests import RequestTracing

log = logging.getLogger(__name__)

SWEEP_S = 0.05
"""How often in-flight exchanges are checked against their deadlines (timeout precision)."""


class Routing(Protocol):
    """What the data plane reads per request (the runtime swaps ``routes`` whole)."""

    @property
    def routes(self) -> RouteTable: ...

    @property
    def services(self) -> Mapping[str, Service]: ...


class ClientConnection(asyncio.Protocol):
    __slots__ = (
        "broken",
        "closed",
        "current",
        "dp",
        "headers",
        "parser",
        "parsing",
        "pause_bits",
        "peer_ip",
        "pending",
        "transport",
        "trusted",
        "upgraded",
        "url",
        "write_paused",
    )

    def __init__(self, dp: DataPlane) -> None:
        self.dp = dp
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport = None  # type: ignore[assignment]  # set in connection_made
        self.peer_ip = b""
        self.trusted = False
        self.current: Exchange | None = None
        """The exchange whose response is being produced."""
        self.parsing: Exchange | None = None
        """The exchange whose request is being parsed (the same one unless pipelined)."""
        self.pending: deque[Exchange] | None = None
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.pause_bits = 0
        self.write_paused = False
        self.closed = False
        self.broken = False
        self.upgraded = False

    # -- asyncio.Protocol ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, transport)  # uvloop's transports are not subclasses
        self.transport = transport
        peer = transport.get_extra_info("peername")
        ip = peer[0] if isinstance(peer, tuple) else ""
        self.peer_ip = ip.encode()
        self.trusted = self.dp.is_trusted(ip)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        transport.set_write_buffer_limits(WRITE_BUFFER_HIGH, WRITE_BUFFER_LOW)
        self.dp.connections.add(self)

    def data_received(self, data: bytes) -> None:
        if self.closed or self.upgraded:
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            # Upgrade is hop-by-hop and not forwarded: serve this request as plain HTTP
            # and close afterwards (the bytes after it are not HTTP).
            self.upgraded = True
            if self.current is None:
                self.close()
        except httptools.HttpParserError:
            self._bad_request()

    def eof_received(self) -> bool | None:
        # Like nginx, a client EOF during an exchange is taken as the client leaving (499):
        # the transport closes and connection_lost cancels the upstream request.
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.dp.connections.discard(self)
        self.pending = None
        current = self.current
        if current is not None:
            current.client_gone()

    def pause_writing(self) -> None:
        self.write_paused = True
        current = self.current
        if current is not None and current.upstream is not None:
            current.upstream.pause_reading()

    def resume_writing(self) -> None:
        self.write_paused = False
        current = self.current
        if current is not None and current.upstream is not None:
            current.upstream.resume_reading()

    # -- httptools callbacks ---------------------------------------------------------------

    def on_message_begin(self) -> None:
        self.url = b""
        self.headers = []

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        if self.closed or self.broken:
            return
        parser = self.parser
        exchange = Exchange(
            self,
            parser.get_method(),
            self.url,
            self.headers,
            keep_alive=parser.should_keep_alive(),
            http11=parser.get_http_version() == "1.1",
        )
        self.parsing = exchange
        if self.current is None:
            self.current = exchange
            exchange.start()
        else:
            if self.pending is None:
                self.pending = deque()
            self.pending.append(exchange)

    def on_body(self, body: bytes) -> None:
        exchange = self.parsing
        if exchange is not None:
            exchange.on_request_body(body)

    def on_message_complete(self) -> None:
        exchange = self.parsing
        if exchange is not None:
            self.parsing = None
            exchange.on_request_end()

    # -- used by Exchange -------------------------------------------------------------------

    def pause(self, bit: int) -> None:
        if not self.pause_bits and not self.closed:
            self.transport.pause_reading()
        self.pause_bits |= bit

    def unpause(self, bits: int) -> None:
        old = self.pause_bits
        if not old & bits:
            return
        self.pause_bits = new = old & ~bits
        if not new and not self.closed:
            self.transport.resume_reading()

    def exchange_done(self, exchange: Exchange) -> None:
        if self.current is exchange:
            self.current = None
        self.unpause(PAUSE_BUFFER | PAUSE_BACKPRESSURE)
        if self.closed:
            return
        if not exchange.keep_alive or self.broken or self.upgraded:
            self.close()
            return
        pending = self.pending
        if pending:
            nxt = pending.popleft()
            self.current = nxt
            nxt.start()

    def close(self) -> None:
        self.closed = True
        self.transport.close()

    def abort(self) -> None:
        self.closed = True
        self.transport.abort()

    def _bad_request(self) -> None:
        self.broken = True
        current = self.current
        if current is None:
            self.transport.write(error_response(Cause.BAD_REQUEST, self.dp.date.get(), close=True))
            self.close()
        elif self.parsing is current:
            current.keep_alive = False
            current.fail(Cause.BAD_REQUEST)
        # else: a later pipelined request is malformed; the current one completes, then close.

    def __repr__(self) -> str:
        return f"ClientConnection({self.peer_ip.decode()}, current={self.current!r})"


class DataPlane:
    """The proxy listener: owns client connections; reads routes and services per request."""

    def __init__(
        self,
        routing: Routing,
        trusted_proxies: Sequence[str] = (),
        loop: asyncio.AbstractEventLoop | None = None,
        tracing: RequestTracing | None = None,
    ) -> None:
        self.routing = routing
        self.tracing = tracing
        """Request tracing when on (``gateway.telemetry``); None costs one branch per request."""
        self.loop = loop or asyncio.get_running_loop()
        self.date = HttpDate()
        self.networks = [ipaddress.ip_network(n, strict=False) for n in trusted_proxies]
        self.connections: set[ClientConnection] = set()
        self.active: set[Exchange] = set()
        """Exchanges that reached a service and have not finished (swept for deadlines)."""
        self.server: asyncio.Server | None = None
        self.drained: asyncio.Event | None = None
        """Set while stopping, once no exchange is active."""
        self._sweeper: asyncio.TimerHandle | None = None

    def _sweep(self) -> None:
        now = self.loop.time()
        due = [ex for ex in self.active if ex.deadline_next <= now]
        for ex in due:
            ex.check(now)
        self._sweeper = self.loop.call_later(SWEEP_S, self._sweep)

    def is_trusted(self, ip: str) -> bool:
        if not self.networks or not ip:
            return False
        try:
            addr = ipaddress.ip_address(ip)
        except ValueError:
            return False
        return any(addr in net for net in self.networks)

    async def start(self, host: str, port: int) -> tuple[str, int]:
        """Listen; return the bound (host, port) (``port=0`` picks a free one)."""
        self.server = await self.loop.create_server(
            lambda: ClientConnection(self), host, port, backlog=2048, reuse_address=True
        )
        self._sweeper = self.loop.call_later(SWEEP_S, self._sweep)
        bound = self.server.sockets[0].getsockname()
        return str(bound[0]), int(bound[1])

    @property
    def active_exchanges(self) -> int:
        return sum(1 for c in self.connections if c.current is not None)

    def _stop_sweeping(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None

    async def stop(self, grace_s: float = 1.0) -> None:
        """Stop accepting, let in-flight exchanges finish for up to ``grace_s``, close the rest."""
        if self.server is not None:
            self.server.close()
        for conn in list(self.connections):
            if conn.current is None:
                conn.close()
        self.drained = asyncio.Event()
        if not self.active:
            self.drained.set()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.drained.wait(), grace_s)
        for conn in list(self.connections):
            conn.abort()
        for service in self.routing.services.values():
            for ep in service.endpoints.endpoints:
                if ep.pool is not None:
                    ep.pool.close()
                    ep.pool = None
        self._stop_sweeping()
        if self.server is not None:
            await self.server.wait_closed()
