"""Request spans for the data plane: sample first, then record only sampled requests, cheaply.

Hot-path contract (the proxy is callback style, with no per-request ``contextvars`` context):

* tracing off: the data plane holds ``tracing = None`` and does one ``is not None`` branch per
  request; nothing else runs;
* tracing on, request not sampled: :meth:`RequestTracing.start` returns None after a few byte
  checks on the incoming ``traceparent`` (parent-based: the caller's sampled flag decides) or
  one ``getrandbits(64)`` compared with the ratio's bound (a new trace); no span object, no
  context attach.  The client's ``traceparent``/``tracestate``/``baggage`` headers are forwarded
  unchanged, so the upstream joins the caller's trace directly;
* sampled: a SERVER span (:class:`RequestSpan`), optionally an INTERNAL
  ``sluice.admission.queue`` child covering the wait for an admission slot, and a CLIENT span per
  upstream attempt (:class:`AttemptSpan`), whose :attr:`AttemptSpan.traceparent` replaces the
  ``traceparent`` header sent upstream (``tracestate`` and ``baggage`` are forwarded as received).

The decision is exactly OpenTelemetry's ``ParentBased(TraceIdRatioBased(ratio))``: a new trace
is recorded when the low 64 bits of its random trace id are below ``ratio × 2**64``.

Sampled spans are plain slotted objects while the request runs and become one SDK
``ReadableSpan`` each when they end, handed straight to the provider's span processors (the
ring buffer, the batch exporter).  This skips the SDK's per-span machinery (sampler call,
locks, attribute re-validation on every ``set_attribute``), which cost ~6x more per request
here; the attributes are Sluice's own, all primitives.  Processors' ``on_start`` is not
called for request spans (neither the buffer nor the batch exporter uses it).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.trace.sampling import TraceIdRatioBased
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags, TraceState

from gateway.telemetry.propagation import SAMPLED, format_traceparent, is_sampled, valid_traceparent

Emit = Callable[[ReadableSpan], None]
_UNSET = Status(StatusCode.UNSET)
_ERROR = Status(StatusCode.ERROR)
_SAMPLED_FLAGS = TraceFlags(SAMPLED)
_EMPTY_STATE = TraceState()


KNOWN_METHODS = frozenset(
    ("GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH")
)
"""HTTP semantic conventions: any other method is recorded as ``_OTHER`` (with
``http.request.method_original``) and the span is named ``HTTP``."""
OTHER_METHOD = "_OTHER"


def _text(value: bytes | str) -> str:
    return value if isinstance(value, str) else value.decode("latin-1")


def _tracestate(value: bytes | None) -> TraceState:
    if not value:
        return _EMPTY_STATE
    return TraceState.from_header([value.decode("latin-1")])


def _span_id() -> int:
    return random.getrandbits(64) or 1


class RequestTracing:
    """Per-gateway request tracer; ``start`` is called once per request when tracing is on."""

    __slots__ = ("_bound", "_emit", "_getrandbits", "_resource", "_scope", "ratio")

    def __init__(
        self, emit: Emit, resource: Resource, scope: InstrumentationScope, ratio: float
    ) -> None:
        if not 0.0 <= ratio <= 1.0:
            raise ValueError(f"ratio must be in 0..1, got {ratio!r}")
        self._emit = emit
        self._resource = resource
        self._scope = scope
        self.ratio = ratio
        self._bound = TraceIdRatioBased.get_bound_for_rate(ratio)
        self._getrandbits = random.getrandbits

    def __repr__(self) -> str:
        return f"RequestTracing(ratio={self.ratio:g})"

    def start(  # noqa: PLR0917 - positional on purpose: called per request
        self,
        traceparent: bytes | None,
        tracestate: bytes | None,
        method: bytes | str,
        path: bytes | str,
        host: bytes | str | None = None,
        client_address: bytes | str | None = None,
        start_ns: int | None = None,
    ) -> RequestSpan | None:
        """Sample this request; return its SERVER span, or None when it is not recorded.

        ``path`` is the request target (``url.path``, and ``url.query`` after '?'); ``host`` the
        Host header (``name[:port]``); ``start_ns`` the arrival time on ``time.time_ns()``
        (default: now).
        """
        if traceparent is not None:
            valid = valid_traceparent(traceparent)
            if valid is not None:
                if not is_sampled(valid):
                    return None
                parent = SpanContext(
                    int(valid[3:35], 16),
                    int(valid[36:52], 16),
                    is_remote=True,
                    trace_flags=TraceFlags(int(valid[53:55], 16)),
                    trace_state=_tracestate(tracestate),
                )
                return RequestSpan(
                    self, parent.trace_id, parent, method, path, host, client_address, start_ns
                )
        low = self._getrandbits(64)
        if low >= self._bound:
            return None
        trace_id = (self._getrandbits(64) << 64) | low or 1
        return RequestSpan(self, trace_id, None, method, path, host, client_address, start_ns)


def _split_host(host: str) -> tuple[str, int | None]:
    if host.startswith("["):
        end = host.find("]")
        name, rest = host[1:end], host[end + 1 :]
        port = rest[1:] if rest.startswith(":") else ""
    else:
        name, _, port = host.partition(":")
    return name, int(port) if port.isdigit() else None


class RequestSpan:
    """The SERVER span of one sampled request, and the hooks the data plane calls on it."""

    __slots__ = (
        "_attempts",
        "_error",
        "_events",
        "_method",
        "_name",
        "_target",
        "_tracing",
        "attributes",
        "context",
        "parent",
        "start_ns",
    )

    def __init__(  # noqa: PLR0917 - built only by RequestTracing.start
        self,
        tracing: RequestTracing,
        trace_id: int,
        parent: SpanContext | None,
        method: bytes | str,
        path: bytes | str,
        host: bytes | str | None,
        client_address: bytes | str | None,
        start_ns: int | None,
    ) -> None:
        self._tracing = tracing
        self._attempts = 0
        self._error: str | None = None
        self.parent = parent
        self.context = SpanContext(
            trace_id,
            _span_id(),
            is_remote=False,
            trace_flags=_SAMPLED_FLAGS if parent is None else parent.trace_flags,
            trace_state=_EMPTY_STATE if parent is None else parent.trace_state,
        )
        self.start_ns = time.time_ns() if start_ns is None else start_ns
        original = _text(method)
        known = original in KNOWN_METHODS
        self._method = original if known else OTHER_METHOD
        self._name = original if known else "HTTP"
        self._events: list[Event] = []
        self._target = _text(path)
        url_path, has_query, query = self._target.partition("?")
        attributes: dict[str, str | int | float] = {
            "http.request.method": self._method,
            "url.path": url_path,
            "url.scheme": "http",
            "network.protocol.version": "1.1",
        }
        if not known:
            attributes["http.request.method_original"] = original
        if has_query:
            attributes["url.query"] = query
        if host:
            name, port = _split_host(_text(host))
            attributes["server.address"] = name
            if port is not None:
                attributes["server.port"] = port
        if client_address:
            peer = _text(client_address)
            attributes["client.address"] = peer
            attributes["network.peer.address"] = peer
        self.attributes = attributes

    def client_headers(self, headers: list[tuple[bytes, bytes]]) -> None:
        """Record what the span needs from the client's header fields (``user_agent.original``)."""
        for name, value in headers:
            if name.lower() == b"user-agent":
                self.attributes["user_agent.original"] = _text(value)
                return

    def __repr__(self) -> str:
        return (
            f"RequestSpan({self.context.trace_id:032x}/{self.context.span_id:016x}, {self._name!r})"
        )

    @property
    def trace_id(self) -> int:
        return self.context.trace_id

    def routed(self, service: str, route: str | None = None) -> None:
        """The request matched ``route`` (its path pattern) of ``service``."""
        self.attributes["sluice.service"] = service
        if route is not None:
            self.attributes["http.route"] = route
            if self._method != OTHER_METHOD:
                self._name = f"{self._method} {route}"

    def queued(self, wait_s: float, end_ns: int | None = None) -> None:
        """The request waited ``wait_s`` seconds for an admission slot, ending at ``end_ns``.

        Recorded as a child INTERNAL span ``sluice.admission.queue`` (so the waterfall shows
        it) plus the ``sluice.admission.queue_wait_s`` attribute (seconds, to the microsecond)
        on the SERVER span.
        """
        self.attributes["sluice.admission.queue_wait_s"] = round(wait_s, 6)
        if wait_s <= 0:
            return
        end = time.time_ns() if end_ns is None else end_ns
        tracing = self._tracing
        tracing._emit(
            ReadableSpan(
                "sluice.admission.queue",
                context=self._child_context(),
                parent=self.context,
                resource=tracing._resource,
                attributes={"sluice.admission.queue_wait_s": round(wait_s, 6)},
                kind=SpanKind.INTERNAL,
                start_time=end - int(wait_s * 1e9),
                end_time=end,
                instrumentation_scope=tracing._scope,
            )
        )

    def event(self, name: str, attributes: dict[str, str | int | float] | None = None) -> None:
        """A point in time worth seeing on the SERVER span (e.g. ``sluice.admission.rejected``)."""
        self._events.append(Event(name, attributes or {}, time.time_ns()))

    def failed(self, error: str) -> None:
        """The request failed with ``error`` (e.g. 'upstream-connect-failed'); ``end`` reports it."""
        self._error = error

    def rejected(self, reason: str) -> None:
        """Admission refused the request (queue full, rate limited, no endpoint...)."""
        self.event("sluice.admission.rejected", {"sluice.reason": reason})

    def _child_context(self) -> SpanContext:
        ctx = self.context
        return SpanContext(
            ctx.trace_id,
            _span_id(),
            is_remote=False,
            trace_flags=ctx.trace_flags,
            trace_state=ctx.trace_state,
        )

    def attempt(
        self,
        host: str,
        port: int,
        attempt: int | None = None,
        retry_reason: str | None = None,
        *,
        path: bytes | str | None = None,
        start_ns: int | None = None,
    ) -> AttemptSpan:
        """A CLIENT span for an upstream attempt to ``host:port``.

        ``attempt`` numbers it (1 = the first try); by default attempts are counted here.
        ``retry_reason`` says why this is a retry (e.g. 'stale-pooled-connection').
        """
        if attempt is None:
            attempt = self._attempts + 1
        self._attempts = attempt
        attributes: dict[str, str | int | float] = {
            "http.request.method": self._method,
            "server.address": host,
            "server.port": port,
            "sluice.upstream.attempt": attempt,
        }
        if attempt > 1:
            attributes["http.request.resend_count"] = attempt - 1
        if retry_reason is not None:
            attributes["sluice.retry.reason"] = retry_reason
        target = self._target if path is None else _text(path)
        if target.startswith("/"):
            attributes["url.full"] = f"http://{host}:{port}{target}"
        return AttemptSpan(
            self._tracing,
            self._method,
            self._child_context(),
            self.context,
            attributes,
            time.time_ns() if start_ns is None else start_ns,
        )

    def end(
        self,
        status_code: int | None,
        request_body_bytes: int | None = None,
        response_body_bytes: int | None = None,
        error: str | None = None,
        end_ns: int | None = None,
    ) -> None:
        """The response is finished (or the request failed with ``error``, e.g. 'client-gone').

        ``error`` defaults to what :meth:`failed` recorded.
        """
        attributes = self.attributes
        if error is None:
            error = self._error
        if request_body_bytes is not None:
            attributes["http.request.body.size"] = request_body_bytes
        status = _outcome(attributes, status_code, response_body_bytes, error, 500)
        tracing = self._tracing
        tracing._emit(
            ReadableSpan(
                self._name,
                context=self.context,
                parent=self.parent,
                resource=tracing._resource,
                attributes=attributes,
                events=self._events,
                kind=SpanKind.SERVER,
                status=status,
                start_time=self.start_ns,
                end_time=time.time_ns() if end_ns is None else end_ns,
                instrumentation_scope=tracing._scope,
            )
        )


class AttemptSpan:
    """The CLIENT span of one upstream attempt."""

    __slots__ = ("_name", "_tracing", "attributes", "context", "parent", "start_ns", "traceparent")

    def __init__(  # noqa: PLR0917 - built only by RequestSpan.attempt
        self,
        tracing: RequestTracing,
        name: str,
        context: SpanContext,
        parent: SpanContext,
        attributes: dict[str, str | int | float],
        start_ns: int,
    ) -> None:
        self._tracing = tracing
        self._name = name
        self.context = context
        self.parent = parent
        self.attributes = attributes
        self.start_ns = start_ns
        self.traceparent: bytes = format_traceparent(
            context.trace_id, context.span_id, context.trace_flags
        )
        """The ``traceparent`` value to send upstream, naming this span as the parent."""

    def __repr__(self) -> str:
        return f"AttemptSpan({self.traceparent.decode()})"

    def end(
        self,
        status_code: int | None,
        error: str | None = None,
        response_body_bytes: int | None = None,
        end_ns: int | None = None,
    ) -> None:
        """The attempt finished with ``status_code``, or failed with ``error`` (e.g. 'connect_refused')."""
        attributes = self.attributes
        status = _outcome(attributes, status_code, response_body_bytes, error, 400)
        tracing = self._tracing
        tracing._emit(
            ReadableSpan(
                self._name,
                context=self.context,
                parent=self.parent,
                resource=tracing._resource,
                attributes=attributes,
                kind=SpanKind.CLIENT,
                status=status,
                start_time=self.start_ns,
                end_time=time.time_ns() if end_ns is None else end_ns,
                instrumentation_scope=tracing._scope,
            )
        )


def _outcome(
    attributes: dict[str, str | int | float],
    status_code: int | None,
    response_body_bytes: int | None,
    error: str | None,
    error_from: int,
) -> Status:
    """Record the response attributes; the span status (HTTP semantic conventions: a SERVER
    span is an error from 5xx, a CLIENT span from 4xx, ``error_from`` says which)."""
    if status_code is not None:
        attributes["http.response.status_code"] = status_code
    if response_body_bytes is not None:
        attributes["http.response.body.size"] = response_body_bytes
    if error is not None:
        attributes["error.type"] = error
        return Status(StatusCode.ERROR, error)
    if status_code is not None and status_code >= error_from:
        attributes["error.type"] = str(status_code)
        return _ERROR
    return _UNSET
