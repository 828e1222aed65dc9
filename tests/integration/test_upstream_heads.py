"""Upstream response heads through the real gateway: 1xx before the final response, heads
split across reads, oversized heads (the data plane takes response heads raw, see
gateway/dataplane/upstream.py)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.support.processes import Gateway, Upstream, gateway, upstreams


@pytest.fixture(scope="module")
def up() -> Iterator[Upstream]:
    with upstreams("u1") as started:
        yield started[0]


@pytest.fixture(scope="module")
def gw(up: Upstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    cfg = {"services": {"main": {"routes": [{"path": "/"}], "endpoints": [up.address]}}}
    with gateway(cfg, tmp_path_factory.mktemp("heads") / "sluice.yaml") as g:
        yield g


@pytest.mark.parametrize("together", ["0", "1"])
def test_a_103_is_not_forwarded_and_the_final_response_is(gw: Gateway, together: str) -> None:
    with httpx.Client(base_url=gw.url, timeout=10) as client:
        for _ in range(3):  # the same upstream and client connections serve again after it
            r = client.get("/early-hints", params={"together": together})
            assert r.status_code == 200
            assert r.text == "after hints\n"
            assert r.headers["x-final"] == "yes"
            assert "link" not in r.headers
            assert r.headers["via"] == "1.1 sluice"
            assert r.http_version == "HTTP/1.1"
            echo = client.get("/echo")
            assert echo.status_code == 200
            assert echo.json()["method"] == "GET"


@pytest.mark.parametrize("piece", [1, 2, 7, 64])
def test_a_head_split_across_reads_is_forwarded_whole(gw: Gateway, piece: int) -> None:
    with httpx.Client(base_url=gw.url, timeout=10) as client:
        for _ in range(2):
            r = client.get("/drip-head", params={"piece": piece})
            assert r.status_code == 200
            assert r.text == "dripped\n"
            assert r.headers["x-dripped"] == "a" * 40
            assert r.headers["x-upstream"] == "u1"
            assert r.headers["content-length"] == "8"
            assert r.headers["via"] == "1.1 sluice"


def test_a_response_head_over_64k_is_a_bad_response(gw: Gateway) -> None:
    big = httpx.get(gw.url + "/huge-head", params={"bytes": 70_000}, timeout=10)
    assert big.status_code == 502
    assert big.headers["sluice-error"] == "upstream-bad-response"
    fits = httpx.get(gw.url + "/huge-head", params={"bytes": 60_000}, timeout=10)
    assert fits.status_code == 200
    assert len(fits.headers["x-huge"]) == 60_000
    assert fits.text == "ok"
