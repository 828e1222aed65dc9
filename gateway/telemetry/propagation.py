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

TRACEPARENT = b"traceparent"
TRACESTATE = b"tracestate"
BAGGAGE = b"baggage"
TRACE_HEADERS = frozenset({TRACEPARENT, TRACESTATE, BAGGAGE})
"""Header names (lowercase bytes) the data plane hands to tracing; the rest pass through."""

SAMPLED = 0x01

_HEX = b"0123456789abcdef"
_ZERO_TRACE = b"0" * 32
_ZERO_SPAN = b"0" * 16
_DASH = 0x2D


def valid_traceparent(value: bytes) -> bytes | None:
    """The 55-byte ``version-trace_id-span_id-flags`` part of a valid ``traceparent``, or None.

    Invalid means: not the W3C shape (lowercase hex, dashes in place), version ``ff``, extra
    fields on version 00, or an all-zero trace or span id.  Surrounding spaces and tabs are
    ignored (OWS in HTTP).  Byte checks in C (``translate``, slices), no regex, no ints.
    """
    if len(value) != 55:
        value = value.strip(b" \t")
        if len(value) != 55:
            # A higher version may append fields: read the first four, as the spec asks.
            if len(value) < 56 or value[55] != _DASH or value[:2] in (b"00", b"ff"):
                return None
            value = value[:55]
    if (
        value[2] != _DASH
        or value[35] != _DASH
        or value[52] != _DASH
        or value.translate(None, _HEX) != b"---"
        or value[:2] == b"ff"
        or value[3:35] == _ZERO_TRACE
        or value[36:52] == _ZERO_SPAN
    ):
        return None
    return value


def is_sampled(valid: bytes) -> bool:
    """The sampled bit of a :func:`valid_traceparent` result, read from its last hex digit."""
    c = valid[54]
    return bool(c & 1) if c <= 0x39 else not c & 1  # '0'-'9' -> c-48; 'a'-'f' -> c-87


def parse_traceparent(value: bytes) -> tuple[int, int, int] | None:
    """``(trace_id, parent_span_id, flags)`` from a ``traceparent`` value, or None if invalid."""
    valid = valid_traceparent(value)
    if valid is None:
        return None
    return int(valid[3:35], 16), int(valid[36:52], 16), int(valid[53:55], 16)


def format_traceparent(trace_id: int, span_id: int, flags: int = SAMPLED) -> bytes:
    """A version-00 ``traceparent`` value: ``00-<trace id>-<span id>-<flags>``."""
    return b"00-%032x-%016x-%02x" % (trace_id, span_id, flags & 0xFF)
