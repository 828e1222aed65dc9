"""Header rewriting: hop-by-hop removal, Via, X-Forwarded-*, Date, framing decisions."""

from __future__ import annotations

import httptools
import pytest

from gateway.dataplane.errors import Cause, HttpDate, error_response
from gateway.dataplane.headers import (
    HeadCache,
    connection_tokens,
    request_fields,
    request_head,
    response_fields,
    rewrite_request,
    rewrite_response,
)
from gateway.dataplane.limits import RequestRejected

H = list[tuple[bytes, bytes]]


def parse(head: bytes) -> tuple[bytes, list[tuple[str, str]]]:
    lines = head.decode("latin-1").split("\r\n")
    assert lines[-2:] == ["", ""], "a head ends with an empty line"
    fields = [tuple(line.split(": ", 1)) for line in lines[1:-2]]
    return lines[0].encode(), [(n, v) for n, v in fields]


def names(fields: list[tuple[str, str]]) -> list[str]:
    return [n.lower() for n, _ in fields]


def request(
    headers: H, trusted: bool = False, peer: bytes = b"192.0.2.9"
) -> tuple[bytes, list[tuple[str, str]]]:
    head = rewrite_request(b"GET", b"/p?q=1", headers, peer, trusted=trusted)
    return parse(head.head)


HOP = [
    (b"Connection", b"keep-alive, X-Named"),
    (b"X-Named", b"secret"),
    (b"Keep-Alive", b"timeout=5"),
    (b"Proxy-Connection", b"keep-alive"),
    (b"TE", b"trailers"),
    (b"Transfer-Encoding", b"chunked"),
    (b"Upgrade", b"websocket"),
    (b"Proxy-Authorization", b"Basic x"),
    (b"Trailer", b"X-Checksum"),
]


def test_request_drops_every_hop_by_hop_field_and_those_connection_names() -> None:
    line, fields = request([(b"Host", b"h.test"), *HOP, (b"Accept", b"*/*")])
    assert line == b"GET /p?q=1 HTTP/1.1"
    got = names(fields)
    for hop in (
        "connection",
        "x-named",
        "keep-alive",
        "proxy-connection",
        "te",
        "upgrade",
        "proxy-authorization",
        "trailer",
    ):
        assert hop not in got, hop
    assert got[:2] == ["host", "accept"]
    # The client's chunked framing is re-declared by the gateway, once.
    assert got.count("transfer-encoding") == 1


def test_a_field_named_by_connection_before_it_appears_is_dropped_too() -> None:
    _, fields = request([(b"X-Early", b"1"), (b"Connection", b"x-early"), (b"X-Other", b"2")])
    assert "x-early" not in names(fields)
    assert "x-other" in names(fields)


def test_request_reports_body_and_framing() -> None:
    f = rewrite_request(b"POST", b"/", [(b"Content-Length", b"5")], b"1.2.3.4", trusted=False)
    assert (f.has_body, f.chunked, f.expect_continue) == (True, False, False)
    f = rewrite_request(b"POST", b"/", [(b"Content-Length", b"0")], b"1.2.3.4", trusted=False)
    assert f.has_body is False
    f = rewrite_request(
        b"POST", b"/", [(b"Transfer-Encoding", b"gzip, chunked")], b"1.2.3.4", trusted=False
    )
    assert (f.has_body, f.chunked) == (True, True)
    f = rewrite_request(
        b"POST",
        b"/",
        [(b"Expect", b"100-Continue"), (b"Content-Length", b"3")],
        b"1.2.3.4",
        trusted=False,
    )
    assert f.expect_continue is True
    assert b"expect" not in f.head.lower()


def test_via_is_appended() -> None:
    _, fields = request([(b"Via", b"1.0 a"), (b"via", b"1.1 b")])
    assert [v for n, v in fields if n == "Via"] == ["1.0 a, 1.1 b, 1.1 sluice"]
    _, fields = request([])
    assert ("Via", "1.1 sluice") in fields


def test_untrusted_client_forwarded_headers_are_replaced() -> None:
    spoof = [
        (b"Host", b"shop.test"),
        (b"X-Forwarded-For", b"6.6.6.6"),
        (b"X-Forwarded-Proto", b"https"),
        (b"X-Forwarded-Host", b"evil.test"),
    ]
    _, fields = request(spoof, trusted=False)
    d = dict(fields)
    assert d["X-Forwarded-For"] == "192.0.2.9"
    assert d["X-Forwarded-Proto"] == "http"
    assert d["X-Forwarded-Host"] == "shop.test"
    assert names(fields).count("x-forwarded-for") == 1


def test_trusted_proxy_forwarded_headers_are_kept_and_extended() -> None:
    chain = [
        (b"Host", b"inner"),
        (b"X-Forwarded-For", b"203.0.113.1"),
        (b"X-Forwarded-For", b"10.0.0.2"),
        (b"X-Forwarded-Proto", b"https"),
        (b"X-Forwarded-Host", b"shop.example"),
    ]
    _, fields = request(chain, trusted=True, peer=b"10.0.0.3")
    d = dict(fields)
    assert d["X-Forwarded-For"] == "203.0.113.1, 10.0.0.2, 10.0.0.3"
    assert d["X-Forwarded-Proto"] == "https"
    assert d["X-Forwarded-Host"] == "shop.example"


def test_no_host_means_no_forwarded_host() -> None:
    _, fields = request([])
    assert "x-forwarded-host" not in names(fields)


def response(headers: H, *, http11: bool = True, head_only: bool = False, keep_alive: bool = True):  # type: ignore[no-untyped-def]
    r = rewrite_response(
        200, b"OK", headers, b"DATE", http11=http11, head_only=head_only, keep_alive=keep_alive
    )
    line, fields = parse(r.head)
    return r, line, fields


def test_response_drops_hop_by_hop_and_adds_via() -> None:
    _, line, fields = response([(b"Content-Length", b"3"), (b"Server", b"origin"), *HOP])
    assert line == b"HTTP/1.1 200 OK"
    got = names(fields)
    for hop in (
        "connection",
        "x-named",
        "keep-alive",
        "proxy-connection",
        "te",
        "upgrade",
        "trailer",
    ):
        assert hop not in got, hop
    assert ("Via", "1.1 sluice") in fields
    assert got.count("server") == 1


def test_response_date_only_when_missing() -> None:
    _, _, fields = response(
        [(b"Date", b"Mon, 01 Jan 2024 00:00:00 GMT"), (b"Content-Length", b"0")]
    )
    assert [v for n, v in fields if n.lower() == "date"] == ["Mon, 01 Jan 2024 00:00:00 GMT"]
    _, _, fields = response([(b"Content-Length", b"0")])
    assert ("Date", "DATE") in fields


@pytest.mark.parametrize(
    ("upstream", "http11", "head_only", "chunked", "close_delimited", "keep_alive", "connection"),
    [
        ([(b"Content-Length", b"5")], True, False, False, False, True, None),
        ([(b"Transfer-Encoding", b"chunked")], True, False, True, False, True, None),
        ([], True, False, True, True, True, None),  # close-delimited upstream, re-framed
        ([(b"Content-Length", b"5")], False, False, False, False, True, "keep-alive"),
        ([(b"Transfer-Encoding", b"chunked")], False, False, False, False, False, "close"),
        ([], False, False, False, True, False, "close"),
        ([(b"Content-Length", b"5")], True, True, False, False, True, None),  # HEAD
        ([], True, True, False, False, True, None),  # 204/304
    ],
)
def test_response_framing(
    upstream: H,
    http11: bool,
    head_only: bool,
    chunked: bool,
    close_delimited: bool,
    keep_alive: bool,
    connection: str | None,
) -> None:
    r, _, fields = response(upstream, http11=http11, head_only=head_only)
    assert (r.chunked, r.close_delimited, r.keep_alive) == (chunked, close_delimited, keep_alive)
    d = {n.lower(): v for n, v in fields}
    assert d.get("connection") == connection
    assert ("transfer-encoding" in d) == chunked
    if (b"Content-Length", b"5") in upstream:
        assert d["content-length"] == "5"


def test_response_connection_close_when_not_keep_alive() -> None:
    r, _, fields = response([(b"Content-Length", b"0")], keep_alive=False)
    assert ("Connection", "close") in fields
    assert r.keep_alive is False


def test_connection_tokens() -> None:
    assert connection_tokens([(b"Connection", b"Keep-Alive, X-A"), (b"connection", b"x-b,,")]) == {
        b"keep-alive",
        b"x-a",
        b"x-b",
    }


def test_error_responses_name_their_cause() -> None:
    data = error_response(Cause.NO_ENDPOINTS, b"DATE", close=False)
    head, _, body = data.partition(b"\r\n\r\n")
    line, fields = parse(head + b"\r\n\r\n")
    assert line == b"HTTP/1.1 503 Service Unavailable"
    d = dict(fields)
    assert d["Sluice-Error"] == "no-endpoints"
    assert d["Server"] == "sluice"
    assert int(d["Content-Length"]) == len(body)
    assert "Connection" not in d
    closing = error_response(Cause.RESET, b"DATE", close=True, head_only=True)
    assert b"Connection: close\r\n" in closing
    assert closing.endswith(b"\r\n\r\n")
    statuses = {c.code: c.status for c in Cause}
    assert statuses["no-route"] == 404
    assert statuses["upstream-connect-failed"] == 502
    assert statuses["upstream-header-timeout"] == 504
    assert len(HttpDate().get()) == 29


def test_head_cache_returns_what_the_pure_functions_return() -> None:
    cache = HeadCache(max_entries=4)
    headers = [
        (b"Host", b"h"),
        (b"X-Forwarded-For", b"1.1.1.1"),
        (b"Connection", b"x-a"),
        (b"X-A", b"1"),
        (b"traceparent", b"00-" + b"1" * 32 + b"-" + b"2" * 16 + b"-01"),
    ]
    peer = b"10.0.0.1"
    for trusted in (False, True, False):
        for drop in (frozenset(), frozenset({b"traceparent"})):
            got = cache.request(b"GET", b"/x", "1.1", list(headers), peer, trusted, drop)
            want = rewrite_request(b"GET", b"/x", headers, peer, trusted=trusted, drop=drop)
            assert got == want
    key_count = len(cache._requests)
    cache.request(b"POST", b"/y", "1.1", list(headers), b"10.9.9.9", True)  # same fields: a hit
    assert len(cache._requests) == key_count
    assert request_head(
        b"GET", b"/", request_fields(headers, trusted=True), peer
    ) == rewrite_request(b"GET", b"/", headers, peer, trusted=True)
    resp = [(b"Content-Length", b"2"), (b"Date", b"D")]
    raw = b"HTTP/1.1 200 Fine\r\nContent-Length: 2\r\nDate: D\r\n"
    got_resp = cache.response(200, raw, b"NOW", True, False, True)
    assert got_resp == rewrite_response(
        200, b"OK", resp, b"NOW", http11=True, head_only=False, keep_alive=True
    )
    assert cache.response(200, raw, b"NOW", False, False, True).head != got_resp.head
    for i in range(10):  # bounded: it starts over instead of growing
        cache.request(b"GET", b"/", "1.0", [(b"X-N", str(i).encode())], peer, False)
    assert len(cache._requests) <= 4


def test_head_cache_checks_each_header_set_for_its_version() -> None:
    cache = HeadCache()
    no_host = [(b"Accept", b"*/*")]
    assert cache.request(b"GET", b"/", "1.0", no_host, b"1.2.3.4", False).host == b""
    for _ in range(2):  # refused every time: a refused set is not remembered
        with pytest.raises(RequestRejected) as info:
            cache.request(b"GET", b"/", "1.1", no_host, b"1.2.3.4", False)
        assert info.value.cause is Cause.BAD_REQUEST
    with_length = [(b"Host", b"h"), (b"Content-Length", b"12")]
    head = cache.request(b"POST", b"/", "1.1", with_length, b"1.2.3.4", False)
    assert head.declared_length == 12
    assert head.has_body


@pytest.mark.parametrize(
    "raw",
    [
        b"HTTP/1.1 200 OK\r\nServer: x\r\nContent-Length: 2\r\n\r\nok",
        b"HTTP/1.1 204 No Content\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nX-A:   v  \t \r\nX-B:\r\nX-C:\tc\r\nContent-Length: 0\r\n\r\n",
        b"HTTP/1.0 200\r\nSet-Cookie: a=b: c\r\nSet-Cookie: d\r\nConnection: close\r\n\r\n",
    ],
)
def test_response_fields_are_what_llhttp_reports(raw: bytes) -> None:
    seen: list[tuple[bytes, bytes]] = []

    class Fields:
        def on_header(self, name: bytes, value: bytes) -> None:
            seen.append((name, value))

    httptools.HttpResponseParser(Fields()).feed_data(raw)
    assert response_fields(raw[: raw.index(b"\r\n\r\n") + 2]) == seen


@pytest.mark.parametrize(
    "raw",
    [
        b"GET / HTTP/1.1\r\nHost: h\r\n\r\n",
        b"GET / HTTP/1.1\r\n\r\n",
        b"GET  /x?y=1  HTTP/1.1\r\nHost: h\r\nX-A:   v  \t \r\nX-B:\r\nX-C:\tc\r\n\r\n",
        b"POST /p HTTP/1.0\r\nCookie: a=b: c\r\nX-Name: caf\xe9\r\nContent-Length: 0\r\n\r\n",
        b"\r\n\nGET / HTTP/1.1\r\nHost: h\r\nAccept: */*\r\nAccept: text/html\r\n\r\n",
    ],
)
def test_request_fields_raw_are_what_llhttp_reports(raw: bytes) -> None:
    """The fields cut from a raw request head equal llhttp's ``on_header`` calls, and what
    they count against ``max_header_bytes`` is what the per-field count adds up."""
    seen: list[tuple[bytes, bytes]] = []

    class Fields:
        def on_header(self, name: bytes, value: bytes) -> None:
            seen.append((name, value))

    httptools.HttpRequestParser(Fields()).feed_data(raw)
    head = raw.lstrip(b"\r\n")
    fields = head[head.index(b"\r\n") + 2 : head.index(b"\r\n\r\n") + 2]
    checked = HeadCache().raw_fields(fields, False)
    assert checked.headers == seen
    assert checked.field_bytes == sum(len(n) + len(v) + 4 for n, v in seen)
    assert not checked.te


def test_head_cache_raw_fields_match_the_per_field_rewrite() -> None:
    cache = HeadCache(max_entries=4)
    raw = b"Host: h\r\nConnection: keep-alive, X-Hop\r\nX-Hop: 1\r\nX-Forwarded-For: 9.9.9.9\r\n"
    headers = [
        (b"Host", b"h"),
        (b"Connection", b"keep-alive, X-Hop"),
        (b"X-Hop", b"1"),
        (b"X-Forwarded-For", b"9.9.9.9"),
    ]
    for trusted in (False, True):
        checked = cache.raw_fields(raw, trusted)
        assert checked.fields == request_fields(headers, trusted=trusted)
        assert checked.headers == headers
        assert checked.keep_alive_token
        assert cache.raw_fields(raw, trusted) is checked  # remembered
    assert cache.raw_fields(b"Host: h\r\nTransfer-Encoding: chunked\r\n", False).te
    for i in range(10):  # bounded: it starts over instead of growing
        cache.raw_fields(b"X-N: %d\r\n" % i, False)
    assert len(cache._raw_requests) <= 4


# -- issue 20, item 5: spoofing and stripping through header names -------------------------


def test_underscore_names_are_dropped_by_default_and_kept_on_request() -> None:
    spoof = [(b"Host", b"h"), (b"X_Forwarded_For", b"6.6.6.6"), (b"X_Custom", b"1")]
    _, fields = request(spoof)
    assert "x_forwarded_for" not in names(fields) and "x_custom" not in names(fields)
    kept = rewrite_request(b"GET", b"/", spoof, b"192.0.2.9", trusted=False, underscores=True)
    assert "x_custom" in names(parse(kept.head)[1])
    assert HeadCache(underscores=True).fields(spoof, False).fields.middle.count(b"X_Custom") == 1
    assert HeadCache().fields(spoof, False).fields.middle.count(b"X_Custom") == 0


@pytest.mark.parametrize("name", [b"Forwarded", b"X-Real-IP", b"x-real-ip"])
def test_forwarded_and_x_real_ip_only_from_trusted_peers(name: bytes) -> None:
    headers = [(b"Host", b"h"), (name, b"for=6.6.6.6")]
    assert name.lower().decode() not in names(request(headers, trusted=False)[1])
    assert name.lower().decode() in names(request(headers, trusted=True)[1])


@pytest.mark.parametrize(
    "name", [b"Authorization", b"Cookie", b"Host", b"Content-Type", b"X-Real-IP", b"Forwarded"]
)
def test_connection_cannot_strip_end_to_end_fields(name: bytes) -> None:
    headers = [(b"Host", b"h"), (b"Connection", name), (b"X-Named", b"1")]
    if name.lower() != b"host":
        headers.append((name, b"v"))
    _, fields = request([*headers, (b"Connection", b"x-named")], trusted=True)
    assert name.lower().decode() in names(fields)
    assert "x-named" not in names(fields)
