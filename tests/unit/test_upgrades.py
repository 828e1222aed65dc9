"""Protocol upgrades: the client's 101 head, which protocols a service takes, and how an
upgraded connection is counted in the service's stats (pure, no sockets)."""

from __future__ import annotations

import pytest

from gateway.dataplane.service import Service
from gateway.dataplane.stats import ServiceStats
from gateway.dataplane.tunnel import switching_head
from gateway.settings import ServiceConfig


def test_switching_head_keeps_the_handshake_and_drops_hop_by_hop_fields() -> None:
    raw = (
        b"HTTP/1.1 101 Switching Protocols\r\n"
        b"Upgrade: websocket\r\n"
        b"Connection: Upgrade, X-Secret\r\n"
        b"X-Secret: 1\r\n"
        b"Keep-Alive: timeout=5\r\n"
        b"Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n"
        b"\r\n"
    )
    head = switching_head(raw, b"ignored")
    assert head.startswith(b"HTTP/1.1 101 Switching Protocols\r\n")
    assert head.endswith(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    assert b"Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=" in lines
    assert b"Connection: Upgrade" in lines
    assert b"Upgrade: websocket" in lines
    assert b"Via: 1.1 sluice" in lines
    assert not any(line.lower().startswith((b"x-secret", b"keep-alive")) for line in lines)


def test_switching_head_without_upgrade_uses_the_requested_protocol() -> None:
    head = switching_head(b"HTTP/1.1 101 Switching Protocols\r\n\r\n", b"websocket")
    assert b"\r\nUpgrade: websocket\r\n" in head


@pytest.mark.parametrize(
    ("protocols", "value", "allowed"),
    [
        (None, b"websocket", True),
        (None, b"WebSocket", True),
        (None, b"h2c", False),
        (None, b"websocket, h2c", False),
        (None, b" , ", False),
        (["websocket", "foo"], b"foo", True),
        ([], b"websocket", False),
    ],
)
def test_allowed_upgrades(protocols: list[str] | None, value: bytes, allowed: bool) -> None:
    config = (
        ServiceConfig() if protocols is None else ServiceConfig(upgrades={"protocols": protocols})
    )  # type: ignore[arg-type]
    service = Service.from_config("chat", config)
    assert service.allows_upgrade(value) is allowed


def test_upgrade_reload_changes_the_allowed_protocols() -> None:
    service = Service.from_config("chat", ServiceConfig())
    service.configure(ServiceConfig(upgrades={"protocols": ["foo"]}))  # type: ignore[arg-type]
    assert service.allows_upgrade(b"foo")
    assert not service.allows_upgrade(b"websocket")


def test_an_upgraded_connection_stays_in_flight_until_it_closes() -> None:
    stats = ServiceStats("chat")
    stats.arrive(10.0)
    stats.upgrade_opened(0.002, 10.002)
    assert (stats.in_flight, stats.upgraded, stats.upgrades_total) == (1, 1, 1)
    assert stats.completions_total == 0
    assert sum(stats.latency_counts) == 1  # the handshake's latency, not the socket's life
    stats.upgrade_closed(70.0)
    assert (stats.in_flight, stats.upgraded, stats.upgrades_total) == (0, 0, 1)
    # in the gateway (the concurrency the scaler reads) for the socket's whole life
    assert stats.snapshot(80.0).concurrency_seconds_total == pytest.approx(60.0)
    assert stats.codes == {101: 1}
    assert stats.arrivals_total - stats.completions_total == stats.in_flight
