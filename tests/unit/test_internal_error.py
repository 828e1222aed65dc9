"""A failure of the gateway's own code while it handles a request is answered 500
``internal-error`` with its traceback logged -- not 400, which would blame the client -- and
the gateway goes on serving the next connection."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator, Mapping

import pytest

from gateway.dataplane.routing import RouteTable
from gateway.dataplane.server import ClientConnection, DataPlane
from gateway.dataplane.service import Service
from tests.unit.test_segmentation import _Transport


class _BrokenRoutes(RouteTable):
    def match(self, host: str, path: str) -> str | None:
        if path == "/boom":
            raise RuntimeError("a bug in routing")
        return super().match(host, path)


class _Routing:
    routes = _BrokenRoutes([])
    services: Mapping[str, Service] = {}


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def send(dp: DataPlane, loop: asyncio.AbstractEventLoop, data: bytes) -> tuple[bytes, str]:
    conn = ClientConnection(dp)
    transport = _Transport()
    conn.connection_made(transport)
    conn.data_received(data)
    loop.run_until_complete(asyncio.sleep(0))
    return bytes(transport.out), transport.state


def test_a_gateway_failure_is_a_500_with_its_traceback_logged(
    loop: asyncio.AbstractEventLoop, caplog: pytest.LogCaptureFixture
) -> None:
    dp = DataPlane(_Routing(), loop=loop)
    with caplog.at_level(logging.ERROR, logger="gateway.dataplane.server"):
        out, state = send(dp, loop, b"GET /boom HTTP/1.1\r\nHost: shop\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 500 Internal Server Error\r\n")
    assert b"\r\nSluice-Error: internal-error\r\n" in out
    assert state != "open"
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert errors and errors[0].exc_info is not None
    assert "a bug in routing" in str(errors[0].exc_info[1])
    # The next request (another connection) is served as usual: no route here, 404.
    out, _ = send(dp, loop, b"GET /other HTTP/1.1\r\nHost: shop\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 404 ")


def test_a_malformed_request_is_still_a_400(loop: asyncio.AbstractEventLoop) -> None:
    out, _ = send(DataPlane(_Routing(), loop=loop), loop, b"GET /x HTTP/1.1\r\nHo st: a\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 400 Bad Request\r\n")
    assert b"\r\nSluice-Error: bad-request\r\n" in out
