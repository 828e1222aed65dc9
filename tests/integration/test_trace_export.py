"""Traces leave Sluice over real OTLP/HTTP: a receiver decodes ExportTraceServiceRequest.

The request spans are driven through the data plane's tracing hooks (``RequestTracing``), with
the traceparent they produce sent to a real upstream that echoes it back.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator

import pytest

import gateway
from gateway.settings import TracesConfig
from gateway.telemetry.propagation import format_traceparent
from gateway.telemetry.provider import Telemetry
from gateway.telemetry.requests import RequestTracing
from gateway.telemetry.scaler import TracedEngine, changed
from scaler.decision import Decision, ServiceState
from scaler.engine import Engine
from scaler.policy import BudgetConfig, ScalingPolicy
from scaler.signals import ServiceSignals
from tests.support.otlp_receiver import (
    OtlpReceiver,
    ReceivedSpan,
    echo_upstream,
    otlp_grpc_receiver,
    otlp_receiver,
)

CALLER_TRACE = 0x4BF92F3577B34DA6A3CE929D0E0E4736
CALLER_SPAN = 0x00F067AA0BA902B7


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    with otlp_receiver() as r:
        yield r


@pytest.fixture
def upstream() -> Iterator[tuple[str, int]]:
    with echo_upstream() as address:
        yield address


def start(
    receiver: OtlpReceiver, ratio: float, env: dict[str, str] | None = None, **extra: object
) -> Telemetry:
    config = TracesConfig.model_validate(
        {
            "enabled": True,
            "sampler": {"ratio": ratio},
            "exporter": "otlp_http",
            "endpoint": receiver.endpoint,
            **extra,
        }
    )
    return Telemetry.start(config, env=env or {})


def proxy_once(
    tracing: RequestTracing,
    upstream: tuple[str, int],
    traceparent: bytes | None = None,
    tracestate: bytes | None = None,
) -> dict[str, object] | None:
    """What the data plane does per request, with a real upstream; returns what it saw."""
    span = tracing.start(
        traceparent, tracestate, b"GET", b"/api/items?x=1", b"gw.local:8080", b"127.0.0.9"
    )
    headers = {}
    if span is None:
        if traceparent is not None:
            headers["traceparent"] = traceparent.decode()
    else:
        span.client_headers([(b"Accept", b"*/*"), (b"User-Agent", b"probe/1.0")])
        span.routed("api", "/api")
        span.queued(0.002)
        attempt = span.attempt(upstream[0], upstream[1], 1)  # url.full from the request target
        headers["traceparent"] = attempt.traceparent.decode()
    if tracestate is not None:
        headers["tracestate"] = tracestate.decode()
    request = urllib.request.Request(
        f"http://{upstream[0]}:{upstream[1]}/api/items?x=1", headers=headers
    )
    with urllib.request.urlopen(request, timeout=5) as response:
        body = response.read()
        status = response.status
    if span is not None:
        attempt.end(status, response_body_bytes=len(body))
        span.end(status, 0, len(body))
    seen: dict[str, object] = json.loads(body)["headers"]
    return seen if span is not None else None


def by_trace(spans: list[ReceivedSpan]) -> dict[str, list[ReceivedSpan]]:
    out: dict[str, list[ReceivedSpan]] = {}
    for s in spans:
        out.setdefault(s.trace_id, []).append(s)
    return out


def test_ratio_one_exports_every_request_as_a_complete_tree(
    receiver: OtlpReceiver, upstream: tuple[str, int]
) -> None:
    telemetry = start(receiver, 1.0)
    try:
        assert telemetry.requests is not None
        seen = [proxy_once(telemetry.requests, upstream) for _ in range(5)]
        telemetry.force_flush()
        spans = receiver.wait_for(lambda s: len(s) >= 15)
    finally:
        telemetry.shutdown()
    traces = by_trace(spans)
    assert len(traces) == 5
    for upstream_saw in seen:
        assert upstream_saw is not None
        traceparent = str(upstream_saw["traceparent"])
        _, trace_hex, parent_hex, flags = traceparent.split("-")
        assert int(flags, 16) & 1, "sampled flag"
        tree = {s.kind: s for s in traces[trace_hex]}
        assert set(tree) == {"SERVER", "CLIENT", "INTERNAL"}
        server, client, queue = tree["SERVER"], tree["CLIENT"], tree["INTERNAL"]
        assert server.parent_span_id is None
        assert client.parent_span_id == server.span_id
        assert queue.parent_span_id == server.span_id and queue.name == "sluice.admission.queue"
        assert parent_hex == client.span_id, "the upstream's parent must be the CLIENT span"
        assert server.name == "GET /api"
        assert server.attributes == {
            "http.request.method": "GET",
            "url.path": "/api/items",
            "url.query": "x=1",
            "url.scheme": "http",
            "network.protocol.version": "1.1",
            "server.address": "gw.local",
            "server.port": 8080,
            "client.address": "127.0.0.9",
            "network.peer.address": "127.0.0.9",
            "user_agent.original": "probe/1.0",
            "sluice.service": "api",
            "http.route": "/api",
            "sluice.admission.queue_wait_s": pytest.approx(0.002),
            "http.response.status_code": 200,
            "http.request.body.size": 0,
            "http.response.body.size": server.attributes["http.response.body.size"],
        }
        assert client.attributes["url.full"] == f"http://{upstream[0]}:{upstream[1]}/api/items?x=1"
        assert client.attributes["server.address"] == upstream[0]
        assert client.attributes["server.port"] == upstream[1]
        assert client.attributes["sluice.upstream.attempt"] == 1
        assert client.attributes["http.response.status_code"] == 200
        assert server.resource["service.name"] == "sluice"
        assert server.resource["service.version"] == gateway.__version__
        assert server.status == "UNSET"


def test_an_unknown_method_is_other_with_the_original_kept(receiver: OtlpReceiver) -> None:
    telemetry = start(receiver, 1.0)
    try:
        assert telemetry.requests is not None
        span = telemetry.requests.start(None, None, b"PURGE", b"/cache/x", b"gw.local")
        assert span is not None
        span.routed("api", "/cache")
        span.end(200, 0, 0)
        telemetry.force_flush()
        (server,) = receiver.wait_for(lambda s: len(s) >= 1)
    finally:
        telemetry.shutdown()
    assert server.name == "HTTP"  # the semantic conventions' name for an unknown method
    assert server.attributes["http.request.method"] == "_OTHER"
    assert server.attributes["http.request.method_original"] == "PURGE"


def test_ratio_zero_exports_nothing_but_a_sampled_caller_is_still_followed(
    receiver: OtlpReceiver, upstream: tuple[str, int]
) -> None:
    telemetry = start(receiver, 0.0)
    try:
        assert telemetry.requests is not None
        for _ in range(50):
            assert proxy_once(telemetry.requests, upstream) is None
        # An unsampled caller: not recorded, and its traceparent reaches the upstream unchanged.
        unsampled = format_traceparent(CALLER_TRACE, CALLER_SPAN, 0)
        assert proxy_once(telemetry.requests, upstream, unsampled) is None
        # A sampled caller (parent-based): recorded although the ratio is 0; it ends the test.
        sampled = format_traceparent(CALLER_TRACE + 1, CALLER_SPAN, 1)
        seen = proxy_once(telemetry.requests, upstream, sampled, b"vendor=abc,other=1")
        telemetry.force_flush()
        spans = receiver.wait_for(lambda s: len(s) >= 3)
    finally:
        telemetry.shutdown()
    assert {s.trace_id for s in spans} == {f"{CALLER_TRACE + 1:032x}"}
    server = next(s for s in spans if s.kind == "SERVER")
    assert server.parent_span_id == f"{CALLER_SPAN:016x}"
    assert server.trace_state == "vendor=abc,other=1"
    assert seen is not None
    assert str(seen["traceparent"]).startswith(f"00-{CALLER_TRACE + 1:032x}-")
    assert seen["tracestate"] == "vendor=abc,other=1"


def test_an_unsampled_caller_is_not_recorded_even_at_ratio_one(
    receiver: OtlpReceiver, upstream: tuple[str, int]
) -> None:
    telemetry = start(receiver, 1.0)
    try:
        assert telemetry.requests is not None
        unsampled = format_traceparent(CALLER_TRACE, CALLER_SPAN, 0)
        assert proxy_once(telemetry.requests, upstream, unsampled) is None
        invalid = b"00-zz-00f067aa0ba902b7-01"
        seen = proxy_once(telemetry.requests, upstream, invalid)  # invalid: a new root trace
        telemetry.force_flush()
        spans = receiver.wait_for(lambda s: len(s) >= 3)
    finally:
        telemetry.shutdown()
    assert seen is not None
    assert len({s.trace_id for s in spans}) == 1
    assert spans[0].trace_id != f"{CALLER_TRACE:032x}"
    assert next(s for s in spans if s.kind == "SERVER").parent_span_id is None


def test_a_ratio_keeps_exactly_the_trace_ids_below_its_bound(
    receiver: OtlpReceiver, upstream: tuple[str, int]
) -> None:
    telemetry = start(receiver, 0.5)
    try:
        assert telemetry.requests is not None
        recorded = sum(proxy_once(telemetry.requests, upstream) is not None for _ in range(60))
        telemetry.force_flush()
        spans = receiver.wait_for(lambda s: len(s) >= 3 * recorded)
    finally:
        telemetry.shutdown()
    assert 0 < recorded < 60  # P(all or none of 60 at 0.5) = 2**-59
    traces = by_trace(spans)
    assert len(traces) == recorded
    for trace_hex in traces:
        assert int(trace_hex, 16) & ((1 << 64) - 1) < 1 << 63  # TraceIdRatioBased's rule


def test_headers_and_service_name_reach_the_receiver(
    receiver: OtlpReceiver, upstream: tuple[str, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_SERVICE_NAME", "sluice-eu-1")
    telemetry = start(receiver, 1.0, headers={"X-Api-Key": "k-123"})
    try:
        assert telemetry.requests is not None
        proxy_once(telemetry.requests, upstream)
        telemetry.force_flush()
        spans = receiver.wait_for(lambda s: len(s) >= 3)
    finally:
        telemetry.shutdown()
    assert receiver.headers_seen[0]["x-api-key"] == "k-123"
    assert spans[0].resource["service.name"] == "sluice-eu-1"


def policy(**kw: object) -> ScalingPolicy:
    base: dict[str, object] = {"target": 10, "cpu": {"min": 0.1, "max": 1.0, "request": 0.25}}
    base.update(kw)
    return ScalingPolicy.model_validate(base)


def test_scaler_ticks_are_spans_with_a_child_per_changed_decision(receiver: OtlpReceiver) -> None:
    telemetry = start(receiver, 1.0)
    try:
        assert telemetry.tracer is not None
        engine = TracedEngine(
            # cpu.max = cpu.request: the horizontal bound is exactly max_replicas replicas
            # (with vertical headroom it would be max_replicas × cpu.max / cpu.request).
            Engine(
                {
                    "api": policy(max_replicas=8, cpu={"min": 0.1, "max": 0.25, "request": 0.25}),
                    "idle": policy(),
                },
                BudgetConfig(cpu=2),
            ),
            telemetry.tracer,
        )
        states: dict[str, ServiceState] = {}
        previous: dict[str, Decision] = {}
        ticks = 0  # ticks that changed a decision: only those are spans
        for t in range(6):
            signals = {
                "api": ServiceSignals("api", float(t), in_flight=100),
                "idle": ServiceSignals("idle", float(t)),
            }
            decisions = engine.tick(float(t), signals, states)
            ticks += any(changed(d, previous.get(n)) for n, d in decisions.items())
            previous = decisions
            states = {
                n: ServiceState(n, d.replicas, d.replicas, d.cpu_per_replica_cores)
                for n, d in decisions.items()
            }
        telemetry.force_flush()
        spans = receiver.wait_for(lambda s: sum(x.name == "sluice.scaler.tick" for x in s) >= ticks)
    finally:
        telemetry.shutdown()
    ticks_spans = [s for s in spans if s.name == "sluice.scaler.tick"]
    assert 1 <= ticks < 6  # the load is steady: later ticks change nothing
    assert len(ticks_spans) == ticks
    children = [s for s in spans if s.name == "sluice.scaler.decision"]
    tick_ids = {s.span_id: s for s in ticks_spans}
    for child in children:
        parent = tick_ids[child.parent_span_id or ""]
        assert parent.trace_id == child.trace_id
        assert (
            child.attributes["sluice.service"]
            in parent.attributes["sluice.scaler.changed_services"]
        )
    for tick in ticks_spans:
        n_children = sum(c.parent_span_id == tick.span_id for c in children)
        assert n_children == tick.attributes["sluice.scaler.changed"]
    first = min(ticks_spans, key=lambda s: s.start_ns)
    assert first.attributes["sluice.scaler.changed"] == 2  # every service on the first tick
    # Find the decision where api borrowed the idle service's share: inputs, rule, CPU moved.
    borrowed = [c for c in children if c.attributes.get("sluice.cpu.borrowed_cores", 0) > 0]
    assert borrowed, [c.attributes for c in children]
    api = borrowed[-1].attributes
    assert api["sluice.service"] == "api"
    assert api["sluice.decision.rule"] in ("stable", "panic")
    assert api["sluice.decision.input.demand_cores"] > api["sluice.decision.input.fair_share_cores"]
    assert api["sluice.decision.allocated_cores"] == pytest.approx(
        api["sluice.decision.replicas"] * api["sluice.decision.cpu_per_replica_cores"]
    )
    assert any(r.startswith("budget:") for r in api["sluice.decision.reasons"])
    lent = [c for c in children if c.attributes.get("sluice.cpu.lent_cores", 0) > 0]
    assert lent and lent[-1].attributes["sluice.service"] == "idle"
    assert api["sluice.cpu.borrowed_cores"] == pytest.approx(0.9)
    # Clamps are the reason lines that name a bound; the budget squeezed api.
    assert set(api["sluice.decision.clamps"]) <= set(api["sluice.decision.reasons"])
    assert any("budget gives" in c for c in api["sluice.decision.clamps"])
    for child in children:
        attrs = child.attributes
        named = [r for r in attrs["sluice.decision.reasons"] if "clamped" in r]
        assert set(named) <= set(attrs["sluice.decision.clamps"])
    assert lent[-1].attributes["sluice.cpu.lent_cores"] == pytest.approx(0.9)


def test_gzip_and_a_refusing_collector_are_handled(
    receiver: OtlpReceiver, upstream: tuple[str, int]
) -> None:
    receiver.fail_next = 2  # 503 twice: the exporter backs off and retries within its timeout
    telemetry = start(receiver, 1.0, env={"OTEL_EXPORTER_OTLP_COMPRESSION": "gzip"})
    try:
        assert telemetry.requests is not None
        seen = proxy_once(telemetry.requests, upstream)
        telemetry.force_flush()
        spans = receiver.wait_for(lambda s: len(s) >= 3)
    finally:
        telemetry.shutdown()
    assert seen is not None
    assert len(receiver.headers_seen) == 3
    assert all(h["content-encoding"] == "gzip" for h in receiver.headers_seen)
    assert {s.trace_id for s in spans} == {str(seen["traceparent"]).split("-")[1]}


def test_the_environment_points_the_exporter_at_the_collector(
    receiver: OtlpReceiver, upstream: tuple[str, int]
) -> None:
    base = receiver.endpoint.removesuffix("/v1/traces")
    telemetry = Telemetry.start(
        TracesConfig(enabled=True),
        env={
            "OTEL_TRACES_EXPORTER": "otlp",
            "OTEL_EXPORTER_OTLP_ENDPOINT": base,
            "OTEL_EXPORTER_OTLP_HEADERS": "authorization=Bearer%20t0ken",
        },
    )
    try:
        assert telemetry.requests is not None
        proxy_once(telemetry.requests, upstream)
        telemetry.force_flush()
        receiver.wait_for(lambda s: len(s) >= 3)
    finally:
        telemetry.shutdown()
    assert receiver.headers_seen[0]["authorization"] == "Bearer t0ken"


def test_otlp_grpc_export_reaches_a_grpc_collector(upstream: tuple[str, int]) -> None:
    with otlp_grpc_receiver() as (endpoint, grpc_receiver):
        config = TracesConfig.model_validate(
            {
                "enabled": True,
                "exporter": "otlp_grpc",
                "endpoint": endpoint,
                "headers": {"x-tenant": "t2"},
            }
        )
        telemetry = Telemetry.start(config, env={})
        try:
            assert telemetry.requests is not None
            seen = proxy_once(telemetry.requests, upstream)
            telemetry.force_flush()
            spans = grpc_receiver.wait_for(lambda s: len(s) >= 3)
        finally:
            telemetry.shutdown()
    assert seen is not None
    assert {s.trace_id for s in spans} == {str(seen["traceparent"]).split("-")[1]}
    assert sorted(s.kind for s in spans) == ["CLIENT", "INTERNAL", "SERVER"]
    assert grpc_receiver.headers_seen[0]["x-tenant"] == "t2"
