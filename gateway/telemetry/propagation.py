"""W3C Trace Context on raw header bytes, cheap enough for the proxy's hot path.

The data plane parses headers as bytes (httptools) and has no per-request ``contextvars``
context, so these helpers work on ``bytes`` and plain ints instead of the OpenTelemetry
propagator API (which wants a carrier dict and a Context).

* ``traceparent`` is parsed by :func:`parse_traceparent` (version 00 exactly; a higher version
  is read by its first four fields, as the spec asks) and written by :func:`format_traceparent`.
* ``tracestate`` and ``baggage`` are opaque to Sluice: they are forwarded upstream unchanged
  (Sluice adds no tracestate entry of its own), and the tracestate is attached to the recorded
  spans' context so exporters see it.
"""

from __future__ import annotations

import re

TRACEPARENT = b"traceparent"
TRACESTATE = b"tracestate"
BAGGAGE = b"baggage"
TRACE_HEADERS = frozenset({TRACEPARENT, TRACESTATE, BAGGAGE})
"""Header names (lowercase bytes) the data plane hands to tracing; the rest pass through."""

SAMPLED = 0x01

_TRACEPARENT = re.compile(rb"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?")


def parse_traceparent(value: bytes) -> tuple[int, int, int] | None:
    """``(trace_id, parent_span_id, flags)`` from a ``traceparent`` value, or None if invalid.

    Invalid means: not the W3C shape, version ``ff``, extra fields on version 00, or an
    all-zero trace or span id.  Surrounding spaces and tabs are ignored (OWS in HTTP).
    """
    m = _TRACEPARENT.fullmatch(value.strip(b" \t"))
    if m is None:
        return None
    version, trace_hex, span_hex, flags_hex, rest = m.groups()
    if version == b"ff" or (version == b"00" and rest is not None):
        return None
    trace_id = int(trace_hex, 16)
    span_id = int(span_hex, 16)
    if trace_id == 0 or span_id == 0:
        return None
    return trace_id, span_id, int(flags_hex, 16)


def format_traceparent(trace_id: int, span_id: int, flags: int = SAMPLED) -> bytes:
    """A version-00 ``traceparent`` value: ``00-<trace id>-<span id>-<flags>``."""
    return b"00-%032x-%016x-%02x" % (trace_id, span_id, flags & 0xFF)
