"""Every TCP connection the data plane serves or opens has TCP_NODELAY (small responses and
request heads leave at once, not after Nagle's wait for an ACK).

The data plane does not set it itself: uvloop and asyncio set it on each TCP transport they
make, accepted or connected, plain or under TLS.  This checks that on a live data plane
(plain and TLS listeners, keep-alive upstream pool) on both event loops.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import uvloop

from gateway.dataplane.server import DataPlane
from gateway.dataplane.tls import CertificateSet, TlsListener, load_certificate
from gateway.dataplane.updates import EndpointInfo, EndpointUpdate, RouteRule, RoutesUpdate
from gateway.dataplane.upstream import EndpointConnections
from gateway.runtime import Runtime
from gateway.settings import TlsCertificateConfig, parse_settings
from tests.support.certs import make_ca
from tests.support.processes import Upstream, upstreams

LOOPS: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
    "uvloop": uvloop.new_event_loop,
    "asyncio": asyncio.new_event_loop,
}


@pytest.fixture(scope="module")
def up() -> Iterator[Upstream]:
    with upstreams("n1") as started:
        yield started[0]


def _nodelay(transport: asyncio.BaseTransport) -> int:
    sock = transport.get_extra_info("socket")
    assert sock is not None
    return int(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))


async def _get(
    host: str, port: int, context: ssl.SSLContext | None, clients: list[asyncio.StreamWriter]
) -> bytes:
    """One keep-alive request; the connection stays open (in ``clients``)."""
    name = "site.test" if context is not None else None
    reader, writer = await asyncio.open_connection(host, port, ssl=context, server_hostname=name)
    clients.append(writer)
    writer.write(b"GET /echo HTTP/1.1\r\nHost: site.test\r\n\r\n")
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    await reader.readexactly(length)
    return head


async def _check(up: Upstream, tmp_path: Path) -> None:
    ca = make_ca(tmp_path)
    issued = ca.issue(tmp_path, "site", ["site.test"])
    rt = Runtime(parse_settings({"services": {"svc": {}}}))
    rt.apply_routes(RoutesUpdate((RouteRule("svc", None, "/", "Prefix"),)))
    rt.apply_endpoints(EndpointUpdate("svc", (EndpointInfo(up.address),)))
    dp = DataPlane(rt)
    host, port = await dp.start("127.0.0.1", 0)
    cert = load_certificate(
        TlsCertificateConfig(cert_file=str(issued.cert_file), key_file=str(issued.key_file))
    )
    listener = TlsListener(CertificateSet([cert]), "1.2", ["http/1.1"])
    tls_host, tls_port = await dp.start_tls("127.0.0.1", 0, listener)
    client_tls = ssl.create_default_context(cafile=str(ca.ca_file))
    clients: list[asyncio.StreamWriter] = []
    try:
        assert (await _get(host, port, None, clients)).startswith(b"HTTP/1.1 200")
        head = await _get(tls_host, tls_port, client_tls, clients)
        assert head.startswith(b"HTTP/1.1 200")
        assert len(dp.connections) == 2
        assert sorted(getattr(c, "tls", None) for c in dp.connections) == [False, True]
        assert [_nodelay(c.transport) for c in dp.connections] == [1, 1]
        pool = rt.services["svc"].endpoints.endpoints[0].pool
        assert isinstance(pool, EndpointConnections) and pool.idle
        assert {_nodelay(c.transport) for c in pool.idle} == {1}
    finally:
        for writer in clients:
            writer.close()
            with contextlib.suppress(OSError, ssl.SSLError):
                await writer.wait_closed()
        await dp.stop(0)


@pytest.mark.parametrize("loop_name", sorted(LOOPS))
def test_client_and_upstream_connections_have_nodelay(
    loop_name: str, up: Upstream, tmp_path: Path
) -> None:
    with asyncio.Runner(loop_factory=LOOPS[loop_name]) as runner:
        runner.run(_check(up, tmp_path))
