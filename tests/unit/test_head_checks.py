"""check_head: what llhttp lets through but HTTP/1.1 forbids (pure, bytes in)."""

from __future__ import annotations

import pytest

from gateway.dataplane.errors import Cause
from gateway.dataplane.limits import HeadLimits, RequestRejected, check_head
from gateway.settings import GatewayLimits

H = [(b"Host", b"a.test")]


@pytest.mark.parametrize(
    ("method", "target", "version", "headers", "length"),
    [
        (b"GET", b"/", "1.1", H, None),
        (b"POST", b"/", "1.1", [*H, (b"Content-Length", b"12")], 12),
        (b"POST", b"/", "1.1", [*H, (b"Transfer-Encoding", b"chunked")], None),
        (b"POST", b"/", "1.1", [*H, (b"transfer-encoding", b" Chunked ")], None),
        (b"GET", b"/", "1.0", [], None),  # HTTP/1.0 may omit Host
        (b"GET", b"/", "1.1", [(b"host", b"a.test:8080")], None),
        (b"GET", b"/", "1.1", [(b"Host", b"[::1]:80")], None),
        (b"GET", b"/", "1.1", [(b"Host", b"10.0.0.1")], None),
        (b"GET", b"http://a.test/p?q", "1.1", H, None),
        (b"GET", b"HTTPS://a.test:443", "1.1", H, None),
    ],
)
def test_accepted(
    method: bytes,
    target: bytes,
    version: str,
    headers: list[tuple[bytes, bytes]],
    length: int | None,
) -> None:
    assert check_head(method, target, version, headers) == length


@pytest.mark.parametrize(
    ("method", "target", "version", "headers", "cause"),
    [
        (b"GET", b"/", "2.0", H, Cause.VERSION_NOT_SUPPORTED),
        (b"GET", b"/", "0.9", H, Cause.BAD_REQUEST),
        (b"GET", b"/", "1.1", [], Cause.BAD_REQUEST),
        (b"GET", b"/", "1.1", [*H, *H], Cause.BAD_REQUEST),
        (b"GET", b"/", "1.0", [*H, (b"HOST", b"b.test")], Cause.BAD_REQUEST),
        (b"GET", b"/", "1.1", [(b"Host", b"")], Cause.BAD_REQUEST),
        (b"GET", b"/", "1.1", [(b"Host", b"a b")], Cause.BAD_REQUEST),
        (b"GET", b"/", "1.1", [(b"Host", b"u@a.test")], Cause.BAD_REQUEST),
        (b"GET", b"/", "1.1", [(b"Host", b"a.test:http")], Cause.BAD_REQUEST),
        (b"GET", b"/a#b", "1.1", H, Cause.BAD_REQUEST),
        (b"GET", b"*", "1.1", H, Cause.BAD_REQUEST),
        (b"CONNECT", b"a.test:443", "1.1", H, Cause.BAD_REQUEST),
        (b"GET", b"ftp://a.test/", "1.1", H, Cause.BAD_REQUEST),
        (b"GET", b"http://u@a.test/", "1.1", H, Cause.BAD_REQUEST),
        (b"GET", b"http:///p", "1.1", H, Cause.BAD_REQUEST),
        (b"POST", b"/", "1.0", [*H, (b"Transfer-Encoding", b"chunked")], Cause.BAD_REQUEST),
        (b"POST", b"/", "1.1", [*H, (b"Transfer-Encoding", b"identity")], Cause.BAD_REQUEST),
        (b"POST", b"/", "1.1", [*H, (b"Transfer-Encoding", b"chunked, gzip")], Cause.BAD_REQUEST),
        (
            b"POST",
            b"/",
            "1.1",
            [*H, (b"Transfer-Encoding", b"chunked"), (b"Transfer-Encoding", b"chunked")],
            Cause.BAD_REQUEST,
        ),
        (
            b"POST",
            b"/",
            "1.1",
            [*H, (b"Transfer-Encoding", b"gzip, chunked")],
            Cause.UNSUPPORTED_CODING,
        ),
    ],
)
def test_refused(
    method: bytes, target: bytes, version: str, headers: list[tuple[bytes, bytes]], cause: Cause
) -> None:
    with pytest.raises(RequestRejected) as info:
        check_head(method, target, version, headers)
    assert info.value.cause is cause


def test_limits_from_settings() -> None:
    limits = HeadLimits.from_settings(GatewayLimits(max_headers=7, header_timeout_s=2))
    assert limits.max_headers == 7 and limits.header_timeout_s == 2
    assert limits.max_header_bytes == 32768 and limits.max_uri_bytes == 8192
