"""Outbox: writes held until the loop round ends (when rounds have several), sent in order;
big writes not held; a quiet loop writes at once."""

from __future__ import annotations

import asyncio
from typing import Any

from gateway.dataplane.outbox import HOLD_MIN_WRITES, OUTBOX_MAX_BYTES, Outbox


class Recording:
    """A transport that records writes into a log shared by all of them."""

    def __init__(self, name: str, log: list[tuple[str, bytes]], closed: bool = False) -> None:
        self.name = name
        self.log = log
        self.closed = closed

    def write(self, data: bytes) -> None:
        if self.closed:
            raise RuntimeError("unable to perform operation: the handler is closed")
        self.log.append((self.name, data))

    def writelines(self, pieces: list[bytes]) -> None:
        if self.closed:
            raise RuntimeError("unable to perform operation: the handler is closed")
        self.log.append((self.name, b"".join(pieces)))


def transports(*names: str) -> tuple[list[tuple[str, bytes]], list[Any]]:
    log: list[tuple[str, bytes]] = []
    return log, [Recording(n, log) for n in names]


def holding_outbox() -> Outbox:
    outbox = Outbox(asyncio.get_running_loop())
    outbox.holding = True  # as after a busy round
    return outbox


async def test_writes_wait_for_the_end_of_the_round_and_keep_their_order() -> None:
    outbox = holding_outbox()
    log, (a, b) = transports("a", "b")
    outbox.write(a, b"1")
    outbox.writelines(b, [b"2", b"3"], 2)
    outbox.write(a, b"4")
    assert log == []
    assert outbox.pending is not None
    await asyncio.sleep(0)
    assert log == [("a", b"1"), ("b", b"23"), ("a", b"4")]
    assert outbox.pending is None
    assert outbox.holding  # that round held three writes
    for n in range(HOLD_MIN_WRITES):
        outbox.write(b, b"%d" % n)  # a new round is scheduled again
    assert outbox.pending is not None
    await asyncio.sleep(0)
    assert log[-HOLD_MIN_WRITES:] == [("b", b"%d" % n) for n in range(HOLD_MIN_WRITES)]


async def test_flush_sends_at_once_and_the_scheduled_round_finds_nothing() -> None:
    outbox = holding_outbox()
    log, (a,) = transports("a")
    outbox.write(a, b"x")
    outbox.flush()
    assert log == [("a", b"x")]
    await asyncio.sleep(0)
    assert log == [("a", b"x")]


async def test_a_big_write_sends_what_is_held_first_then_itself() -> None:
    outbox = holding_outbox()
    log, (a, b) = transports("a", "b")
    big = b"b" * (OUTBOX_MAX_BYTES + 1)
    outbox.write(a, b"small")
    outbox.write(b, big)
    assert log == [("a", b"small"), ("b", big)]
    assert outbox.pending is None
    outbox.writelines(a, [b"x"], 1)
    outbox.writelines(a, [big], len(big))
    assert log[2:] == [("a", b"x"), ("a", big)]


async def test_held_bytes_are_bounded() -> None:
    outbox = holding_outbox()
    log, (a,) = transports("a")
    piece = b"p" * (OUTBOX_MAX_BYTES // 4)
    for _ in range(4):
        outbox.write(a, piece)
    assert log == []  # exactly at the bound: still held
    outbox.write(a, b"!")
    assert len(log) == 5
    assert outbox.held_bytes == 0


async def test_a_transport_closed_meanwhile_does_not_stop_the_others() -> None:
    outbox = holding_outbox()
    log: list[tuple[str, bytes]] = []
    gone = Recording("gone", log)
    live = Recording("live", log)
    outbox.write(gone, b"lost")
    outbox.write(live, b"kept")
    gone.closed = True
    outbox.flush()
    assert log == [("live", b"kept")]


async def test_a_quiet_loop_writes_at_once_and_a_busy_round_turns_holding_on() -> None:
    outbox = Outbox(asyncio.get_running_loop())
    log, (a, b) = transports("a", "b")
    outbox.write(a, b"lone")
    assert log == [("a", b"lone")]  # at once: a lone request does not wait for its round
    await asyncio.sleep(0)
    assert not outbox.holding
    for n in range(HOLD_MIN_WRITES):
        outbox.writelines(b, [b"%d" % n], 1)
    assert len(log) == 1 + HOLD_MIN_WRITES  # still at once in this round
    await asyncio.sleep(0)
    assert outbox.holding  # the next rounds hold
    outbox.write(a, b"held")
    assert log[-1] != ("a", b"held")
    await asyncio.sleep(0)
    assert log[-1] == ("a", b"held")
    assert not outbox.holding  # that round held only one write: at once again
    outbox.write(a, b"again")
    assert log[-1] == ("a", b"again")


async def test_a_producer_writes_once_at_the_end_of_the_round_before_the_held_writes_go() -> None:
    outbox = holding_outbox()
    log, (a, b) = transports("a", "b")
    queued: list[bytes] = []

    def produce() -> None:  # an HTTP/2 connection writing what its streams queued
        outbox.write(b, b"".join(queued))
        queued.clear()

    outbox.write(a, b"1")
    queued.append(b"frame1")
    outbox.later(produce)
    queued.append(b"frame2")  # (the producer is asked once per round)
    assert log == []
    await asyncio.sleep(0)
    assert log == [("a", b"1"), ("b", b"frame1frame2")]
    queued.append(b"frame3")
    outbox.later(produce)  # alone in its round: still waits for the round's end
    assert log[-1] == ("b", b"frame1frame2")
    outbox.flush()  # an explicit flush (before a close) runs the producers first
    assert log[-1] == ("b", b"frame3")


async def test_a_producer_runs_at_once_when_writes_are_not_held() -> None:
    outbox = Outbox(asyncio.get_running_loop())
    log, (a,) = transports("a")
    outbox.later(lambda: outbox.write(a, b"now"))
    assert log == [("a", b"now")]
