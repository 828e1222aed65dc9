"""Request spans for the data plane: sample first, then build spans only for sampled requests.

Hot-path contract (the proxy is callback style, with no per-request ``contextvars`` context):

* tracing off: the data plane holds ``tracing = None`` and does one ``is not None`` branch per
  request; nothing else runs;
* tracing on, request not sampled: :meth:`RequestTracing.start` returns None after one regex
  match on the incoming ``traceparent`` (parent-based: the caller's sampled flag decides) or
  one ``getrandbits(64)`` compared with the ratio's bound (a new trace); no span object, no
  context attach.  The client's ``traceparent``/``tracestate``/``baggage`` headers are forwarded
  unchanged, so the upstream joins the caller's trace directly;
* sampled: a SERVER span (:class:`RequestSpan`), optionally an INTERNAL
  ``sluice.admission.queue`` child covering the wait for an admission slot, and a CLIENT span per
  upstream attempt (:class:`AttemptSpan`), whose :attr:`AttemptSpan.traceparent` replaces the
  ``traceparent`` header sent upstream (``tracestate`` and ``baggage`` are forwarded as received).

The decision is exactly OpenTelemetry's ``ParentBased(TraceIdRatioBased(ratio))``: a new trace
is recorded when the low 64 bits of its trace id are below ``ratio × 2**64``; the trace id chosen
here is handed to the SDK (``PresetTraceIds``), whose sampler then agrees.
"""

from __future__ import annotations

import random
import time
from typing import TYPE_CHECKING

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.trace.sampling import TraceIdRatioBased
from opentelemetry.trace import (
    NonRecordingSpan,
    Span,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    Tracer,
    TraceState,
)

from gateway.telemetry.propagation import SAMPLED, format_traceparent, parse_traceparent

if TYPE_CHECKING:
    from gateway.telemetry.provider import PresetTraceIds

_EMPTY = Context()


def _text(value: bytes | str) -> str:
    return value if isinstance(value, str) else value.decode("latin-1")


def _tracestate(value: bytes | None) -> TraceState:
    if not value:
        return TraceState()
    return TraceState.from_header([value.decode("latin-1")])


class RequestTracing:
    """Per-gateway request tracer; ``start`` is called once per request when tracing is on."""

    __slots__ = ("_bound", "_getrandbits", "_ids", "_tracer", "ratio")

    def __init__(self, tracer: Tracer, ids: PresetTraceIds, ratio: float) -> None:
        if not 0.0 <= ratio <= 1.0:
            raise ValueError(f"ratio must be in 0..1, got {ratio!r}")
        self._tracer = tracer
        self._ids = ids
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
        client_address: str | None = None,
        start_ns: int | None = None,
    ) -> RequestSpan | None:
        """Sample this request; return its SERVER span, or None when it is not recorded.

        ``path`` is the request target's path (a query string after '?' is cut off);
        ``host`` the Host header (``name[:port]``); ``start_ns`` the arrival time on
        ``time.time_ns()`` (default: now).
        """
        if traceparent is not None:
            parsed = parse_traceparent(traceparent)
            if parsed is not None:
                if not parsed[2] & SAMPLED:
                    return None
                parent = SpanContext(
                    parsed[0],
                    parsed[1],
                    is_remote=True,
                    trace_flags=TraceFlags(parsed[2]),
                    trace_state=_tracestate(tracestate),
                )
                context = trace.set_span_in_context(NonRecordingSpan(parent), _EMPTY)
                return RequestSpan(
                    self._tracer, context, method, path, host, client_address, start_ns
                )
        low = self._getrandbits(64)
        if low >= self._bound:
            return None
        self._ids.preset((self._getrandbits(64) << 64) | low or 1)
        return RequestSpan(self._tracer, _EMPTY, method, path, host, client_address, start_ns)


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

    __slots__ = ("_context", "_method", "_route", "_tracer", "span")

    def __init__(  # noqa: PLR0917 - built only by RequestTracing.start
        self,
        tracer: Tracer,
        parent: Context,
        method: bytes | str,
        path: bytes | str,
        host: bytes | str | None,
        client_address: str | None,
        start_ns: int | None,
    ) -> None:
        self._tracer = tracer
        self._method = _text(method)
        self._route: str | None = None
        target = _text(path)
        url_path, _, _query = target.partition("?")
        attributes: dict[str, str | int] = {
            "http.request.method": self._method,
            "url.path": url_path,
            "url.scheme": "http",
            "network.protocol.version": "1.1",
        }
        if host:
            name, port = _split_host(_text(host))
            attributes["server.address"] = name
            if port is not None:
                attributes["server.port"] = port
        if client_address:
            attributes["client.address"] = client_address
        self.span: Span = tracer.start_span(
            self._method,
            context=parent,
            kind=SpanKind.SERVER,
            attributes=attributes,
            start_time=start_ns,
        )
        self._context = trace.set_span_in_context(self.span, _EMPTY)

    def __repr__(self) -> str:
        ctx = self.span.get_span_context()
        return f"RequestSpan({ctx.trace_id:032x}/{ctx.span_id:016x}, route={self._route!r})"

    @property
    def trace_id(self) -> int:
        return self.span.get_span_context().trace_id

    def routed(self, service: str, route: str | None = None) -> None:
        """The request matched ``route`` (its path pattern) of ``service``."""
        self._route = route
        self.span.set_attribute("sluice.service", service)
        if route is not None:
            self.span.set_attribute("http.route", route)
            self.span.update_name(f"{self._method} {route}")

    def queued(self, wait_s: float, end_ns: int | None = None) -> None:
        """The request waited ``wait_s`` seconds for an admission slot, ending at ``end_ns``.

        Recorded as a child INTERNAL span ``sluice.admission.queue`` (so the waterfall shows
        it) plus the ``sluice.admission.queue_wait_ms`` attribute on the SERVER span.
        """
        end = time.time_ns() if end_ns is None else end_ns
        self.span.set_attribute("sluice.admission.queue_wait_ms", wait_s * 1e3)
        if wait_s <= 0:
            return
        child = self._tracer.start_span(
            "sluice.admission.queue",
            context=self._context,
            kind=SpanKind.INTERNAL,
            start_time=end - int(wait_s * 1e9),
        )
        child.end(end)

    def rejected(self, reason: str) -> None:
        """Admission refused the request (queue full, rate limited, no endpoint...)."""
        self.span.add_event("sluice.admission.rejected", {"sluice.reason": reason})

    def attempt(
        self,
        host: str,
        port: int,
        attempt: int = 1,
        retry_reason: str | None = None,
        *,
        path: bytes | str | None = None,
        start_ns: int | None = None,
    ) -> AttemptSpan:
        """A CLIENT span for upstream attempt number ``attempt`` (1 = first try) to ``host:port``."""
        attributes: dict[str, str | int] = {
            "http.request.method": self._method,
            "server.address": host,
            "server.port": port,
            "sluice.upstream.attempt": attempt,
        }
        if attempt > 1:
            attributes["http.request.resend_count"] = attempt - 1
        if retry_reason is not None:
            attributes["sluice.retry.reason"] = retry_reason
        if path is not None:
            attributes["url.full"] = f"http://{host}:{port}{_text(path)}"
        span = self._tracer.start_span(
            self._method,
            context=self._context,
            kind=SpanKind.CLIENT,
            attributes=attributes,
            start_time=start_ns,
        )
        return AttemptSpan(span)

    def end(
        self,
        status_code: int | None,
        request_body_bytes: int | None = None,
        response_body_bytes: int | None = None,
        error: str | None = None,
        end_ns: int | None = None,
    ) -> None:
        """The response is finished (or the request failed with ``error``, e.g. 'client_gone')."""
        span = self.span
        if status_code is not None:
            span.set_attribute("http.response.status_code", status_code)
        if request_body_bytes is not None:
            span.set_attribute("http.request.body.size", request_body_bytes)
        if response_body_bytes is not None:
            span.set_attribute("http.response.body.size", response_body_bytes)
        if error is not None:
            span.set_attribute("error.type", error)
            span.set_status(Status(StatusCode.ERROR, error))
        elif status_code is not None and status_code >= 500:
            span.set_attribute("error.type", str(status_code))
            span.set_status(Status(StatusCode.ERROR))
        span.end(end_ns)


class AttemptSpan:
    """The CLIENT span of one upstream attempt."""

    __slots__ = ("span", "traceparent")

    def __init__(self, span: Span) -> None:
        self.span = span
        ctx = span.get_span_context()
        self.traceparent: bytes = format_traceparent(ctx.trace_id, ctx.span_id, ctx.trace_flags)
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
        span = self.span
        if status_code is not None:
            span.set_attribute("http.response.status_code", status_code)
        if response_body_bytes is not None:
            span.set_attribute("http.response.body.size", response_body_bytes)
        if error is not None:
            span.set_attribute("error.type", error)
            span.set_status(Status(StatusCode.ERROR, error))
        elif status_code is not None and status_code >= 400:
            span.set_attribute("error.type", str(status_code))
            span.set_status(Status(StatusCode.ERROR))
        span.end(end_ns)
