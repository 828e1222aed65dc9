"""``protocol: h2`` upstreams: HTTP/2 over TLS (the service's ``upstream_tls``, ALPN ``h2``)
to a real ``grpcio`` server with a certificate from a throwaway CA; gRPC and HTTP/1.1
clients through the gateway; an endpoint that does not speak h2 is a connect failure."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Iterator

import grpc
import pytest

from tests.support.certs import Issued, ThrowawayCa, make_ca
from tests.support.processes import Gateway, GrpcUpstream, Upstream, gateway


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> tuple[ThrowawayCa, Issued]:
    directory = tmp_path_factory.mktemp("ca")
    authority = make_ca(directory)
    return authority, authority.issue(directory, "backend", ["backend.internal.test"])


@pytest.fixture(scope="module")
def gw(
    ca: tuple[ThrowawayCa, Issued], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Gateway]:
    authority, backend = ca
    tls = (str(backend.cert_file), str(backend.key_file))
    secure = GrpcUpstream("s1", tls=tls)
    http1_only = Upstream("h1", tls=tls)  # HTTPS that offers no h2 by ALPN
    upstream_tls = {
        "enabled": True,
        "ca_file": str(authority.ca_file),
        "server_name": "backend.internal.test",
    }
    cfg = {
        "listen": {"host": "127.0.0.1", "port": 0, "h2c": True},
        "services": {
            "echo": {
                "routes": [{"path": "/test.Echo/"}],
                "endpoints": [secure.address],
                "protocol": "h2",
                "upstream_tls": upstream_tls,
                "timeouts": {"connect_s": 2, "response_header_s": 5, "total_s": 30},
            },
            "h1": {
                "routes": [{"path": "/test.H1/"}],
                "endpoints": [http1_only.address],
                "protocol": "h2",
                "upstream_tls": upstream_tls,
                "retries": {"retry_on": []},
            },
        },
    }
    try:
        with gateway(cfg, tmp_path_factory.mktemp("h2tls") / "sluice.yaml") as g:
            yield g
    finally:
        secure.stop()
        http1_only.stop()


@pytest.fixture
def channel(gw: Gateway) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(f"{gw.host}:{gw.port}") as ch:
        yield ch


def test_unary_over_tls_upstream(channel: grpc.Channel) -> None:
    assert channel.unary_unary("/test.Echo/Unary")(b"hello", timeout=10) == b"s1:hello"


def test_status_and_trailers_cross_intact(channel: grpc.Channel) -> None:
    with pytest.raises(grpc.RpcError) as err:
        channel.unary_unary("/test.Echo/Unary")(b"fail", timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details() == "you asked for it"
    assert ("why", "asked-to") in (err.value.trailing_metadata() or ())


def test_streams_share_the_multiplexed_connection(channel: grpc.Channel) -> None:
    parts = list(channel.unary_stream("/test.Echo/Stream")(b"5", timeout=10))
    assert parts == [b"part-%d" % i for i in range(5)]
    chat = channel.stream_stream("/test.Echo/Chat")(iter([b"a", b"b", b"c"]), timeout=10)
    assert list(chat) == [b"A", b"B", b"C"]
    futures = [channel.unary_unary("/test.Echo/Unary").future(b"%d" % i) for i in range(40)]
    assert [f.result(timeout=20) for f in futures] == [b"s1:%d" % i for i in range(40)]


def test_http1_client_reaches_an_h2_upstream(gw: Gateway) -> None:
    req = urllib.request.Request(
        f"{gw.url}/test.Echo/Unary",
        data=b"\x00\x00\x00\x00\x02hi",
        headers={"content-type": "application/grpc", "te": "trailers"},
    )
    with urllib.request.urlopen(req, timeout=10) as r:
        assert r.status == 200
        assert r.read() == b"\x00\x00\x00\x00\x05s1:hi"


def test_an_endpoint_without_h2_by_alpn_is_a_connect_failure(channel: grpc.Channel) -> None:
    with pytest.raises(grpc.RpcError) as err:
        channel.unary_unary("/test.H1/Unary")(b"x", timeout=10)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    meta = dict(err.value.trailing_metadata() or ())
    assert meta.get("sluice-error") == "upstream-connect-failed"
