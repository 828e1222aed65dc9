"""The pure parts of the HTTP/2 front: grpc-timeout parsing and the h2 <-> HTTP/1.1 field maps."""

from __future__ import annotations

import pytest

from gateway.dataplane.errors import Cause
from gateway.dataplane.h2server import (
    GRPC_STATUS,
    MalformedRequest,
    grpc_timeout_s,
    h2_response_fields,
    http1_fields,
)
from gateway.dataplane.limits import RequestRejected


@pytest.mark.parametrize(
    ("value", "seconds"),
    [(b"1S", 1.0), (b"250m", 0.25), (b"2M", 120.0), (b"1H", 3600.0), (b"500u", 0.0005)],
)
def test_grpc_timeout_units(value: bytes, seconds: float) -> None:
    assert grpc_timeout_s(value) == pytest.approx(seconds)


@pytest.mark.parametrize("value", [b"", b"S", b"1x", b"-1S", b"123456789S", b"1.5S"])
def test_grpc_timeout_malformed_is_none(value: bytes) -> None:
    assert grpc_timeout_s(value) is None


def test_request_fields_become_http1() -> None:
    method, path, fields, grpc = http1_fields(
        [
            (b":method", b"POST"),
            (b":scheme", b"http"),
            (b":authority", b"api.test"),
            (b":path", b"/svc/Call"),
            (b"content-type", b"application/grpc+proto"),
            (b"te", b"trailers"),
            (b"cookie", b"a=1"),
            (b"cookie", b"b=2"),
        ],
        end_stream=False,
    )
    assert (method, path, grpc) == (b"POST", b"/svc/Call", True)
    assert fields[0] == (b"host", b"api.test")
    assert (b"cookie", b"a=1; b=2") in fields
    assert (b"te", b"trailers") in fields
    assert (b"transfer-encoding", b"chunked") in fields  # a body without a length


def test_request_with_length_or_without_body_is_not_chunked() -> None:
    base = [(b":method", b"GET"), (b":scheme", b"http"), (b":path", b"/"), (b":authority", b"h")]
    assert (b"transfer-encoding", b"chunked") not in http1_fields(base, end_stream=True)[2]
    sized = [*base, (b"content-length", b"3")]
    assert (b"transfer-encoding", b"chunked") not in http1_fields(sized, end_stream=False)[2]


@pytest.mark.parametrize(
    "headers",
    [
        [(b":method", b"GET"), (b":authority", b"h")],  # no :path
        [(b":method", b"CONNECT"), (b":authority", b"h:443")],
    ],
)
def test_requests_http1_cannot_carry_are_rejected(headers: list[tuple[bytes, bytes]]) -> None:
    with pytest.raises(RequestRejected):
        http1_fields(headers, end_stream=True)


def test_response_fields_lose_connection_specific_ones() -> None:
    raw = (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nConnection: keep-alive, X-Hop\r\n"
        b"X-Hop: 1\r\nTransfer-Encoding: chunked\r\nKeep-Alive: timeout=5\r\nX-Kept: yes\r\n"
    )
    assert h2_response_fields(raw) == [(b"content-type", b"text/plain"), (b"x-kept", b"yes")]
    again = h2_response_fields(raw)  # from the cache: equal, and the caller's own list
    again.append((b"x-mutated", b"1"))
    assert h2_response_fields(raw) == [(b"content-type", b"text/plain"), (b"x-kept", b"yes")]


def test_grpc_statuses_of_gateway_errors() -> None:
    assert GRPC_STATUS[Cause.NO_ROUTE] == 12
    assert GRPC_STATUS[Cause.RATE_LIMITED] == 8
    assert GRPC_STATUS[Cause.TOTAL_TIMEOUT] == 4
    assert Cause.NO_ENDPOINTS not in GRPC_STATUS  # -> 14 UNAVAILABLE
    assert Cause.QUEUE_FULL not in GRPC_STATUS


_OK = [(b":method", b"GET"), (b":scheme", b"https"), (b":path", b"/x"), (b":authority", b"h")]


@pytest.mark.parametrize(
    "headers",
    [
        [*_OK, (b":bogus", b"1")],  # unknown pseudo-header
        [*_OK, (b":path", b"/y")],  # repeated
        [(b":method", b"GET"), (b"x", b"1"), (b":scheme", b"http"), (b":path", b"/")],  # late
        [(b":method", b"GET"), (b":path", b"/")],  # no :scheme
        [(b":method", b"GET"), (b":scheme", b"http")],  # no :path
        [*_OK[:2], (b":path", b"x")],  # not origin-form
        [*_OK, (b"Upper", b"1")],
        [*_OK, (b"bad name", b"1")],
        [*_OK, (b"", b"1")],
        [*_OK, (b"x", b"a\r\nInjected: yes")],
        [*_OK, (b"x", b"a\x00")],
        [*_OK, (b"x", b" padded")],
        [*_OK, (b"connection", b"close")],
        [*_OK, (b"transfer-encoding", b"chunked")],
        [*_OK, (b"upgrade", b"websocket")],
        [*_OK, (b"te", b"gzip")],
        [*_OK, (b"host", b"other")],  # host differs from :authority
    ],
)
def test_malformed_requests_are_refused(headers: list[tuple[bytes, bytes]]) -> None:
    with pytest.raises(MalformedRequest):
        http1_fields(headers, end_stream=True)


def test_a_valid_header_set_is_answered_the_same_from_the_cache() -> None:
    headers = [*_OK, (b"x-a", b"1"), (b"host", b"h")]
    first = http1_fields(headers, end_stream=True)
    again = http1_fields(list(headers), end_stream=True)
    assert first == again
    again[2].append((b"x-mutated", b"1"))  # a caller's list is its own
    assert http1_fields(headers, end_stream=True) == first
    assert http1_fields([(b":method", b"OPTIONS"), (b":scheme", b"http"), (b":path", b"*")], True)
