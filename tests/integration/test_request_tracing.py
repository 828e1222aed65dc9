"""Request traces through the real gateway: `sluice run` exporting to a real OTLP/HTTP receiver.

The upstreams are real servers that echo the headers they received, so the test sees the
traceparent the upstream got and checks it against the spans the gateway exported.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.otlp_receiver import (
    OtlpReceiver,
    ReceivedSpan,
    flaky_keep_alive_upstream,
    otlp_receiver,
)
from tests.support.processes import Gateway, Upstream, gateway, upstreams

CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def receiver() -> Iterator[OtlpReceiver]:
    with otlp_receiver() as r:
        yield r


@pytest.fixture(scope="module")
def up() -> Iterator[Upstream]:
    with upstreams("u1") as started:
        yield started[0]


@pytest.fixture(scope="module")
def flaky() -> Iterator[tuple[str, list[dict[str, str]]]]:
    with flaky_keep_alive_upstream() as f:
        yield f


@pytest.fixture(scope="module")
def gw(
    up: Upstream,
    receiver: OtlpReceiver,
    flaky: tuple[str, list[dict[str, str]]],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Gateway]:
    cfg = {
        "listen": {"host": "127.0.0.1", "port": 0, "h2c": True},
        "services": {
            "api": {"routes": [{"path": "/api"}], "endpoints": [up.address]},
            "dead": {"routes": [{"path": "/dead"}], "endpoints": [f"127.0.0.1:{free_port()}"]},
            "flaky": {"routes": [{"path": "/flaky"}], "endpoints": [flaky[0]]},
        },
        "telemetry": {
            "traces": {
                "enabled": True,
                "sampler": {"type": "parentbased_ratio", "ratio": 1.0},
                "exporter": "otlp_http",
                "endpoint": receiver.endpoint,
                "headers": {"x-tenant": "t1"},
            }
        },
    }
    mp = pytest.MonkeyPatch()
    mp.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")  # export within 50 ms instead of 5 s
    try:
        with gateway(cfg, tmp_path_factory.mktemp("tracing") / "sluice.yaml") as g:
            yield g
    finally:
        mp.undo()


def trace_of(receiver: OtlpReceiver, trace_id: str, n_spans: int) -> list[ReceivedSpan]:
    spans = receiver.wait_for(lambda s: sum(x.trace_id == trace_id for x in s) >= n_spans)
    return [s for s in spans if s.trace_id == trace_id]


def test_a_request_is_one_server_span_with_a_client_span_the_upstream_joins(
    gw: Gateway, up: Upstream, receiver: OtlpReceiver
) -> None:
    r = httpx.get(
        f"{gw.url}/api/items?page=2",
        headers={
            "traceparent": f"00-{CALLER_TRACE}-{CALLER_SPAN}-01",
            "tracestate": "vendor=abc",
            "baggage": "user=alice,tier=gold",
            "host": "shop.example:8443",
        },
    )
    assert r.status_code == 200
    seen = {k.lower(): v for k, v in r.json()["headers"]}
    assert [k for k, _ in r.json()["headers"] if k.lower() == "traceparent"] == ["traceparent"], (
        "exactly one traceparent reaches the upstream"
    )
    version, trace_id, parent_id, flags = seen["traceparent"].split("-")
    assert (version, trace_id, flags) == ("00", CALLER_TRACE, "01")
    assert seen["tracestate"] == "vendor=abc"
    assert seen["baggage"] == "user=alice,tier=gold"

    spans = trace_of(receiver, CALLER_TRACE, 2)
    assert sorted(s.kind for s in spans) == ["CLIENT", "SERVER"]
    server = next(s for s in spans if s.kind == "SERVER")
    client = next(s for s in spans if s.kind == "CLIENT")
    assert server.parent_span_id == CALLER_SPAN, "the caller's span is the SERVER span's parent"
    assert client.parent_span_id == server.span_id
    assert parent_id == client.span_id, "the upstream's parent is the CLIENT span"
    assert server.trace_state == "vendor=abc"
    assert server.name == "GET"
    assert server.attributes["http.request.method"] == "GET"
    assert server.attributes["network.protocol.version"] == "1.1"
    assert server.attributes["url.path"] == "/api/items"
    assert server.attributes["server.address"] == "shop.example"
    assert server.attributes["server.port"] == 8443
    assert server.attributes["client.address"] == "127.0.0.1"
    assert server.attributes["sluice.service"] == "api"
    assert server.attributes["http.response.status_code"] == 200
    assert server.attributes["http.request.body.size"] == 0
    assert server.attributes["http.response.body.size"] == len(r.content)
    assert server.status == "UNSET"
    host, port = up.address.rsplit(":", 1)
    assert client.attributes["server.address"] == host
    assert client.attributes["server.port"] == int(port)
    assert client.attributes["sluice.upstream.attempt"] == 1
    assert client.attributes["http.response.status_code"] == 200
    assert client.start_ns >= server.start_ns and client.end_ns <= server.end_ns
    assert server.resource["service.name"] == "sluice"
    assert receiver.headers_seen[-1]["x-tenant"] == "t1"


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_an_http2_request_is_a_server_span_of_protocol_version_2(
    gw: Gateway, receiver: OtlpReceiver
) -> None:
    out = subprocess.run(
        ["curl", "-sS", "--http2-prior-knowledge", "--max-time", "10", f"{gw.url}/api/h2"],
        capture_output=True, text=True, timeout=30, check=True,
    ).stdout  # fmt: skip
    seen = {k.lower(): v for k, v in json.loads(out)["headers"]}
    _, trace_id, _, _ = seen["traceparent"].split("-")
    spans = trace_of(receiver, trace_id, 2)
    server = next(s for s in spans if s.kind == "SERVER")
    assert server.attributes["network.protocol.version"] == "2"
    assert server.attributes["url.path"] == "/api/h2"


def test_an_http10_request_is_a_server_span_of_protocol_version_1_0(
    gw: Gateway, receiver: OtlpReceiver
) -> None:
    with socket.create_connection((gw.host, gw.port), timeout=10) as s:
        s.sendall(b"GET /api/h10 HTTP/1.0\r\nHost: h10.test\r\n\r\n")
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") or head.startswith(b"HTTP/1.0 200")
    seen = {k.lower(): v for k, v in json.loads(body)["headers"]}
    _, trace_id, _, _ = seen["traceparent"].split("-")
    spans = trace_of(receiver, trace_id, 2)
    server = next(s for s in spans if s.kind == "SERVER")
    assert server.attributes["network.protocol.version"] == "1.0"


def test_a_request_without_traceparent_starts_a_trace(gw: Gateway, receiver: OtlpReceiver) -> None:
    r = httpx.post(f"{gw.url}/api/new", content=b"x" * 1000)
    seen = {k.lower(): v for k, v in r.json()["headers"]}
    _, trace_id, parent_id, _ = seen["traceparent"].split("-")
    spans = trace_of(receiver, trace_id, 2)
    server = next(s for s in spans if s.kind == "SERVER")
    client = next(s for s in spans if s.kind == "CLIENT")
    assert server.parent_span_id is None
    assert client.span_id == parent_id
    assert server.attributes["http.request.method"] == "POST"
    assert server.attributes["http.request.body.size"] == 1000


def test_an_unsampled_caller_passes_through_untouched(gw: Gateway) -> None:
    traceparent = f"00-{CALLER_TRACE[::-1]}-{CALLER_SPAN}-00"
    r = httpx.get(f"{gw.url}/api/x", headers={"traceparent": traceparent})
    seen = {k.lower(): v for k, v in r.json()["headers"]}
    assert seen["traceparent"] == traceparent


def test_failures_are_error_spans(gw: Gateway, receiver: OtlpReceiver) -> None:
    r = httpx.get(f"{gw.url}/dead", headers={"traceparent": f"00-{'1' * 32}-{CALLER_SPAN}-01"})
    assert r.status_code == 502
    spans = trace_of(receiver, "1" * 32, 2)
    server = next(s for s in spans if s.kind == "SERVER")
    client = next(s for s in spans if s.kind == "CLIENT")
    assert server.status == "ERROR"
    assert server.attributes["error.type"] == "upstream-connect-failed"
    assert server.attributes["http.response.status_code"] == 502
    assert client.status == "ERROR"
    assert client.attributes["error.type"] == "upstream-connect-failed"
    assert "http.response.status_code" not in client.attributes

    r = httpx.get(f"{gw.url}/nowhere", headers={"traceparent": f"00-{'2' * 32}-{CALLER_SPAN}-01"})
    assert r.status_code == 404
    [server] = trace_of(receiver, "2" * 32, 1)
    assert server.attributes["http.response.status_code"] == 404
    assert server.status == "UNSET", "a 4xx is not a server error"
    assert "sluice.service" not in server.attributes


def test_a_retry_is_a_second_client_span(
    gw: Gateway, receiver: OtlpReceiver, flaky: tuple[str, list[dict[str, str]]]
) -> None:
    _, seen = flaky
    with httpx.Client() as client:
        assert client.get(f"{gw.url}/flaky/1").status_code == 200  # pools the connection
        trace_id = "3" * 32
        r = client.get(
            f"{gw.url}/flaky/2", headers={"traceparent": f"00-{trace_id}-{CALLER_SPAN}-01"}
        )
    assert r.status_code == 200
    spans = trace_of(receiver, trace_id, 3)
    server = next(s for s in spans if s.kind == "SERVER")
    attempts = sorted(
        (s for s in spans if s.kind == "CLIENT"),
        key=lambda s: s.attributes["sluice.upstream.attempt"],
    )
    assert [a.attributes["sluice.upstream.attempt"] for a in attempts] == [1, 2]
    first, second = attempts
    assert all(a.parent_span_id == server.span_id for a in attempts)
    assert first.status == "ERROR" and first.attributes["error.type"] == "upstream-reset"
    assert second.attributes["sluice.retry.reason"] == "stale-pooled-connection"
    assert second.attributes["http.request.resend_count"] == 1
    assert second.attributes["http.response.status_code"] == 200
    assert server.status == "UNSET"
    # The upstream answered the retry, and saw the second attempt as its parent.
    assert seen[-1]["traceparent"] == f"00-{trace_id}-{second.span_id}-01"


def test_the_admin_api_lists_recent_traces_with_filters(gw: Gateway) -> None:
    trace_id = "4" * 32
    httpx.get(f"{gw.url}/api/slow", headers={"traceparent": f"00-{trace_id}-{CALLER_SPAN}-01"})
    body = httpx.get(f"{gw.admin_url}/api/traces", params={"trace_id": trace_id}).json()
    [t] = body["traces"]
    assert t["trace_id"] == trace_id
    assert t["services"] == ["api"]
    assert t["kind"] == "request"
    assert [s["kind"] for s in t["spans"]] == ["SERVER", "CLIENT"]
    assert body["buffer"]["tracing"] == "on"

    # A failing request of its own (earlier tests' traces may have been evicted from the ring
    # buffer by the scaler's tick spans, one a second).
    assert httpx.get(f"{gw.url}/dead/x").status_code == 502
    errors = httpx.get(f"{gw.admin_url}/api/traces", params={"status": "error", "limit": 100})
    assert errors.json()["traces"]
    assert all(t["status"] == "error" for t in errors.json()["traces"])
    dead = httpx.get(f"{gw.admin_url}/api/traces", params={"service": "dead"}).json()["traces"]
    assert dead and all("dead" in t["services"] for t in dead)
    none = httpx.get(f"{gw.admin_url}/api/traces", params={"min_duration_ms": 60_000}).json()
    assert none["traces"] == []
    bad = httpx.get(f"{gw.admin_url}/api/traces", params={"status": "broken"})
    assert bad.status_code == 400
    assert bad.json() == {"error": "status: must be one of ok, error, got 'broken'"}


def test_spans_are_flushed_when_the_gateway_stops(
    up: Upstream, receiver: OtlpReceiver, tmp_path: Path
) -> None:
    cfg = {
        "services": {"api": {"routes": [{"path": "/"}], "endpoints": [up.address]}},
        "telemetry": {
            "traces": {"enabled": True, "exporter": "otlp_http", "endpoint": receiver.endpoint}
        },
    }
    trace_id = "5" * 32
    with gateway(cfg, tmp_path / "sluice.yaml") as g:  # the default 5 s batch delay
        httpx.get(f"{g.url}/x", headers={"traceparent": f"00-{trace_id}-{CALLER_SPAN}-01"})
        code = g.stop()
    assert code == 0
    assert len([s for s in receiver.spans() if s.trace_id == trace_id]) == 2
