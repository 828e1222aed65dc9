"""Inbound HTTP/1.1: the data plane's listener and one :class:`ClientConnection` per client.

A client connection is an ``asyncio.Protocol`` driving an ``httptools.HttpRequestParser``;
each parsed request becomes an :class:`~gateway.dataplane.forward.Exchange`.  Keep-alive
and pipelining are supported: a request that arrives while the previous response is still
going out waits (its body buffered up to a bound, then reading pauses) and starts when the
previous exchange ends, so responses leave in request order.

Request heads are taken raw, like response heads (``upstream.py``): the parser has no
``on_header`` callback; a head that arrives whole in one read is cut from the read's bytes
when it completes and its fields are looked up by those bytes (``HeadCache.raw_fields``).
A connection whose head is split across reads, or whose body is chunked (trailer fields),
re-parses that request with per-field callbacks and keeps them (``_parse_fields``).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
from collections import deque
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, NoReturn, Protocol, cast

import httptools

from gateway.dataplane.access_log import AccessLog
from gateway.dataplane.errors import Cause, HttpDate, error_response
from gateway.dataplane.forward import PAUSE_BACKPRESSURE, PAUSE_BUFFER, Exchange
from gateway.dataplane.h2server import PREFACE, H2Connection
from gateway.dataplane.headers import HeadCache
from gateway.dataplane.limits import (
    HeadLimits,
    RequestRejected,
    check_fields,
    check_request_line,
    origin_form,
)
from gateway.dataplane.outbox import Outbox
from gateway.dataplane.routing import RouteTable
from gateway.dataplane.service import Service
from gateway.dataplane.tls import AlpnDispatch, ProtocolFactory, TlsListener
from gateway.dataplane.tunnel import Tunnel
from gateway.dataplane.upstream import WRITE_BUFFER_HIGH, WRITE_BUFFER_LOW, EndpointConnections

if TYPE_CHECKING:
    from gateway.telemetry.requests import RequestTracing

log = logging.getLogger(__name__)

ROUTE_CACHE_MAX = 4096
"""Distinct (Host, path) pairs remembered per route table before the cache starts over."""
SWEEP_S = 0.05
"""How often in-flight exchanges are checked against their deadlines (timeout precision)."""
IDLE_SWEEP_EVERY = 20
"""Idle keep-alive connections are checked every this many sweeps (once a second)."""
LINGER_S = 2.0
"""After an error response, unread input is drained (not reset) for at most this long."""
LINGER_MAX_BYTES = 1 << 20
_SERVED_VERSIONS = frozenset({"1.1", "1.0"})


class Routing(Protocol):
    """What the data plane reads per request (the runtime swaps ``routes`` whole)."""

    @property
    def routes(self) -> RouteTable: ...

    @property
    def services(self) -> Mapping[str, Service]: ...


class ClientConnection(asyncio.Protocol):
    __slots__ = (
        "body_end",
        "broken",
        "closed",
        "current",
        "data",
        "dp",
        "error_cause",
        "head_deadline",
        "head_from",
        "head_left",
        "head_open",
        "headers",
        "last_active",
        "limits",
        "line_bytes",
        "lingering",
        "parser",
        "parsing",
        "pause_bits",
        "peer_ip",
        "pending",
        "raw",
        "refeed",
        "reject_cause",
        "tls",
        "transport",
        "trusted",
        "upgraded",
        "upgrading",
        "url",
        "write_paused",
    )

    def __init__(self, dp: DataPlane, tls: bool = False) -> None:
        self.dp = dp
        self.tls = tls
        """The connection came through the TLS listener (``X-Forwarded-Proto: https``)."""
        self.parser = _parser(self)
        self.raw = True
        """Heads are taken raw (the parser has no ``on_header``); False once the connection
        needed per-field callbacks (see ``_parse_fields``)."""
        self.refeed = False
        """``on_headers_complete`` stopped the raw parser to re-parse the head per field."""
        self.data = b""
        """This read's bytes (raw heads are cut from them)."""
        self.head_from = 0
        """Where the next request starts in ``data`` (raw heads: the parser's position at a
        message boundary; bodies are counted as ``on_body`` reports them)."""
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
        """The parser stopped at an upgrade request: no more HTTP on this connection."""
        self.upgrading: Exchange | None = None
        """The exchange of that request (it gets the bytes that follow: see ``Tunnel``)."""
        # -- issue 4: head limits, slow and idle clients, rejections
        self.head_open = False
        """A request head has begun and is not complete."""
        self.head_left = 0
        """Bytes the current head may still take (request line and fields as reported)."""
        self.limits = dp.limits
        """The head limits in force when the current message began (reload swaps dp's)."""
        self.line_bytes = 0
        """The incomplete line at the end of the last read (not yet reported by the parser)."""
        self.body_end = -1
        """Per-field heads: where the current Content-Length body ends, on the running count
        of body bytes (``head_from``); -1 for a chunked body (see ``_feed_fields``)."""
        self.head_deadline = 0.0
        self.last_active = 0.0
        self.reject_cause: Cause | None = None
        """Why a callback stopped the parser."""
        self.error_cause: Cause | None = None
        """A later pipelined request was refused: answered once the ones before it are done."""
        self.lingering = False

    # -- asyncio.Protocol ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, transport)  # uvloop's transports are not subclasses
        self.transport = transport
        peer = transport.get_extra_info("peername")
        ip = peer[0] if isinstance(peer, tuple) else ""
        self.peer_ip = ip.encode()
        self.trusted = self.dp.is_trusted(ip)
        # TCP_NODELAY: uvloop and asyncio set it on every TCP transport they make
        transport.set_write_buffer_limits(WRITE_BUFFER_HIGH, WRITE_BUFFER_LOW)
        self.dp.connections.add(self)
        self.last_active = self.dp.loop.time()

    def data_received(self, data: bytes) -> None:
        if self.closed or self.upgraded:
            if self.lingering:
                self._linger_read(len(data))
            elif self.upgrading is not None and not self.closed:
                self.upgrading.upgrade_data(data)
            return
        if self.raw:
            self.data = data
            self.head_from = 0
        tail = data  # the bytes fed last: an unfinished line at their end is counted
        try:
            try:
                if self.raw:
                    self.parser.feed_data(data)
                else:
                    tail = self._feed_fields(data)
            except httptools.HttpParserError:
                if not self.refeed:
                    raise
                self.refeed = False
                tail = self._parse_fields(data)
            else:
                if self.head_open and self.raw and not (self.broken or self.closed):
                    tail = self._parse_fields(data)  # the read ended inside a head
        except httptools.HttpParserUpgrade as e:
            # No more HTTP on this connection: an allowed upgrade goes to the upstream (the
            # bytes after the request go to its tunnel); otherwise the request is served as
            # plain HTTP without the Upgrade and the connection closes afterwards.
            self.upgraded = True
            if self.current is None:
                self.close()
            elif self.upgrading is not None and self.raw:
                rest = data[e.args[0] :] if e.args and isinstance(e.args[0], int) else b""
                if rest:
                    self.upgrading.upgrade_data(rest)
        except httptools.HttpParserError as e:
            if self.dp.h2c and self._take_h2c(data):
                return
            cause = self.reject_cause
            if cause is None and isinstance(e, httptools.HttpParserCallbackError):
                # Not the request's fault: one of the gateway's own callbacks raised (a
                # deliberate stop sets reject_cause first).  500, and the traceback logged.
                log.error("internal error on a request", exc_info=e.__context__ or e)
                cause = Cause.INTERNAL
            if cause is None and "PRI" in str(e):
                cause = Cause.VERSION_NOT_SUPPORTED
            elif cause is None:
                cause = self._limit_before_error(data) if self.raw else None
            self._reject(cause or Cause.BAD_REQUEST)
            return
        except RequestRejected as e:  # a head limit crossed between two steps of _feed_fields
            self._reject(e.cause)
            return
        if self.head_open:
            self._head_pending(tail)

    def _take_h2c(self, data: bytes) -> bool:
        """The HTTP/2 preface opened the connection (h2c by prior knowledge, ``listen.h2c``):
        hand the transport to an :class:`H2Connection`.  False if it is not a preface."""
        if self.current is not None or self.pending or not data.startswith(PREFACE[:16]):
            return False
        self.closed = True
        self.dp.connections.discard(self)
        h2conn = H2Connection(self.dp)
        self.transport.set_protocol(h2conn)
        h2conn.connection_made(self.transport)
        h2conn.data_received(data)
        return True

    def _parse_fields(self, data: bytes) -> bytes:
        """Re-parse the current request from its first byte with per-field callbacks, and
        keep doing so on this connection: its head is split across reads (the limits are
        then counted field by field as they arrive, see ``_head_pending``) or its body is
        chunked (trailer fields are counted and bounded the same way)."""
        self.raw = False
        self.head_open = False
        self.parser = _parser(_FieldCallbacks(self))
        return self._feed_fields(data[self.head_from :])

    # -- issue 4: head size and time limits -------------------------------------------------
    #
    # The answer must not depend on how TCP cuts the bytes (issue 20).  Fed byte by byte, a
    # head gets the answer of the first problem in byte order, as nginx gives it (it parses
    # only what fits its header buffers): a syntax error before a limit is crossed is 400, a
    # limit crossed before any syntax error is 414/431 whatever follows.  llhttp reports an
    # error without the spans before it, so a read is fed in steps that no limit can be
    # crossed inside of (``_room``), and a raw head that fails is replayed that way.

    def _room(self) -> int:
        """Bytes the parser may take before a head limit could be crossed (each byte adds at
        most 2 to what is counted: the target counts on the line and as the target)."""
        if not self.head_open:
            limits = self.dp.limits  # a head may begin at any byte (and take these limits)
            return min(limits.max_uri_bytes, limits.max_header_bytes - self.line_bytes)
        limits = self.limits
        return min(limits.max_uri_bytes - len(self.url), self.head_left - self.line_bytes)

    def _feed_fields(self, data: bytes) -> bytes:
        """Feed the per-field parser in steps of at most half the room left (so a limit is
        met where byte-by-byte reads would meet it); return the last step.  A Content-Length
        body in progress is one step up to its end (it is not counted, and smaller steps
        would cut its writes); a chunked one in steps that end at a blank line (CRLF CRLF:
        a chunked message can end only there, llhttp insists on CRLF) no more than half the
        room after the first one (so no head after the body gets more than that with it)."""
        parser = self.parser
        at = 0
        end = len(data)
        while True:
            if self.parsing is None or self.head_open:
                step = max(1, self._room() // 2)
            elif self.body_end >= 0:
                step = max(1, self.body_end - self.head_from)
            elif at == 0 and b"\n" in data[:3]:
                step = max(1, self._room() // 2)  # a blank line split by the read may end it
            else:
                blank = data.find(b"\r\n\r\n", max(at - 3, 0))
                if blank == -1:
                    break  # the body cannot end in this read: the rest in one piece
                last = data.rfind(b"\r\n\r\n", blank, blank + 4 + self._room() // 2)
                step = last + 4 - at
            if end - at <= step:
                break
            piece = data[at : at + step]
            parser.feed_data(piece)
            at += step
            if self.closed:
                return b""
            if self.head_open and self._head_excess(piece):
                raise RequestRejected(Cause.HEADERS_TOO_LARGE)
        if at:
            data = data[at:]
        parser.feed_data(data)
        return data

    def _limit_before_error(self, data: bytes) -> Cause | None:
        """A raw head failed to parse: the limit it crossed before its first syntax error,
        if any, found by replaying it (from ``head_from``) per field in steps.  Nothing is
        dispatched: the connection counts as broken while replaying."""
        parsing = self.parsing
        self.broken = True
        self.parsing = None
        self.raw = False
        self.head_open = False
        self.line_bytes = 0
        self.parser = _parser(_FieldCallbacks(self))
        cause: Cause | None = None
        try:
            self._feed_fields(data[self.head_from :])
        except httptools.HttpParserError:
            cause = self.reject_cause
        except RequestRejected as e:
            cause = e.cause
        self.broken = False
        self.parsing = parsing
        return cause

    def _head_excess(self, data: bytes) -> bool:
        """Count the unfinished line at the end of ``data``: is the head over its limits?"""
        i = data.rfind(b"\n")
        self.line_bytes = self.line_bytes + len(data) if i == -1 else len(data) - i - 1
        return self.line_bytes > self.head_left or len(self.headers) > self.limits.max_headers

    def _head_pending(self, data: bytes) -> None:
        """A head is still incomplete after this read: bound its size, its fields and its time."""
        if self._head_excess(data):
            self._reject(Cause.HEADERS_TOO_LARGE)
            return
        if not self.head_deadline:
            self.head_deadline = self.dp.loop.time() + self.dp.limits.header_timeout_s
            self.dp.slow_heads.add(self)

    def head_timed_out(self) -> None:
        self.dp.slow_heads.discard(self)
        self.head_deadline = 0.0
        if not self.closed:
            self._reject(Cause.HEAD_TIMEOUT)

    def _stop_parsing(self, cause: Cause) -> NoReturn:
        self.reject_cause = cause
        raise RequestRejected(cause)

    def eof_received(self) -> bool | None:
        if self.lingering:
            self.transport.close()
            return None
        upgrading = self.upgrading
        if upgrading is not None and upgrading.tunnel is not None:
            return upgrading.tunnel.client_eof_received()
        # Like nginx, a client EOF during an exchange is taken as the client leaving (499):
        # the transport closes and connection_lost cancels the upstream request.
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.dp.connections.discard(self)
        if self.head_deadline:
            self.dp.slow_heads.discard(self)
        self.pending = None
        current = self.current
        if current is not None:
            current.client_gone()

    def pause_writing(self) -> None:
        self.write_paused = True
        current = self.current
        if current is not None:
            current.pause_upstream_reading()

    def resume_writing(self) -> None:
        self.write_paused = False
        current = self.current
        if current is not None:
            current.resume_upstream_reading()

    # -- httptools callbacks ---------------------------------------------------------------

    # The limits are counted as the parser reports the head: the URI and the field bytes
    # per callback (the cheapest place: the lengths are at hand), the number of fields
    # (headers and trailers) once per read and once per head (len() of the list), and an
    # unfinished line by _head_pending.  Each callback runs per request, so they are kept
    # to a few operations.

    def on_message_begin(self) -> None:
        self.url = b""
        self.headers = []
        self.head_open = True
        limits = self.limits = self.dp.limits
        self.head_left = limits.max_header_bytes
        self.line_bytes = 0

    def on_url(self, url: bytes) -> None:
        self.url += url
        self.head_left -= len(url)
        if len(self.url) > self.limits.max_uri_bytes:
            self._stop_parsing(Cause.URI_TOO_LONG)

    def header_field(self, name: bytes, value: bytes) -> None:
        """``on_header``, for a connection that left raw heads (see ``_FieldCallbacks``)."""
        self.headers.append((name, value))
        left = self.head_left = self.head_left - len(name) - len(value) - 4
        if left < 0 or len(self.headers) > self.limits.max_headers:
            self._stop_parsing(Cause.HEADERS_TOO_LARGE)

    def on_headers_complete(self) -> None:
        self.head_open = False
        if self.head_deadline:
            self.head_deadline = 0.0
            self.dp.slow_heads.discard(self)
        if self.closed or self.broken:
            return
        heads = self.heads
        if self.raw:
            # Cut the head from this read (it is whole: a split head leaves raw heads);
            # llhttp skips empty lines before a request and has checked every CRLF.
            data = self.data
            start = self.head_from
            if data[start] in b"\r\n":
                start = len(data) - len(data[start:].lstrip(b"\r\n"))
            line_end = data.find(b"\n", start) - 1
            if data[line_end] != 13:  # CR
                # A bare LF ended the request line (llhttp takes it for HTTP/0.9): parsed
                # per field like a split head, so the answer does not depend on the cut.
                self.refeed = True
                self.head_from = start
                raise _Refeed
            major_1 = data[line_end - 3] == 49  # "HTTP/1.x" ends the line
            end = data.find(b"\r\n\r\n", line_end) + 2
            self.head_from = end + 2
            checked = heads.raw_fields(data[line_end + 2 : end], self.trusted)
            if checked.te:  # the body is chunked: its trailers are counted per field
                self.refeed = True
                self.head_from = start
                raise _Refeed
            headers = self.headers = checked.headers
            if len(self.url) + checked.field_bytes > self.limits.max_header_bytes:
                self._stop_parsing(Cause.HEADERS_TOO_LARGE)
        else:
            headers = self.headers
            checked = heads.fields(headers, self.trusted)
            major_1 = False  # the request line is gone: ask the parser
            length = -1 if checked.fields.chunked else checked.fields.declared_length or 0
            self.body_end = -1 if length < 0 else self.head_from + length
        if len(headers) > self.limits.max_headers:
            self._stop_parsing(Cause.HEADERS_TOO_LARGE)
        parser = self.parser
        method = parser.get_method()
        target = self.url
        keep_alive = parser.should_keep_alive()
        try:
            # llhttp keeps a connection alive by default only from HTTP/1.1 up (other versions
            # need a keep-alive token), so keep-alive without one and a major version of 1
            # (1.1 to 1.9, all served as 1.1) means 1.1: no need to ask (get_http_version
            # formats a new str per call, ~3 % of a request's work).
            if keep_alive and major_1 and not checked.keep_alive_token:
                version = "1.1"
            else:
                version = parser.get_http_version()
            # The common request line (origin-form, no fragment, HTTP/1.x) needs no checks.
            # (find, not `b"#" in target`: bytes.__contains__ first tries the operand as an
            # int and raises and clears a TypeError: ~2k instructions per request.)
            if (
                target[:1] != b"/"
                or target.find(b"#") != -1
                or version not in _SERVED_VERSIONS
                or method == b"CONNECT"
            ):
                version = check_request_line(method, target, version)
                if target[:1] != b"/" and target != b"*":  # absolute-form: fields checked first
                    check_fields(version, headers)
                    target, headers = origin_form(target, headers)
                    checked = heads.fields(headers, self.trusted)
            # The header set is checked once per distinct set and version.
            if version not in checked.passed:
                checked.check(version, headers)
        except RequestRejected as e:
            self._stop_parsing(e.cause)
        head = heads.head(method, target, checked.fields, self.peer_ip)
        exchange = Exchange(self, method, target, headers, head, keep_alive, version == "1.1")
        if parser.should_upgrade():
            self._upgrade_requested(exchange, method, version)
        if not head.has_body:  # the request is complete now (llhttp ends it without a body)
            exchange.req_done = True
        self.parsing = exchange
        if self.current is None:
            self.current = exchange
            exchange.start()
        else:
            if self.pending is None:
                self.pending = deque()
            self.pending.append(exchange)

    def _upgrade_requested(self, exchange: Exchange, method: bytes, version: str) -> None:
        """``Connection: upgrade`` with ``Upgrade``: offered to the service (``Exchange.start``)
        when it is an HTTP/1.1 request without a body."""
        if version != "1.1" or exchange.head.has_body or method == b"CONNECT":
            return
        values = [v for n, v in self.headers if n.lower() == b"upgrade"]
        if len(values) == 1 and values[0].strip():
            exchange.upgrade = values[0].strip()
            self.upgrading = exchange

    def on_body(self, body: bytes) -> None:
        self.head_from += len(body)  # raw heads: the next request starts after the body
        exchange = self.parsing
        if exchange is not None:
            exchange.on_request_body(body)

    def on_message_complete(self) -> None:
        if len(self.headers) > self.limits.max_headers:  # trailers count too
            self._stop_parsing(Cause.HEADERS_TOO_LARGE)
        exchange = self.parsing
        if exchange is not None:
            self.parsing = None
            if not exchange.req_done:
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

    def exchange_done(self, exchange: Exchange, now: float) -> None:
        if self.current is exchange:
            self.current = None
        if self.pause_bits:
            self.unpause(PAUSE_BUFFER | PAUSE_BACKPRESSURE)
        if self.closed:
            return
        self.last_active = now
        if not exchange.keep_alive or self.dp.stopping:
            if exchange.req_done:
                self.close()
            else:
                self.linger_close()
            return
        pending = self.pending
        if pending:
            nxt = pending.popleft()
            self.current = nxt
            nxt.start()
            return
        if self.broken:
            if self.error_cause is not None:
                self._answer_and_close(self.error_cause)
            else:
                self.close()
        elif self.upgraded:
            self.close()

    def close(self) -> None:
        self.closed = True
        outbox = self.dp.outbox
        if outbox.pending is not None:  # what is held for this client goes out first
            outbox.flush()
        self.transport.close()

    def abort(self) -> None:
        self.closed = True
        outbox = self.dp.outbox
        if outbox.pending is not None:
            outbox.flush()
        self.transport.abort()

    def _reject(self, cause: Cause) -> None:
        """The request being parsed is refused (malformed, too big, too slow)."""
        if self.broken:
            return
        self.broken = True
        if self.head_deadline:
            self.head_deadline = 0.0
            self.dp.slow_heads.discard(self)
        current = self.current
        parsing = self.parsing
        if current is None:
            self._answer_and_close(cause)
        elif parsing is current:
            current.keep_alive = False
            current.fail(cause)
        else:
            # A later pipelined request is refused: the ones before it complete first, then
            # it is answered and the connection closes.
            if parsing is not None and self.pending is not None and parsing in self.pending:
                self.pending.remove(parsing)
            self.parsing = None
            self.error_cause = cause

    def _answer_and_close(self, cause: Cause) -> None:
        access_log = self.dp.access_log
        if access_log is not None:
            # The method is known once the target began (else llhttp's default, not the client's).
            method = self.parser.get_method() if self.url else b""
            access_log.refused(self.peer_ip, cause, method, self.url)
        if not self.closed:
            self.dp.outbox.write(
                self.transport, error_response(cause, self.dp.date_value, close=True)
            )
            self.linger_close()

    def linger_close(self) -> None:
        """Close after a response while the client may still be sending: stop sending (FIN),
        read and drop what arrives for a while, then close — so the client reads the
        response instead of a reset."""
        if self.closed:
            return
        self.closed = True
        self.lingering = True
        self.line_bytes = 0
        self.pause_bits = 0
        transport = self.transport
        outbox = self.dp.outbox
        if outbox.pending is not None:  # the response goes out before the FIN
            outbox.flush()
        try:
            if transport.can_write_eof():
                transport.write_eof()
            transport.resume_reading()
        except (OSError, RuntimeError):
            transport.close()
            return
        self.dp.loop.call_later(LINGER_S, transport.close)

    def _linger_read(self, n: int) -> None:
        self.line_bytes += n
        if self.line_bytes > LINGER_MAX_BYTES:
            self.transport.close()

    @property
    def heads(self) -> HeadCache:
        """The data plane's head cache for this connection's scheme (reloads may swap it)."""
        return self.dp.heads_tls if self.tls else self.dp.heads

    def __repr__(self) -> str:
        return f"ClientConnection({self.peer_ip.decode()}, current={self.current!r})"


def _parser(callbacks: object) -> httptools.HttpRequestParser:
    """llhttp, lenient about the version digits only (``check_request_line`` decides)."""
    parser = httptools.HttpRequestParser(callbacks)
    parser.set_dangerous_leniencies(lenient_version=True)
    return parser


class _Refeed(Exception):
    """Stops the raw parser: the request is parsed again with per-field callbacks."""


class _FieldCallbacks:
    """The callbacks of a connection that takes heads field by field (``on_header``)."""

    __slots__ = (
        "on_body",
        "on_header",
        "on_headers_complete",
        "on_message_begin",
        "on_message_complete",
        "on_url",
    )

    def __init__(self, conn: ClientConnection) -> None:
        self.on_message_begin = conn.on_message_begin
        self.on_url = conn.on_url
        self.on_header = conn.header_field
        self.on_headers_complete = conn.on_headers_complete
        self.on_body = conn.on_body
        self.on_message_complete = conn.on_message_complete


class DataPlane:
    """The proxy listener: owns client connections; reads routes and services per request."""

    def __init__(
        self,
        routing: Routing,
        trusted_proxies: Sequence[str] = (),
        loop: asyncio.AbstractEventLoop | None = None,
        tracing: RequestTracing | None = None,
        limits: HeadLimits | None = None,
        *,
        h2c: bool = False,
    ) -> None:
        self.routing = routing
        self.h2c = h2c
        """HTTP/2 by prior knowledge on this listener (``listen.h2c``)."""
        self.tracing = tracing
        """Request tracing when on (``gateway.telemetry``); None costs one branch per request."""
        self.limits = limits or HeadLimits()
        """Head size/time limits (``limits`` in the config; swapped whole on reload)."""
        self.slow_heads: set[ClientConnection] = set()
        """Connections whose request head spans reads (checked against header_timeout_s)."""
        self.stopping = False
        self.unmatched_total = 0
        """Requests no route matched (answered 404 no-route)."""
        self._sweeps = 0
        self.loop = loop or asyncio.get_running_loop()
        self.date = HttpDate()
        self.date_value = self.date.get()
        """The ``Date`` header value, refreshed by the sweep (every ``SWEEP_S``)."""
        self.outbox = Outbox(self.loop)
        """Writes of one loop round, sent together at its end (fewer cross-CPU wake-ups)."""
        self.heads = HeadCache(underscores=self.limits.underscores_in_headers)
        """Memoised header rewriting (a repeated header set costs one dict lookup)."""
        self.heads_tls = HeadCache(underscores=self.limits.underscores_in_headers, proto=b"https")
        """The same for connections through the TLS listener."""
        self.tls: TlsListener | None = None
        self.tls_server: asyncio.Server | None = None
        self.tls_protocols: dict[str, ProtocolFactory] = {
            "http/1.1": lambda: ClientConnection(self, tls=True),
        }
        """What serves a TLS connection, by ALPN protocol name, most preferred first (the
        names are advertised in this order; no ALPN = ``http/1.1``)."""
        self.https_redirect: bytes | None = None
        """``redirect_http``: the port suffix (``b":8443"``, or ``b""`` for 443) of the https
        URL every plain request is sent to with 308; None serves plain requests."""
        self._route_table: RouteTable | None = None
        self._route_cache: dict[tuple[bytes, bytes], str | None] = {}
        self.networks = [ipaddress.ip_network(n, strict=False) for n in trusted_proxies]
        self.connections: set[ClientConnection | H2Connection] = set()
        self.access_log: AccessLog | None = None
        """The access log when on (set by the composition root); None costs one branch."""
        self.tunnels: set[Tunnel] = set()
        """Upgraded connections (WebSockets), swept for their service's idle timeout."""
        self.active: set[Exchange] = set()
        """Exchanges that reached a service and have not finished (swept for deadlines)."""
        self.server: asyncio.Server | None = None
        self.drained: asyncio.Event | None = None
        """Set while stopping, once no exchange is active."""
        self._sweeper: asyncio.TimerHandle | None = None

    def route(self, host: bytes, path: bytes) -> str | None:
        """``routes.match`` for raw header bytes, memoised per route table (swaps reset it)."""
        table = self.routing.routes
        cache = self._route_cache
        if table is not self._route_table:
            self._route_table = table
            cache.clear()
        key = (host, path)
        try:
            return cache[key]
        except KeyError:
            pass
        name = table.match(host.decode("latin-1"), path.decode("latin-1"))
        if len(cache) >= ROUTE_CACHE_MAX:
            cache.clear()
        cache[key] = name
        return name

    def _sweep(self) -> None:
        self.date_value = self.date.get()
        now = self.loop.time()
        due = [ex for ex in self.active if ex.deadline_next <= now]
        for ex in due:
            ex.check(now)
        if self.slow_heads:
            for conn in [c for c in self.slow_heads if c.head_deadline <= now]:
                conn.head_timed_out()
        self._sweeps += 1
        if self._sweeps % IDLE_SWEEP_EVERY == 0:
            idle_before = now - self.limits.idle_timeout_s
            for idle in [
                c
                for c in self.connections
                if c.current is None and not c.head_open and c.last_active < idle_before
            ]:
                idle.close()
            if self.tunnels:
                self._sweep_tunnels(now)
            for service in self.routing.services.values():
                for ep in service.endpoints.endpoints:
                    if isinstance(ep.pool, EndpointConnections):
                        ep.pool.expire(now)
        self._sweeper = self.loop.call_later(SWEEP_S, self._sweep)

    def _sweep_tunnels(self, now: float) -> None:
        idle = []
        for tunnel in self.tunnels:
            service = tunnel.exchange.service
            if service is not None and tunnel.idle(now - service.config.upgrades.idle_timeout_s):
                idle.append(tunnel)
        for tunnel in idle:
            tunnel.end()

    def configure(self, trusted_proxies: Sequence[str], limits: HeadLimits) -> None:
        """Hot reload: new trusted networks (for new connections) and head limits."""
        self.networks = [ipaddress.ip_network(n, strict=False) for n in trusted_proxies]
        if limits.underscores_in_headers != self.heads.underscores:
            self.heads = HeadCache(underscores=limits.underscores_in_headers)
            self.heads_tls = HeadCache(underscores=limits.underscores_in_headers, proto=b"https")
        self.limits = limits

    def is_trusted(self, ip: str) -> bool:
        if not self.networks or not ip:
            return False
        try:
            addr = ipaddress.ip_address(ip)
        except ValueError:
            return False
        return any(addr in net for net in self.networks)

    async def start_tls(
        self, host: str, port: int, listener: TlsListener, reuse_port: bool = False
    ) -> tuple[str, int]:
        """Listen for TLS (``listener`` holds the certificates and the ALPN list, which must
        be ``tls_protocols``' names); return the bound (host, port). ``reuse_port``: share
        the port with other processes (``SO_REUSEPORT``, data-plane workers)."""
        self.tls = listener
        protocols = self.tls_protocols
        self.tls_server = await self.loop.create_server(
            lambda: AlpnDispatch(protocols),
            host,
            port,
            ssl=listener.context,
            backlog=2048,
            reuse_address=True,
            reuse_port=reuse_port or None,
            ssl_handshake_timeout=self.limits.header_timeout_s,
        )
        bound = self.tls_server.sockets[0].getsockname()
        return str(bound[0]), int(bound[1])

    def offer_h2(self) -> None:
        """Serve HTTP/2 to TLS clients that choose ``h2`` by ALPN (advertised first).  The
        mapping is changed in place: the TLS listener's dispatch reads it per connection."""
        rest = {k: v for k, v in self.tls_protocols.items() if k != "h2"}
        self.tls_protocols.clear()
        self.tls_protocols["h2"] = lambda: H2Connection(self, tls=True)
        self.tls_protocols.update(rest)

    def withdraw_h2(self) -> None:
        """Reload turned ``tls.http2`` off: no ``h2`` for new TLS connections; open ones get
        GOAWAY (their streams in progress finish)."""
        self.tls_protocols.pop("h2", None)
        self._goaway_h2(tls=True)

    def serve_h2c(self, on: bool) -> None:
        """Reload: HTTP/2 by prior knowledge on the plain listener (``listen.h2c``) on or off;
        off answers new prefaces 505 and sends GOAWAY to open h2c connections."""
        self.h2c = on
        if not on:
            self._goaway_h2(tls=False)

    def _goaway_h2(self, tls: bool) -> None:
        for conn in list(self.connections):
            if isinstance(conn, H2Connection) and conn.tls == tls:
                conn.goaway()

    def redirect_to_https(self, tls_port: int | None) -> None:
        """Send plain requests to https on ``tls_port`` with 308 (None: serve them)."""
        if tls_port is None:
            self.https_redirect = None
        else:
            self.https_redirect = b"" if tls_port == 443 else b":%d" % tls_port

    async def start(self, host: str, port: int, reuse_port: bool = False) -> tuple[str, int]:
        """Listen; return the bound (host, port) (``port=0`` picks a free one). ``reuse_port``:
        share the port with other processes (``SO_REUSEPORT``, data-plane workers)."""
        self.server = await self.loop.create_server(
            lambda: ClientConnection(self),
            host,
            port,
            backlog=2048,
            reuse_address=True,
            reuse_port=reuse_port or None,
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
        self.stopping = True  # finished exchanges close their connection (no keep-alive)
        if self.server is not None:
            self.server.close()
        if self.tls_server is not None:
            self.tls_server.close()
        for conn in list(self.connections):
            if conn.current is None:
                conn.close()
            elif isinstance(conn, H2Connection):
                conn.goaway()  # no new streams; the open ones finish
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
        if self.tls_server is not None:
            await self.tls_server.wait_closed()
