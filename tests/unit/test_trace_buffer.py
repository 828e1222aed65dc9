"""The recent-traces ring buffer: bounds and filters, fed by a real TracerProvider."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import SpanKind, Status, StatusCode

from gateway.telemetry.api import QueryError, parse_query
from gateway.telemetry.buffer import RecentTraces

MS = 1_000_000


@pytest.fixture
def provider() -> Iterator[TracerProvider]:
    p = TracerProvider()
    yield p
    p.shutdown()


def request_trace(
    provider: TracerProvider,
    service: str,
    duration_ms: int,
    status: int = 200,
    start_ns: int = 1_000 * MS,
) -> int:
    tracer = provider.get_tracer("test")
    server = tracer.start_span(
        "GET /", context=Context(), kind=SpanKind.SERVER, start_time=start_ns
    )
    server.set_attribute("sluice.service", service)
    ctx = trace.set_span_in_context(server, Context())
    client = tracer.start_span("GET", context=ctx, kind=SpanKind.CLIENT, start_time=start_ns + MS)
    if status >= 500:
        client.set_status(Status(StatusCode.ERROR))
        server.set_status(Status(StatusCode.ERROR))
    client.end(start_ns + (duration_ms - 1) * MS)
    server.end(start_ns + duration_ms * MS)
    return server.get_span_context().trace_id


def test_keeps_at_most_max_traces_dropping_the_oldest(provider: TracerProvider) -> None:
    buffer = RecentTraces(max_traces=3)
    provider.add_span_processor(buffer)
    ids = [request_trace(provider, "api", 10) for _ in range(5)]
    assert len(buffer) == 3
    kept = [t["trace_id"] for t in buffer.query(limit=10)]
    assert kept == [f"{i:032x}" for i in reversed(ids[2:])]


def test_caps_spans_per_trace_and_counts_the_rest(provider: TracerProvider) -> None:
    buffer = RecentTraces(max_traces=10, max_spans_per_trace=3)
    provider.add_span_processor(buffer)
    tracer = provider.get_tracer("test")
    root = tracer.start_span("root", context=Context())
    ctx = trace.set_span_in_context(root, Context())
    for i in range(5):
        tracer.start_span(f"child {i}", context=ctx).end()
    root.end()
    [t] = buffer.query()
    assert t["span_count"] == 3
    assert t["dropped_spans"] == 3
    assert [s["name"] for s in t["spans"]] == ["child 0", "child 1", "child 2"]


def test_a_trace_is_summarised_with_its_tree(provider: TracerProvider) -> None:
    buffer = RecentTraces()
    provider.add_span_processor(buffer)
    trace_id = request_trace(provider, "api", 12)
    [t] = buffer.query()
    assert t["trace_id"] == f"{trace_id:032x}"
    assert t["root"] == "GET /"
    assert t["kind"] == "request"
    assert t["services"] == ["api"]
    assert t["duration_ms"] == pytest.approx(12.0)
    assert t["status"] == "ok"
    server, client = t["spans"]
    assert server["kind"] == "SERVER" and server["parent_span_id"] is None
    assert client["kind"] == "CLIENT" and client["parent_span_id"] == server["span_id"]
    assert client["duration_ms"] == pytest.approx(10.0)


def test_filters(provider: TracerProvider) -> None:
    buffer = RecentTraces()
    provider.add_span_processor(buffer)
    fast_api = request_trace(provider, "api", 5)
    slow_api = request_trace(provider, "api", 50)
    failed_web = request_trace(provider, "web", 20, status=502)

    def ids(**query: object) -> list[int]:
        return [int(t["trace_id"], 16) for t in buffer.query(**query)]  # type: ignore[arg-type]

    assert ids(service="api") == [slow_api, fast_api]
    assert ids(service="nope") == []
    assert ids(min_duration_ms=20) == [failed_web, slow_api]
    assert ids(status="error") == [failed_web]
    assert ids(status="ok", service="api", min_duration_ms=10) == [slow_api]
    assert ids(trace_id=fast_api) == [fast_api]
    assert ids(trace_id=fast_api + 1) == []
    assert ids(limit=1) == [failed_web]
    assert ids(kind="scaler") == []


def test_zero_max_traces_keeps_nothing(provider: TracerProvider) -> None:
    buffer = RecentTraces(max_traces=0)
    provider.add_span_processor(buffer)
    request_trace(provider, "api", 5)
    assert buffer.query() == []


def test_query_parameters_are_checked() -> None:
    assert parse_query(
        {
            "service": "api",
            "min_duration_ms": "2.5",
            "status": "ERROR",
            "trace_id": "4bf92f3577b34da6a3ce929d0e0e4736",
            "kind": "request",
            "limit": "5",
        }
    ) == {
        "service": "api",
        "min_duration_ms": 2.5,
        "status": "error",
        "trace_id": 0x4BF92F3577B34DA6A3CE929D0E0E4736,
        "kind": "request",
        "limit": 5,
    }
    for params, message in [
        ({"min_duration_ms": "-1"}, "min_duration_ms: must be a number >= 0, got '-1'"),
        ({"min_duration_ms": "nan"}, "min_duration_ms: must be a number >= 0, got 'nan'"),
        ({"status": "failed"}, "status: must be one of ok, error, got 'failed'"),
        ({"trace_id": "abc"}, "trace_id: must be 32 hex digits, got 'abc'"),
        ({"limit": "0"}, "limit: must be an integer in 1..1000, got '0'"),
        (
            {"servce": "api"},
            "servce: unknown parameter (allowed: kind, limit, min_duration_ms, "
            "service, status, trace_id)",
        ),
    ]:
        with pytest.raises(QueryError) as info:
            parse_query(params)
        assert str(info.value) == message
