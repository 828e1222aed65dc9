"""An upgraded connection (WebSocket): bytes spliced both ways between client and upstream.

After the upstream's ``101 Switching Protocols`` the exchange's client and upstream
connections stop parsing HTTP and hand every read to their :class:`Tunnel`, which writes
it to the other side.  Flow control is the transports': a full write buffer on one side
pauses reading on the other (so at most one write buffer plus one read per direction is
held), a half-close (EOF) is passed on, and the tunnel ends when both sides are closed,
either side is lost, it idles past the service's ``upgrades.idle_timeout_s`` or the
gateway stops.  The exchange stays in flight (one admission slot, one in-flight request
in the service's signals) for the tunnel's whole life.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gateway.dataplane.headers import HOP_BY_HOP, connection_tokens, response_fields

if TYPE_CHECKING:
    from gateway.dataplane.forward import Exchange
    from gateway.dataplane.server import ClientConnection
    from gateway.dataplane.upstream import UpstreamConnection

PAUSE_TUNNEL = 4
"""Client-reading pause bit: the upstream's write buffer is full."""


def switching_head(raw_head: bytes, upgrade: bytes) -> bytes:
    """The client's ``101`` head from the upstream's: hop-by-hop fields dropped (and those
    its ``Connection`` names), ``Connection: Upgrade`` and the ``Upgrade`` kept."""
    fields = response_fields(raw_head)
    named = connection_tokens(fields)
    out = [b"HTTP/1.1 101 Switching Protocols\r\n"]
    for name, value in fields:
        low = name.lower()
        if low == b"upgrade":
            upgrade = value
        elif low not in HOP_BY_HOP and low not in named:
            out.append(name + b": " + value + b"\r\n")
    out.append(b"Connection: Upgrade\r\nUpgrade: " + upgrade + b"\r\nVia: 1.1 sluice\r\n\r\n")
    return b"".join(out)


class Tunnel:
    """The two connections of one upgraded exchange, and what has passed through them."""

    __slots__ = (
        "bytes_in",
        "bytes_out",
        "client",
        "client_eof",
        "ended",
        "exchange",
        "handshake_s",
        "last_active",
        "upstream",
        "upstream_eof",
    )

    def __init__(
        self,
        exchange: Exchange,
        client: ClientConnection,
        upstream: UpstreamConnection,
        handshake_s: float,
        now: float,
    ) -> None:
        self.exchange = exchange
        self.client = client
        self.upstream = upstream
        self.handshake_s = handshake_s
        """From the request's arrival to the upstream's 101."""
        self.last_active = now
        self.bytes_in = 0
        """Bytes from the client to the upstream since the switch."""
        self.bytes_out = 0
        """Bytes from the upstream to the client since the switch."""
        self.client_eof = False
        self.upstream_eof = False
        self.ended = False

    # -- data ------------------------------------------------------------------------------

    def from_client(self, data: bytes) -> None:
        up = self.upstream
        if self.ended or up.closed or up.transport is None:
            return
        self.bytes_in += len(data)
        self.last_active = self.client.dp.loop.time()
        up.transport.write(data)

    def from_upstream(self, data: bytes) -> None:
        client = self.client
        if self.ended or client.closed:
            return
        self.bytes_out += len(data)
        self.last_active = client.dp.loop.time()
        client.dp.outbox.write(client.transport, data)

    # -- flow control (the client's pause_writing pauses the upstream's reading itself) ---

    def upstream_write_paused(self) -> None:
        self.client.pause(PAUSE_TUNNEL)

    def upstream_write_resumed(self) -> None:
        self.client.unpause(PAUSE_TUNNEL)

    # -- endings ---------------------------------------------------------------------------

    def client_eof_received(self) -> bool:
        """The client half-closed: pass it on; the tunnel ends when both sides have."""
        self.client_eof = True
        up = self.upstream
        if self.upstream_eof or up.transport is None or not up.transport.can_write_eof():
            self.end()
            return False
        up.transport.write_eof()
        return True

    def upstream_eof_received(self) -> bool:
        self.upstream_eof = True
        client = self.client
        if self.client_eof or client.closed or not client.transport.can_write_eof():
            self.end()
            return False
        outbox = client.dp.outbox
        if outbox.pending is not None:
            outbox.flush()
        client.transport.write_eof()
        return True

    def lost(self) -> None:
        """Either connection was lost (closed or reset): close the other."""
        self.end()

    def end(self, abort: bool = False) -> None:
        """Close both sides (what is buffered for them is sent first unless ``abort``)."""
        if self.ended:
            return
        self.ended = True
        client = self.client
        client.dp.tunnels.discard(self)
        up = self.upstream
        up.tunnel = None
        if not up.closed:
            if abort:
                up.abort()
            else:
                up.close()
        if abort and not client.closed:
            client.abort()
        self.exchange.tunnel_ended()

    def idle(self, before: float) -> bool:
        return self.last_active < before

    def __repr__(self) -> str:
        state = "ended" if self.ended else "open"
        return f"Tunnel({self.upstream.pool.address}, {state}, in={self.bytes_in}, out={self.bytes_out})"
