"""HTTP/2 by prior knowledge (``listen.h2c``) through the real gateway: curl, a raw ``h2``
client with several streams per connection, and hostile frames answered per RFC 9113 while
other connections keep being served."""

from __future__ import annotations

import contextlib
import json
import shutil
import socket
import ssl
import subprocess
from collections.abc import Iterator
from typing import Any

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.settings
import hpack
import pytest
from hyperframe.frame import (
    ContinuationFrame,
    Frame,
    GoAwayFrame,
    HeadersFrame,
    RstStreamFrame,
    SettingsFrame,
)

from tests.support.certs import make_ca
from tests.support.h2client import Client
from tests.support.processes import Gateway, Upstream, gateway, upstreams

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


@pytest.fixture(scope="module")
def up() -> Iterator[Upstream]:
    with upstreams("u1") as started:
        yield started[0]


@pytest.fixture(scope="module")
def gw(up: Upstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    cfg = {
        "listen": {"host": "127.0.0.1", "port": 0, "h2c": True},
        "services": {
            "main": {"routes": [{"host": "main.test", "path": "/"}], "endpoints": [up.address]},
            "empty": {"routes": [{"path": "/empty"}], "endpoints": []},
            "tight": {
                "routes": [{"path": "/hang"}],
                "endpoints": [up.address],
                "timeouts": {"connect_s": 1, "response_header_s": 0.3, "total_s": 5},
            },
        },
    }
    with gateway(cfg, tmp_path_factory.mktemp("h2c") / "sluice.yaml") as g:
        yield g


def read_verdict(sock: socket.socket, stream_id: int) -> tuple[str, int] | None:
    """Read raw frames until a GOAWAY, a RST_STREAM or HEADERS on ``stream_id``, or EOF:
    ("goaway" | "reset", error code) or ("answered", status-less 0); None at EOF."""
    buf = b""
    while True:
        while len(buf) >= 9:
            frame, length = Frame.parse_frame_header(memoryview(buf[:9]))
            if len(buf) < 9 + length:
                break
            frame.parse_body(memoryview(buf[9 : 9 + length]))
            buf = buf[9 + length :]
            if isinstance(frame, GoAwayFrame):
                return "goaway", frame.error_code
            if isinstance(frame, RstStreamFrame) and frame.stream_id == stream_id:
                return "reset", frame.error_code
            if isinstance(frame, HeadersFrame) and frame.stream_id == stream_id:
                return "answered", 0
        try:
            data = sock.recv(65536)
        except ConnectionResetError:
            return None
        if not data:
            return None
        buf += data


def test_streams_route_by_authority_and_answer_independently(gw: Gateway) -> None:
    c = Client(gw)
    try:
        ok = c.request("/echo?a=1", method="POST", body=b"hello")
        empty = c.request("/empty", host="other.test")
        nothing = c.request("/x", host="nowhere.test")
        c.pump({ok, empty, nothing})
        assert c.responses[ok]["headers"][b":status"] == b"200"
        echoed = json.loads(c.responses[ok]["body"])
        assert echoed["body"] == "hello"
        assert echoed["method"] == "POST"
        assert ["host", "main.test"] in echoed["headers"]
        assert c.responses[empty]["headers"][b":status"] == b"503"
        assert c.responses[empty]["headers"][b"sluice-error"] == b"no-endpoints"
        assert c.responses[nothing]["headers"][b":status"] == b"404"
        again = c.request("/echo?b=2")  # the connection still serves
        c.pump({again})
        assert json.loads(c.responses[again]["body"])["target"] == "/echo?b=2"
    finally:
        c.close()


def test_timeout_on_one_stream_leaves_others(gw: Gateway) -> None:
    c = Client(gw)
    try:
        hung = c.request("/hang", host="any.test")
        fine = c.request("/echo", host="main.test")
        c.pump({hung, fine})
        assert c.responses[fine]["headers"][b":status"] == b"200"
        assert c.responses[hung]["headers"][b":status"] == b"504"
    finally:
        c.close()


def test_large_body_through_a_small_window(gw: Gateway) -> None:
    """The client's 16 KiB window: the gateway sends as the window reopens, nothing lost."""
    c = Client(gw, window=16384)
    try:
        big = c.request("/stream?bytes=3000000&chunked=1")
        sized = c.request("/stream?bytes=1000000")
        c.pump({big, sized})
        assert len(c.responses[big]["body"]) == 3_000_000
        assert len(c.responses[sized]["body"]) == 1_000_000
        assert c.responses[big]["ended"] and c.responses[sized]["ended"]
    finally:
        c.close()


def test_large_request_body_streams(gw: Gateway) -> None:
    c = Client(gw)
    try:
        sid = c.request("/sink", method="PUT", body=b"x" * 2_000_000)
        c.pump({sid})
        assert json.loads(c.responses[sid]["body"])["bytes"] == 2_000_000
    finally:
        c.close()


def test_http1_still_served_on_an_h2c_listener(gw: Gateway) -> None:
    with socket.create_connection((gw.host, gw.port), timeout=10) as s:
        s.sendall(b"GET /echo HTTP/1.1\r\nHost: main.test\r\nConnection: close\r\n\r\n")
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    assert data.startswith(b"HTTP/1.1 200")


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_curl_http2_prior_knowledge(gw: Gateway) -> None:
    version = subprocess.run(["curl", "--version"], capture_output=True, text=True, check=True)
    if "HTTP2" not in version.stdout:
        pytest.skip("this curl has no HTTP/2")
    out = subprocess.run(
        [
            "curl", "-sS", "--http2-prior-knowledge", "-H", "Host: main.test",
            "-w", "\n%{http_version} %{http_code}", f"{gw.url}/echo?curl=1",
        ],
        capture_output=True, text=True, timeout=30, check=True,
    )  # fmt: skip
    body, _, status = out.stdout.rpartition("\n")
    assert status == "2 200"
    assert json.loads(body)["target"] == "/echo?curl=1"


def _served(gw: Gateway) -> bool:
    c = Client(gw)
    try:
        sid = c.request("/echo")
        c.pump({sid})
        return bool(c.responses[sid]["headers"][b":status"] == b"200")
    finally:
        c.close()


def _raw_connection(gw: Gateway) -> tuple[socket.socket, hpack.Encoder]:
    s = socket.create_connection((gw.host, gw.port), timeout=10)
    s.sendall(PREFACE + SettingsFrame(0).serialize())
    return s, hpack.Encoder()


def _request_block(enc: hpack.Encoder, path: str = "/hang") -> bytes:
    return bytes(
        enc.encode(
            [(":method", "GET"), (":path", path), (":scheme", "http"), (":authority", "main.test")]
        )
    )


def test_rapid_reset_gets_goaway_enhance_your_calm(gw: Gateway) -> None:
    s, enc = _raw_connection(gw)
    other = Client(gw)  # an established connection, served throughout
    try:
        frames = []
        for i in range(1000):
            sid = 1 + 2 * i
            frames.append(
                HeadersFrame(sid, _request_block(enc), flags=["END_HEADERS", "END_STREAM"])
            )
            frames.append(RstStreamFrame(sid, error_code=h2.errors.ErrorCodes.CANCEL))
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            s.sendall(b"".join(f.serialize() for f in frames))
        verdict = read_verdict(s, 0)
        assert verdict == ("goaway", h2.errors.ErrorCodes.ENHANCE_YOUR_CALM)
        sid = other.request("/echo")
        other.pump({sid})
        assert other.responses[sid]["headers"][b":status"] == b"200"
    finally:
        s.close()
        other.close()
    assert _served(gw)


def test_continuation_flood_gets_goaway(gw: Gateway) -> None:
    s, enc = _raw_connection(gw)
    try:
        block = _request_block(enc)
        frames = [HeadersFrame(1, block)]
        frames += [ContinuationFrame(1, b"\x40\x01a\x01b") for _ in range(5000)]
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            s.sendall(b"".join(f.serialize() for f in frames))
        verdict = read_verdict(s, 0)
        assert verdict is not None
        assert verdict[0] == "goaway"
        assert verdict[1] in {
            h2.errors.ErrorCodes.PROTOCOL_ERROR,
            h2.errors.ErrorCodes.ENHANCE_YOUR_CALM,
        }
    finally:
        s.close()
    assert _served(gw)


@pytest.mark.parametrize(
    "headers",
    [
        [(":method", "GET"), (":path", "/echo"), (":scheme", "http"), (":bogus", "x")],
        [(":method", "GET"), (":scheme", "http"), (":authority", "main.test")],  # no :path
        [(":path", "/echo"), (":method", "GET"), ("x", "1"), (":scheme", "http")],  # pseudo late
        [(":method", "GET"), (":path", "/echo"), (":scheme", "http"), ("Upper", "1")],
        [(":method", "GET"), (":path", "/echo"), (":scheme", "http"), ("connection", "close")],
    ],
)
def test_malformed_request_is_a_protocol_error(gw: Gateway, headers: list[tuple[str, str]]) -> None:
    s, enc = _raw_connection(gw)
    try:
        block = bytes(enc.encode(headers))
        s.sendall(HeadersFrame(1, block, flags=["END_HEADERS", "END_STREAM"]).serialize())
        verdict = read_verdict(s, 1)
        assert verdict is not None
        assert verdict[0] in {"goaway", "reset"}  # a stream or connection error (RFC 9113 8.1.1)
        assert verdict[1] == h2.errors.ErrorCodes.PROTOCOL_ERROR
    finally:
        s.close()
    assert _served(gw)


def test_oversized_header_list_gets_enhance_your_calm(gw: Gateway) -> None:
    s, enc = _raw_connection(gw)
    try:
        block = bytes(
            enc.encode(
                [
                    (":method", "GET"),
                    (":path", "/echo"),
                    (":scheme", "http"),
                    (":authority", "main.test"),
                    ("x-big", "v" * 200_000),
                ]
            )
        )
        pieces = [block[i : i + 16384] for i in range(0, len(block), 16384)]
        frames = [HeadersFrame(1, pieces[0], flags=["END_STREAM"])]
        frames += [ContinuationFrame(1, p) for p in pieces[1:]]
        frames[-1].flags.add("END_HEADERS")
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            s.sendall(b"".join(f.serialize() for f in frames))
        assert read_verdict(s, 1) == ("goaway", h2.errors.ErrorCodes.ENHANCE_YOUR_CALM)
    finally:
        s.close()
    assert _served(gw)


@pytest.fixture(scope="module")
def tls_gw(up: Upstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Gateway, Any]]:
    d = tmp_path_factory.mktemp("h2-certs")
    ca = make_ca(d)
    leaf = ca.issue(d, "site", ["site.example.test"])
    cfg = {
        "tls": {
            "listen": {"host": "127.0.0.1", "port": 0},
            "certificates": [leaf.config()],
            "http2": True,
        },
        "services": {"main": {"routes": [{"path": "/"}], "endpoints": [up.address]}},
    }
    with gateway(cfg, tmp_path_factory.mktemp("h2tls") / "sluice.yaml") as g:
        yield g, ca


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_curl_http2_over_tls_by_alpn(tls_gw: tuple[Gateway, Any]) -> None:
    g, ca = tls_gw
    assert g.tls_url is not None
    port = g.tls_url.rpartition(":")[2]
    out = subprocess.run(
        [
            "curl", "-sS", "--http2", "--max-time", "10",
            "--resolve", f"site.example.test:{port}:127.0.0.1", "--cacert", str(ca.ca_file),
            "-w", "\n%{http_code} %{http_version}", f"https://site.example.test:{port}/echo?tls=1",
        ],
        capture_output=True, text=True, timeout=30, check=True,
    ).stdout  # fmt: skip
    body, _, status = out.rpartition("\n")
    assert status == "200 2"
    echoed = json.loads(body)
    assert echoed["target"] == "/echo?tls=1"
    headers = {n.lower(): v for n, v in echoed["headers"]}
    assert headers["x-forwarded-proto"] == "https"


def test_http1_still_chosen_by_alpn_when_asked(tls_gw: tuple[Gateway, Any]) -> None:
    g, ca = tls_gw
    assert g.tls_url is not None
    port = int(g.tls_url.rpartition(":")[2])
    ctx = ssl.create_default_context(cafile=str(ca.ca_file))
    ctx.set_alpn_protocols(["http/1.1"])
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as raw_sock,
        ctx.wrap_socket(raw_sock, server_hostname="site.example.test") as s,
    ):
        assert s.selected_alpn_protocol() == "http/1.1"
        s.sendall(b"GET /echo HTTP/1.1\r\nHost: site.example.test\r\nConnection: close\r\n\r\n")
        assert s.recv(65536).startswith(b"HTTP/1.1 200")
