"""Small writes held until the event loop has run this round's I/O callbacks, then sent together.

uvloop writes to the socket at once inside ``transport.write``.  Under load one round of the
event loop handles many reads (client requests, upstream responses) with tens of
microseconds of Python between them, so the writes they cause reach the peers one by one,
and each loopback write that finds its reader asleep wakes it: on another CPU that is an
inter-processor interrupt, which in a VM is an exit to the hypervisor (a few microseconds of
the *sender's* system time).  Measured under ``wrk -c50`` through the gateway: 1.46 wake-up
IPIs per proxied request to the load's core, against 0.2 for nginx; with the writes of a
round sent back to back at its end, the readers are still awake for most of them.

:class:`Outbox` holds the data plane's small writes (request heads, response heads with
their bodies, error responses) and sends them, in order, from one ``call_soon`` callback: it
runs once the loop has dispatched the I/O events of the current round, before it polls
again.  Holding is only worth it when a round has several writes: a lone write would wait
for the rest of its round's work (at c=1 that is the bookkeeping after the write, which
used to overlap with the peer's work: +30 µs of p50 latency measured).  So the outbox
adapts: while rounds have at most one write, writes go out at once (counted by a
``call_soon`` per round); after a round with ``HOLD_MIN_WRITES`` or more, the next rounds'
writes are held, until a round holds fewer again.  Writes larger than
``OUTBOX_MAX_BYTES`` (body streaming) are written at once after what is held, so memory and
flow control (``pause_writing`` of the transport) stay as they were.

A connection that produces its bytes in many small steps per round (an HTTP/2 connection:
each stream's frames) can ask to be called once at the end of the round instead
(:meth:`Outbox.later`): its producer runs before the held writes go out, so the round's
frames of all its streams leave in one write.

Whoever writes to, closes or aborts a transport the outbox may hold writes for must
:meth:`Outbox.flush` first when :attr:`Outbox.pending` is set, so the bytes stay in order
and a close never overtakes them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

log = logging.getLogger(__name__)

OUTBOX_MAX_BYTES = 64 * 1024
"""Bytes held at most; a write that would pass it sends everything held and itself at once."""
HOLD_MIN_WRITES = 2
"""A round with at least this many writes makes the next rounds hold theirs."""


class Outbox:
    """The data plane's writes of one event-loop round, sent together at its end when the
    loop is busy (several writes per round), at once when it is not."""

    __slots__ = ("held_bytes", "holding", "loop", "pending", "producers", "round_writes")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.pending: list[tuple[asyncio.Transport, bytes | list[bytes]]] | None = None
        """Held writes in order (``bytes`` for write, a list for writelines); None when empty."""
        self.held_bytes = 0
        self.holding = False
        """Writes are held (the last round had several); else they go out at once."""
        self.round_writes = 0
        """Writes sent at once in the current round (while not holding)."""
        self.producers: list[Callable[[], None]] = []
        """Called at the end of the round, before the held writes go out (see ``later``)."""

    def write(self, transport: asyncio.Transport, data: bytes) -> None:
        """``transport.write(data)``, at the end of this loop round when holding."""
        pending = self.pending
        if pending is None and not self.holding:
            transport.write(data)
            n = self.round_writes = self.round_writes + 1
            if n == 1:
                self.loop.call_soon(self._round_end)
            return
        size = self.held_bytes + len(data)
        if size > OUTBOX_MAX_BYTES:
            if pending is not None:
                self.flush()
            transport.write(data)
            return
        if pending is None:
            pending = self.pending = []
            self.loop.call_soon(self._round_flush)
        pending.append((transport, data))
        self.held_bytes = size

    def writelines(self, transport: asyncio.Transport, pieces: list[bytes], nbytes: int) -> None:
        """``transport.writelines(pieces)`` at the end of this loop round when holding
        (``nbytes``: about their total size; ``pieces`` must not change afterwards)."""
        pending = self.pending
        if pending is None and not self.holding:
            transport.writelines(pieces)
            n = self.round_writes = self.round_writes + 1
            if n == 1:
                self.loop.call_soon(self._round_end)
            return
        size = self.held_bytes + nbytes
        if size > OUTBOX_MAX_BYTES:
            if pending is not None:
                self.flush()
            transport.writelines(pieces)
            return
        if pending is None:
            pending = self.pending = []
            self.loop.call_soon(self._round_flush)
        pending.append((transport, pieces))
        self.held_bytes = size

    def later(self, producer: Callable[[], None]) -> None:
        """Call ``producer`` (which writes through this outbox) once the round's I/O
        callbacks ran, before the held writes go out; at once when writes are not held.
        The caller asks once per round (it keeps its own flag)."""
        if self.pending is None and not self.holding:
            producer()
            return
        self.producers.append(producer)
        if self.pending is None:
            self.pending = []
            self.loop.call_soon(self._round_flush)

    def _round_end(self) -> None:
        """A round that wrote at once ended: hold the next rounds' writes if it wrote several."""
        if self.round_writes >= HOLD_MIN_WRITES:
            self.holding = True
        self.round_writes = 0

    def _round_flush(self) -> None:
        """A round that held writes ended: send them; write at once again if it held few."""
        pending = self.pending
        if pending is not None and len(pending) + len(self.producers) < HOLD_MIN_WRITES:
            self.holding = False
        self.flush()

    def flush(self) -> None:
        """Send everything held, in order (to a transport closed meanwhile: dropped), after
        the producers waiting for the round's end wrote theirs."""
        producers = self.producers
        if producers:
            self.producers = []
            for producer in producers:
                producer()
        pending = self.pending
        if pending is None:
            return
        self.pending = None
        self.held_bytes = 0
        for transport, data in pending:
            try:
                if isinstance(data, list):
                    transport.writelines(data)
                else:
                    transport.write(data)
            except RuntimeError as e:
                # Closed by the peer since (uvloop refuses writes to a closed handle): what
                # was held is dropped, as a direct write would have been; connection_lost
                # is on its way.
                log.debug("held write to %r dropped: %s", transport, e)
