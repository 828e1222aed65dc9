"""HTTP semantics through the real gateway: headers both ways, framing, keep-alive, error statuses."""

from __future__ import annotations

import contextlib
import json
import socket
from collections.abc import Iterator

import httpx
import pytest

from tests.support.processes import Gateway, Upstream, gateway, upstreams


def free_port() -> int:
    """A port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def up() -> Iterator[Upstream]:
    with upstreams("u1") as started:
        yield started[0]


@pytest.fixture(scope="module")
def gw(up: Upstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    cfg = {
        "trusted_proxies": ["10.0.0.0/8"],
        "services": {
            "main": {"routes": [{"path": "/"}], "endpoints": [up.address]},
            "empty": {"routes": [{"path": "/empty"}], "endpoints": []},
            "dead": {
                "routes": [{"path": "/dead"}],
                "endpoints": [f"127.0.0.1:{free_port()}"],
            },
            "slow": {
                "routes": [{"path": "/hang"}, {"path": "/delay"}],
                "endpoints": [up.address],
                "timeouts": {"connect_s": 1, "response_header_s": 0.3, "total_s": 5},
            },
            "tight": {
                "routes": [{"host": "tight.test", "path": "/"}],
                "endpoints": [up.address],
                "timeouts": {"connect_s": 1, "response_header_s": 5, "total_s": 0.3},
            },
            "short": {
                "routes": [{"path": "/stream"}],
                "endpoints": [up.address],
                "timeouts": {"connect_s": 1, "response_header_s": 5, "total_s": 30},
            },
        },
    }
    with gateway(cfg, tmp_path_factory.mktemp("http") / "sluice.yaml") as g:
        yield g


def raw(gw: Gateway, request: bytes, timeout_s: float = 10.0) -> bytes:
    """Send raw bytes, read until the gateway closes the connection."""
    with socket.create_connection((gw.host, gw.port), timeout=timeout_s) as s:
        s.sendall(request)
        chunks = []
        while True:
            try:
                data = s.recv(65536)
            except ConnectionResetError:
                break
            if not data:
                break
            chunks.append(data)
    return b"".join(chunks)


def split_response(data: bytes) -> tuple[int, list[tuple[str, str]], bytes]:
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    headers = [
        (n.strip().lower(), v.strip()) for n, _, v in (line.partition(":") for line in lines[1:])
    ]
    return status, headers, body


def names(headers: list[tuple[str, str]]) -> list[str]:
    return [n for n, _ in headers]


def echo_headers(r: httpx.Response) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for n, v in r.json()["headers"]:
        out.setdefault(n.lower(), []).append(v)
    return out


def test_request_hop_by_hop_fields_are_removed(gw: Gateway) -> None:
    request = (
        b"GET /echo HTTP/1.1\r\nHost: h.test\r\n"
        b"Connection: keep-alive, X-Secret-Hop\r\nConnection: close\r\n"
        b"X-Secret-Hop: 1\r\nKeep-Alive: timeout=5\r\nProxy-Connection: keep-alive\r\n"
        b"TE: trailers\r\nUpgrade: websocket\r\nProxy-Authorization: Basic abc\r\n"
        b"X-End-To-End: kept\r\n\r\n"
    )
    status, headers, body = split_response(raw(gw, request))
    assert status == 200
    seen = {n.lower() for n, _ in json.loads(body)["headers"]}
    for hop in (
        "connection",
        "x-secret-hop",
        "keep-alive",
        "proxy-connection",
        "te",
        "upgrade",
        "proxy-authorization",
    ):
        assert hop not in seen, hop
    assert "x-end-to-end" in seen
    assert ("connection", "close") in headers  # the client asked to close


def test_response_hop_by_hop_fields_are_removed(gw: Gateway) -> None:
    hs = [
        "Connection:X-Hop-Out",
        "X-Hop-Out:1",
        "Keep-Alive:timeout=9",
        "Proxy-Connection:x",
        "Upgrade:h2c",
        "X-Kept:yes",
    ]
    r = httpx.get(gw.url + "/headers", params=[("h", h) for h in hs], timeout=10)
    assert r.status_code == 200
    for hop in ("x-hop-out", "keep-alive", "proxy-connection", "upgrade"):
        assert hop not in r.headers, hop
    assert r.headers["x-kept"] == "yes"
    assert r.headers["via"] == "1.1 sluice"


def test_via_is_appended_both_ways(gw: Gateway) -> None:
    r = httpx.get(gw.url + "/echo", headers={"Via": "1.0 corp-proxy"}, timeout=10)
    assert echo_headers(r)["via"] == ["1.0 corp-proxy, 1.1 sluice"]
    r = httpx.get(gw.url + "/headers", params={"h": "Via:1.1 origin-cache"}, timeout=10)
    assert r.headers["via"] == "1.1 origin-cache, 1.1 sluice"


def test_forwarded_headers_from_an_untrusted_client_are_replaced(gw: Gateway) -> None:
    r = httpx.get(
        gw.url + "/echo",
        headers={
            "Host": "shop.test",
            "X-Forwarded-For": "6.6.6.6",
            "X-Forwarded-Proto": "https",
            "X-Forwarded-Host": "evil.test",
        },
        timeout=10,
    )
    h = echo_headers(r)
    assert h["x-forwarded-for"] == ["127.0.0.1"]
    assert h["x-forwarded-proto"] == ["http"]
    assert h["x-forwarded-host"] == ["shop.test"]
    assert h["host"] == ["shop.test"]


def test_forwarded_headers_from_a_trusted_proxy_are_extended(
    up: Upstream, tmp_path_factory: pytest.TempPathFactory
) -> None:
    cfg = {
        "trusted_proxies": ["127.0.0.0/8"],
        "services": {"main": {"routes": [{"path": "/"}], "endpoints": [up.address]}},
    }
    with gateway(cfg, tmp_path_factory.mktemp("trusted") / "sluice.yaml") as g:
        r = httpx.get(
            g.url + "/echo",
            headers={
                "Host": "inner.test",
                "X-Forwarded-For": "203.0.113.7, 10.1.1.1",
                "X-Forwarded-Proto": "https",
                "X-Forwarded-Host": "shop.example",
            },
            timeout=10,
        )
        h = echo_headers(r)
        assert h["x-forwarded-for"] == ["203.0.113.7, 10.1.1.1, 127.0.0.1"]
        assert h["x-forwarded-proto"] == ["https"]
        assert h["x-forwarded-host"] == ["shop.example"]


def test_no_duplicate_date_or_server(gw: Gateway) -> None:
    status, headers, _ = split_response(
        raw(
            gw,
            b"GET /headers?h=Server:origin&h=Date:Tue,%2001%20Jan%202030%2000:00:00%20GMT HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        )
    )
    assert status == 200
    assert names(headers).count("date") == 1
    assert dict(headers)["date"] == "Tue, 01 Jan 2030 00:00:00 GMT"
    assert names(headers).count("server") == 1
    # An upstream without Date gets one added (RFC 9110 §6.6.1), still exactly one.
    status, headers, _ = split_response(
        raw(gw, b"GET /echo HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    )
    assert names(headers).count("date") == 1


def test_request_bodies_content_length_and_chunked(gw: Gateway) -> None:
    r = httpx.post(gw.url + "/echo", content=b"hello world", timeout=10)
    body = r.json()
    assert body["body"] == "hello world"
    assert echo_headers(r)["content-length"] == ["11"]

    def gen() -> Iterator[bytes]:
        yield b"part1-"
        yield b"part2"

    r = httpx.post(gw.url + "/echo", content=gen(), timeout=10)
    body = r.json()
    assert body["body"] == "part1-part2"
    assert echo_headers(r)["transfer-encoding"] == ["chunked"]


def test_chunked_and_close_delimited_responses_reach_the_client_complete(gw: Gateway) -> None:
    r = httpx.get(gw.url + "/stream", params={"bytes": 300000, "chunked": 1}, timeout=10)
    assert len(r.content) == 300000
    assert r.headers["transfer-encoding"] == "chunked"
    r = httpx.get(gw.url + "/close-delimited", params={"bytes": 5000}, timeout=10)
    assert r.status_code == 200
    assert len(r.content) == 5000
    assert r.headers["transfer-encoding"] == "chunked"  # re-framed for the HTTP/1.1 client


def test_http10_client_gets_a_close_delimited_body(gw: Gateway) -> None:
    data = raw(gw, b"GET /stream?bytes=1000&chunked=1 HTTP/1.0\r\nHost: x\r\n\r\n")
    status, headers, body = split_response(data)
    assert status == 200
    assert "transfer-encoding" not in names(headers)
    assert len(body) == 1000


def test_head_request(gw: Gateway) -> None:
    r = httpx.head(gw.url + "/stream", params={"bytes": 1234}, timeout=10)
    assert r.status_code == 200
    assert r.headers["content-length"] == "1234"
    assert r.content == b""
    r = httpx.get(gw.url + "/echo", timeout=10)  # the service still works afterwards
    assert r.status_code == 200


def test_expect_100_continue(gw: Gateway) -> None:
    with socket.create_connection((gw.host, gw.port), timeout=10) as s:
        s.sendall(
            b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n"
        )
        interim = s.recv(65536)
        assert interim.startswith(b"HTTP/1.1 100 Continue\r\n\r\n")
        s.sendall(b"hello")
        data = interim[len(b"HTTP/1.1 100 Continue\r\n\r\n") :]
        while b"}" not in data:
            data += s.recv(65536)
    status, _, body = split_response(data)
    assert status == 200
    echoed = json.loads(body)
    assert echoed["body"] == "hello"
    assert "expect" not in {n.lower() for n, _ in echoed["headers"]}


def test_keep_alive_both_sides(gw: Gateway) -> None:
    with httpx.Client(base_url=gw.url, timeout=10) as client:
        ports = {client.get("/echo").json()["peer_port"] for _ in range(10)}
    assert len(ports) == 1  # sequential requests reuse one pooled upstream connection


def test_pipelined_requests_are_answered_in_order(gw: Gateway) -> None:
    data = raw(
        gw,
        b"GET /echo?n=1 HTTP/1.1\r\nHost: x\r\n\r\n"
        b"POST /echo?n=2 HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc"
        b"GET /echo?n=3 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    assert data.count(b"HTTP/1.1 200") == 3
    assert data.index(b"n=1") < data.index(b"n=2") < data.index(b"n=3")


def test_no_endpoints_is_503(gw: Gateway) -> None:
    r = httpx.get(gw.url + "/empty", timeout=10)
    assert r.status_code == 503
    assert r.headers["sluice-error"] == "no-endpoints"
    assert r.headers["server"] == "sluice"
    assert r.text.strip()


def test_connection_refused_is_502(gw: Gateway) -> None:
    r = httpx.get(gw.url + "/dead", timeout=10)
    assert r.status_code == 502
    assert r.headers["sluice-error"] == "upstream-connect-failed"


def test_reset_before_response_is_502(gw: Gateway) -> None:
    r = httpx.get(gw.url + "/reset", timeout=10)
    assert r.status_code == 502
    assert r.headers["sluice-error"] == "upstream-reset"


def test_response_header_timeout_is_504(gw: Gateway) -> None:
    r = httpx.get(gw.url + "/hang", timeout=10)
    assert r.status_code == 504
    assert r.headers["sluice-error"] == "upstream-header-timeout"
    r = httpx.get(gw.url + "/delay", params={"s": 0.01}, timeout=10)
    assert r.status_code == 200


def test_total_timeout_is_504(gw: Gateway) -> None:
    r = httpx.get(gw.url + "/delay", params={"s": 3}, headers={"Host": "tight.test"}, timeout=10)
    assert r.status_code == 504
    assert r.headers["sluice-error"] == "upstream-timeout"


def test_connect_timeout_is_504(up: Upstream, tmp_path_factory: pytest.TempPathFactory) -> None:
    # A listening socket whose accept queue is full never completes new handshakes.
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        port = listener.getsockname()[1]
        fillers = []
        try:
            for _ in range(8):
                f = socket.socket()
                f.setblocking(False)
                with contextlib.suppress(BlockingIOError):
                    f.connect(("127.0.0.1", port))
                fillers.append(f)
            cfg = {
                "services": {
                    "blackhole": {
                        "routes": [{"path": "/"}],
                        "endpoints": [f"127.0.0.1:{port}"],
                        "timeouts": {"connect_s": 0.2, "response_header_s": 5, "total_s": 10},
                    }
                }
            }
            with gateway(cfg, tmp_path_factory.mktemp("blackhole") / "sluice.yaml") as g:
                r = httpx.get(g.url + "/", timeout=10)
                assert r.status_code == 504
                assert r.headers["sluice-error"] == "upstream-connect-timeout"
        finally:
            for f in fillers:
                f.close()


def test_truncated_content_length_body_is_never_passed_off_as_complete(gw: Gateway) -> None:
    data = raw(gw, b"GET /reset-mid-body?bytes=100000 HTTP/1.1\r\nHost: x\r\n\r\n")
    status, headers, body = split_response(data)
    assert status == 200
    assert dict(headers)["content-length"] == "100000"
    assert len(body) < 100000  # the client sees the connection end early


def test_truncated_chunked_body_has_no_last_chunk(gw: Gateway) -> None:
    data = raw(gw, b"GET /truncate-chunked HTTP/1.1\r\nHost: x\r\n\r\n")
    status, headers, body = split_response(data)
    assert status == 200
    assert dict(headers)["transfer-encoding"] == "chunked"
    assert b"hello" in body
    assert not body.endswith(b"0\r\n\r\n")


def test_upstream_status_codes_pass_through(gw: Gateway) -> None:
    for code in (201, 204, 301, 404, 500, 503):
        r = httpx.get(gw.url + f"/status/{code}", timeout=10)
        assert r.status_code == code
        assert "sluice-error" not in r.headers


def test_malformed_request_is_400_and_closed(gw: Gateway) -> None:
    data = raw(gw, b"GET / HTTP/1.1\r\nHost x\r\n\r\n")
    status, headers, _ = split_response(data)
    assert status == 400
    assert dict(headers)["sluice-error"] == "bad-request"
    assert dict(headers)["connection"] == "close"


def test_many_clients_at_once_get_complete_ordered_answers(gw: Gateway) -> None:
    """Concurrent clients make the loop's rounds carry many writes, so the data plane holds
    them until the round ends (the outbox): pipelined answers stay in order and complete,
    errors among them too, and a closing request's answer arrives before the close."""
    import re
    import threading

    clients = 24
    barrier = threading.Barrier(clients)
    answers: dict[int, bytes] = {}

    def client(i: int) -> None:
        request = (
            f"GET /echo?c={i}&n=1 HTTP/1.1\r\nHost: x\r\n\r\n"
            f"POST /echo?c={i}&n=2 HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello"
            f"GET /empty?c={i}&n=3 HTTP/1.1\r\nHost: x\r\n\r\n"
            f"GET /echo?c={i}&n=4 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        ).encode()
        barrier.wait(timeout=10)
        answers[i] = raw(gw, request)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert sorted(answers) == list(range(clients))
    for i, data in answers.items():
        statuses = [int(code) for code in re.findall(rb"HTTP/1\.[01] (\d{3}) ", data)]
        assert statuses == [200, 200, 503, 200], (i, data[:300])
        assert data.index(f"c={i}&n=1".encode()) < data.index(f"c={i}&n=2".encode())
        assert data.index(b"Sluice-Error: no-endpoints") < data.index(f"c={i}&n=4".encode())
        last_body = data.rpartition(b"\r\n\r\n")[2]  # complete: the connection closed after it
        assert json.loads(last_body)["target"] == f"/echo?c={i}&n=4"
