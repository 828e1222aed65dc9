"""Inbound HTTP/2: one :class:`H2Connection` per client, one :class:`StreamExchange` per stream.

The framing, HPACK, stream states and flow-control windows are the ``h2`` library's; this
module maps each request stream onto the data plane's :class:`~gateway.dataplane.forward.Exchange`
(routing by ``:authority``, admission, balancing, retries, timeouts, stats, tracing), so a
stream is exactly one request in flight.  Memory is bounded by the windows: request DATA is
acknowledged (WINDOW_UPDATE) only while the exchange is not paused, and response bytes the
client's window cannot take yet pause reading from the upstream.  Gateway errors on gRPC
requests are answered as gRPC statuses (trailers-only responses).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING, cast

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings
from hyperframe.frame import GoAwayFrame

from gateway.dataplane.errors import Cause
from gateway.dataplane.forward import Exchange
from gateway.dataplane.h2lean import LeanConnection
from gateway.dataplane.headers import (
    H2_BAD_VALUE,
    H2_CONNECTION_SPECIFIC,
    H2_FIELD_NAME,
    HOP_BY_HOP,
    HeadCache,
    connection_tokens,
    response_fields,
)
from gateway.dataplane.limits import RequestRejected
from gateway.dataplane.upstream import WRITE_BUFFER_HIGH, WRITE_BUFFER_LOW

if TYPE_CHECKING:
    from gateway.dataplane.server import DataPlane

log = logging.getLogger(__name__)

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
MAX_CONCURRENT_STREAMS = 128
"""SETTINGS_MAX_CONCURRENT_STREAMS announced to clients (more open streams: refused)."""
INITIAL_WINDOW = 256 * 1024
"""SETTINGS_INITIAL_WINDOW_SIZE: request body bytes a stream may send before it is acknowledged."""
CONNECTION_WINDOW = 1 << 20
"""The connection's receive window (all streams' unacknowledged request bytes together)."""
MAX_RESETS_PER_S = 200
"""Client RST_STREAMs tolerated per second and connection; more is a rapid-reset attack
(CVE-2023-44487): GOAWAY ENHANCE_YOUR_CALM and close."""

GRPC_STATUS = {
    Cause.NO_ROUTE: 12,  # UNIMPLEMENTED
    Cause.RATE_LIMITED: 8,  # RESOURCE_EXHAUSTED
    Cause.BODY_TOO_LARGE: 8,
    Cause.HEADERS_TOO_LARGE: 8,
    Cause.TOTAL_TIMEOUT: 4,  # DEADLINE_EXCEEDED
    Cause.HEADER_TIMEOUT: 4,
    Cause.CONNECT_TIMEOUT: 4,
    Cause.BAD_REQUEST: 13,  # INTERNAL
    Cause.BAD_RESPONSE: 13,
    Cause.URI_TOO_LONG: 13,
    Cause.INTERNAL: 13,
}
"""gRPC status codes of gateway errors on gRPC requests; any other cause: 14 UNAVAILABLE."""
_CONFIG = h2.config.H2Configuration(
    client_side=False,
    header_encoding=None,
    # Request fields are checked by http1_fields (RFC 9113 §8.2, §8.3: one pass, and once per
    # distinct header set) instead of h2's chain of generators, a fifth of a request's time.
    validate_inbound_headers=False,
    normalize_inbound_headers=False,  # (split cookie fields are joined by http1_fields)
    # What we send was parsed and checked on the way in (llhttp, or http1_fields) and
    # lower-cased here: checking it again costs a third of a response's framing time.
    validate_outbound_headers=False,
    normalize_outbound_headers=False,
)
_GRPC_UNITS = {b"H": 3600.0, b"M": 60.0, b"S": 1.0, b"m": 1e-3, b"u": 1e-6, b"n": 1e-9}
_DROP_RESPONSE = HOP_BY_HOP | {b"http2-settings"}


def grpc_timeout_s(value: bytes) -> float | None:
    """The ``grpc-timeout`` header as seconds (``1S``, ``250m``, ...; None if malformed)."""
    digits, unit = value[:-1], value[-1:]
    if not digits.isdigit() or len(digits) > 8 or unit not in _GRPC_UNITS:
        return None
    return int(digits) * _GRPC_UNITS[unit]


class MalformedRequest(RequestRejected):
    """A request RFC 9113 §8.1.1 calls malformed: answered with a stream error
    (RST_STREAM PROTOCOL_ERROR), the connection's other streams carry on."""

    def __init__(self, why: str) -> None:
        super().__init__(Cause.BAD_REQUEST, why)


_PSEUDO = frozenset({b":method", b":scheme", b":authority", b":path"})
_CONNECTION_SPECIFIC = H2_CONNECTION_SPECIFIC
_NAME = H2_FIELD_NAME
_BAD_VALUE = H2_BAD_VALUE
_FIELDS_CACHE_MAX = 1024
_FIELDS_CACHE_ENTRY_MAX = 2048
"""Header sets larger than this (bytes of names and values) are not cached."""
_fields_cache: dict[
    tuple[tuple[tuple[bytes, bytes], ...], bool],
    tuple[bytes, bytes, tuple[tuple[bytes, bytes], ...], bool],
] = {}


def http1_fields(
    headers: list[tuple[bytes, bytes]], end_stream: bool
) -> tuple[bytes, bytes, list[tuple[bytes, bytes]], bool]:
    """Split an HTTP/2 request's fields into method, path and HTTP/1.1 fields (``Host`` from
    ``:authority``, cookies joined, a body without a length sent chunked) plus whether it
    is gRPC.  Raises :class:`MalformedRequest` for a request RFC 9113 calls malformed
    (pseudo-header fields unknown, repeated, late or missing; a field name not a lower-case
    token; NUL, CR, LF or surrounding whitespace in a value; connection-specific fields;
    ``te`` other than ``trailers``; ``host`` and ``:authority`` naming different hosts), and
    ``RequestRejected`` for what HTTP/1.1 cannot carry (CONNECT).  A header set seen before
    that passed before (and is small) is answered from a bounded cache."""
    key = (tuple(headers), end_stream)
    hit = _fields_cache.get(key)
    if hit is not None:
        method, path, out, grpc = hit
        return method, path, list(out), grpc
    method, path, fields, grpc = _http1_fields(headers, end_stream)
    if sum(len(n) + len(v) for n, v in headers) <= _FIELDS_CACHE_ENTRY_MAX:
        if len(_fields_cache) >= _FIELDS_CACHE_MAX:
            _fields_cache.clear()
        _fields_cache[key] = (method, path, tuple(fields), grpc)
    return method, path, fields, grpc


def _http1_fields(
    headers: list[tuple[bytes, bytes]], end_stream: bool
) -> tuple[bytes, bytes, list[tuple[bytes, bytes]], bool]:
    method = path = authority = scheme = host = b""
    out: list[tuple[bytes, bytes]] = []
    cookies: list[bytes] = []
    pseudo: set[bytes] = set()
    regular = has_length = has_host = grpc = False
    bad_value = _BAD_VALUE.search
    for name, value in headers:
        if bad_value(value) is not None:
            raise MalformedRequest(f"invalid value of {name!r}")
        if name[:1] == b":":
            if regular or name not in _PSEUDO or name in pseudo:
                raise MalformedRequest(f"pseudo-header field {name!r} unknown, repeated or late")
            pseudo.add(name)
            if name == b":method":
                method = value
            elif name == b":path":
                path = value
            elif name == b":authority":
                authority = value
            else:
                scheme = value
            continue
        regular = True
        if _NAME.match(name) is None:
            raise MalformedRequest(f"invalid field name {name!r}")
        if name in _CONNECTION_SPECIFIC:
            raise MalformedRequest(f"connection-specific field {name!r}")
        if name == b"cookie":
            cookies.append(value)
            continue
        if name == b"content-length":
            has_length = True
        elif name == b"host":
            has_host = True
            host = value
        elif name == b"content-type":
            grpc = value.startswith(b"application/grpc")
        elif name == b"expect":
            continue  # no 100-continue over HTTP/2
        elif name == b"te" and value != b"trailers":
            raise MalformedRequest("te other than trailers")
        out.append((name, value))
    if method == b"CONNECT":
        raise RequestRejected(Cause.BAD_REQUEST)
    if not method or not scheme or not path:
        raise MalformedRequest("missing :method, :scheme or :path")
    if path[:1] != b"/" and not (path == b"*" and method == b"OPTIONS"):
        raise MalformedRequest(":path neither origin-form nor OPTIONS *")
    if has_host and authority and host != authority:
        raise MalformedRequest("host and :authority differ")
    if authority and not has_host:
        out.insert(0, (b"host", authority))
    if cookies:
        out.append((b"cookie", b"; ".join(cookies)))
    if not end_stream and not has_length:
        out.append((b"transfer-encoding", b"chunked"))
    return method, path, out, grpc


_RESPONSE_CACHE_MAX = 256
_RESPONSE_HEAD_CACHED_MAX = 2048
_response_cache: dict[bytes, tuple[tuple[bytes, bytes], ...]] = {}


def h2_response_fields(raw_head: bytes) -> list[tuple[bytes, bytes]]:
    """An HTTP/1.1 response head's fields as HTTP/2 fields (lower-case, no hop-by-hop ones);
    memoised per head (an upstream repeats its heads but for the Date, once a second)."""
    hit = _response_cache.get(raw_head)
    if hit is not None:
        return list(hit)
    fields = [(name.lower(), value) for name, value in response_fields(raw_head)]
    drop = _DROP_RESPONSE | connection_tokens(fields)
    out = [(n, v) for n, v in fields if n not in drop]
    if len(raw_head) <= _RESPONSE_HEAD_CACHED_MAX:
        if len(_response_cache) >= _RESPONSE_CACHE_MAX:
            _response_cache.clear()
        _response_cache[raw_head] = tuple(out)
    return out


class StreamExchange(Exchange):
    """An :class:`Exchange` whose client is one HTTP/2 stream (:class:`H2Stream`)."""

    grpc = False
    grpc_timeout: float | None = None
    client_h2 = True

    def start(self) -> None:
        super().start()
        if self.grpc_timeout is not None and self.arrived and not self.done:
            deadline = self.started_at + self.grpc_timeout
            if deadline < self.deadline_total:
                self.deadline_total = deadline
                self._arm(deadline)

    def on_upstream_headers(self, status: int, raw_head: bytes) -> None:
        if self.done:
            return
        if status < 200:
            if status == 101:
                self.upstream_bad_response()
                return
            self.interim = True
            return
        self.resp_status = status
        self.resp_head = raw_head
        service = self.service
        if service is not None and service.app_headers is not None and self.endpoint is not None:
            service.app_headers.observe(self.endpoint.address, raw_head, self.client.dp.loop.time())
        self.resp_state = 1
        head_only = self.method == b"HEAD"
        if not head_only and status not in {204, 304}:
            low = raw_head.lower()
            if low.find(b"\r\ncontent-length:") == -1 and low.find(b"\r\ntransfer-encoding:") == -1:
                self.resp_close_delimited = True  # the body ends when the upstream closes
        stream = cast(H2Stream, self.client)
        fields = [(b":status", b"%d" % status), *h2_response_fields(raw_head)]
        h2up = self.h2up
        stream.send_headers(fields, end=h2up is not None and h2up.head_ends)
        if head_only:
            self._finish(status)

    def on_upstream_body(self, body: bytes) -> None:
        if self.done or self.interim:
            return
        self.resp_bytes += len(body)
        wbuf = self.wbuf  # sent by flush() at the end of the upstream read (one DATA frame)
        if wbuf is None:
            self.wbuf = [body]
        else:
            wbuf.append(body)

    def flush(self, nbytes: int = 0) -> None:
        wbuf = self.wbuf
        if wbuf:
            self.wbuf = None
            cast(H2Stream, self.client).send_body(wbuf[0] if len(wbuf) == 1 else b"".join(wbuf))

    def on_upstream_complete(self) -> None:
        wbuf = self.wbuf
        if wbuf and not self.interim and not self.done:
            # The last DATA frame carries END_STREAM (no separate empty frame).
            self.wbuf = None
            body = wbuf[0] if len(wbuf) == 1 else b"".join(wbuf)
            cast(H2Stream, self.client).send_body(body, end=True)
        super().on_upstream_complete()

    def _finish(self, status: int, failed: bool = False, reusable: bool = False) -> None:
        self.flush()  # (as HTTP/2 frames: Exchange._finish would write wbuf raw)
        super()._finish(status, failed, reusable)

    def on_upstream_trailers(self, trailers: list[tuple[bytes, bytes]]) -> None:
        if not self.done:
            cast(H2Stream, self.client).send_trailers(trailers)

    def reply_error(self, cause: Cause, retry_after_s: int | None = None) -> None:
        if self.span is not None and cause.status >= 500:
            self.span.failed(cause.code)
        self.cause = cause
        stream = cast(H2Stream, self.client)
        if not stream.closed:
            stream.send_error(cause, retry_after_s, self.grpc, self.method == b"HEAD")
        self.resp_state = 1
        self._finish(cause.status, failed=cause.status >= 500)


class H2Stream:
    """One client stream as its exchange sees its client (the per-request part of
    ``ClientConnection``): writes become HTTP/2 frames, pauses withhold WINDOW_UPDATEs."""

    __slots__ = (
        "closed",
        "conn",
        "dp",
        "ended",
        "exchange",
        "pause_bits",
        "peer_ip",
        "pending",
        "pending_end",
        "stream_id",
        "tls",
        "trailers",
        "trusted",
        "unacked",
        "write_paused",
    )

    def __init__(self, conn: H2Connection, stream_id: int) -> None:
        self.conn = conn
        self.dp = conn.dp
        self.stream_id = stream_id
        self.peer_ip = conn.peer_ip
        self.trusted = conn.trusted
        self.tls = conn.tls
        self.closed = False
        """Reset or ended: nothing more is sent on it."""
        self.ended = False
        """The response is complete on our side (END_STREAM queued or sent)."""
        self.write_paused = conn.write_paused
        self.exchange: StreamExchange | None = None
        self.pause_bits = 0
        self.unacked = 0
        """Request bytes received while paused (acknowledged when the pause ends)."""
        self.pending: list[bytes] = []
        """Response bytes the client's flow-control window cannot take yet."""
        self.pending_end = False
        self.trailers: list[tuple[bytes, bytes]] | None = None

    @property
    def transport(self) -> asyncio.Transport:
        return self.conn.transport

    @property
    def heads(self) -> HeadCache:
        """The data plane's head cache for this connection's scheme."""
        return self.dp.heads_tls if self.tls else self.dp.heads

    # -- used by Exchange (as ClientConnection) ------------------------------------------

    def pause(self, bit: int) -> None:
        self.pause_bits |= bit

    def unpause(self, bits: int) -> None:
        if self.pause_bits & bits:
            self.pause_bits &= ~bits
            if not self.pause_bits and self.unacked:
                n, self.unacked = self.unacked, 0
                self.conn.acknowledge(self.stream_id, n)

    def exchange_done(self, exchange: Exchange, now: float) -> None:
        self.exchange = None
        if self.unacked:  # the connection's window gets these bytes back
            n, self.unacked = self.unacked, 0
            self.conn.acknowledge(self.stream_id, n)
        self.conn.last_active = now
        if not self.closed and not self.ended:
            if exchange.cause is None and exchange.resp_state == 1:
                self.end()
            else:
                self.abort()
        self.conn.stream_done(self)

    def abort(self) -> None:
        """Reset the stream (a response cut short must not look complete)."""
        if not self.closed:
            self.closed = True
            self.conn.reset(self.stream_id, h2.errors.ErrorCodes.INTERNAL_ERROR)

    def close(self) -> None:
        self.abort()

    # -- response frames ------------------------------------------------------------------

    def send_headers(self, fields: list[tuple[bytes, bytes]], end: bool = False) -> None:
        if self.closed:
            return
        if end:
            self.ended = True
        self.conn.send_headers(self.stream_id, fields, end)

    def send_body(self, body: bytes, end: bool = False) -> None:
        """Send ``body`` as the window allows (``end``: the response ends with it)."""
        if self.closed:
            return
        if end:
            self.ended = True
        if self.pending:
            self.pending.append(body)
            if end:
                self.pending_end = True
            return
        rest = self.conn.send_data(self.stream_id, body, end)
        if rest:
            self.pending.append(rest)
            if end:
                self.pending_end = True
            self.conn.blocked.add(self)
            self._pause_upstream()
        elif end:
            self.closed = True

    def send_trailers(self, fields: list[tuple[bytes, bytes]]) -> None:
        """End the response with trailer fields (after any data still pending)."""
        if self.closed:
            return
        self.ended = True
        if self.pending:
            self.trailers = fields
            self.pending_end = True
            return
        self.conn.send_headers(self.stream_id, fields, True)
        self.closed = True

    def end(self) -> None:
        self.ended = True
        if self.pending:
            self.pending_end = True
        elif not self.closed:
            self.conn.end_stream(self.stream_id)
            self.closed = True

    def window_opened(self) -> bool:
        """Send what the window now allows; True once nothing is pending."""
        pending = self.pending
        while pending:
            rest = self.conn.send_data(self.stream_id, pending[0])
            if rest:
                pending[0] = rest
                return False
            pending.pop(0)
        if self.pending_end and not self.closed:
            if self.trailers is not None:
                self.conn.send_headers(self.stream_id, self.trailers, True)
            else:
                self.conn.end_stream(self.stream_id)
            self.closed = True
        ex = self.exchange
        if ex is not None and not self.conn.write_paused:
            ex.resume_upstream_reading()
        return True

    def _pause_upstream(self) -> None:
        ex = self.exchange
        if ex is not None:
            ex.pause_upstream_reading()

    def send_error(
        self, cause: Cause, retry_after_s: int | None, grpc: bool, head_only: bool
    ) -> None:
        """The gateway's own response: a gRPC status (trailers-only) for gRPC requests."""
        code = cause.code.encode()
        if grpc:
            fields = [
                (b":status", b"200"),
                (b"content-type", b"application/grpc"),
                (b"grpc-status", b"%d" % GRPC_STATUS.get(cause, 14)),
                (b"grpc-message", cause.message.replace(" ", "%20").encode()),
                (b"sluice-error", code),
            ]
            self.send_headers(fields, end=True)
            return
        body = b"" if head_only else cause.message.encode() + b"\n"
        fields = [
            (b":status", b"%d" % cause.status),
            (b"content-type", b"text/plain; charset=utf-8"),
            (b"content-length", b"%d" % len(cause.message.encode() + b"\n")),
            (b"sluice-error", code),
        ]
        if retry_after_s is not None:
            fields.append((b"retry-after", b"%d" % retry_after_s))
        self.send_headers(fields, end=not body)
        if body:
            self.send_body(body)
            self.end()

    def __repr__(self) -> str:
        return f"H2Stream({self.stream_id}, exchange={self.exchange!r})"


class H2Connection(asyncio.Protocol):
    """One HTTP/2 client connection (h2c by prior knowledge, or ``h2`` by ALPN)."""

    def __init__(self, dp: DataPlane, tls: bool = False) -> None:
        self.dp = dp
        self.tls = tls
        """Came through the TLS listener (``h2`` by ALPN): ``X-Forwarded-Proto: https``."""
        self.send_queued = False
        """``_send`` waits for the end of the loop round (``_send_soon``)."""
        self.h2 = LeanConnection(_CONFIG)
        self.transport: asyncio.Transport = None  # type: ignore[assignment]  # connection_made
        self.peer_ip = b""
        self.trusted = False
        self.streams: dict[int, H2Stream] = {}
        self.blocked: set[H2Stream] = set()
        """Streams with response bytes waiting for the client's window."""
        self.closed = False
        self.write_paused = False
        self.going_away = False
        self.last_active = 0.0
        self.head_open = False  # (as ClientConnection: the idle sweep reads it)
        self._reset_window_start = 0.0
        self._resets = 0
        self._refused = 0

    # -- what the data plane's sweep and stop read (as ClientConnection) ------------------

    @property
    def current(self) -> Exchange | None:
        """An exchange in progress on this connection, or None when idle."""
        for stream in self.streams.values():
            if stream.exchange is not None:
                return stream.exchange
        return None

    # -- asyncio.Protocol -----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, transport)
        self.transport = transport
        peer = transport.get_extra_info("peername")
        ip = peer[0] if isinstance(peer, tuple) else ""
        self.peer_ip = ip.encode()
        self.trusted = self.dp.is_trusted(ip)
        # TCP_NODELAY: uvloop and asyncio set it on every TCP transport they make
        transport.set_write_buffer_limits(WRITE_BUFFER_HIGH, WRITE_BUFFER_LOW)
        self.dp.connections.add(self)
        self.last_active = self.dp.loop.time()
        limits = self.dp.limits
        conn = self.h2
        conn.local_settings = h2.settings.Settings(
            client=False,
            initial_values={
                h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: MAX_CONCURRENT_STREAMS,
                h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: INITIAL_WINDOW,
                h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE: limits.max_header_bytes,
            },
        )
        conn.initiate_connection()
        conn.increment_flow_control_window(CONNECTION_WINDOW - 65535)
        self._send()

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        try:
            events = self.h2.receive_data(data)
        except h2.exceptions.ProtocolError as e:
            self._protocol_error(e)
            return
        for event in events:
            if self.closed:
                return
            self._event(event)
        self._send_soon()

    def _event(self, event: h2.events.Event) -> None:
        if isinstance(event, h2.events.RequestReceived):
            self._request(event)
        elif isinstance(event, h2.events.DataReceived):
            sid = event.stream_id
            stream = self.streams.get(sid)
            n = event.flow_controlled_length
            ex = stream.exchange if stream is not None else None
            if stream is not None and stream.pause_bits:
                stream.unacked += n
            else:
                self.acknowledge(sid, n)
            if ex is not None:
                ended = event.stream_ended is not None
                if event.data:
                    ex.on_request_body(event.data, ended)
                if ended and not ex.req_done:
                    ex.on_request_end()
        elif isinstance(event, h2.events.StreamEnded):
            pass  # carried by the DataReceived/RequestReceived it came with
        elif isinstance(event, h2.events.TrailersReceived):
            stream = self.streams.get(event.stream_id)
            ex = stream.exchange if stream is not None else None
            if ex is not None and not ex.req_done:
                h2up = ex.h2up
                if h2up is not None:  # trailers travel end to end only h2 <-> h2
                    h2up.request_trailers(
                        [
                            (n, v)
                            for n, v in event.headers
                            if n[:1] != b":"
                            and n not in HOP_BY_HOP
                            and _NAME.match(n) is not None
                            and _BAD_VALUE.search(v) is None
                        ]
                    )
                ex.on_request_end()
        elif isinstance(event, h2.events.StreamReset):
            self._stream_reset(event.stream_id)
        elif isinstance(event, h2.events.WindowUpdated):
            self._window_opened(event.stream_id)
        elif isinstance(event, h2.events.RemoteSettingsChanged):
            if h2.settings.SettingCodes.INITIAL_WINDOW_SIZE in event.changed_settings:
                self._window_opened(0)
        elif isinstance(event, h2.events.ConnectionTerminated):
            if event.error_code == h2.errors.ErrorCodes.NO_ERROR:
                # The client is done: its open streams still get their answers (its last
                # stream id is about streams the gateway would open), then the connection
                # closes with the gateway's own GOAWAY.
                self.goaway()
            else:
                self.abort()

    def _request(self, event: h2.events.RequestReceived) -> None:
        sid = event.stream_id
        if self.going_away:
            self.reset(sid, h2.errors.ErrorCodes.REFUSED_STREAM)
            return
        end_stream = event.stream_ended is not None
        headers = event.headers
        stream = H2Stream(self, sid)
        self.streams[sid] = stream
        heads = self.dp.heads_tls if self.tls else self.dp.heads
        try:
            method, path, fields, grpc = http1_fields(headers, end_stream)
            if len(fields) > self.dp.limits.max_headers:
                raise RequestRejected(Cause.HEADERS_TOO_LARGE)
            checked = heads.fields(fields, self.trusted)
            if "1.1" not in checked.passed:
                checked.check("1.1", fields)
        except MalformedRequest as e:
            log.debug("h2: malformed request from %s: %s", self.peer_ip.decode(), e)
            stream.closed = True
            self.reset(sid, h2.errors.ErrorCodes.PROTOCOL_ERROR)
            self.stream_done(stream)
            return
        except RequestRejected as e:
            stream.send_error(e.cause, None, False, False)
            self.stream_done(stream)
            return
        head = heads.head(method, path, checked.fields, self.peer_ip)
        ex = StreamExchange(stream, method, path, fields, head, True, True)  # type: ignore[arg-type]
        if grpc:
            ex.grpc = True
            for name, value in fields:
                if name == b"grpc-timeout":
                    ex.grpc_timeout = grpc_timeout_s(value)
        stream.exchange = ex
        if end_stream or not head.has_body:
            ex.req_done = True
        ex.start()

    def _stream_reset(self, sid: int) -> None:
        now = self.dp.loop.time()
        if now - self._reset_window_start > 1.0:
            self._reset_window_start = now
            self._resets = 0
        self._resets += 1
        stream = self.streams.get(sid)
        if stream is not None:
            stream.closed = True
            self.blocked.discard(stream)
            ex = stream.exchange
            if ex is not None:
                ex.client_gone()
            self.stream_done(stream)
        if self._resets > MAX_RESETS_PER_S:
            log.debug("h2: rapid reset from %s: GOAWAY", self.peer_ip.decode())
            self._goaway_close(h2.errors.ErrorCodes.ENHANCE_YOUR_CALM)

    def _window_opened(self, sid: int) -> None:
        if sid == 0:
            for stream in list(self.blocked):
                if stream.window_opened():
                    self.blocked.discard(stream)
                    self._forget(stream)
        else:
            one = self.streams.get(sid)
            if one is not None and one in self.blocked and one.window_opened():
                self.blocked.discard(one)
                self._forget(one)

    def _protocol_error(self, e: h2.exceptions.ProtocolError) -> None:
        code = getattr(e, "error_code", h2.errors.ErrorCodes.PROTOCOL_ERROR)
        if isinstance(e, h2.exceptions.DenialOfServiceError):
            code = h2.errors.ErrorCodes.ENHANCE_YOUR_CALM
        log.debug("h2: protocol error from %s: %s", self.peer_ip.decode(), e)
        self._goaway_close(code)

    def _goaway_close(self, code: int) -> None:
        with contextlib.suppress(h2.exceptions.ProtocolError):
            self.h2.close_connection(error_code=code)
        self._send()
        outbox = self.dp.outbox
        if outbox.pending is not None:
            outbox.flush()
        self._close()
        self.transport.close()

    def eof_received(self) -> bool | None:
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self._close()

    def _close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.dp.connections.discard(self)
        for stream in list(self.streams.values()):
            stream.closed = True
            if stream.exchange is not None:
                stream.exchange.client_gone()
        self.streams.clear()
        self.blocked.clear()

    def pause_writing(self) -> None:
        self.write_paused = True
        for stream in self.streams.values():
            stream.write_paused = True
            stream._pause_upstream()

    def resume_writing(self) -> None:
        self.write_paused = False
        for stream in self.streams.values():
            stream.write_paused = False
            ex = stream.exchange
            if ex is not None and not stream.pending:
                ex.resume_upstream_reading()

    # -- sending (h2 queues frames; one write per call site) ------------------------------

    def _send(self) -> None:
        self.send_queued = False
        data = self.h2.data_to_send()
        if data and not self.closed:
            self.dp.outbox.write(self.transport, data)

    def _send_soon(self) -> None:
        """Write what h2 queued at the end of this loop round (with the other streams'
        frames of the round: one write), or at once when the data plane writes at once."""
        if not self.send_queued:
            self.send_queued = True
            self.dp.outbox.later(self._send)

    def send_headers(self, sid: int, fields: list[tuple[bytes, bytes]], end: bool) -> None:
        try:
            self.h2.send_headers(sid, fields, end_stream=end)
        except h2.exceptions.ProtocolError:
            return  # the stream is gone (reset meanwhile)
        self._send_soon()

    def send_data(self, sid: int, data: bytes, end: bool = False) -> bytes:
        """Send what the windows allow (``end``: END_STREAM on the last frame, when all of
        ``data`` fits); return the rest."""
        conn = self.h2
        try:
            window = conn.local_flow_control_window(sid)
            size = conn.max_outbound_frame_size
            total = len(data)
            if total <= window and total <= size:  # the usual case: one frame
                conn.send_data(sid, data, end_stream=end)
                self._send_soon()
                return b""
            sent = 0
            while sent < total and window > 0:
                n = min(window, size, total - sent)
                conn.send_data(sid, data[sent : sent + n], end_stream=end and sent + n == total)
                sent += n
                window -= n
        except h2.exceptions.ProtocolError:
            return b""  # the stream is gone: drop the rest
        self._send_soon()
        return data[sent:]

    def end_stream(self, sid: int) -> None:
        with contextlib.suppress(h2.exceptions.ProtocolError):
            self.h2.end_stream(sid)
        self._send_soon()

    def reset(self, sid: int, code: int) -> None:
        with contextlib.suppress(h2.exceptions.ProtocolError):
            self.h2.reset_stream(sid, error_code=code)
        self._send()

    def acknowledge(self, sid: int, n: int) -> None:
        if n:
            with contextlib.suppress(h2.exceptions.ProtocolError):
                self.h2.acknowledge_received_data(n, sid)
            self._send_soon()

    # -- stream lifetimes -----------------------------------------------------------------

    def stream_done(self, stream: H2Stream) -> None:
        """The stream's exchange ended: forget it once nothing is pending for it."""
        if stream not in self.blocked:
            self._forget(stream)

    def _forget(self, stream: H2Stream) -> None:
        if stream.exchange is None:
            self.streams.pop(stream.stream_id, None)
        if self.going_away and not self.streams and not self.closed:
            self.close()

    def goaway(self) -> None:
        """Drain: announce GOAWAY (NO_ERROR, the last stream taken), finish open streams,
        then close."""
        if self.going_away or self.closed:
            return
        self.going_away = True
        # Written by hand: h2's close_connection() would move the connection to CLOSED, and
        # the open streams could send nothing more.  Streams above the last one are refused
        # (``_request``).
        frame = GoAwayFrame(0)
        frame.last_stream_id = self.h2.highest_inbound_stream_id
        frame.error_code = h2.errors.ErrorCodes.NO_ERROR
        self._send()
        if not self.closed:
            self.dp.outbox.write(self.transport, frame.serialize())
        if not self.streams:
            self.close()

    def close(self) -> None:
        if not self.going_away and not self.closed:
            self.goaway()
            return
        outbox = self.dp.outbox
        if outbox.pending is not None:
            outbox.flush()
        self._close()
        self.transport.close()

    def abort(self) -> None:
        outbox = self.dp.outbox
        if outbox.pending is not None:
            outbox.flush()
        self._close()
        self.transport.abort()

    def __repr__(self) -> str:
        return f"H2Connection({self.peer_ip.decode()}, {len(self.streams)} streams)"
