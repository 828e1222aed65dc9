"""Outbound HTTP/2 (``protocol: h2c``, or ``h2`` over TLS by ALPN): one multiplexed connection
per endpoint, one stream per exchange.

An :class:`H2Upstream` is an exchange's side of one upstream stream: it sends the request
(headers from the exchange's fields, the body as the stream's window allows, pausing the
client while it cannot) and hands the response to the exchange through the same calls an
HTTP/1.1 upstream makes (``on_upstream_headers`` with an HTTP/1.1-shaped head,
``on_upstream_body``, ``on_upstream_complete``, ``upstream_lost``) plus
``on_upstream_trailers``.  Response DATA is acknowledged only while the client takes it, so
a slow client is bounded by the upstream stream's window.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections import deque
from typing import TYPE_CHECKING, cast

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings

from gateway.dataplane.errors import Cause
from gateway.dataplane.h2lean import LeanConnection
from gateway.dataplane.headers import (
    H2_BAD_VALUE,
    H2_CONNECTION_SPECIFIC,
    H2_FIELD_NAME,
    HOP_BY_HOP,
    connection_tokens,
)
from gateway.dataplane.upstream import WRITE_BUFFER_HIGH, WRITE_BUFFER_LOW

if TYPE_CHECKING:
    from gateway.dataplane.endpoints import Endpoint
    from gateway.dataplane.forward import Exchange
    from gateway.dataplane.server import DataPlane

log = logging.getLogger(__name__)

BUFFER_LIMIT = 64 * 1024
"""Request body buffered before the stream opens, before reading from the client pauses."""
STREAM_WINDOW = 256 * 1024
"""SETTINGS_INITIAL_WINDOW_SIZE toward upstreams: response bytes in flight per stream."""
_CONFIG = h2.config.H2Configuration(
    client_side=True,
    header_encoding=None,
    validate_outbound_headers=False,  # checked on the way in, lower-cased by _request_headers
    normalize_outbound_headers=False,
    # Response fields are checked by response_head (RFC 9113 §8.2, §8.3 in one pass, once per
    # distinct header set) instead of h2's chain of generators (a twelfth of a gRPC call).
    validate_inbound_headers=False,
    normalize_inbound_headers=False,  # (only joins cookie fields: none in responses)
)
_DROP_REQUEST = HOP_BY_HOP | {b"host", b"expect", b"http2-settings"}


class MalformedResponse(Exception):
    """A response (or trailer) field block RFC 9113 §8.1.1 calls malformed."""


_HEADS_CACHE_MAX = 512
_HEAD_CACHED_MAX = 2048
"""Header sets larger than this (bytes of names and values) are not cached."""
_heads: dict[tuple[tuple[bytes, bytes], ...], tuple[int, bytes, bool]] = {}
_trailers: dict[tuple[tuple[bytes, bytes], ...], bool] = {}


def response_head(headers: list[tuple[bytes, bytes]]) -> tuple[int, bytes, bool]:
    """Check an HTTP/2 response's field block and turn it into HTTP/1.1 field lines:
    (status, the lines, whether it has ``content-length``).  Raises
    :class:`MalformedResponse` when RFC 9113 calls it malformed: a pseudo-header field other
    than one ``:status`` of three digits first; a field name not a lower-case token; NUL, CR,
    LF or surrounding whitespace in a value; a connection-specific field; ``te`` other than
    ``trailers``.  A header set seen before (and small) is answered from a bounded cache."""
    key = tuple(headers)
    hit = _heads.get(key)
    if hit is not None:
        return hit
    status = 0
    lines = []
    has_length = False
    bad_value = H2_BAD_VALUE.search
    name_ok = H2_FIELD_NAME.match
    for i, (name, value) in enumerate(headers):
        if bad_value(value) is not None:
            raise MalformedResponse(f"invalid value of {name!r}")
        if name[:1] == b":":
            if name != b":status" or i != 0 or len(value) != 3 or not value.isdigit():
                raise MalformedResponse(f"pseudo-header field {name!r} unknown, late or invalid")
            status = int(value)
            continue
        if name_ok(name) is None:
            raise MalformedResponse(f"invalid field name {name!r}")
        if name in H2_CONNECTION_SPECIFIC or (name == b"te" and value != b"trailers"):
            raise MalformedResponse(f"connection-specific field {name!r}")
        if name == b"content-length":
            has_length = True
        lines.append(b"%s: %s\r\n" % (name, value))
    if not status:
        raise MalformedResponse("no :status")
    checked = (status, b"".join(lines), has_length)
    if sum(len(n) + len(v) for n, v in headers) <= _HEAD_CACHED_MAX:
        if len(_heads) >= _HEADS_CACHE_MAX:
            _heads.clear()
        _heads[key] = checked
    return checked


def check_trailers(fields: list[tuple[bytes, bytes]]) -> None:
    """Raise :class:`MalformedResponse` for trailer fields RFC 9113 calls malformed (any
    pseudo-header field, and the field rules of :func:`response_head`); cached likewise."""
    key = tuple(fields)
    if key in _trailers:
        return
    bad_value = H2_BAD_VALUE.search
    name_ok = H2_FIELD_NAME.match
    for name, value in fields:
        if bad_value(value) is not None or name_ok(name) is None:
            raise MalformedResponse(f"invalid trailer field {name!r}")
        if name in H2_CONNECTION_SPECIFIC or name == b"te":
            raise MalformedResponse(f"connection-specific trailer field {name!r}")
    if sum(len(n) + len(v) for n, v in fields) <= _HEAD_CACHED_MAX:
        if len(_trailers) >= _HEADS_CACHE_MAX:
            _trailers.clear()
        _trailers[key] = True


class H2EndpointConnections:
    """The endpoint's ``pool`` for an h2c or h2 service: one multiplexed connection
    (reconnected when it closes or goes away) and the streams waiting for it to connect or
    for a free stream slot."""

    __slots__ = (
        "address",
        "closed",
        "conn",
        "connecting",
        "dp",
        "host",
        "port",
        "scheme",
        "server_hostname",
        "ssl",
        "waiting",
    )

    def __init__(
        self,
        dp: DataPlane,
        host: str,
        port: int,
        address: str,
        *,
        ssl_context: ssl.SSLContext | None = None,
        server_hostname: str | None = None,
    ) -> None:
        self.dp = dp
        self.host = host
        self.port = port
        self.address = address
        self.ssl = ssl_context
        """``protocol: h2``: the service's ``upstream_tls`` context offering ALPN ``h2``."""
        self.server_hostname = server_hostname
        self.scheme = b"https" if ssl_context is not None else b"http"
        self.conn: H2UpstreamConnection | None = None
        self.connecting: asyncio.Task[object] | None = None
        self.waiting: deque[H2Upstream] = deque()
        self.closed = False

    def open(self, stream: H2Upstream, connect_s: float) -> None:
        conn = self.conn
        if conn is not None and conn.usable and conn.has_room():
            conn.start(stream)
            return
        self.waiting.append(stream)
        if (conn is None or not conn.usable) and self.connecting is None:
            self._connect(connect_s)

    def _connect(self, connect_s: float) -> None:
        loop = self.dp.loop
        if self.ssl is None:
            connecting = loop.create_connection(
                lambda: H2UpstreamConnection(self), self.host, self.port
            )
        else:
            connecting = loop.create_connection(
                lambda: H2UpstreamConnection(self),
                self.host,
                self.port,
                ssl=self.ssl,
                server_hostname=self.server_hostname or self.host,
            )
        coro = asyncio.wait_for(connecting, connect_s)
        task = self.connecting = loop.create_task(coro)
        task.add_done_callback(self._connected)

    def _connected(self, task: asyncio.Task[object]) -> None:
        self.connecting = None
        if task.cancelled():
            self._fail_waiting(Cause.CONNECT_FAILED)
            return
        exc = task.exception()
        if exc is not None:
            timed_out = isinstance(exc, TimeoutError)
            self._fail_waiting(Cause.CONNECT_TIMEOUT if timed_out else Cause.CONNECT_FAILED)
            return
        transport, conn = cast(tuple[asyncio.BaseTransport, H2UpstreamConnection], task.result())
        if self.closed:
            conn.close()
            return
        if self.ssl is not None:
            ssl_object = transport.get_extra_info("ssl_object")
            chosen = ssl_object.selected_alpn_protocol() if ssl_object is not None else None
            if chosen != "h2":
                log.warning(
                    "upstream %s did not choose h2 by ALPN (chose %s): protocol: h2 needs an "
                    "HTTP/2 server",
                    self.address,
                    chosen or "nothing",
                )
                conn.abort()
                self._fail_waiting(Cause.CONNECT_FAILED)
                return
        self.conn = conn
        self.drain_waiting()

    def _fail_waiting(self, cause: Cause) -> None:
        waiting, self.waiting = self.waiting, deque()
        for stream in waiting:
            stream.connect_failed(cause)

    def drain_waiting(self) -> None:
        """Start waiting streams while the connection has room."""
        conn = self.conn
        while self.waiting and conn is not None and conn.usable and conn.has_room():
            stream = self.waiting.popleft()
            if not stream.cancelled:
                conn.start(stream)

    def lost(self, conn: H2UpstreamConnection) -> None:
        if self.conn is conn:
            self.conn = None
        if self.waiting and not self.closed and self.connecting is None:
            self._connect(self.waiting[0].connect_s)

    def close(self) -> None:
        """The endpoint is gone: no new streams; the connection closes once its streams end
        (as busy HTTP/1.1 connections close when their exchange ends)."""
        self.closed = True
        conn, self.conn = self.conn, None
        if conn is not None:
            conn.usable = False
            if not conn.streams:
                conn.close()
        if self.connecting is not None:
            self.connecting.cancel()

    def __repr__(self) -> str:
        return f"H2EndpointConnections({self.address}, {self.conn!r})"


class H2UpstreamConnection(asyncio.Protocol):
    """One HTTP/2 client connection to an endpoint, carrying many exchanges' streams."""

    def __init__(self, pool: H2EndpointConnections) -> None:
        self.pool = pool
        self.dp = pool.dp
        self.h2 = LeanConnection(_CONFIG)  # (a received GOAWAY leaves it open)
        self.transport: asyncio.Transport | None = None
        self.streams: dict[int, H2Upstream] = {}
        self.blocked: set[H2Upstream] = set()
        """Streams with request bytes waiting for the upstream's window."""
        self.usable = True
        """Not closed and no GOAWAY received: new streams may start here."""
        self.closed = False
        self.send_queued = False
        """``_send`` waits for the end of the loop round (``_send_soon``)."""

    def has_room(self) -> bool:
        return len(self.streams) < self.h2.remote_settings.max_concurrent_streams

    # -- asyncio.Protocol -----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, transport)
        self.transport = transport
        # TCP_NODELAY: uvloop and asyncio set it on every TCP transport they make
        transport.set_write_buffer_limits(WRITE_BUFFER_HIGH, WRITE_BUFFER_LOW)
        conn = self.h2
        conn.local_settings = h2.settings.Settings(
            client=True,
            initial_values={
                h2.settings.SettingCodes.ENABLE_PUSH: 0,
                h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: STREAM_WINDOW,
            },
        )
        conn.initiate_connection()
        conn.increment_flow_control_window(4 * STREAM_WINDOW)
        self._send()

    def data_received(self, data: bytes) -> None:
        try:
            events = self.h2.receive_data(data)
        except h2.exceptions.ProtocolError:
            self._send()
            self.abort()
            return
        for event in events:
            self._event(event)
        self._send_soon()

    def _event(self, event: h2.events.Event) -> None:
        if isinstance(event, h2.events.ResponseReceived):
            stream = self.streams.get(event.stream_id)
            if stream is not None:
                stream.on_headers(event.headers, event.stream_ended is not None)
        elif isinstance(event, h2.events.DataReceived):
            stream = self.streams.get(event.stream_id)
            if stream is None:
                self.ack(event.stream_id, event.flow_controlled_length)
            else:
                stream.on_data(event.data, event.flow_controlled_length)
                if event.stream_ended is not None:
                    stream.on_end()
        elif isinstance(event, h2.events.TrailersReceived):
            stream = self.streams.get(event.stream_id)
            if stream is not None:
                stream.on_trailers(event.headers)
        elif isinstance(event, h2.events.StreamEnded):
            stream = self.streams.get(event.stream_id)
            if stream is not None and not stream.response_ended:
                stream.on_end()
        elif isinstance(event, h2.events.StreamReset):
            stream = self.streams.pop(event.stream_id, None)
            if stream is not None:
                self.blocked.discard(stream)
                # REFUSED_STREAM: not processed at all (RFC 9113 §8.7), safe to retry
                stream.on_reset(event.error_code == h2.errors.ErrorCodes.REFUSED_STREAM)
                self.pool.drain_waiting()
        elif isinstance(event, h2.events.WindowUpdated):
            self._window_opened()
        elif isinstance(event, h2.events.RemoteSettingsChanged):
            self._window_opened()
            self.pool.drain_waiting()
        elif isinstance(event, h2.events.ConnectionTerminated):
            # No new streams here; those above the last stream id were never processed (the
            # exchange sends them again on a new connection), the others are still answered.
            self.usable = False
            last = event.last_stream_id if event.last_stream_id is not None else 0
            for sid in [s for s in self.streams if s > last]:
                stream = self.streams.pop(sid)
                self.blocked.discard(stream)
                stream.on_reset(unprocessed=True, goaway=True)
            self.pool.lost(self)
            if not self.streams:
                self.close()

    def _window_opened(self) -> None:
        for stream in list(self.blocked):
            if stream.window_opened():
                self.blocked.discard(stream)

    def eof_received(self) -> bool | None:
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.usable = False
        streams, self.streams = self.streams, {}
        self.blocked.clear()
        for stream in streams.values():
            stream.on_reset()
        self.pool.lost(self)

    def pause_writing(self) -> None:
        for stream in self.streams.values():
            stream.ex.client.pause(PAUSE_BACKPRESSURE)

    def resume_writing(self) -> None:
        for stream in self.streams.values():
            stream.ex.client.unpause(PAUSE_BACKPRESSURE)

    # -- used by H2Upstream ----------------------------------------------------------------

    def _send(self) -> None:
        self.send_queued = False
        data = self.h2.data_to_send()
        if data and self.transport is not None and not self.closed:
            self.dp.outbox.write(self.transport, data)

    def _send_soon(self) -> None:
        """Write what h2 queued at the end of this loop round (all the streams' frames of
        the round in one write), or at once when the data plane writes at once."""
        if not self.send_queued:
            self.send_queued = True
            self.dp.outbox.later(self._send)

    def start(self, stream: H2Upstream) -> None:
        sid = self.h2.get_next_available_stream_id()
        self.streams[sid] = stream
        stream.bound(self, sid)
        self._send_soon()

    def send_data(self, sid: int, data: bytes, end: bool = False) -> bytes:
        """Send what the windows allow (``end``: END_STREAM on the frame that takes the last
        byte); return the rest."""
        conn = self.h2
        sent = 0
        total = len(data)
        try:
            window = conn.local_flow_control_window(sid)
            size = conn.max_outbound_frame_size
            while sent < total and window > 0:
                n = min(window, size, total - sent)
                piece = data if n == total else data[sent : sent + n]
                sent += n
                conn.send_data(sid, piece, end_stream=end and sent == total)
                window -= n
        except h2.exceptions.ProtocolError:
            return b""
        self._send_soon()
        return data[sent:]

    def end_stream(self, sid: int) -> None:
        with contextlib.suppress(h2.exceptions.ProtocolError):
            self.h2.end_stream(sid)
        self._send_soon()

    def send_trailers(self, sid: int, fields: list[tuple[bytes, bytes]]) -> None:
        with contextlib.suppress(h2.exceptions.ProtocolError):
            self.h2.send_headers(sid, fields, end_stream=True)
        self._send_soon()

    def ack_connection(self, n: int) -> None:
        """Give ``n`` received bytes back to the connection's window only."""
        if n:
            with contextlib.suppress(h2.exceptions.ProtocolError):
                self.h2.increment_flow_control_window(n)

    def ack_stream(self, sid: int, n: int) -> None:
        """Give ``n`` received bytes back to one stream's window only."""
        if n:
            with contextlib.suppress(h2.exceptions.ProtocolError):
                self.h2.increment_flow_control_window(n, stream_id=sid)

    def ack(self, sid: int, n: int) -> None:
        if n:
            with contextlib.suppress(h2.exceptions.ProtocolError):
                self.h2.acknowledge_received_data(n, sid)

    def reset(self, stream: H2Upstream, code: int) -> None:
        """Reset the stream with ``code`` and forget it (the exchange learns why elsewhere)."""
        sid = stream.sid
        if self.streams.pop(sid, None) is None:
            return
        self.blocked.discard(stream)
        stream.conn = None
        with contextlib.suppress(h2.exceptions.ProtocolError):
            self.h2.reset_stream(sid, error_code=code)
        self._send()
        if self.usable:
            self.pool.drain_waiting()
        elif not self.streams:
            self.close()

    def release(self, stream: H2Upstream) -> None:
        """The exchange is done with its stream: reset it unless it is closed both ways -- a
        response not complete, or one complete before the request's body ended (RFC 9113
        §8.1: a server may answer early and leave the stream half-closed, which would count
        against the connection's concurrent streams for good)."""
        sid = stream.sid
        if self.streams.pop(sid, None) is None:
            return
        self.blocked.discard(stream)
        h2_stream = self.h2.streams.get(sid)
        if not stream.response_ended or (h2_stream is not None and not h2_stream.closed):
            with contextlib.suppress(h2.exceptions.ProtocolError):
                self.h2.reset_stream(sid, error_code=h2.errors.ErrorCodes.CANCEL)
            self._send()
        if self.usable:
            self.pool.drain_waiting()
        elif not self.streams:
            self.close()

    def close(self) -> None:
        self.usable = False
        if self.transport is not None and not self.closed:
            with contextlib.suppress(h2.exceptions.ProtocolError):
                self.h2.close_connection()
            self._send()
            self.closed = True
            self.transport.close()

    def abort(self) -> None:
        self.usable = False
        if self.transport is not None:
            self.closed = True
            self.transport.abort()

    def __repr__(self) -> str:
        return f"H2UpstreamConnection({self.pool.address}, {len(self.streams)} streams)"


# Client-reading pause reasons (see forward.py; repeated here to avoid an import cycle).
PAUSE_BUFFER = 1
PAUSE_BACKPRESSURE = 2


class H2Upstream:
    """One exchange's upstream HTTP/2 stream (``Exchange.h2up``)."""

    __slots__ = (
        "buf",
        "buf_bytes",
        "cancelled",
        "conn",
        "connect_s",
        "end_sent",
        "ex",
        "got_bytes",
        "head_ends",
        "pending",
        "read_paused",
        "replay",
        "replay_bytes",
        "req_end",
        "response_ended",
        "sid",
        "trailers",
        "unacked",
    )

    def __init__(self, ex: Exchange) -> None:
        self.ex = ex
        self.conn: H2UpstreamConnection | None = None
        self.sid = 0
        self.buf: list[bytes] = []
        self.buf_bytes = 0
        self.pending: list[bytes] = []
        """Request bytes waiting for the upstream's window."""
        self.req_end = ex.req_done  # (an HTTP/2 GET ended with its HEADERS: no end() call)
        self.end_sent = False
        """END_STREAM went with the last DATA frame (no separate empty frame to end)."""
        self.response_ended = False
        self.got_bytes = False
        self.head_ends = False
        """The response head came with END_STREAM (gRPC's trailers-only responses)."""
        self.read_paused = False
        self.unacked = 0
        self.cancelled = False
        self.connect_s = 1.0
        self.trailers: list[tuple[bytes, bytes]] | None = None
        """The request's trailer fields (an HTTP/2 client's), sent after the body."""
        self.replay: list[bytes] | None = []
        """Every request body piece so far, kept (up to the retry policy's
        ``replay_body_bytes``) so a stream the upstream never processed can be sent again
        elsewhere; None once the body outgrew that."""
        self.replay_bytes = 0

    def retry_copy(self) -> H2Upstream:
        """A fresh stream for another attempt, carrying the request body so far (the caller
        checked ``replay`` is not None), its end and its trailers."""
        new = H2Upstream(self.ex)
        replay = self.replay
        assert replay is not None
        new.buf = list(replay)
        new.buf_bytes = self.replay_bytes
        new.replay = replay
        new.replay_bytes = self.replay_bytes
        new.req_end = self.req_end
        new.trailers = self.trailers
        return new

    def open(self, ep: Endpoint) -> None:
        ex = self.ex
        service = ex.service
        assert service is not None
        dp = ex.client.dp
        pool = ep.pool
        if not isinstance(pool, H2EndpointConnections):
            pool = ep.pool = H2EndpointConnections(
                dp,
                ep.host,
                ep.port,
                ep.address,
                ssl_context=service.upstream_ssl,
                server_hostname=service.upstream_sni,
            )
        self.connect_s = service.connect_s
        ex.attempts += 1
        pool.open(self, service.connect_s)

    # -- the request -----------------------------------------------------------------------

    def bound(self, conn: H2UpstreamConnection, sid: int) -> None:
        self.conn = conn
        self.sid = sid
        ex = self.ex
        end = self.req_end and not self.buf and self.trailers is None
        conn.h2.send_headers(sid, self._request_headers(conn.pool.scheme), end_stream=end)
        if self.buf:
            buf, self.buf = self.buf, []
            self.buf_bytes = 0
            ex.client.unpause(PAUSE_BUFFER)
            last = len(buf) - 1
            end_with_data = self.req_end and self.trailers is None
            for i, piece in enumerate(buf):
                self._send_body(piece, end_with_data and i == last)
        if end:
            ex._request_sent()
        elif self.req_end:
            self._end()

    def _request_headers(self, conn_scheme: bytes) -> list[tuple[bytes, bytes]]:
        ex = self.ex
        client = ex.client
        head = ex.head
        fields: list[tuple[bytes, bytes]] = [
            (b":method", ex.method),
            (b":scheme", conn_scheme),
            (b":authority", head.host),
            (b":path", ex.target),
        ]
        drop = _DROP_REQUEST | connection_tokens(ex.headers)
        xff = b""
        proto = b"https" if client.tls else b"http"
        for name, value in ex.headers:
            low = name.lower()
            if low in drop:
                if low == b"te" and value.strip().lower() == b"trailers":
                    fields.append((b"te", b"trailers"))
                continue
            if low[:12] == b"x-forwarded-":
                if not client.trusted:
                    continue
                if low == b"x-forwarded-for":
                    xff = value + b", "
                    continue
                if low == b"x-forwarded-proto":  # a trusted proxy's is kept
                    proto = value
                    continue
            if low == b"traceparent" and ex.attempt_span is not None:
                continue
            fields.append((low, value))
        fields.append((b"x-forwarded-for", xff + client.peer_ip))
        fields.append((b"x-forwarded-proto", proto))
        fields.append((b"via", b"2 sluice"))
        if ex.attempt_span is not None:
            fields.append((b"traceparent", ex.attempt_span.traceparent))
        return fields

    def body(self, data: bytes, last: bool = False) -> None:
        """A piece of the request body (``last``: nothing follows, the stream may end with
        it unless trailers are to come)."""
        replay = self.replay
        if replay is not None:
            self.replay_bytes += len(data)
            service = self.ex.service
            if service is not None and self.replay_bytes <= service.retry_policy.replay_body_bytes:
                replay.append(data)
            else:
                self.replay = None
        if self.conn is None:
            self.buf.append(data)
            self.buf_bytes += len(data)
            if self.buf_bytes > BUFFER_LIMIT:
                self.ex.client.pause(PAUSE_BUFFER)
            return
        self._send_body(data, last and self.trailers is None)

    def _send_body(self, data: bytes, end: bool = False) -> None:
        conn = self.conn
        assert conn is not None
        if self.pending:
            self.pending.append(data)
            return
        rest = conn.send_data(self.sid, data, end)
        if end and not rest:
            self.end_sent = True
        if rest:
            self.pending.append(rest)
            conn.blocked.add(self)
            self.ex.client.pause(PAUSE_BACKPRESSURE)

    def request_trailers(self, fields: list[tuple[bytes, bytes]]) -> None:
        """The client's trailer fields: sent after the body, ending the request stream (call
        before :meth:`end`)."""
        self.trailers = fields

    def end(self) -> None:
        self.req_end = True
        if self.conn is not None:
            self._end()

    def _end(self) -> None:
        if self.pending:
            return  # sent when the window opens (window_opened)
        conn = self.conn
        assert conn is not None
        if self.end_sent:
            pass
        elif self.trailers is not None:
            conn.send_trailers(self.sid, self.trailers)
        else:
            conn.end_stream(self.sid)
        self.ex._request_sent()

    def window_opened(self) -> bool:
        conn = self.conn
        assert conn is not None
        pending = self.pending
        while pending:
            rest = conn.send_data(self.sid, pending[0])
            if rest:
                pending[0] = rest
                return False
            pending.pop(0)
        self.ex.client.unpause(PAUSE_BACKPRESSURE)
        if self.req_end:
            self._end()
        return True

    def connect_failed(self, cause: Cause) -> None:
        if not self.cancelled:
            ex = self.ex
            if not ex._retry(cause):
                ex.fail(cause)

    # -- the response ----------------------------------------------------------------------

    def on_headers(self, headers: list[tuple[bytes, bytes]], ended: bool) -> None:
        self.got_bytes = True
        try:
            status, lines, has_length = response_head(headers)
        except MalformedResponse as e:
            self._malformed(e)
            return
        ex = self.ex
        if not has_length and not ended and status >= 200 and ex.method != b"HEAD":
            extra = b"transfer-encoding: chunked\r\n"  # (for HTTP/1.1 clients)
        elif ended and not has_length and status >= 200:
            extra = b"content-length: 0\r\n"
        else:
            extra = b""
        self.head_ends = ended
        ex.on_upstream_headers(status, b"HTTP/1.1 %d -\r\n%s%s" % (status, lines, extra))
        if ended:
            self.on_end()

    def _malformed(self, e: MalformedResponse) -> None:
        """A malformed response: a stream error (RST_STREAM PROTOCOL_ERROR, RFC 9113 §8.1.1),
        answered 502 (or the client's stream cut if the head is out); not retried."""
        log.debug("h2 upstream: malformed response on stream %d: %s", self.sid, e)
        conn = self.conn
        self.response_ended = True
        if conn is not None:
            conn.reset(self, h2.errors.ErrorCodes.PROTOCOL_ERROR)
        self.ex.upstream_bad_response()

    def on_data(self, data: bytes, flow_len: int) -> None:
        self.got_bytes = True
        conn = self.conn
        assert conn is not None
        if self.read_paused:
            # The stream's window is held until the client takes more (at most one stream
            # window is buffered for it); the connection's is given back at once, so a slow
            # client cannot stall the other exchanges sharing this upstream connection.
            self.unacked += flow_len
            conn.ack_connection(flow_len)
        else:
            conn.ack(self.sid, flow_len)
        ex = self.ex
        if data:
            ex.on_upstream_body(data)
            ex.flush(len(data))

    def on_trailers(self, trailers: list[tuple[bytes, bytes]]) -> None:
        try:
            check_trailers(trailers)
        except MalformedResponse as e:
            self._malformed(e)
            return
        self.ex.on_upstream_trailers(trailers)
        self.on_end()

    def on_end(self) -> None:
        if self.response_ended:
            return
        self.response_ended = True
        self.ex.on_upstream_complete()

    def on_reset(self, unprocessed: bool = False, goaway: bool = False) -> None:
        """The stream was reset or its connection lost (``unprocessed``: refused, or beyond
        a GOAWAY's last stream (``goaway``): the upstream did nothing with it)."""
        self.conn = None
        if not self.response_ended:
            self.response_ended = True
            unprocessed = unprocessed and not self.got_bytes
            self.ex.upstream_lost(self.got_bytes, unprocessed, goaway and unprocessed)

    # -- flow control toward the client -----------------------------------------------------

    def pause(self) -> None:
        self.read_paused = True

    def resume(self) -> None:
        self.read_paused = False
        if self.unacked and self.conn is not None:
            n, self.unacked = self.unacked, 0
            self.conn.ack_stream(self.sid, n)
            self.conn._send_soon()

    def release(self) -> None:
        self.cancelled = True
        conn = self.conn
        if conn is not None:
            self.conn = None
            self.unacked = 0  # (the connection's window got them back as they came)
            conn.release(self)

    def __repr__(self) -> str:
        return f"H2Upstream(stream {self.sid}, {self.conn!r})"
