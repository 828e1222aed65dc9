"""WebSockets through the gateway: a real ``websockets`` client and server on loopback.

The handshake is proxied, the connection is spliced both ways after the upstream's 101
(large and fragmented messages, ping/pong, either side closing abruptly), each open socket
counts as one request in flight for its service, other upgrade protocols are passed only
where a service allows them, and a 101 nobody asked for is a 502.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import time
from collections.abc import Iterator

import httpx
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from tests.support.processes import Gateway, PeakRss, Upstream, WsUpstream, gateway, upstreams

MANY = int(os.environ.get("SLUICE_WS_SOCKETS", "200"))
"""Concurrent sockets in the many-sockets test (1,000 by hand: SLUICE_WS_SOCKETS=1000)."""
WAIT_S = 20.0


@pytest.fixture(scope="module")
def ws_up() -> Iterator[WsUpstream]:
    up = WsUpstream()
    try:
        yield up
    finally:
        up.stop()


@pytest.fixture(scope="module")
def raw_up() -> Iterator[Upstream]:
    with upstreams("raw") as started:
        yield started[0]


@pytest.fixture(scope="module")
def gw(
    ws_up: WsUpstream, raw_up: Upstream, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Gateway]:
    cfg = {
        "services": {
            "chat": {"routes": [{"host": "chat.test"}], "endpoints": [ws_up.address]},
            "raw": {
                "routes": [{"host": "raw.test"}],
                "endpoints": [raw_up.address],
                "upgrades": {"protocols": ["websocket", "foo"]},
            },
            "plain": {"routes": [{"host": "plain.test"}], "endpoints": [raw_up.address]},
            "idle": {
                "routes": [{"host": "idle.test"}],
                "endpoints": [ws_up.address],
                "upgrades": {"idle_timeout_s": 0.5},
            },
        }
    }
    with gateway(cfg, tmp_path_factory.mktemp("ws") / "sluice.yaml") as g:
        yield g


def chat(gw: Gateway, path: str = "/echo", host: str = "chat.test", **kw: object) -> connect:
    """A client for ``ws://HOST:PORT/path`` that connects to the gateway's address."""
    return connect(
        f"ws://{host}:{gw.port}{path}",
        host=gw.host,
        port=gw.port,
        max_size=None,
        compression=None,
        open_timeout=WAIT_S,
        close_timeout=WAIT_S,
        **kw,  # type: ignore[arg-type]
    )


def service_view(gw: Gateway, name: str) -> dict[str, object]:
    r = httpx.get(gw.admin_url + "/api/services", timeout=10)
    r.raise_for_status()
    body = r.json()
    services = body["services"] if isinstance(body, dict) and "services" in body else body
    if isinstance(services, dict):
        return services[name]  # type: ignore[no-any-return]
    return next(s for s in services if s["name"] == name)


async def wait_for(predicate: object, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        if await asyncio.to_thread(predicate):  # type: ignore[arg-type]
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


async def test_echo_text_and_binary(gw: Gateway) -> None:
    async with chat(gw) as ws:
        await ws.send("hello")
        assert await ws.recv() == "hello"
        await ws.send(b"\x00\x01\xff")
        assert await ws.recv() == b"\x00\x01\xff"


async def test_handshake_headers_reach_the_upstream(gw: Gateway) -> None:
    async with chat(gw, "/headers") as ws:
        headers = {k.lower(): v for k, v in json.loads(await ws.recv())}
    assert headers["upgrade"].lower() == "websocket"
    assert "upgrade" in headers["connection"].lower()
    assert "sec-websocket-key" in headers
    assert headers["sec-websocket-version"] == "13"
    assert "x-forwarded-for" in headers


async def test_large_messages_both_ways(gw: Gateway) -> None:
    big = os.urandom(16 * 1024 * 1024)
    async with chat(gw) as ws:
        await ws.send(big)
        assert await ws.recv() == big
        text = "é" * (2 * 1024 * 1024)
        await ws.send(text)
        assert await ws.recv() == text


async def test_fragmented_message(gw: Gateway) -> None:
    parts = [os.urandom(n) for n in (1, 70_000, 3, 200_000)]
    async with chat(gw) as ws:
        await ws.send(iter(parts))
        assert await ws.recv() == b"".join(parts)


async def test_ping_pong(gw: Gateway) -> None:
    async with chat(gw, ping_interval=None) as ws:
        for _ in range(3):
            pong = await ws.ping(b"are you there")
            latency = await asyncio.wait_for(pong, WAIT_S)
            assert latency >= 0


async def test_upstream_aborts(gw: Gateway) -> None:
    async with chat(gw, "/abort") as ws:
        await ws.send("bye")
        with pytest.raises(ConnectionClosed) as closed:
            await asyncio.wait_for(ws.recv(), WAIT_S)
    assert closed.value.rcvd is None  # no close frame: the connection was dropped


async def test_client_aborts_and_the_slot_is_given_back(gw: Gateway) -> None:
    async with chat(gw) as ws:
        await ws.send("x")
        await ws.recv()
        await wait_for(lambda: service_view(gw, "chat")["upgraded"]["open"] >= 1, "open")  # type: ignore[index]
        sock = ws.transport.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        ws.transport.abort()
    await wait_for(lambda: service_view(gw, "chat")["upgraded"]["open"] == 0, "all closed")  # type: ignore[index]
    # The gateway still serves: a new socket works.
    async with chat(gw) as ws:
        await ws.send("again")
        assert await ws.recv() == "again"


async def test_refused_handshake_is_an_ordinary_response(gw: Gateway) -> None:
    with pytest.raises(InvalidStatus) as refused:
        async with chat(gw, "/forbidden"):
            pass
    assert refused.value.response.status_code == 403


async def test_open_sockets_count_in_flight(gw: Gateway) -> None:
    n = 20
    before = service_view(gw, "chat")
    async with asyncio.timeout(WAIT_S * 2):
        sockets = [await chat(gw) for _ in range(n)]
        try:
            for i, ws in enumerate(sockets):
                await ws.send(str(i))
                assert await ws.recv() == str(i)
            view = service_view(gw, "chat")
            assert view["upgraded"]["open"] == n  # type: ignore[index]
            assert view["signals"]["in_flight"] == n  # type: ignore[index]
            metrics = httpx.get(gw.admin_url + "/metrics", timeout=10).text
            assert f'sluice_upgraded_connections{{service="chat"}} {float(n)}' in metrics
        finally:
            for ws in sockets:
                await ws.close()
    await wait_for(lambda: service_view(gw, "chat")["signals"]["in_flight"] == 0, "in-flight 0")  # type: ignore[index]
    after = service_view(gw, "chat")
    assert after["upgraded"]["total"] - before["upgraded"]["total"] == n  # type: ignore[index,operator]


async def test_idle_timeout_closes_the_socket(gw: Gateway) -> None:
    async with chat(gw, host="idle.test", ping_interval=None) as ws:
        with pytest.raises(ConnectionClosed):
            await asyncio.wait_for(ws.recv(), WAIT_S)


async def test_many_concurrent_sockets_with_bounded_memory(gw: Gateway) -> None:
    async with chat(gw) as warm:  # the first socket's imports and buffers are not growth
        await warm.send("w")
        await warm.recv()
    baseline = gw.rss_bytes()
    with PeakRss(gw) as rss:
        async with asyncio.timeout(120):
            sockets = []
            try:
                for start in range(0, MANY, 100):  # opened 100 at a time, all kept open
                    batch = min(100, MANY - start)
                    sockets += await asyncio.gather(*(chat(gw) for _ in range(batch)))
                await asyncio.gather(*(ws.send(f"m{i}") for i, ws in enumerate(sockets)))
                got = await asyncio.gather(*(ws.recv() for ws in sockets))
                assert got == [f"m{i}" for i in range(MANY)]
                view = service_view(gw, "chat")
                assert view["upgraded"]["open"] == MANY  # type: ignore[index]
            finally:
                await asyncio.gather(*(ws.close() for ws in sockets))
    growth = rss.peak - baseline
    print(f"{MANY} sockets: gateway RSS {baseline} -> peak {rss.peak} (+{growth} bytes)")
    # Two connections per socket; a few KiB each is expected, megabytes each is a leak.
    assert growth < MANY * 64 * 1024, growth


def raw_exchange(gw: Gateway, request: bytes, read_until: bytes = b"\r\n\r\n") -> bytes:
    with socket.create_connection((gw.host, gw.port), timeout=WAIT_S) as s:
        s.sendall(request)
        data = b""
        while read_until not in data:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
        return data


def test_other_protocol_passes_where_allowed(gw: Gateway) -> None:
    req = b"GET /switch HTTP/1.1\r\nHost: raw.test\r\nConnection: Upgrade\r\nUpgrade: foo\r\n\r\n"
    with socket.create_connection((gw.host, gw.port), timeout=WAIT_S) as s:
        s.sendall(req)
        data = b""
        while b"other side\n" not in data:
            chunk = s.recv(65536)
            assert chunk, data
            data += chunk
        assert data.startswith(b"HTTP/1.1 101 ")
        assert b"\r\nUpgrade: foo\r\n" in data
        s.sendall(b"raw bytes, not HTTP")
        echoed = b""
        while len(echoed) < len(b"raw bytes, not HTTP"):
            chunk = s.recv(65536)
            assert chunk
            echoed += chunk
        assert echoed == b"raw bytes, not HTTP"


def test_other_protocol_is_not_passed_where_not_allowed(gw: Gateway) -> None:
    # The service does not take "foo": the request goes without its Upgrade (plain HTTP).
    data = raw_exchange(
        gw,
        b"GET /echo HTTP/1.1\r\nHost: plain.test\r\nConnection: Upgrade\r\nUpgrade: foo\r\n\r\n",
        b"}",
    )
    assert data.startswith(b"HTTP/1.1 200 ")
    body = json.loads(data.split(b"\r\n\r\n", 1)[1])
    names = {k.lower() for k, _ in body["headers"]}
    assert "upgrade" not in names


def test_unexpected_101_is_a_502_without_a_traceback(gw: Gateway) -> None:
    r = httpx.get(gw.url + "/switch", headers={"Host": "plain.test"}, timeout=WAIT_S)
    assert r.status_code == 502
    assert r.headers["Sluice-Error"] == "upstream-bad-response"
    time.sleep(0.2)  # let the gateway's stderr pump catch up
    assert "Traceback" not in gw.output()
    assert "Fatal error" not in gw.output()


async def test_sigterm_closes_open_sockets_after_drain(
    ws_up: WsUpstream, tmp_path: pytest.TempPathFactory
) -> None:
    cfg = {
        "shutdown": {"drain_s": 2.0},
        "services": {"chat": {"routes": [{"host": "chat.test"}], "endpoints": [ws_up.address]}},
    }
    with gateway(cfg, tmp_path / "sluice.yaml") as g:  # type: ignore[operator]
        async with chat(g) as ws:
            await ws.send("x")
            assert await ws.recv() == "x"
            g.signal(signal.SIGTERM)
            await ws.send("still open while draining")
            assert await ws.recv() == "still open while draining"
            with pytest.raises(ConnectionClosed):
                await asyncio.wait_for(ws.recv(), WAIT_S)
        assert await asyncio.to_thread(g.wait, WAIT_S) == 0
