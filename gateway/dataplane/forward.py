"""One request end to end: route, pick, forward, stream back, record (DESIGN seam 5).

An :class:`Exchange` is a small callback-driven state machine — no coroutine per request.
The client connection feeds it the request (head, body chunks, end); the bound upstream
connection feeds it the response.  Bodies stream both ways with flow control: a full
upstream write buffer pauses reading from the client, a full client write buffer pauses
reading from the upstream, so memory stays flat whatever the body size.

Per-request flow (the numbered steps are where later features plug in, see
docs/dataplane.md)::

    start()      1 route lookup (RouteTable.match)  -> 404 no-route / 503 unknown-service
                 2 stats.arrive                     [tracing: SERVER span starts]
                 3 admission (issue 4)              -> may defer dispatch() or reject
    dispatch()   4 balancer pick                    -> 503 no-endpoints
                 5 upstream connection (pool / connect) [tracing: CLIENT span per attempt]
    on_upstream_*   6 stream the response back
    _finish()    7 stats.complete, balancer.observe, endpoint release, pool return
                                                    [tracing: spans end]

Timeouts (connect_s, response_header_s, total_s of the service) cost no timer per
request: an exchange records its nearest deadline and the data plane's sweep (every
``SWEEP_S``) calls :meth:`Exchange.check` on those due, so a timeout fires at most one
sweep interval late.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gateway.dataplane.admission import AdmissionError, QueueFull, RateLimited
from gateway.dataplane.endpoints import Endpoint
from gateway.dataplane.errors import Cause, error_response, redirect_response
from gateway.dataplane.h2upstream import H2Upstream
from gateway.dataplane.headers import (
    HOP_BY_HOP,
    RequestHead,
    connection_tokens,
    response_fields,
)
from gateway.dataplane.retry import Failure, retry_reason, untried
from gateway.dataplane.tunnel import Tunnel, switching_head
from gateway.dataplane.upstream import EndpointConnections, UpstreamConnection

if TYPE_CHECKING:
    import asyncio

    from gateway.dataplane.admission import Waiter
    from gateway.dataplane.server import ClientConnection
    from gateway.dataplane.service import Service
    from gateway.telemetry.requests import AttemptSpan, RequestSpan

CRLF = b"\r\n"
LAST_CHUNK = b"0\r\n\r\n"
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
BUFFER_LIMIT = 64 * 1024
TLS_JOIN_MAX_BYTES = 16 * 1024
"""Pieces of a response up to this size (one TLS record) are joined before a TLS client's
transport writes them: each piece would otherwise be a TLS record of its own (its own
encryption and framing, ~4 µs each), as the SSL transport encrypts each piece it is given."""
"""Request body buffered while no upstream connection is bound, before client reads pause."""
INF = float("inf")
IDEMPOTENT = frozenset({b"GET", b"HEAD", b"OPTIONS", b"TRACE", b"PUT", b"DELETE"})

# Client-reading pause reasons (bits), see ClientConnection.pause.
PAUSE_BUFFER = 1
PAUSE_BACKPRESSURE = 2

# Gateway errors that count against the endpoint for outlier detection (issue 4).
UPSTREAM_FAULTS = frozenset(
    {
        Cause.CONNECT_FAILED,
        Cause.CONNECT_TIMEOUT,
        Cause.RESET,
        Cause.BAD_RESPONSE,
        Cause.HEADER_TIMEOUT,
    }
)
_FAILURE_OF = {
    Cause.CONNECT_FAILED: Failure.CONNECT,
    Cause.CONNECT_TIMEOUT: Failure.CONNECT,
    Cause.RESET: Failure.RESET_BEFORE_RESPONSE,
}


def _admission_cause(e: AdmissionError) -> Cause:
    if isinstance(e, RateLimited):
        return Cause.RATE_LIMITED
    if isinstance(e, QueueFull):
        return Cause.QUEUE_FULL
    return Cause.QUEUE_TIMEOUT


def _pool_of(ep: Endpoint) -> EndpointConnections:
    pool = ep.pool
    if pool is None:
        pool = ep.pool = EndpointConnections(ep.host, ep.port, ep.address)
    return pool  # type: ignore[return-value]  # only the data plane sets Endpoint.pool


class Exchange:
    """One request/response exchange.

    Not slotted on purpose: most fields keep their class-level default for most requests
    (no body, no retry, no queue, no tracing), so only the few that change are written per
    request instead of all of them in ``__init__``.
    """

    done = False
    arrived = False
    req_done = False
    req_sent = False
    continue_sent = False
    body_buf: list[bytes] | None = None
    body_buf_bytes = 0
    service: Service | None = None
    endpoint: Endpoint | None = None
    pool: EndpointConnections | None = None
    upstream: UpstreamConnection | None = None
    connect_task: asyncio.Task[tuple[asyncio.BaseTransport, UpstreamConnection]] | None = None
    reused = False
    attempts = 0
    resp_state = 0  # 0 waiting for the head, 1 head sent to the client
    resp_status = 0
    resp_chunked = False
    resp_close_delimited = False
    interim = False
    resp_head = b""
    """The upstream's response head as received (status line and fields, CRLF each)."""
    started_at = 0.0
    deadline_total = 0.0
    deadline_connect = 0.0
    deadline_header = 0.0
    deadline_next = INF
    """The earliest deadline to check (the data plane sweeps active exchanges)."""
    wbuf: list[bytes] | None = None
    span: RequestSpan | None = None
    """This request's SERVER span when tracing sampled it (else None: no tracing cost)."""
    attempt_span: AttemptSpan | None = None
    """The CLIENT span of the current upstream attempt (sampled requests only)."""
    # -- issue 4: admission, body limit, retries, outlier detection
    body_bytes = 0
    body_limit: int | None = None
    slot = False
    waiter: Waiter | None = None
    cause: Cause | None = None
    tried: list[Endpoint] | None = None
    retried = False
    """A retry holds a reservation in the service's retry budget (released when done)."""
    unreached = 0
    """Attempts that failed to connect (they count against no attempt limit or budget)."""
    replay: list[bytes] | None = None
    """A copy of the framed body sent so far (idempotent requests; dropped once too big)."""
    replay_bytes = 0
    # -- issue 16: protocol upgrades (WebSockets)
    upgrade: bytes | None = None
    """The client's ``Upgrade`` value when it asked for one the service allows."""
    tunnel: Tunnel | None = None
    """Set once the upstream switched protocols (the exchange then lives as long as it)."""
    # -- issue 16: access log
    resp_bytes = 0
    """Response body bytes from the upstream (as received, before any re-framing)."""
    dispatched_at = 0.0
    """When a queued request left the admission queue (loop time; else ``started_at``)."""
    h2up: H2Upstream | None = None
    """The upstream HTTP/2 stream when the service's protocol is h2c (else None)."""
    goaway_retried = False
    """The stream was sent again after an upstream's GOAWAY left it unprocessed."""
    client_h2 = False
    """The client speaks HTTP/2 (``h2server.StreamExchange``)."""

    def __init__(  # noqa: PLR0917  (positional: one call per request, no keyword matching)
        self,
        client: ClientConnection,
        method: bytes,
        target: bytes,
        headers: list[tuple[bytes, bytes]],
        head: RequestHead,
        keep_alive: bool,
        http11: bool,
    ) -> None:
        self.client = client
        self.method = method
        self.target = target
        """The request target in origin-form."""
        self.headers = headers
        self.head = head
        """The checked request head, rewritten for the upstream, and what it says."""
        self.keep_alive = keep_alive
        self.http11 = http11

    # -- 1..3: route, count, admit --------------------------------------------------------

    def start(self) -> None:
        client = self.client
        target = self.target
        if target[:1] == b"/":
            q = target.find(b"?")
            path = target if q == -1 else target[:q]
        elif target == b"*":  # OPTIONS *: routed like the root of its Host
            path = b"/"
        else:  # an absolute-form target httptools could not split: routed as it is
            path = target
        dp = client.dp
        head = self.head
        tracing = dp.tracing
        if tracing is not None:
            self.span = tracing.start(
                head.traceparent, head.tracestate, self.method, target, head.host, client.peer_ip
            )
            if self.span is not None:
                self.span.client_headers(self.headers)
                if client.tls:
                    self.span.attributes["url.scheme"] = "https"
                if self.client_h2:
                    self.span.attributes["network.protocol.version"] = "2"
                elif not self.http11:
                    self.span.attributes["network.protocol.version"] = "1.0"
                if head.traceparent is not None:
                    self._drop_client_traceparent()
        if dp.https_redirect is not None and not client.tls and not self.client_h2:
            self.reply_redirect(dp.https_redirect)  # (h2c by prior knowledge is served)
            return
        name = dp.route(head.host, path)
        if name is None:
            dp.unmatched_total += 1
            self.reply_error(Cause.NO_ROUTE)
            return
        service = dp.routing.services.get(name)
        if service is None:
            self.reply_error(Cause.UNKNOWN_SERVICE)
            return
        self.service = service
        if service.upstream_h2:
            self.h2up = H2Upstream(self)
        if tracing is not None and self.span is not None:
            self.span.routed(name)
        if self.upgrade is not None and not service.allows_upgrade(self.upgrade):
            self.upgrade = None  # served as plain HTTP, without the Upgrade (RFC 9110 §7.8)
        # -- issue 4: the service's body limit (declared now, counted as the body streams)
        limit = service.admission.max_body_bytes
        if limit is not None:
            self.body_limit = limit
            if (head.declared_length or 0) > limit or self.body_bytes > limit:
                self.keep_alive = False
                self.reply_error(Cause.BODY_TOO_LARGE)
                return
        now = dp.loop.time()
        self.started_at = now
        self.deadline_total = now + service.total_s
        service.stats.arrive(now)
        self.arrived = True
        dp.active.add(self)
        # -- issue 4: admission — a free slot dispatches now; queued -> _admitted() later;
        # refused (rate limit, queue full) or timed out in the queue -> 429/503 + Retry-After.
        admission = service.admission
        if admission.try_take():
            self.slot = True
            self.dispatch()
            return
        try:
            waiter = admission.admit(self._admitted, self._refused)
        except AdmissionError as e:
            self._refused(e)
            return
        if waiter is None:
            self.slot = True
            self.dispatch()
        else:
            self.waiter = waiter

    def _admitted(self, wait_s: float) -> None:
        self.waiter = None
        self.slot = True
        self.dispatched_at = self.started_at + wait_s
        if self.span is not None:
            self.span.queued(wait_s)
        self.dispatch()

    def _refused(self, e: AdmissionError) -> None:
        self.waiter = None
        if self.span is not None:
            self.span.rejected(_admission_cause(e).code)
        self.reply_error(_admission_cause(e), retry_after_s=e.retry_after_s)

    def _drop_client_traceparent(self) -> None:
        """Sampled: the upstream gets our CLIENT span's traceparent, so drop the client's."""
        client = self.client
        drop = frozenset((connection_tokens(self.headers) - HOP_BY_HOP) | {b"traceparent"})
        self.head = client.heads.request(
            self.method,
            self.target,
            "1.1" if self.http11 else "1.0",
            self.headers,
            client.peer_ip,
            client.trusted,
            drop,
        )

    # -- 4..5: pick and connect -------------------------------------------------------------

    def dispatch(self) -> None:
        service = self.service
        assert service is not None
        endpoints = service.endpoints.routable
        if not endpoints:
            self.reply_error(Cause.NO_ENDPOINTS)
            return
        ep = service.balancer.pick(endpoints)
        ep.acquire()
        self.endpoint = ep
        if self.span is not None:
            self.attempt_span = self.span.attempt(ep.host, ep.port)
        if self.h2up is not None:
            self.h2up.open(ep)
            return
        pool: EndpointConnections | None = ep.pool  # type: ignore[assignment]  # (as _pool_of)
        if pool is None:
            pool = _pool_of(ep)
        self.pool = pool
        head = self.head
        if head.expect_continue and head.has_body and not self.req_done and not self.client.closed:
            self.client.dp.outbox.write(self.client.transport, CONTINUE)
            self.continue_sent = True
        conn = pool.take(self.started_at)
        if conn is not None:
            self.reused = True
            self.bind(conn)
        else:
            self.connect()

    def connect(self) -> None:
        pool = self.pool
        service = self.service
        assert pool is not None and service is not None
        loop = self.client.dp.loop
        self.reused = False
        self.attempts += 1
        if service.upstream_ssl is None:
            connecting = loop.create_connection(
                lambda: UpstreamConnection(pool), pool.host, pool.port
            )
        else:
            connecting = loop.create_connection(
                lambda: UpstreamConnection(pool),
                pool.host,
                pool.port,
                ssl=service.upstream_ssl,
                server_hostname=service.upstream_sni or pool.host,
            )
        task = loop.create_task(connecting)
        self.connect_task = task
        task.add_done_callback(self._connected)
        self.deadline_connect = loop.time() + service.connect_s
        self._arm(min(self.deadline_connect, self.deadline_total))

    def _connected(
        self, task: asyncio.Task[tuple[asyncio.BaseTransport, UpstreamConnection]]
    ) -> None:
        if task.cancelled():
            return
        exc = task.exception()
        if self.connect_task is not task:  # timed out or the client left meanwhile
            if exc is None:
                task.result()[1].abort()
            return
        self.connect_task = None
        if exc is not None:
            if not self._retry(Cause.CONNECT_FAILED):
                self.fail(Cause.CONNECT_FAILED)
            return
        self.bind(task.result()[1])

    def bind(self, conn: UpstreamConnection) -> None:
        """Send the request head (and any buffered body) on ``conn``."""
        conn.exchange = self
        conn.data = b""  # no response bytes yet (see upstream_lost)
        self.upstream = conn
        client = self.client
        if client.write_paused:
            conn.pause_reading()
        transport = conn.transport
        assert transport is not None
        head = self.head.head
        if not self.head.host and self.endpoint is not None:
            # HTTP/1.0 without Host: the endpoint's authority, as nginx sends $proxy_host.
            i = head.find(b"\r\n") + 2
            head = b"%sHost: %s\r\n%s" % (head[:i], self.endpoint.address.encode(), head[i:])
        if self.attempt_span is not None:
            head = head[:-2] + b"traceparent: " + self.attempt_span.traceparent + b"\r\n\r\n"
        if self.upgrade is not None:
            head = head[:-2] + b"Connection: Upgrade\r\nUpgrade: " + self.upgrade + b"\r\n\r\n"
        buf = self.body_buf
        if self.head.has_body and self.method in IDEMPOTENT:
            self._keep_replay(buf)
        if buf:
            client.dp.outbox.writelines(transport, [head, *buf], len(head) + self.body_buf_bytes)
            self.body_buf = None
            self.body_buf_bytes = 0
            client.unpause(PAUSE_BUFFER)
        else:
            client.dp.outbox.write(transport, head)
        if conn.write_paused:
            client.pause(PAUSE_BACKPRESSURE)
        if self.req_done:
            self._request_sent()
        elif self.deadline_total < self.deadline_next:  # _arm, inlined
            self.deadline_next = self.deadline_total

    def _request_sent(self) -> None:
        self.req_sent = True
        if self.resp_state == 0:
            service = self.service
            assert service is not None
            deadline = self.deadline_header = self.client.dp.loop.time() + service.response_header_s
            if self.deadline_total < deadline:  # noqa: PLR1730  (no min() call per request)
                deadline = self.deadline_total
            if deadline < self.deadline_next:  # noqa: PLR1730  (_arm, inlined)
                self.deadline_next = deadline

    # -- request body from the client ----------------------------------------------------------

    def on_request_body(self, body: bytes, last: bool = False) -> None:
        """A piece of the request body (``last``: an HTTP/2 client's END_STREAM came with it,
        so an HTTP/2 upstream stream can end with it too; ``on_request_end`` follows)."""
        if self.done:
            return  # the exchange ended early: the rest of the body is read and dropped
        self.body_bytes += len(body)
        limit = self.body_limit
        if limit is not None and self.body_bytes > limit:  # issue 4: chunked over the limit
            self.keep_alive = False
            self.fail(Cause.BODY_TOO_LARGE)
            return
        if self.h2up is not None:
            self.h2up.body(body, last)
            return
        up = self.upstream
        if up is not None:
            if up.closed:
                return  # connection_lost is on its way and ends the exchange
            transport = up.transport
            assert transport is not None
            outbox = self.client.dp.outbox
            if self.head.chunked:
                framed: list[bytes] = [b"%x\r\n" % len(body), body, CRLF]
                outbox.writelines(transport, framed, len(body))
            else:
                framed = [body]
                outbox.write(transport, body)
            if self.replay is not None:
                self._keep_replay(framed)
            return
        buf = self.body_buf
        if buf is None:
            buf = self.body_buf = []
        if self.head.chunked:
            buf += (b"%x\r\n" % len(body), body, CRLF)
        else:
            buf.append(body)
        self.body_buf_bytes += len(body)
        if self.body_buf_bytes > BUFFER_LIMIT:
            self.client.pause(PAUSE_BUFFER)

    def on_request_end(self) -> None:
        self.req_done = True
        if self.done:
            return
        if self.h2up is not None:
            self.h2up.end()
            return
        up = self.upstream
        if up is not None and not up.closed:
            if self.head.chunked:
                transport = up.transport
                assert transport is not None
                self.client.dp.outbox.write(transport, LAST_CHUNK)
                if self.replay is not None:
                    self.replay.append(LAST_CHUNK)
            self._request_sent()
        elif self.head.chunked:
            if self.body_buf is None:
                self.body_buf = []
            self.body_buf.append(LAST_CHUNK)

    # -- flow control ---------------------------------------------------------------------

    def pause_upstream_reading(self) -> None:
        """The client cannot take more response bytes now."""
        up = self.upstream
        if up is not None:
            up.pause_reading()
        elif self.h2up is not None:
            self.h2up.pause()

    def resume_upstream_reading(self) -> None:
        up = self.upstream
        if up is not None:
            up.resume_reading()
        elif self.h2up is not None:
            self.h2up.resume()

    def upstream_write_paused(self) -> None:
        self.client.pause(PAUSE_BACKPRESSURE)

    def upstream_write_resumed(self) -> None:
        self.client.unpause(PAUSE_BACKPRESSURE)

    # -- 6: the response from the upstream --------------------------------------------------

    def on_upstream_headers(self, status: int, raw_head: bytes) -> None:
        """The upstream's head: ``raw_head`` is its status line and fields, CRLF each."""
        if self.done:
            return
        if status < 200:
            if status == 101:
                if self.upgrade is not None and self.upstream is not None:
                    self._switch(raw_head)
                else:  # a switch nobody asked for: a broken upstream
                    self.upstream_bad_response()
                return
            self.interim = True  # 1xx (e.g. 103): not forwarded
            return
        self.resp_status = status
        self.resp_head = raw_head
        service = self.service
        if service is not None and service.app_headers is not None and self.endpoint is not None:
            service.app_headers.observe(self.endpoint.address, raw_head, self.client.dp.loop.time())
        head_only = self.method == b"HEAD" or status in {204, 304}
        keep_alive = self.keep_alive
        if keep_alive and self.head.expect_continue and not self.continue_sent:
            keep_alive = not self.head.has_body  # the client may or may not send the body now
        dp = self.client.dp
        head = dp.heads.response(
            status, raw_head, dp.date_value, self.http11, head_only, keep_alive
        )
        self.resp_state = 1
        # Only what differs from the class defaults is written (most responses: nothing).
        if not head.keep_alive:
            self.keep_alive = False
        if head.chunked:
            self.resp_chunked = True
        if head.close_delimited:
            self.resp_close_delimited = True
        # Held until the end of this read so head and body leave in one write.
        self.wbuf = [head.head]
        if self.method == b"HEAD":
            # httptools cannot be told a HEAD response has no body: finish here and do not
            # reuse the connection (its parser would wait for the announced body).
            self._finish(status)

    def on_upstream_body(self, body: bytes) -> None:
        if self.done or self.interim:
            return
        self.resp_bytes += len(body)
        wbuf = self.wbuf
        if wbuf is None:
            wbuf = self.wbuf = []
        if self.resp_chunked:
            wbuf += (b"%x\r\n" % len(body), body, CRLF)
        else:
            wbuf.append(body)

    def flush(self, nbytes: int = 0) -> None:
        """Write what this read produced for the client (called after each upstream read of
        ``nbytes``: about the size of what is written; 0 when small)."""
        wbuf = self.wbuf
        if wbuf:
            self.wbuf = None
            client = self.client
            if not client.closed:
                if client.tls and nbytes <= TLS_JOIN_MAX_BYTES and len(wbuf) > 1:
                    client.dp.outbox.write(client.transport, b"".join(wbuf))
                else:
                    client.dp.outbox.writelines(client.transport, wbuf, nbytes)

    def on_upstream_complete(self) -> None:
        if self.interim:
            self.interim = False
            return
        if self.done:
            return
        if self.resp_chunked:
            self.on_upstream_body_end()
        up = self.upstream
        reusable = up is not None and self.req_sent and up.parser.should_keep_alive()
        self._finish(self.resp_status, False, reusable)

    def on_upstream_trailers(self, trailers: list[tuple[bytes, bytes]]) -> None:
        """Trailer fields from an HTTP/2 upstream (an HTTP/1.1 client does not get them)."""

    def on_upstream_body_end(self) -> None:
        if self.wbuf is None:
            self.wbuf = []
        self.wbuf.append(LAST_CHUNK)

    def upstream_lost(
        self, got_bytes: bool, unprocessed: bool = False, goaway: bool = False
    ) -> None:
        """The bound upstream connection closed or was reset (``got_bytes``: after answering;
        ``unprocessed``: an HTTP/2 stream the upstream refused or never took, retried like a
        connect failure; ``goaway``: never taken because beyond the last stream id of the
        upstream's GOAWAY, sent again once on a new connection to the same endpoint)."""
        if self.done:
            return
        self.upstream = None
        if self.resp_state == 0:
            if goaway and self._reopen_h2():
                return
            if (
                self.reused
                and self.attempts == 0
                and not self.head.has_body
                and not self.interim
                and not got_bytes
                and self.method in IDEMPOTENT
            ):
                # A pooled connection the upstream had closed: nothing was processed, try a
                # fresh connection to the same endpoint once.
                self.req_sent = False
                if self.attempt_span is not None and self.span is not None:
                    self.attempt_span.end(None, Cause.RESET.code)
                    ep = self.endpoint
                    assert ep is not None
                    self.attempt_span = self.span.attempt(
                        ep.host, ep.port, retry_reason="stale-pooled-connection"
                    )
                self.connect()
                return
            if not self._retry(Cause.RESET, unprocessed):
                self.fail(Cause.RESET)
        elif self.resp_close_delimited:
            if self.resp_chunked:
                self.on_upstream_body_end()
            self._finish(self.resp_status)
        else:
            self.fail(Cause.RESET)  # truncated: the client connection is aborted

    # -- issue 16: upgraded connections --------------------------------------------------

    def _switch(self, raw_head: bytes) -> None:
        """The upstream switched protocols: answer the client's upgrade and splice the two
        connections (the exchange stays in flight until the tunnel ends)."""
        up = self.upstream
        service = self.service
        assert up is not None and service is not None and self.upgrade is not None
        client = self.client
        dp = client.dp
        now = dp.loop.time()
        self.resp_status = 101
        self.resp_head = raw_head
        self.resp_state = 1
        self.keep_alive = False
        self.req_sent = True
        self.deadline_next = INF  # no request timeouts now (the idle timeout is the tunnel's)
        up.exchange = None
        tunnel = self.tunnel = up.tunnel = Tunnel(self, client, up, now - self.started_at, now)
        dp.tunnels.add(tunnel)
        service.stats.upgrade_opened(tunnel.handshake_s, now)
        if not client.closed:
            dp.outbox.write(client.transport, switching_head(raw_head, self.upgrade))
        early = self.body_buf  # bytes the client sent after its request, before the 101
        if early:
            self.body_buf = None
            self.body_buf_bytes = 0
            for data in early:
                tunnel.from_client(data)
            client.unpause(PAUSE_BUFFER)

    def upgrade_data(self, data: bytes) -> None:
        """Client bytes after an upgrade request: to the tunnel, or held until the 101."""
        tunnel = self.tunnel
        if tunnel is not None:
            tunnel.from_client(data)
            return
        if self.done or self.upgrade is None:
            return  # not upgraded: the connection closes after this response
        buf = self.body_buf
        if buf is None:
            buf = self.body_buf = []
        buf.append(data)
        self.body_buf_bytes += len(data)
        if self.body_buf_bytes > BUFFER_LIMIT:
            self.client.pause(PAUSE_BUFFER)

    def tunnel_ended(self) -> None:
        """The tunnel closed: the exchange ends (status 101)."""
        self.upstream = None
        self._finish(101)

    def upstream_bad_response(self) -> None:
        if not self.done:
            self.fail(Cause.BAD_RESPONSE)

    # -- timers ---------------------------------------------------------------------------

    def _arm(self, deadline: float) -> None:
        """Be checked at ``deadline`` at the latest (the data plane's sweep calls ``check``)."""
        if deadline < self.deadline_next:  # noqa: PLR1730  (no min() call per request)
            self.deadline_next = deadline

    def check(self, now: float) -> None:
        """A deadline passed: fail with the timeout that expired, or wait for the next one."""
        self.deadline_next = INF
        if self.done:
            return
        if now >= self.deadline_total:
            self.fail(Cause.TOTAL_TIMEOUT)
            return
        deadline = self.deadline_total
        if self.connect_task is not None:
            if now >= self.deadline_connect:
                task, self.connect_task = self.connect_task, None
                task.cancel()
                if not self._retry(Cause.CONNECT_TIMEOUT):
                    self.fail(Cause.CONNECT_TIMEOUT)
                return
            deadline = min(deadline, self.deadline_connect)
        elif self.resp_state == 0 and self.req_sent:
            if now >= self.deadline_header:
                self.fail(Cause.HEADER_TIMEOUT)
                return
            deadline = min(deadline, self.deadline_header)
        self._arm(deadline)

    # -- 7: endings -----------------------------------------------------------------------

    def reply_error(self, cause: Cause, retry_after_s: int | None = None) -> None:
        """Answer with the gateway's own error response (nothing was sent to the client yet)."""
        if self.span is not None and cause.status >= 500:
            self.span.failed(cause.code)
        self.cause = cause
        if (
            self.head.expect_continue
            and self.head.has_body
            and not self.continue_sent
            and not self.req_done
        ):
            self.keep_alive = False  # the client may or may not send the body now
        client = self.client
        if not client.closed:
            client.dp.outbox.write(
                client.transport,
                error_response(
                    cause,
                    client.dp.date_value,
                    not self.keep_alive,
                    head_only=self.method == b"HEAD",
                    retry_after_s=retry_after_s,
                ),
            )
        self.resp_state = 1
        self._finish(cause.status, failed=cause.status >= 500)

    def reply_redirect(self, port: bytes) -> None:
        """``redirect_http``: 308 to the same URL on https (the host without its port, then
        the TLS listener's ``port`` suffix)."""
        host = self.head.host
        # An IPv6 literal keeps its brackets; any other host loses its port.
        host = host[: host.find(b"]") + 1] if host[:1] == b"[" else host.partition(b":")[0]
        client = self.client
        if not host:
            self.reply_error(Cause.BAD_REQUEST)
            return
        if self.head.has_body and not self.req_done:
            self.keep_alive = False  # the body is not read: the connection ends after it
        if not client.closed:
            client.dp.outbox.write(
                client.transport,
                redirect_response(
                    b"https://" + host + port + self.target,
                    client.dp.date_value,
                    not self.keep_alive,
                    head_only=self.method == b"HEAD",
                ),
            )
        self.resp_state = 1
        self._finish(308)

    def fail(self, cause: Cause) -> None:
        if self.done:
            return
        if self.span is not None:
            self.span.failed(cause.code)
        self.cause = cause
        if self.resp_state == 0:
            self.reply_error(cause)
            return
        # The head is out: the status cannot change.  End the client connection without
        # completing the body, so the truncation is visible.
        self.keep_alive = False
        self._finish(self.resp_status, failed=True)
        self.client.abort()

    def client_gone(self) -> None:
        """The client disconnected: cancel the upstream request (its connection is not reused)."""
        if self.done:
            return
        if self.tunnel is not None:
            self.tunnel.lost()
            return
        self.keep_alive = False
        if self.span is not None:
            self.span.failed("client-gone")
        self._finish(499)

    def _finish(self, status: int, failed: bool = False, reusable: bool = False) -> None:
        self.done = True
        client = self.client
        wbuf = self.wbuf
        if wbuf:  # flush(), inlined
            self.wbuf = None
            if not client.closed:
                up = self.upstream
                nbytes = 0 if up is None else len(up.data)
                if client.tls and nbytes <= TLS_JOIN_MAX_BYTES and len(wbuf) > 1:
                    client.dp.outbox.write(client.transport, b"".join(wbuf))
                else:
                    client.dp.outbox.writelines(client.transport, wbuf, nbytes)
        dp = client.dp
        active = dp.active
        active.discard(self)
        if not active and dp.drained is not None:
            dp.drained.set()
        task = self.connect_task
        if task is not None:
            self.connect_task = None
            task.cancel()
        now = dp.loop.time()
        h2up = self.h2up
        if h2up is not None:
            self.h2up = None  # (h2up.ex is this exchange: no cycle left for the GC to find)
            h2up.release()
        up = self.upstream
        if up is not None:
            self.upstream = None
            pool = self.pool
            if reusable and pool is not None and not up.closed:
                pool.put(up, now)
            else:
                up.exchange = None
                up.abort()
        if self.span is not None:
            self._end_spans(status, failed)
        service = self.service
        if service is not None and self.arrived:
            tunnel = self.tunnel
            if tunnel is None:
                latency_s = now - self.started_at
                service.stats.complete(status, latency_s, now, failed)
            else:
                latency_s = tunnel.handshake_s
                service.stats.upgrade_closed(now)
            ep = self.endpoint
            if ep is not None:
                balancer = service.balancer
                if balancer.uses_latency:
                    balancer.observe(ep, latency_s, now)
                ep.release()
                # -- issue 4: outlier detection (5xx answers and upstream faults count)
                cause = self.cause
                if cause is None:
                    if status < 500:
                        if status != 499:
                            service.outlier.success(ep.address, now)
                    else:
                        service.outlier.failure(ep.address, now)
                elif cause in UPSTREAM_FAULTS:
                    service.outlier.failure(ep.address, now)
                elif status < 500 and status != 499:
                    service.outlier.success(ep.address, now)
            # -- issue 4: give the slot back (or leave the queue), end the retry reservation
            if self.slot:
                self.slot = False
                service.admission.release()
            elif self.waiter is not None:
                service.admission.abandon(self.waiter)
                self.waiter = None
            if self.retried:
                service.retry_budget.finish()
        access_log = dp.access_log
        if access_log is not None:
            access_log.exchange(self, status, now)
        client.exchange_done(self, now)

    def _end_spans(self, status: int, failed: bool) -> None:
        """End the attempt and SERVER spans (sampled requests only)."""
        span = self.span
        assert span is not None
        attempt = self.attempt_span
        error = span._error if failed else None
        if attempt is not None:
            self.attempt_span = None
            attempt.end(
                self.resp_status or None,
                error,
                _content_length(response_fields(self.resp_head)) if self.resp_status else None,
            )
        request_bytes = None if self.head.chunked else (_content_length(self.headers) or 0)
        span.end(
            status,
            request_bytes,
            _content_length(response_fields(self.resp_head)) if self.resp_status else None,
            error,
        )

    # -- issue 4: retries (see gateway.dataplane.retry for the rules) -----------------------------------

    def _keep_replay(self, pieces: list[bytes] | tuple[bytes, ...] | None) -> None:
        service = self.service
        assert service is not None
        policy = service.retry_policy
        if policy.max_attempts < 2 or "reset" not in policy.retry_on:
            self.replay = None
            return
        if self.replay is None:
            if self.replay_bytes:
                return  # already dropped for being too big
            self.replay = []
        for piece in pieces or ():
            self.replay.append(piece)
            self.replay_bytes += len(piece)
        if self.replay_bytes > policy.replay_body_bytes:
            self.replay = None
            self.replay_bytes = policy.replay_body_bytes + 1

    def _reopen_h2(self) -> bool:
        """Send an HTTP/2 stream the upstream's GOAWAY left unprocessed again, on a new
        connection to the same endpoint (RFC 9113 §6.8), once per exchange; True if sent.
        Like a connect failure it costs no attempt and no retry budget."""
        h2up = self.h2up
        ep = self.endpoint
        service = self.service
        if (
            h2up is None
            or h2up.replay is None
            or ep is None
            or service is None
            or self.goaway_retried
            or self.done
            or self.client.closed
            or getattr(ep.pool, "closed", True)
        ):
            return False
        self.goaway_retried = True
        service.retry_budget.start_unbudgeted()
        h2up.release()
        new = self.h2up = h2up.retry_copy()
        self.req_sent = False
        self.interim = False
        if self.span is not None and self.attempt_span is not None:
            self.attempt_span.end(None, Cause.RESET.code)
            self.attempt_span = self.span.attempt(ep.host, ep.port, retry_reason="goaway")
        new.open(ep)
        return True

    def _retry(self, cause: Cause, unprocessed: bool = False) -> bool:
        """Start another attempt on an untried endpoint if that is safe; True if started.
        ``unprocessed``: an HTTP/2 stream the upstream refused (REFUSED_STREAM) or never
        took (beyond its GOAWAY): safe like a connect failure."""
        service = self.service
        ep = self.endpoint
        if service is None or ep is None or self.done or self.client.closed:
            return False
        h2up = self.h2up
        if h2up is not None and h2up.replay is None:
            return False  # body bytes went out on the stream that are no longer kept
        failure = Failure.CONNECT if unprocessed else _FAILURE_OF[cause]
        tried = self.tried = [*(self.tried or ()), ep]
        never_sent = failure is Failure.CONNECT
        if never_sent:
            self.unreached += 1
        if h2up is not None:  # its replay holds the whole body so far
            replayable = not self.head.has_body or never_sent or self.req_done
        else:
            replayable = (
                not self.head.has_body or never_sent or (self.replay is not None and self.req_done)
            )
        reached = len(tried) - self.unreached
        if retry_reason(service.retry_policy, failure, reached, self.method, replayable) is None:
            return False
        candidates = untried(service.endpoints.routable, tried)
        if not candidates:
            return False
        now = self.client.dp.loop.time()
        if never_sent:  # reached no upstream: bounded by the endpoints left and the deadline
            if now >= self.deadline_total:
                return False
            service.retry_budget.start_unbudgeted()
        elif not self.retried:
            if not service.retry_budget.try_start(service.stats.in_flight):
                return False
            self.retried = True
        service.outlier.failure(ep.address, now)
        service.balancer.observe(ep, now - self.started_at, now)
        ep.release()
        if h2up is not None:
            h2up.release()
            self.h2up = h2up.retry_copy()
        elif not never_sent:
            self.body_buf = self.replay
            self.replay = None
            self.replay_bytes = 0
        self.req_sent = False
        self.interim = False
        self.upstream = None
        self.deadline_next = INF
        self._arm(self.deadline_total)
        new = service.balancer.pick(candidates)
        new.acquire()
        self.endpoint = new
        if self.span is not None:
            if self.attempt_span is not None:
                self.attempt_span.end(None, cause.code)
            self.attempt_span = self.span.attempt(new.host, new.port, retry_reason=cause.code)
        if self.h2up is not None:
            self.h2up.open(new)
            return True
        pool = self.pool = _pool_of(new)
        conn = pool.take(now)
        if conn is not None:
            self.reused = True
            self.bind(conn)
        else:
            self.connect()
        return True

    def __repr__(self) -> str:
        state = "done" if self.done else ("responding" if self.resp_state else "waiting")
        return f"Exchange({self.method.decode()} {self.target.decode('latin-1')}, {state})"


def _content_length(
    headers: list[tuple[bytes, bytes]] | tuple[tuple[bytes, bytes], ...],
) -> int | None:
    """The Content-Length of a message (for span attributes; sampled requests only)."""
    for name, value in headers:
        if name.lower() == b"content-length":
            digits = value.strip()
            return int(digits) if digits.isdigit() else None
    return None
