"""Balancer distribution through the real gateway, across real upstream processes."""

from __future__ import annotations

import socket
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.processes import Upstream, gateway, upstreams


@pytest.fixture(scope="module")
def ups() -> Iterator[list[Upstream]]:
    with upstreams("a", "b", "c") as started:
        yield started


def config(ups: list[Upstream], balancer: str) -> dict[str, object]:
    return {
        "services": {
            "svc": {
                "routes": [{"path": "/"}],
                "endpoints": [u.address for u in ups],
                "balancer": balancer,
            }
        }
    }


def test_round_robin_is_even(ups: list[Upstream], tmp_path: Path) -> None:
    with (
        gateway(config(ups, "round_robin"), tmp_path / "s.yaml") as g,
        httpx.Client(base_url=g.url, timeout=10) as client,
    ):
        counts = Counter(client.get("/echo").headers["x-upstream"] for _ in range(90))
    assert counts == {"a": 30, "b": 30, "c": 30}


def test_least_request_spreads_sequential_load(ups: list[Upstream], tmp_path: Path) -> None:
    with (
        gateway(config(ups, "least_request"), tmp_path / "s.yaml") as g,
        httpx.Client(base_url=g.url, timeout=10) as client,
    ):
        counts = Counter(client.get("/echo").headers["x-upstream"] for _ in range(150))
    # All idle: p2c ties go to a uniformly random first sample, so each gets ~1/3
    # (50 ± 5.8; the bounds are over 4 standard deviations away).
    assert set(counts) == {"a", "b", "c"}
    assert all(25 <= n <= 75 for n in counts.values()), counts


def test_least_request_avoids_a_busy_endpoint(ups: list[Upstream], tmp_path: Path) -> None:
    """Three held requests over two endpoints sit 2/1; new requests all go to the one with 1.

    With two endpoints, p2c compares both, so it always picks the less loaded one.  The held
    requests are raw connections closed at the end (which also cancels them upstream).
    """
    with gateway(config(ups[:2], "least_request"), tmp_path / "s.yaml") as g:
        held: list[socket.socket] = []
        try:
            for n in range(1, 4):
                s = socket.create_connection((g.host, g.port), timeout=10)
                held.append(s)
                s.sendall(b"GET /hold?s=60 HTTP/1.1\r\nHost: x\r\n\r\n")
                deadline = time.monotonic() + 10
                while True:  # one at a time, so each placement sees the previous ones
                    eps = httpx.get(g.admin_url + "/api/services", timeout=10).json()["services"][
                        "svc"
                    ]["endpoints"]
                    if sum(e["in_flight"] for e in eps) == n:
                        break
                    assert time.monotonic() < deadline
                    time.sleep(0.02)
            in_flight = {e["address"]: e["in_flight"] for e in eps}
            quick = Counter(
                httpx.get(g.url + "/echo", timeout=10).headers["x-upstream"] for _ in range(20)
            )
        finally:
            for s in held:
                s.close()
        assert sorted(in_flight.values()) == [1, 2]
        idler = min(in_flight, key=lambda a: in_flight[a])
        names = {u.address: u.name for u in ups}
        assert quick == {names[idler]: 20}, (in_flight, quick)


def test_peak_ewma_distributes_over_all_endpoints(ups: list[Upstream], tmp_path: Path) -> None:
    with (
        gateway(config(ups, "peak_ewma"), tmp_path / "s.yaml") as g,
        httpx.Client(base_url=g.url, timeout=10) as client,
    ):
        counts = Counter(client.get("/echo").headers["x-upstream"] for _ in range(150))
    assert set(counts) == {"a", "b", "c"}
