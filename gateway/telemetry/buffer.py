"""The in-memory ring buffer of recent traces: a SpanProcessor behind ``GET /api/traces``.

Bounded twice: at most ``max_traces`` traces (the trace whose first span ended longest ago
is dropped first) and at most ``max_spans_per_trace`` spans each (later spans are counted in
``dropped_spans``, not kept).  Only sampled spans reach a SpanProcessor, so the buffer holds
what the sampler kept.  On the hot path
the SDK's finished, immutable ``ReadableSpan`` objects are kept as they are (appending a
reference is all ``on_end`` costs); :meth:`RecentTraces.query` turns them into JSON-ready
dicts.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from opentelemetry.trace import StatusCode

SERVICE_ATTRIBUTE = "sluice.service"
TraceStatus = Literal["ok", "error"]
TraceKind = Literal["request", "scaler"]


@dataclass(frozen=True, slots=True)
class SpanRecord:
    """One finished span, as kept in the buffer."""

    span_id: int
    parent_span_id: int | None
    name: str
    kind: str
    start_ns: int
    end_ns: int
    status: str
    status_description: str | None
    attributes: Mapping[str, Any]
    events: tuple[tuple[str, int, Mapping[str, Any]], ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "span_id": f"{self.span_id:016x}",
            "parent_span_id": None
            if self.parent_span_id is None
            else f"{self.parent_span_id:016x}",
            "name": self.name,
            "kind": self.kind,
            "start_unix_nano": self.start_ns,
            "end_unix_nano": self.end_ns,
            "duration_ms": (self.end_ns - self.start_ns) / 1e6,
            "status": self.status,
            "status_description": self.status_description,
            "attributes": {k: _jsonable(v) for k, v in self.attributes.items()},
            "events": [
                {
                    "name": n,
                    "time_unix_nano": t,
                    "attributes": {k: _jsonable(v) for k, v in a.items()},
                }
                for n, t, a in self.events
            ],
        }


def _jsonable(value: Any) -> Any:
    if isinstance(value, tuple | list):
        return list(value)
    return value


@dataclass(slots=True)
class _Trace:
    trace_id: int
    spans: list[ReadableSpan] = field(default_factory=list)
    dropped_spans: int = 0


def _record(span: ReadableSpan) -> SpanRecord:
    ctx = span.context
    assert ctx is not None
    parent = span.parent
    status = span.status
    return SpanRecord(
        span_id=ctx.span_id,
        parent_span_id=None if parent is None else parent.span_id,
        name=span.name,
        kind=span.kind.name,
        start_ns=span.start_time or 0,
        end_ns=span.end_time or span.start_time or 0,
        status=status.status_code.name,
        status_description=status.description,
        attributes=dict(span.attributes or {}),
        events=tuple((e.name, e.timestamp, dict(e.attributes or {})) for e in span.events),
    )


class RecentTraces(SpanProcessor):
    """Keeps the most recent traces in memory, bounded by trace count and spans per trace."""

    def __init__(self, max_traces: int = 200, max_spans_per_trace: int = 256) -> None:
        if max_traces < 0:
            raise ValueError(f"max_traces must be >= 0, got {max_traces}")
        if max_spans_per_trace < 1:
            raise ValueError(f"max_spans_per_trace must be >= 1, got {max_spans_per_trace}")
        self.max_traces = max_traces
        self.max_spans_per_trace = max_spans_per_trace
        self._traces: OrderedDict[int, _Trace] = OrderedDict()
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return (
            f"RecentTraces(traces={len(self._traces)}/{self.max_traces}, "
            f"max_spans_per_trace={self.max_spans_per_trace})"
        )

    def __len__(self) -> int:
        return len(self._traces)

    # -- SpanProcessor -------------------------------------------------------------

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        return None

    def on_end(self, span: ReadableSpan) -> None:
        if self.max_traces == 0 or span.context is None:
            return
        trace_id = span.context.trace_id
        with self._lock:
            entry = self._traces.get(trace_id)
            if entry is None:
                entry = self._traces[trace_id] = _Trace(trace_id)
                while len(self._traces) > self.max_traces:
                    self._traces.popitem(last=False)
            if len(entry.spans) < self.max_spans_per_trace:
                entry.spans.append(span)
            else:
                entry.dropped_spans += 1

    def shutdown(self) -> None:
        return None

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True

    # -- queries -------------------------------------------------------------------

    def query(
        self,
        *,
        service: str | None = None,
        min_duration_ms: float = 0.0,
        status: TraceStatus | None = None,
        trace_id: int | None = None,
        kind: TraceKind | None = None,
        limit: int = 20,
    ) -> list[dict[str, Any]]:
        """Matching traces, most recent first, as JSON-ready dicts (see docs/telemetry.md)."""
        with self._lock:
            if trace_id is not None:
                found = self._traces.get(trace_id)
                candidates = [] if found is None else [(found, list(found.spans))]
            else:
                candidates = [(t, list(t.spans)) for t in reversed(self._traces.values())]
        # Copied out of the spans outside the lock, on the (rare) query path.
        out: list[dict[str, Any]] = []
        for entry, kept in candidates:
            if len(out) >= limit:
                break
            summary = _summarise(entry, [_record(span) for span in kept])
            if service is not None and service not in summary["services"]:
                continue
            if summary["duration_ms"] < min_duration_ms:
                continue
            if status is not None and summary["status"] != status:
                continue
            if kind is not None and summary["kind"] != kind:
                continue
            out.append(summary)
        return out


def _summarise(entry: _Trace, spans: Sequence[SpanRecord]) -> dict[str, Any]:
    ids = {s.span_id for s in spans}
    roots = [s for s in spans if s.parent_span_id is None or s.parent_span_id not in ids]
    root = min(roots, key=lambda s: s.start_ns) if roots else None
    start = min(s.start_ns for s in spans) if spans else 0
    end = max(s.end_ns for s in spans) if spans else 0
    services = sorted(
        {str(s.attributes[SERVICE_ATTRIBUTE]) for s in spans if SERVICE_ATTRIBUTE in s.attributes}
    )
    error_spans = sum(s.status == StatusCode.ERROR.name for s in spans)
    error = root.status == StatusCode.ERROR.name if root is not None else error_spans > 0
    name = root.name if root is not None else ""
    return {
        "trace_id": f"{entry.trace_id:032x}",
        "root": name,
        "kind": "scaler" if name.startswith("sluice.scaler") else "request",
        "services": services,
        "start_unix_nano": start,
        "duration_ms": (end - start) / 1e6,
        "status": "error" if error else "ok",
        "span_count": len(spans),
        "error_spans": error_spans,
        "dropped_spans": entry.dropped_spans,
        "spans": [s.to_json() for s in sorted(spans, key=lambda s: (s.start_ns, s.end_ns))],
    }
