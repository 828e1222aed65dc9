"""UpstreamConnection hands each response head over raw, however the bytes are split.

The connection's contract with its exchange (no sockets): for every way of cutting the
upstream's bytes into reads, the exchange sees the same heads (status and raw bytes), the
same body bytes and one completion; bytes nobody asked for make the connection unusable.
"""

from __future__ import annotations

from typing import Any

import pytest

from gateway.dataplane import upstream
from gateway.dataplane.upstream import EndpointConnections, UpstreamConnection


class RecordingExchange:
    """What the connection calls on its bound exchange, recorded."""

    def __init__(self) -> None:
        self.heads: list[tuple[int, bytes]] = []
        self.body = b""
        self.completions = 0
        self.bad = 0
        self.lost: list[bool] = []
        self.wbuf: list[bytes] | None = None

    def on_upstream_headers(self, status: int, raw_head: bytes) -> None:
        self.heads.append((status, raw_head))

    def on_upstream_body(self, body: bytes) -> None:
        self.body += body

    def on_upstream_complete(self) -> None:
        self.completions += 1

    def upstream_bad_response(self) -> None:
        self.bad += 1

    def upstream_lost(self, got_bytes: bool) -> None:
        self.lost.append(got_bytes)

    def flush(self, nbytes: int = 0) -> None:
        self.wbuf = None


class MemoryTransport:
    def __init__(self) -> None:
        self.aborted = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def abort(self) -> None:
        self.aborted = True

    def close(self) -> None:
        self.aborted = True


def bound() -> tuple[UpstreamConnection, RecordingExchange, MemoryTransport]:
    conn = UpstreamConnection(EndpointConnections("h", 1, "h:1"))
    transport = MemoryTransport()
    conn.connection_made(transport)  # type: ignore[arg-type]
    exchange = RecordingExchange()
    conn.exchange = exchange  # type: ignore[assignment]
    conn.data = b""
    return conn, exchange, transport


HINTS = b"HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\n"
FINAL_HEAD = b"HTTP/1.1 200 OK\r\nX-A:  one \r\nContent-Length: 5\r\n"
FINAL = FINAL_HEAD + b"\r\nhello"
CHUNKED_HEAD = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n"
CHUNKED = CHUNKED_HEAD + b"\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"


@pytest.mark.parametrize(
    ("wire", "heads", "body"),
    [
        (FINAL, [(200, FINAL_HEAD)], b"hello"),
        (HINTS + FINAL, [(103, HINTS[:-2]), (200, FINAL_HEAD)], b"hello"),
        (CHUNKED, [(200, CHUNKED_HEAD)], b"abcde"),
    ],
)
def test_every_split_of_a_response_gives_the_same_heads_and_body(
    wire: bytes, heads: list[tuple[int, bytes]], body: bytes
) -> None:
    cuts = [(i, j) for i in range(len(wire) + 1) for j in range(i, len(wire) + 1)]
    for i, j in cuts:  # every pair of cut points (a few thousand)
        conn, exchange, transport = bound()
        for piece in (wire[:i], wire[i:j], wire[j:]):
            if piece:
                conn.data_received(piece)
        assert exchange.heads == heads, (i, j)
        assert exchange.body == body, (i, j)
        assert exchange.completions == len(heads), (i, j)
        assert exchange.bad == 0 and not transport.aborted, (i, j)
        assert conn.partial == b"", (i, j)


def test_the_same_connection_serves_the_next_response() -> None:
    conn, first, _ = bound()
    conn.data_received(FINAL[:10])
    conn.data_received(FINAL[10:])
    assert first.heads == [(200, FINAL_HEAD)]
    second = RecordingExchange()
    conn.exchange = second  # type: ignore[assignment]
    conn.data = b""
    conn.data_received(HINTS + FINAL[:30])
    conn.data_received(FINAL[30:])
    assert second.heads == [(103, HINTS[:-2]), (200, FINAL_HEAD)]
    assert second.body == b"hello"


def test_bytes_after_a_final_response_make_the_connection_unusable() -> None:
    conn, exchange, transport = bound()
    conn.data_received(FINAL + FINAL)
    assert exchange.heads == [(200, FINAL_HEAD)]
    assert transport.aborted


def test_bytes_on_an_idle_connection_make_it_unusable() -> None:
    conn, exchange, transport = bound()
    conn.exchange = None
    conn.data_received(b"HTTP/1.1 200 OK\r\n")
    assert transport.aborted
    assert exchange.heads == []


def test_a_head_larger_than_the_limit_is_a_bad_response(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(upstream, "MAX_RESPONSE_HEAD_BYTES", 64)
    head = b"HTTP/1.1 200 OK\r\nX-Big: " + b"b" * 80 + b"\r\nContent-Length: 0\r\n\r\n"
    for split in (None, 30, 90):  # in one read; completed in a later read; too big unfinished
        conn, exchange, transport = bound()
        if split is None:
            conn.data_received(head)
        else:
            conn.data_received(head[:split])
            if not transport.aborted:  # an aborted transport delivers nothing more
                conn.data_received(head[split:])
        assert exchange.bad == 1 and transport.aborted
        assert exchange.heads == []


def test_lost_tells_whether_response_bytes_arrived() -> None:
    conn, exchange, _ = bound()
    conn.connection_lost(None)
    assert exchange.lost == [False]
    conn, exchange, _ = bound()
    conn.data_received(FINAL[:12])
    conn.connection_lost(None)
    assert exchange.lost == [True]
