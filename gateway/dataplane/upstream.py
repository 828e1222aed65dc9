"""Outbound HTTP/1.1: one keep-alive connection per :class:`UpstreamConnection`, pooled per endpoint.

A connection is an ``asyncio.Protocol`` with an ``httptools.HttpResponseParser``; while it
serves a request it is bound to that request's :class:`~gateway.dataplane.forward.Exchange`
and forwards every parser callback and flow-control event to it.  Idle connections wait in
their endpoint's :class:`EndpointConnections` (LIFO, bounded, with an idle timeout shorter
than common upstream keep-alive timeouts so a reused connection is rarely a closed one).

Response heads are handed over raw: the parser has no ``on_header`` callback (one Python
call per field per response); when it reports a complete head, the head's bytes are cut
from what was read (llhttp only accepts CRLF line ends in a response head, so the head is
everything up to the first CRLF CRLF) and the exchange rewrites them through a cache keyed
by those bytes (``HeadCache.response``).  A head split across reads is kept until it
completes, up to ``MAX_RESPONSE_HEAD_BYTES``.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, cast

import httptools

if TYPE_CHECKING:
    from gateway.dataplane.forward import Exchange
    from gateway.dataplane.tunnel import Tunnel

MAX_IDLE_PER_ENDPOINT = 256
IDLE_TIMEOUT_S = 4.0
WRITE_BUFFER_HIGH = 256 * 1024
WRITE_BUFFER_LOW = 64 * 1024
MAX_RESPONSE_HEAD_BYTES = 64 * 1024
"""A response head larger than this is a bad response (502), like Envoy's 60 KiB default."""


class UpstreamConnection(asyncio.Protocol):
    __slots__ = (
        "closed",
        "data",
        "exchange",
        "head_from",
        "idle_since",
        "in_head",
        "interim",
        "parser",
        "partial",
        "pool",
        "read_paused",
        "transport",
        "tunnel",
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
        self.data = b""
        """This read's bytes (the bound exchange's: ``Exchange.bind`` empties it)."""
        self.head_from = 0
        """Where the response head being parsed starts in ``data`` (-1: not a response of ours)."""
        self.partial = b""
        """The start of a response head whose end has not arrived yet."""
        self.in_head = True
        """Between messages or inside a head (not inside a body)."""
        self.interim = False
        """The message being parsed is a 1xx (no body: the final head follows it)."""
        self.tunnel: Tunnel | None = None
        """Set when the upstream switched protocols (101): reads go to the tunnel."""

    # -- asyncio.Protocol ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, transport)  # uvloop's transports are not subclasses
        self.transport = transport
        # TCP_NODELAY: uvloop and asyncio set it on every TCP transport they make
        transport.set_write_buffer_limits(WRITE_BUFFER_HIGH, WRITE_BUFFER_LOW)

    def data_received(self, data: bytes) -> None:
        exchange = self.exchange
        if exchange is None:  # bytes on an idle connection: nobody asked, it is unusable
            if self.tunnel is not None:
                self.tunnel.from_upstream(data)
            else:
                self.abort()
            return
        partial = self.partial
        if partial:  # a head continues: cut it from partial + data
            self.partial = b""
            self.data = partial + data
        else:
            self.data = data
        self.head_from = 0
        try:
            self.parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade):
            if self.tunnel is not None:  # switched protocols: the rest of the read is theirs
                rest = self.data[self.head_from :]
                if rest:
                    self.tunnel.from_upstream(rest)
                return
            # A parse error, or a 101 nobody asked for (llhttp stops at it): a bad response.
            exchange = self.exchange
            self.abort()
            if exchange is not None:
                exchange.upstream_bad_response()
            return
        if self.in_head and self.head_from >= 0 and self.exchange is not None:
            self._keep_partial()
        if exchange.wbuf:
            exchange.flush(len(data))  # one write per upstream read, head and body together

    def _keep_partial(self) -> None:
        """The read ended inside a response head: keep its start for the next read."""
        partial = self.data[self.head_from :]
        if len(partial) > MAX_RESPONSE_HEAD_BYTES:
            exchange = self.exchange
            self.abort()
            if exchange is not None:
                exchange.upstream_bad_response()
            return
        self.partial = partial

    def eof_received(self) -> bool | None:
        if self.tunnel is not None:
            return self.tunnel.upstream_eof_received()
        return None  # close; connection_lost tells the exchange

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        exchange = self.exchange
        if exchange is not None:
            self.exchange = None
            exchange.upstream_lost(bool(self.data))
        elif self.tunnel is not None:
            self.tunnel.lost()
        else:
            self.pool.discard(self)

    def pause_writing(self) -> None:
        self.write_paused = True
        if self.exchange is not None:
            self.exchange.upstream_write_paused()
        elif self.tunnel is not None:
            self.tunnel.upstream_write_paused()

    def resume_writing(self) -> None:
        self.write_paused = False
        if self.exchange is not None:
            self.exchange.upstream_write_resumed()
        elif self.tunnel is not None:
            self.tunnel.upstream_write_resumed()

    # -- httptools callbacks (forwarded to the bound exchange) -----------------------------

    # No on_message_begin/on_status/on_header: each callback costs a Python call per
    # response (per field for on_header); the head is taken raw (see the module docstring)
    # and the reason phrase is rebuilt from the status code (RFC 9112 §4: clients ignore it).

    def on_headers_complete(self) -> None:
        self.in_head = False
        exchange = self.exchange
        start = self.head_from
        if exchange is None or start < 0:  # a response nobody asked for: unusable
            self.abort()
            return
        data = self.data
        end = data.find(b"\r\n\r\n", start) + 2  # llhttp has checked the CRLFs
        if end == 1 or end - start > MAX_RESPONSE_HEAD_BYTES:
            self.abort()
            exchange.upstream_bad_response()
            return
        status = self.parser.get_status_code()
        self.interim = status < 200
        self.head_from = end + 2
        exchange.on_upstream_headers(status, data[start:end])
        if self.tunnel is not None:
            raise _Switched  # stop parsing: what follows the head is the new protocol's

    def on_body(self, body: bytes) -> None:
        exchange = self.exchange
        if exchange is not None:
            exchange.on_upstream_body(body)

    def on_message_complete(self) -> None:
        self.in_head = True
        if not self.interim:
            self.head_from = -1  # more bytes in this read would be a response nobody asked for
        exchange = self.exchange
        if exchange is not None:
            exchange.on_upstream_complete()

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


class _Switched(Exception):
    """Stops the response parser at a 101 the exchange took (see ``Exchange.on_upstream_headers``)."""


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
