"""Outbound HTTP/1.1: one keep-alive connection per :class:`UpstreamConnection`, pooled per endpoint.

A connection is an ``asyncio.Protocol`` with an ``httptools.HttpResponseParser``; while it
serves a request it is bound to that request's :class:`~gateway.dataplane.forward.Exchange`
and forwards every parser callback and flow-control event to it.  Idle connections wait in
their endpoint's :class:`EndpointConnections` (LIFO, bounded, with an idle timeout shorter
than common upstream keep-alive timeouts so a reused connection is rarely a closed one).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from typing import TYPE_CHECKING, cast

import httptools

if TYPE_CHECKING:
    from gateway.dataplane.forward import Exchange

MAX_IDLE_PER_ENDPOINT = 256
IDLE_TIMEOUT_S = 4.0
WRITE_BUFFER_HIGH = 256 * 1024
WRITE_BUFFER_LOW = 64 * 1024


class UpstreamConnection(asyncio.Protocol):
    __slots__ = (
        "closed",
        "exchange",
        "idle_since",
        "parser",
        "pool",
        "read_paused",
        "transport",
        "write_paused",
    )

    def __init__(self, pool: EndpointConnections) -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.exchange: Exchange | None = None
        self.closed = False
        self.write_paused = False
        self.read_paused = False
        self.idle_since = 0.0

    # -- asyncio.Protocol ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, transport)  # uvloop's transports are not subclasses
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):  # not TCP: nothing to tune
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        transport.set_write_buffer_limits(WRITE_BUFFER_HIGH, WRITE_BUFFER_LOW)

    def data_received(self, data: bytes) -> None:
        exchange = self.exchange
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            exchange = self.exchange
            self.abort()
            if exchange is not None:
                exchange.upstream_bad_response()
            return
        if exchange is not None and exchange.wbuf:
            exchange.flush()  # one write per upstream read, head and body together

    def eof_received(self) -> bool | None:
        return None  # close; connection_lost tells the exchange

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        exchange = self.exchange
        if exchange is not None:
            self.exchange = None
            exchange.upstream_lost()
        else:
            self.pool.discard(self)

    def pause_writing(self) -> None:
        self.write_paused = True
        if self.exchange is not None:
            self.exchange.upstream_write_paused()

    def resume_writing(self) -> None:
        self.write_paused = False
        if self.exchange is not None:
            self.exchange.upstream_write_resumed()

    # -- httptools callbacks (forwarded to the bound exchange) -----------------------------

    # No on_message_begin/on_status: each callback costs a Python call per response, and
    # the reason phrase is rebuilt from the status code (RFC 9112 §4: clients ignore it).

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.exchange is not None:
            self.exchange.resp_headers.append((name, value))

    def on_headers_complete(self) -> None:
        if self.exchange is not None:
            self.exchange.on_upstream_headers(self.parser.get_status_code())
        else:  # a response nobody asked for: this connection is unusable
            self.abort()

    def on_body(self, body: bytes) -> None:
        if self.exchange is not None:
            self.exchange.on_upstream_body(body)

    def on_message_complete(self) -> None:
        if self.exchange is not None:
            self.exchange.on_upstream_complete()

    # -- control ---------------------------------------------------------------------------

    def pause_reading(self) -> None:
        if not self.read_paused and self.transport is not None and not self.closed:
            self.read_paused = True
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.read_paused and self.transport is not None and not self.closed:
            self.read_paused = False
            self.transport.resume_reading()

    def close(self) -> None:
        """Close an idle connection politely (FIN); ``connection_lost`` follows."""
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def abort(self) -> None:
        """Drop the connection at once (never reused); ``connection_lost`` follows."""
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    def __repr__(self) -> str:
        state = "closed" if self.closed else ("busy" if self.exchange else "idle")
        return f"UpstreamConnection({self.pool.address}, {state})"


class EndpointConnections:
    """Idle keep-alive connections to one endpoint (the endpoint's ``pool``)."""

    __slots__ = ("address", "closed", "host", "idle", "port")

    def __init__(self, host: str, port: int, address: str) -> None:
        self.host = host
        self.port = port
        self.address = address
        self.idle: list[UpstreamConnection] = []
        self.closed = False

    def take(self, now: float) -> UpstreamConnection | None:
        """The most recently used idle connection, or None (then the caller connects)."""
        idle = self.idle
        while idle:
            conn = idle.pop()
            if conn.closed:
                continue
            if now - conn.idle_since > IDLE_TIMEOUT_S:
                conn.abort()
                continue
            return conn
        return None

    def put(self, conn: UpstreamConnection, now: float) -> None:
        """Return a connection whose last exchange completed cleanly."""
        conn.exchange = None
        if conn.read_paused:
            conn.resume_reading()  # watch for the upstream closing it while idle
        if self.closed or conn.closed or len(self.idle) >= MAX_IDLE_PER_ENDPOINT:
            conn.abort()
            return
        conn.idle_since = now
        self.idle.append(conn)

    def expire(self, now: float) -> None:
        """Close connections idle longer than ``IDLE_TIMEOUT_S`` (oldest are first in the list)."""
        idle = self.idle
        cutoff = now - IDLE_TIMEOUT_S
        n = 0
        while n < len(idle) and idle[n].idle_since < cutoff:
            idle[n].close()
            n += 1
        if n:
            del idle[:n]

    def discard(self, conn: UpstreamConnection) -> None:
        with contextlib.suppress(ValueError):
            self.idle.remove(conn)

    def close(self) -> None:
        """Close every idle connection; busy ones are closed when their exchange ends."""
        self.closed = True
        idle, self.idle = self.idle, []
        for conn in idle:
            conn.close()

    def __repr__(self) -> str:
        return f"EndpointConnections({self.address}, {len(self.idle)} idle)"
