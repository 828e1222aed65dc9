"""The lean OTLP encoder writes exactly what the SDK's protobuf encoder writes."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans as sdk_encode
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.trace import (
    Link,
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    TraceState,
)

from gateway.settings import TracesConfig
from gateway.telemetry.otlp import encode_spans, otlp_http_settings, parse_headers
from gateway.telemetry.provider import Telemetry


class Keep(SpanProcessor):
    """Collects finished spans."""

    def __init__(self) -> None:
        self.spans: list[ReadableSpan] = []

    def on_end(self, span: ReadableSpan) -> None:
        self.spans.append(span)


def decoded(data: bytes) -> ExportTraceServiceRequest:
    message = ExportTraceServiceRequest()
    message.ParseFromString(data)
    return message


@pytest.fixture
def keep() -> Iterator[Keep]:
    yield Keep()


def test_sdk_spans_of_every_shape_encode_identically(keep: Keep) -> None:
    provider = TracerProvider(resource=Resource.create({"service.name": "sluice", "n": 3}))
    provider.add_span_processor(keep)
    tracer = provider.get_tracer("sluice", "1.2", schema_url="https://example.com/s")
    remote = SpanContext(
        0x4BF92F3577B34DA6A3CE929D0E0E4736,
        0x00F067AA0BA902B7,
        is_remote=True,
        trace_flags=TraceFlags(1),
        trace_state=TraceState([("vendor", "abc"), ("x", "1")]),
    )
    parent_ctx = trace.set_span_in_context(NonRecordingSpan(remote), Context())
    root = tracer.start_span(
        "root",
        context=parent_ctx,
        kind=SpanKind.SERVER,
        attributes={
            "s": "text é",
            "i": 42,
            "neg": -7,
            "big": 2**62,
            "f": 0.25,
            "b": True,
            "no": False,
            "strs": ["a", "b"],
            "ints": [1, 2, 3],
            "floats": [1.5],
            "bools": [True, False],
        },
        links=[Link(remote, {"why": "batch"})],
    )
    root.add_event("thing", {"k": "v", "n": 1})
    root.add_event("bare")
    child = tracer.start_span(
        "child", context=trace.set_span_in_context(root, Context()), kind=SpanKind.CLIENT
    )
    child.set_status(Status(StatusCode.ERROR, "boom"))
    child.end()
    ok = tracer.start_span("ok", context=Context(), kind=SpanKind.INTERNAL)
    ok.set_status(Status(StatusCode.OK))
    ok.end()
    root.end()
    other = TracerProvider(resource=Resource({"service.name": "other"}))
    other.add_span_processor(keep)
    other.get_tracer("x").start_span("elsewhere", context=Context()).end()
    assert len(keep.spans) == 4
    assert decoded(encode_spans(keep.spans)) == decoded(sdk_encode(keep.spans).SerializeToString())
    provider.shutdown()
    other.shutdown()


def test_request_spans_encode_identically(keep: Keep) -> None:
    telemetry = Telemetry.start(TracesConfig(enabled=True), env={}, extra_processors=(keep,))
    try:
        tracing = telemetry.requests
        assert tracing is not None
        span = tracing.start(
            b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            b"vendor=abc",
            b"GET",
            b"/api/x?y=1",
            b"shop.example:8443",
            b"10.0.0.1",
        )
        assert span is not None
        span.routed("api")
        span.queued(0.001)
        span.rejected("queue-full")
        attempt = span.attempt("127.0.0.1", 9000)
        attempt.end(None, "upstream-reset")
        retry = span.attempt("127.0.0.1", 9000, retry_reason="stale-pooled-connection")
        retry.end(200, response_body_bytes=12)
        span.end(200, 0, 12)
    finally:
        telemetry.shutdown()
    assert len(keep.spans) == 4
    assert decoded(encode_spans(keep.spans)) == decoded(sdk_encode(keep.spans).SerializeToString())


def test_settings_come_from_config_then_environment() -> None:
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318/",
        "OTEL_EXPORTER_OTLP_HEADERS": "api-key=a%20b, X-Team = core",
        "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "2500",
        "OTEL_EXPORTER_OTLP_COMPRESSION": "gzip",
    }
    s = otlp_http_settings(None, None, env)
    assert s.endpoint == "http://collector:4318/v1/traces"
    assert s.headers == {"api-key": "a b", "x-team": "core"}
    assert s.timeout_s == 2.5
    assert s.gzip is True
    s = otlp_http_settings(
        None, None, {**env, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://t:1/x"}
    )
    assert s.endpoint == "http://t:1/x"
    s = otlp_http_settings("http://cfg:4318/v1/traces", {"k": "v"}, env)
    assert (s.endpoint, s.headers) == ("http://cfg:4318/v1/traces", {"k": "v"})
    s = otlp_http_settings(None, None, {})
    assert (s.endpoint, s.headers, s.timeout_s, s.gzip) == (
        "http://localhost:4318/v1/traces",
        {},
        10.0,
        False,
    )
    assert parse_headers("a=1,broken,=x,b=2") == {"a": "1", "b": "2"}
