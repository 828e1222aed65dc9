"""Large bodies stream both ways with flat gateway memory; a client that leaves cancels its upstream request."""

from __future__ import annotations

import functools
import hashlib
import socket
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.support.processes import Gateway, PeakRss, Upstream, gateway, upstreams

BODY_BYTES = 256 * 1024 * 1024
PIECE = bytes(range(256)) * 256  # 64 KiB, the upstream's own pattern
RSS_GROWTH_LIMIT = 48 * 1024 * 1024


@pytest.fixture(scope="module")
def up() -> Iterator[Upstream]:
    with upstreams("big") as started:
        yield started[0]


@pytest.fixture(scope="module")
def gw(up: Upstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    cfg = {"services": {"big": {"routes": [{"path": "/"}], "endpoints": [up.address]}}}
    with gateway(cfg, tmp_path_factory.mktemp("stream") / "sluice.yaml") as g:
        httpx.get(g.url + "/echo", timeout=10)  # warm up: imports and first connection done
        yield g


@functools.cache
def expected_sha256(total: int) -> str:
    digest = hashlib.sha256()
    for p in pieces(total):
        digest.update(p)
    return digest.hexdigest()


def pieces(total: int) -> Iterator[bytes]:
    sent = 0
    while sent < total:
        yield PIECE
        sent += len(PIECE)


def test_large_upload_streams_with_flat_memory(gw: Gateway) -> None:
    baseline = gw.rss_bytes()
    with PeakRss(gw) as rss:
        r = httpx.post(
            gw.url + "/sink",
            content=pieces(BODY_BYTES),
            headers={"Content-Length": str(BODY_BYTES)},
            timeout=120,
        )
    assert r.status_code == 200
    assert r.json() == {"bytes": BODY_BYTES, "sha256": expected_sha256(BODY_BYTES), "name": "big"}
    assert rss.peak - baseline < RSS_GROWTH_LIMIT, (baseline, rss.peak)


def test_large_chunked_upload(gw: Gateway) -> None:
    total = 32 * 1024 * 1024
    r = httpx.post(gw.url + "/sink", content=pieces(total), timeout=60)
    assert r.json()["bytes"] == total


@pytest.mark.parametrize(("chunked", "total"), [(0, BODY_BYTES), (1, BODY_BYTES // 4)])
def test_large_download_streams_with_flat_memory(gw: Gateway, chunked: int, total: int) -> None:
    baseline = gw.rss_bytes()
    digest = hashlib.sha256()
    n = 0
    with (
        PeakRss(gw) as rss,
        httpx.stream(
            "GET", gw.url + "/stream", params={"bytes": total, "chunked": chunked}, timeout=120
        ) as r,
    ):
        assert r.status_code == 200
        for data in r.iter_raw():
            n += len(data)
            digest.update(data)
    assert n == total
    assert digest.hexdigest() == expected_sha256(total)
    assert rss.peak - baseline < RSS_GROWTH_LIMIT, (baseline, rss.peak)


def test_slow_reader_backpressure_keeps_memory_flat(gw: Gateway) -> None:
    """A client that reads slowly must not make the gateway buffer the upstream's body."""
    baseline = gw.rss_bytes()
    with PeakRss(gw) as rss, socket.create_connection((gw.host, gw.port), timeout=30) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        s.sendall(
            f"GET /stream?bytes={128 * 1024 * 1024} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode()
        )
        time.sleep(1.0)  # let the upstream push as hard as it can while we do not read
        mid_peak = rss.peak
        n = 0
        while True:
            data = s.recv(1 << 20)
            if not data:
                break
            n += len(data)
    assert n > 128 * 1024 * 1024  # head + body
    assert mid_peak - baseline < RSS_GROWTH_LIMIT, (baseline, mid_peak)
    assert rss.peak - baseline < RSS_GROWTH_LIMIT, (baseline, rss.peak)


def admin_services(gw: Gateway) -> dict[str, object]:
    data: dict[str, object] = httpx.get(gw.admin_url + "/api/services", timeout=10).json()
    return data


def test_client_disconnect_cancels_the_upstream_request(gw: Gateway, up: Upstream) -> None:
    s = socket.create_connection((gw.host, gw.port), timeout=10)
    s.sendall(b"GET /hold?s=30&id=disc HTTP/1.1\r\nHost: x\r\n\r\n")
    deadline = time.monotonic() + 10
    while admin_services(gw)["services"]["big"]["signals"]["in_flight"] != 1:  # type: ignore[index]
        assert time.monotonic() < deadline, "the request never reached the upstream"
        time.sleep(0.02)
    s.close()
    deadline = time.monotonic() + 10
    while True:
        events = httpx.get(up.url + "/_events", timeout=10).json()
        if any(e["target"] == "/hold?s=30&id=disc" for e in events):
            break
        assert time.monotonic() < deadline, f"upstream never saw the cancel: {events}"
        time.sleep(0.02)
    assert {"event": "hold-cancelled", "target": "/hold?s=30&id=disc"} in events
    services = admin_services(gw)["services"]
    assert services["big"]["signals"]["in_flight"] == 0  # type: ignore[index]
    metrics = httpx.get(gw.admin_url + "/metrics", timeout=10).text
    assert 'sluice_requests_total{code="499",service="big"}' in metrics
