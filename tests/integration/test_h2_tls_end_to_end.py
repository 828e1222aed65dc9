"""HTTP/2 end to end over TLS on both sides, with real peers: clients that choose ``h2`` by
ALPN on the gateway's TLS listener (curl, built on nghttp2; a ``grpcio`` channel with TLS
credentials) through the gateway to ``protocol: h2`` upstreams (HTTP/2 over TLS) and to
``protocol: h2c`` upstreams (an HTTP/2 server on the ``h2`` library, a ``grpcio`` server).

And an upstream's GOAWAY (RFC 9113 §6.8): a stream above its last stream id was not
processed and is sent again on a new connection; the streams at or below it are still
answered on the old one; a stream at or below it whose connection then closes is retried
only when its method is idempotent (and on another endpoint, as any reset)."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from typing import Any

import grpc
import httpx
import pytest

from tests.support.certs import Issued, ThrowawayCa, make_ca
from tests.support.h2client import Client
from tests.support.processes import Gateway, GrpcUpstream, H2Upstream, gateway

SITE = "site.example.test"
BACKEND = "backend.internal.test"
CURL = shutil.which("curl")


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> tuple[ThrowawayCa, Issued, Issued]:
    directory = tmp_path_factory.mktemp("ca")
    authority = make_ca(directory)
    site = authority.issue(
        directory, "site", [SITE, "grpc-h2.example.test", "grpc-h2c.example.test"]
    )
    backend = authority.issue(directory, "backend", [BACKEND])
    return authority, site, backend


@pytest.fixture(scope="module")
def peers(
    ca: tuple[ThrowawayCa, Issued, Issued], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    _authority, _site, backend = ca
    fired = tmp_path_factory.mktemp("fired")
    tls = (str(backend.cert_file), str(backend.key_file))
    started: dict[str, Any] = {}
    try:
        started["h2"] = H2Upstream("tls-h2", tls=tls)
        started["h2c"] = H2Upstream("clear-h2c")
        started["grpc-h2"] = GrpcUpstream("gs", tls=tls)
        started["grpc-h2c"] = GrpcUpstream("gc")
        started["away1"] = H2Upstream("away1", fired_dir=fired)
        started["away2"] = H2Upstream("away2", fired_dir=fired)
        yield started
    finally:
        for process in started.values():
            process.stop()


@pytest.fixture(scope="module")
def gw(
    ca: tuple[ThrowawayCa, Issued, Issued],
    peers: dict[str, Any],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Gateway]:
    authority, site, _backend = ca
    upstream_tls = {"enabled": True, "ca_file": str(authority.ca_file), "server_name": BACKEND}
    cfg = {
        "listen": {"host": "127.0.0.1", "port": 0, "h2c": True},
        "tls": {
            "listen": {"host": "127.0.0.1", "port": 0},
            "certificates": [site.config()],
            "http2": True,
        },
        "services": {
            "tls-h2": {
                "routes": [{"path": "/to-h2"}],
                "endpoints": [peers["h2"].address],
                "protocol": "h2",
                "upstream_tls": upstream_tls,
            },
            "clear-h2c": {
                "routes": [{"path": "/to-h2c"}],
                "endpoints": [peers["h2c"].address],
                "protocol": "h2c",
            },
            "grpc-h2": {
                "routes": [{"host": "grpc-h2.example.test", "path": "/"}],
                "endpoints": [peers["grpc-h2"].address],
                "protocol": "h2",
                "upstream_tls": upstream_tls,
            },
            "grpc-h2c": {
                "routes": [{"host": "grpc-h2c.example.test", "path": "/"}],
                "endpoints": [peers["grpc-h2c"].address],
                "protocol": "h2c",
            },
            "away-one": {
                "routes": [{"path": "/goaway-above"}, {"path": "/hold"}],
                "endpoints": [peers["away1"].address],
                "protocol": "h2c",
            },
            "away-two": {
                "routes": [{"path": "/goaway-at"}],
                "endpoints": [peers["away1"].address, peers["away2"].address],
                "protocol": "h2c",
                "balancer": "round_robin",
            },
        },
    }
    with gateway(cfg, tmp_path_factory.mktemp("h2tls-e2e") / "sluice.yaml") as g:
        yield g


def _curl(gw: Gateway, ca: ThrowawayCa, path: str, *args: str) -> tuple[str, int, bytes]:
    """curl over TLS with ALPN h2 through the gateway: (HTTP version, status, body)."""
    assert CURL is not None and gw.tls_url is not None
    port = gw.tls_url.rpartition(":")[2]
    done = subprocess.run(
        [
            CURL,
            "--silent",
            "--show-error",
            "--http2",
            "--max-time",
            "20",
            "--cacert",
            str(ca.ca_file),
            "--resolve",
            f"{SITE}:{port}:127.0.0.1",
            "--write-out",
            "\n%{http_version} %{http_code}",
            *args,
            f"https://{SITE}:{port}{path}",
        ],
        capture_output=True,
        timeout=30,
        check=True,
    )
    body, _, tail = done.stdout.rpartition(b"\n")
    version, code = tail.decode().split()
    return version, int(code), body


@pytest.mark.skipif(CURL is None, reason="needs curl (installed by .ci/run)")
@pytest.mark.parametrize(("path", "upstream"), [("/to-h2", "tls-h2"), ("/to-h2c", "clear-h2c")])
def test_curl_over_tls_h2_reaches_h2_and_h2c_upstreams(
    gw: Gateway, ca: tuple[ThrowawayCa, Issued, Issued], path: str, upstream: str
) -> None:
    version, status, body = _curl(gw, ca[0], path + "/x?y=1", "--header", "x-probe: 1")
    assert (version, status) == ("2", 200)
    answer = json.loads(body)
    assert answer["path"] == path + "/x?y=1"
    headers = dict(answer["headers"])
    assert headers[":scheme"] == ("https" if upstream == "tls-h2" else "http")
    assert headers["x-probe"] == "1"
    assert headers["x-forwarded-proto"] == "https"
    version, status, body = _curl(gw, ca[0], path, "--data-binary", "hello", "--request", "PUT")
    assert (version, status) == ("2", 200)
    assert json.loads(body)["method"] == "PUT"
    assert json.loads(body)["body_bytes"] == 5


@pytest.mark.skipif(CURL is None, reason="needs curl (installed by .ci/run)")
@pytest.mark.parametrize("path", ["/to-h2/big", "/to-h2c/big"])
def test_curl_over_tls_h2_gets_a_large_body_whole(
    gw: Gateway, ca: tuple[ThrowawayCa, Issued, Issued], path: str
) -> None:
    n = 3 * 1024 * 1024 + 17  # beyond every window on both sides
    version, status, body = _curl(gw, ca[0], f"{path}?bytes={n}")
    assert (version, status) == ("2", 200)
    assert body == b"x" * n


@pytest.fixture
def secure_channel(gw: Gateway, ca: tuple[ThrowawayCa, Issued, Issued]) -> Iterator[Any]:
    assert gw.tls_url is not None
    target = gw.tls_url.removeprefix("https://")
    credentials = grpc.ssl_channel_credentials(root_certificates=ca[0].ca_file.read_bytes())
    channels: list[grpc.Channel] = []

    def open_channel(authority: str) -> grpc.Channel:
        channel = grpc.secure_channel(
            target,
            credentials,
            options=[
                ("grpc.ssl_target_name_override", authority),
                ("grpc.default_authority", authority),
            ],
        )
        channels.append(channel)
        return channel

    try:
        yield open_channel
    finally:
        for channel in channels:
            channel.close()


@pytest.mark.parametrize(
    ("authority", "name"), [("grpc-h2.example.test", "gs"), ("grpc-h2c.example.test", "gc")]
)
def test_grpc_over_tls_to_h2_and_h2c_upstreams(
    secure_channel: Any, authority: str, name: str
) -> None:
    channel = secure_channel(authority)
    assert channel.unary_unary("/test.Echo/Unary")(b"hi", timeout=10) == name.encode() + b":hi"
    parts = list(channel.unary_stream("/test.Echo/Stream")(b"4", timeout=10))
    assert parts == [b"part-%d" % i for i in range(4)]
    chat = channel.stream_stream("/test.Echo/Chat")(iter([b"x", b"y"]), timeout=10)
    assert list(chat) == [b"X", b"Y"]
    with pytest.raises(grpc.RpcError) as err:
        channel.unary_unary("/test.Echo/Unary")(b"fail", timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details() == "you asked for it"
    assert ("why", "asked-to") in (err.value.trailing_metadata() or ())
    futures = [channel.unary_unary("/test.Echo/Unary").future(b"%d" % i) for i in range(30)]
    assert [f.result(timeout=20) for f in futures] == [
        name.encode() + b":%d" % i for i in range(30)
    ]


# -- an upstream's GOAWAY ---------------------------------------------------------------------


def _arrivals(gw: Gateway, path: str) -> dict[str, int]:
    """The upstream's count of each key's arrivals (``/_count`` through the gateway)."""
    with httpx.Client(timeout=10) as client:
        answer = client.get(gw.url + path + "/_count")
    assert answer.status_code == 200
    return dict(answer.json()["arrivals"])


def test_a_stream_above_goaways_last_stream_id_is_retried_on_a_new_connection(
    gw: Gateway, peers: dict[str, Any]
) -> None:
    """Stream X is held by the upstream; stream Y (after X, on the same upstream connection)
    makes it send GOAWAY with last stream id X: Y was not processed and must be answered
    from a new connection to the same (only) endpoint; X is still answered on the old one."""
    c = Client(gw)
    try:
        held = c.request("/hold?key=above")
        above = c.request("/goaway-above?key=above", method="POST", body=b"p" * 1000)
        c.pump({held, above})
        first, second = c.responses[held], c.responses[above]
    finally:
        c.close()
    assert first["headers"][b":status"] == b"200", first
    assert json.loads(first["body"])["path"] == "/hold?key=above"
    assert second["headers"][b":status"] == b"200", second
    assert json.loads(second["body"])["body_bytes"] == 1000
    assert second["headers"][b"x-connection"] != first["headers"][b"x-connection"]
    assert second["headers"][b"x-upstream"] == b"away1"
    with httpx.Client(timeout=10) as client:  # (the upstream process counts per key)
        counts = client.get(gw.url + "/hold/_count").json()["arrivals"]
    assert counts["above"] == 3  # the held stream once, the unprocessed stream twice


def test_a_post_at_goaways_last_stream_id_is_not_retried(gw: Gateway) -> None:
    """The upstream's GOAWAY names the POST's stream as possibly processed, then the
    connection closes without an answer: a POST that may have been processed is never sent
    again (502), whatever endpoints are left."""
    c = Client(gw)
    try:
        sid = c.request("/goaway-at?key=post", method="POST", body=b"once")
        c.pump({sid})
        answer = c.responses[sid]
    finally:
        c.close()
    assert answer["headers"][b":status"] == b"502", answer
    first, second = _arrivals(gw, "/goaway-at"), _arrivals(gw, "/goaway-at")
    assert first.get("post", 0) + second.get("post", 0) == 1  # (round robin: both upstreams)


def test_a_get_at_goaways_last_stream_id_is_retried_on_another_endpoint(gw: Gateway) -> None:
    """The same for an idempotent GET: the retry policy allows it (``reset``), so it is
    answered by the other endpoint."""
    c = Client(gw)
    try:
        sid = c.request("/goaway-at?key=get")
        c.pump({sid})
        answer = c.responses[sid]
    finally:
        c.close()
    assert answer["headers"][b":status"] == b"200", answer
    counts = [_arrivals(gw, "/goaway-at") for _ in range(2)]
    assert sum(count.get("get", 0) for count in counts) == 2
