"""Malformed responses from an HTTP/2 upstream (RFC 9113 §8.1.1): each is a stream error —
the client gets ``502 upstream-bad-response`` (or, once the head is out, its stream cut), the
upstream stream is reset, and the upstream connection goes on carrying other streams."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.support.h2_upstream import MALFORMED
from tests.support.h2client import Client
from tests.support.processes import Gateway, H2Upstream, gateway

HEADER_KINDS = sorted(kind for kind, (_block, trailers) in MALFORMED.items() if trailers is None)
TRAILER_KINDS = sorted(kind for kind, (_block, trailers) in MALFORMED.items() if trailers)


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    up = H2Upstream("bad")
    cfg = {
        "listen": {"host": "127.0.0.1", "port": 0, "h2c": True},
        "services": {
            "bad": {"routes": [{"path": "/"}], "endpoints": [up.address], "protocol": "h2c"}
        },
    }
    try:
        with gateway(cfg, tmp_path_factory.mktemp("h2bad") / "sluice.yaml") as g:
            yield g
    finally:
        up.stop()


def _connection(client: httpx.Client, gw: Gateway) -> bytes:
    answer = client.get(gw.url + "/fine")
    assert answer.status_code == 200
    return answer.headers["x-connection"].encode()


@pytest.mark.parametrize("kind", HEADER_KINDS)
def test_a_malformed_head_is_a_502_and_a_stream_error(gw: Gateway, kind: str) -> None:
    with httpx.Client(timeout=10) as client:
        before = _connection(client, gw)
        answer = client.get(gw.url + f"/malformed?kind={kind}")
        assert answer.status_code == 502
        assert answer.headers["sluice-error"] == "upstream-bad-response"
        assert "x-injected" not in answer.headers
        assert _connection(client, gw) == before  # the upstream connection carried on


@pytest.mark.parametrize("kind", HEADER_KINDS)
def test_an_http2_client_gets_the_same_502(gw: Gateway, kind: str) -> None:
    c = Client(gw)
    try:
        sid = c.request(f"/malformed?kind={kind}")
        c.pump({sid})
        headers = c.responses[sid]["headers"]
    finally:
        c.close()
    assert headers[b":status"] == b"502"
    assert headers[b"sluice-error"] == b"upstream-bad-response"


@pytest.mark.parametrize("kind", TRAILER_KINDS)
def test_malformed_trailers_cut_the_clients_stream(gw: Gateway, kind: str) -> None:
    with httpx.Client(timeout=10) as client:
        before = _connection(client, gw)
    c = Client(gw)
    try:
        sid = c.request(f"/malformed?kind={kind}", extra=(("te", "trailers"),))
        c.pump({sid})
        response = c.responses[sid]
    finally:
        c.close()
    assert response["headers"][b":status"] == b"200"
    assert response["trailers"] is None
    assert response["reset"] is not None  # the truncation is visible
    with httpx.Client(timeout=10) as client:
        assert _connection(client, gw) == before
