"""A slow reader cannot make the gateway buffer more than the flow-control windows allow.

An HTTP/2 client asks for large responses and never reads its socket (nor sends a
WINDOW_UPDATE).  Against an HTTP/2 upstream the bound is visible at the source: the upstream
counts the body bytes the gateway's windows let it send, and they stop far below the
response's size.  Against an HTTP/1.1 upstream the gateway stops reading the upstream
socket.  Either way the gateway's resident memory grows by a bounded amount.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator

import h2.config
import h2.connection
import pytest

from tests.support.h2client import Client
from tests.support.processes import Gateway, H2Upstream, Upstream, gateway, upstreams

RESPONSE_BYTES = 64 * 1024 * 1024
"""Each response: far more than any window or buffer on the way."""
STREAMS = 8
MIB = 1024 * 1024


@pytest.fixture(scope="module")
def h2up() -> Iterator[H2Upstream]:
    up = H2Upstream("big")
    try:
        yield up
    finally:
        up.stop()


@pytest.fixture(scope="module")
def h1up() -> Iterator[Upstream]:
    with upstreams("u1") as started:
        yield started[0]


@pytest.fixture(scope="module")
def gw(
    h2up: H2Upstream, h1up: Upstream, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Gateway]:
    cfg = {
        "listen": {"host": "127.0.0.1", "port": 0, "h2c": True},
        "services": {
            "h2": {"routes": [{"path": "/big"}], "endpoints": [h2up.address], "protocol": "h2c"},
            "h1": {"routes": [{"path": "/stream"}], "endpoints": [h1up.address]},
        },
    }
    with gateway(cfg, tmp_path_factory.mktemp("slow") / "sluice.yaml") as g:
        yield g


class NeverReads:
    """An HTTP/2 client that sends its requests and then never reads: the gateway sees the
    default 64 KiB windows (stream and connection) and a socket that stops draining."""

    def __init__(self, gw: Gateway) -> None:
        self.sock = socket.create_connection((gw.host, gw.port), timeout=10)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        self.h2 = h2.connection.H2Connection(h2.config.H2Configuration(header_encoding=None))
        self.h2.initiate_connection()

    def get(self, path: str) -> None:
        sid = self.h2.get_next_available_stream_id()
        headers = [(":method", "GET"), (":path", path), (":scheme", "http")]
        self.h2.send_headers(sid, [*headers, (":authority", "slow.test")], end_stream=True)
        self.sock.sendall(self.h2.data_to_send())

    def close(self) -> None:
        self.sock.close()


def upstream_sent(h2up: H2Upstream) -> int:
    """Response body bytes the upstream has handed to its connection so far."""

    class Direct:
        host, _, port_text = h2up.address.rpartition(":")
        port = int(port_text)

    c = Client(Direct)  # type: ignore[arg-type]
    try:
        sid = c.request("/_count")
        c.pump({sid})
        sent: int = json.loads(c.responses[sid]["body"])["sent_bytes"]
        return sent
    finally:
        c.close()


def settled(read: Iterator[int], rounds: int = 50) -> int:
    """The value once two readings 0.2 s apart agree (at most ``rounds`` readings)."""
    last = next(read)
    for _ in range(rounds):
        time.sleep(0.2)
        now = next(read)
        if now == last:
            return now
        last = now
    return last


def test_an_h2_upstream_sends_only_what_the_windows_allow(gw: Gateway, h2up: H2Upstream) -> None:
    before_sent = upstream_sent(h2up)
    rss_before = gw.rss_bytes()
    client = NeverReads(gw)
    try:
        for _ in range(STREAMS):
            client.get(f"/big?bytes={RESPONSE_BYTES}")

        def readings() -> Iterator[int]:
            while True:
                yield upstream_sent(h2up)

        sent = settled(readings()) - before_sent
        grown = gw.rss_bytes() - rss_before
        # Per stream: the gateway's 256 KiB upstream stream window plus what the client's
        # 64 KiB windows took; nothing like the 8 x 64 MiB asked for.
        assert sent <= STREAMS * 512 * 1024, sent
        assert grown < 16 * MIB, grown
        # The gateway is still serving others meanwhile.
        other = Client(gw)
        try:
            sid = other.request("/big?bytes=1000", host="other.test")
            other.pump({sid})
            assert len(other.responses[sid]["body"]) == 1000
        finally:
            other.close()
    finally:
        client.close()


def test_an_http1_upstream_is_not_read_past_the_windows(gw: Gateway) -> None:
    rss_before = gw.rss_bytes()
    client = NeverReads(gw)
    try:
        for _ in range(STREAMS):
            client.get(f"/stream?bytes={RESPONSE_BYTES}")

        def readings() -> Iterator[int]:
            while True:
                yield gw.rss_bytes() // MIB

        grown = settled(readings()) * MIB - rss_before
        # Unbounded, the 8 x 64 MiB responses would be in the gateway's memory within a
        # second on loopback; bounded, each stream holds at most one upstream read.
        assert grown < 24 * MIB, grown
    finally:
        client.close()
