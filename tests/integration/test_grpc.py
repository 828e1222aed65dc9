"""gRPC through the real gateway: a ``grpcio`` client and server (h2c both sides,
``protocol: h2c``), unary / server-streaming / bidi calls with trailers intact, deadlines,
gateway errors as gRPC statuses, the standard health check, and in-flight accounting."""

from __future__ import annotations

import json
import queue
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.support.h2client import Client
from tests.support.processes import Gateway, GrpcUpstream, Upstream, gateway, upstreams


@pytest.fixture(scope="module")
def server() -> Iterator[GrpcUpstream]:
    g = GrpcUpstream("g1")
    try:
        yield g
    finally:
        g.stop()


@pytest.fixture(scope="module")
def plain() -> Iterator[Upstream]:
    with upstreams("u1") as started:
        yield started[0]


@pytest.fixture(scope="module")
def gw(
    server: GrpcUpstream, plain: Upstream, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Gateway]:
    cfg = {
        "listen": {"host": "127.0.0.1", "port": 0, "h2c": True},
        "services": {
            "echo": {
                "routes": [{"path": "/test.Echo/"}, {"path": "/grpc.health.v1.Health/"}],
                "endpoints": [server.address],
                "protocol": "h2c",
                "timeouts": {"connect_s": 1, "response_header_s": 5, "total_s": 30},
            },
            "down": {
                "routes": [{"path": "/test.Down/"}],
                "endpoints": [],
                "protocol": "h2c",
            },
            "hanging": {  # an upstream that ignores grpc-timeout: only the gateway's deadline
                "routes": [{"path": "/hang"}],
                "endpoints": [plain.address],
            },
            "limited": {
                "routes": [{"path": "/test.Limited/"}],
                "endpoints": [server.address],
                "protocol": "h2c",
                "limits": {"rate_limit": {"rps": 0.1, "burst": 1}},
            },
        },
    }
    with gateway(cfg, tmp_path_factory.mktemp("grpc") / "sluice.yaml") as g:
        yield g


@pytest.fixture
def channel(gw: Gateway) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(f"{gw.host}:{gw.port}") as ch:
        yield ch


def unary(ch: grpc.Channel, method: str = "/test.Echo/Unary") -> grpc.UnaryUnaryMultiCallable:
    return ch.unary_unary(method)


def test_unary(channel: grpc.Channel) -> None:
    reply, call = unary(channel).with_call(b"hello", timeout=10)
    assert reply == b"g1:hello"
    assert call.code() == grpc.StatusCode.OK


def test_upstream_status_and_trailers_arrive_intact(channel: grpc.Channel) -> None:
    with pytest.raises(grpc.RpcError) as err:
        unary(channel)(b"fail", timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details() == "you asked for it"
    assert ("why", "asked-to") in tuple(err.value.trailing_metadata())


def test_server_streaming(channel: grpc.Channel) -> None:
    parts = list(channel.unary_stream("/test.Echo/Stream")(b"50", timeout=10))
    assert parts == [b"part-%d" % i for i in range(50)]


def test_bidi_streaming(channel: grpc.Channel) -> None:
    words = [b"alpha", b"beta", b"gamma"]
    replies = list(channel.stream_stream("/test.Echo/Chat")(iter(words), timeout=10))
    assert replies == [w.upper() for w in words]


def test_many_concurrent_calls_on_one_channel(channel: grpc.Channel) -> None:
    call = unary(channel)
    futures = [call.future(b"n%d" % i, timeout=20) for i in range(64)]
    assert [f.result() for f in futures] == [b"g1:n%d" % i for i in range(64)]


def test_health_check(channel: grpc.Channel) -> None:
    stub = health_pb2_grpc.HealthStub(channel)
    reply = stub.Check(health_pb2.HealthCheckRequest(service="test.Echo"), timeout=10)
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_deadline_is_honoured_as_grpc_timeout(channel: grpc.Channel) -> None:
    """The client's deadline travels as grpc-timeout; the gateway's own deadline or the
    client's ends the call as DEADLINE_EXCEEDED either way."""
    with pytest.raises(grpc.RpcError) as err:
        unary(channel).with_call(b"slow", timeout=0.5, metadata=(("sleep-ms", "3000"),))
    assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED


def test_no_route_is_unimplemented(channel: grpc.Channel) -> None:
    with pytest.raises(grpc.RpcError) as err:
        unary(channel, "/nowhere.Service/Call")(b"x", timeout=10)
    assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert ("sluice-error", "no-route") in tuple(err.value.trailing_metadata())


def test_no_endpoint_is_unavailable(channel: grpc.Channel) -> None:
    with pytest.raises(grpc.RpcError) as err:
        unary(channel, "/test.Down/Call")(b"x", timeout=10)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE


def test_rate_limited_is_resource_exhausted(channel: grpc.Channel) -> None:
    codes = []
    for _ in range(3):
        try:
            unary(channel, "/test.Limited/Unary")(b"x", timeout=10)
            codes.append(grpc.StatusCode.OK)
        except grpc.RpcError as e:
            codes.append(e.code())
    assert grpc.StatusCode.RESOURCE_EXHAUSTED in codes


def test_a_stream_counts_as_one_request_in_flight_for_its_duration(
    gw: Gateway, channel: grpc.Channel
) -> None:
    def in_flight() -> int:
        with urllib.request.urlopen(f"{gw.admin_url}/api/services", timeout=10) as r:
            services = json.load(r)["services"]
        return int(services["echo"]["signals"]["in_flight"])

    sent: queue.Queue[bytes | None] = queue.Queue()

    def requests() -> Iterator[bytes]:
        while (item := sent.get(timeout=20)) is not None:
            yield item

    sent.put(b"one")
    responses = channel.stream_stream("/test.Echo/Chat")(requests(), timeout=20)
    assert next(responses) == b"ONE"
    assert in_flight() == 1
    sent.put(None)  # the client half-closes; the call ends
    assert list(responses) == []
    assert in_flight() == 0


def test_grpc_timeout_is_the_gateways_deadline(gw: Gateway) -> None:
    """A client without a deadline of its own, an upstream that never answers: the gateway
    ends the call at grpc-timeout."""
    c = Client(gw)
    try:
        sid = c.request(
            "/hang",
            host="any.test",
            method="POST",
            body=b"\x00\x00\x00\x00\x04slow",
            extra=(
                ("content-type", "application/grpc"),
                ("te", "trailers"),
                ("grpc-timeout", "300m"),
            ),
        )
        c.pump({sid})
        headers = c.responses[sid]["headers"]
        assert headers[b"grpc-status"] == b"4"  # DEADLINE_EXCEEDED
        assert headers[b"sluice-error"] == b"upstream-timeout"
    finally:
        c.close()


def test_http1_client_reaches_an_h2c_upstream(gw: Gateway) -> None:
    """Semantics allowing: an HTTP/1.1 request reaches the HTTP/2 upstream and its answer
    comes back framed for HTTP/1.1 (gRPC trailers cannot travel on this side)."""
    req = urllib.request.Request(
        f"{gw.url}/test.Echo/Unary",
        data=b"\x00\x00\x00\x00\x02hi",
        headers={"content-type": "application/grpc", "te": "trailers"},
    )
    with urllib.request.urlopen(req, timeout=10) as r:
        assert r.status == 200
        assert r.headers["content-type"] == "application/grpc"
        body = r.read()
    assert body == b"\x00\x00\x00\x00\x05g1:hi"


def test_a_removed_endpoint_finishes_its_open_streams(server: GrpcUpstream, tmp_path: Path) -> None:
    """Reloading the endpoint away drains its HTTP/2 connection: the open bidi call goes on
    to its end; new calls find no endpoint (UNAVAILABLE)."""

    def cfg(endpoints: list[str]) -> dict[str, Any]:
        service = {"routes": [{"path": "/test.Echo/"}], "endpoints": endpoints}
        return {
            "listen": {"host": "127.0.0.1", "port": 0, "h2c": True},
            "services": {"echo": {**service, "protocol": "h2c"}},
        }

    with gateway(cfg([server.address]), tmp_path / "sluice.yaml") as g:
        sent: queue.Queue[bytes | None] = queue.Queue()

        def requests() -> Iterator[bytes]:
            while (item := sent.get(timeout=20)) is not None:
                yield item

        with grpc.insecure_channel(f"{g.host}:{g.port}") as ch:
            sent.put(b"before")
            replies = ch.stream_stream("/test.Echo/Chat")(requests(), timeout=20)
            assert next(replies) == b"BEFORE"
            current = yaml.safe_load(g.config_path.read_text())
            current["services"]["echo"]["endpoints"] = []
            g.config_path.write_text(yaml.safe_dump(current))
            with httpx.Client(timeout=10) as admin:
                assert admin.post(g.admin_url + "/api/reload").status_code == 200
            sent.put(b"after")
            assert next(replies) == b"AFTER"
            sent.put(None)
            assert list(replies) == []
            with pytest.raises(grpc.RpcError) as err:
                unary(ch)(b"x", timeout=10)
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
