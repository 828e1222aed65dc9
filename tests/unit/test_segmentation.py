"""The answer to a request stream does not depend on how TCP cuts it (issue 20, item 1).

The whole hostile corpus of ``tests/integration/test_malformed.py`` is fed to a real
:class:`ClientConnection` in memory (a real ``DataPlane`` with an empty route table, so an
accepted request is answered 404 by the gateway itself) in one read, byte by byte, and cut
where hypothesis draws; the bytes written back, the heads that would go upstream and whether
the connection closed must be the same every time.
"""

from __future__ import annotations

import asyncio
import itertools
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.dataplane.headers import HeadCache, RequestFields
from gateway.dataplane.routing import RouteTable
from gateway.dataplane.server import ClientConnection, DataPlane
from gateway.dataplane.service import Service
from tests.integration.test_malformed import CASES

CORPUS = {case.id: case.data for case in CASES}
BYTEWISE_MAX = 4096
"""Longer inputs are fed in 7-byte reads instead of 1 (the 32 KiB heads stay fast)."""


class _Routing:
    routes = RouteTable([])
    services: Mapping[str, Service] = {}


class _RecordingHeads(HeadCache):
    """The real head cache, keeping every head it builds for the upstream."""

    def __init__(self) -> None:
        super().__init__()
        self.built: list[bytes] = []

    def head(self, method: bytes, target: bytes, fields: RequestFields, peer_ip: bytes) -> Any:
        built = super().head(method, target, fields, peer_ip)
        self.built.append(built.head)
        return built


class _Transport(asyncio.Transport):
    """Collects what the connection writes; records how it ended."""

    def __init__(self) -> None:
        super().__init__()
        self.out = bytearray()
        self.state = "open"

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 40000) if name == "peername" else default

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.out += data

    def writelines(self, list_of_data: Any) -> None:
        for data in list_of_data:
            self.out += data

    def close(self) -> None:
        self.state = "closed"

    def abort(self) -> None:
        self.state = "aborted"

    def is_closing(self) -> bool:
        return self.state != "open"

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        self.state = "eof"


@pytest.fixture(scope="module")
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def answer(
    loop: asyncio.AbstractEventLoop, reads: Sequence[bytes]
) -> tuple[bytes, list[bytes], bool]:
    """What the gateway writes back, the heads it would send upstream, whether it closed."""
    dp = DataPlane(_Routing(), loop=loop)
    heads = dp.heads = _RecordingHeads()
    conn = ClientConnection(dp)
    transport = _Transport()
    conn.connection_made(transport)
    for data in reads:
        conn.data_received(data)
        loop.run_until_complete(asyncio.sleep(0))  # the outbox's end-of-round writes
    out = re.sub(rb"\r\nDate: [^\r]*", b"\r\nDate: -", bytes(transport.out))
    return out, heads.built, conn.closed


def pieces(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


def cut_at(data: bytes, cuts: Sequence[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    bounds = [0, *points, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds) if b > a]


@pytest.mark.parametrize("case_id", sorted(CORPUS))
def test_one_read_and_byte_by_byte_agree(case_id: str, loop: asyncio.AbstractEventLoop) -> None:
    data = CORPUS[case_id]
    whole = answer(loop, [data])
    step = 1 if len(data) <= BYTEWISE_MAX else 7
    assert answer(loop, pieces(data, step)) == whole
    for cut in (1, len(data) // 2, len(data) - 1):
        assert answer(loop, [data[:cut], data[cut:]]) == whole, f"cut at {cut}"


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(case_id=st.sampled_from(sorted(CORPUS)), cuts=st.lists(st.integers(min_value=0), max_size=6))
def test_any_cut_agrees_with_one_read(
    case_id: str, cuts: list[int], loop: asyncio.AbstractEventLoop
) -> None:
    data = CORPUS[case_id]
    assert answer(loop, cut_at(data, cuts)) == answer(loop, [data])


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    before=st.integers(min_value=8185, max_value=8200),
    cuts=st.lists(st.integers(min_value=0), max_size=4),
)
def test_first_problem_in_byte_order_decides(
    before: int, cuts: list[int], loop: asyncio.AbstractEventLoop
) -> None:
    """A control byte after ``before`` bytes of target: 400 while the target is within
    ``max_uri_bytes`` (8192) up to it, 414 once the limit was crossed before it (nginx's
    order), however the bytes are cut."""
    data = b"GET /" + b"u" * (before - 1) + b"\x01u HTTP/1.1\r\nHost: a\r\n\r\n"
    status = answer(loop, cut_at(data, cuts))[0].split(b" ", 2)[1]
    assert status == (b"414" if before > 8192 else b"400")
