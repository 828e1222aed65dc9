"""An HTTP/2 upstream that answers before the request body ends (RFC 9113 §8.1: a complete
response, no RST_STREAM): the gateway resets the stream it no longer sends on, so the
upstream connection's stream count stays true and later requests on it are served."""

from __future__ import annotations

import contextlib
import json
import socket
from collections.abc import Iterator

import h2.exceptions
import pytest

from gateway.dataplane.h2server import CONNECTION_WINDOW
from tests.support.h2client import Client
from tests.support.processes import Gateway, H2Upstream, gateway

MAX_STREAMS = 2


@pytest.fixture(scope="module")
def early() -> Iterator[H2Upstream]:
    up = H2Upstream("early", max_streams=MAX_STREAMS)
    try:
        yield up
    finally:
        up.stop()


@pytest.fixture(scope="module")
def gw(early: H2Upstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    cfg = {
        "listen": {"host": "127.0.0.1", "port": 0, "h2c": True},
        "services": {
            "early": {
                "routes": [{"path": "/"}],
                "endpoints": [early.address],
                "protocol": "h2c",
            },
        },
    }
    with gateway(cfg, tmp_path_factory.mktemp("h2early") / "sluice.yaml") as g:
        yield g


def post_part_of_a_body(gw: Gateway) -> bytes:
    """POST /early announcing 1 MB, send 1 KB of it, and return the response head."""
    with socket.create_connection((gw.host, gw.port), timeout=10) as s:
        s.sendall(
            b"POST /early HTTP/1.1\r\nHost: shop\r\nContent-Length: 1000000\r\n\r\n" + b"x" * 1024
        )
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = s.recv(4096)
            if not chunk:
                break
            head += chunk
        return head


def test_streams_answered_before_their_body_ends_do_not_use_up_the_connection(
    gw: Gateway,
) -> None:
    # Three times the upstream's SETTINGS_MAX_CONCURRENT_STREAMS, one after another on the
    # gateway's one upstream connection: each stream must be closed (reset: the gateway stops
    # sending the body) when its exchange ends, or the connection counts it open for good.
    heads = [post_part_of_a_body(gw) for _ in range(3 * MAX_STREAMS)]
    statuses = [h.split(b"\r\n", 1)[0] for h in heads]
    assert statuses == [b"HTTP/1.1 413 Request Entity Too Large"] * (3 * MAX_STREAMS), statuses


def test_an_http2_client_may_go_on_sending_a_body_answered_early(gw: Gateway) -> None:
    """RFC 9113 §8.1: a client answered before its body ended may go on sending it (the
    gateway may also reset the stream).  Whatever it sends must not use up the connection's
    flow-control window: a later stream's body still gets through."""
    c = Client(gw)
    try:
        sid = c.h2.get_next_available_stream_id()
        c.h2.send_headers(
            sid,
            [(":method", "POST"), (":path", "/early"), (":scheme", "http"), (":authority", "a")],
        )
        c.h2.send_data(sid, b"x" * 10_000)
        c.sock.sendall(c.h2.data_to_send())
        c.responses[sid] = {"headers": None, "body": b"", "ended": False, "reset": None}
        c.pump({sid})
        assert c.responses[sid]["headers"][b":status"] == b"413"
        # Two connection windows' worth more of the same body, as the windows allow.
        left = 2 * CONNECTION_WINDOW
        while left > 0 and c.responses[sid]["reset"] is None:
            try:
                n = min(c.h2.local_flow_control_window(sid), c.h2.max_outbound_frame_size, left)
                if n > 0:
                    c.h2.send_data(sid, b"x" * n)
                    left -= n
            except h2.exceptions.StreamClosedError:
                break  # the gateway reset it: the client stops
            c.sock.sendall(c.h2.data_to_send())
            if n <= 0 and not c._read():
                break
        with contextlib.suppress(h2.exceptions.StreamClosedError):
            c.h2.end_stream(sid)
        c.sock.sendall(c.h2.data_to_send())
        later = c.request("/echo", method="POST", body=b"y" * 200_000)
        c.pump({later})
        r = c.responses[later]
        assert r["headers"][b":status"] == b"200"
        assert json.loads(r["body"])["body_bytes"] == 200_000
    finally:
        c.close()
