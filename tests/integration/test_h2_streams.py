"""HTTP/2 streams through the real gateway, against real upstreams: request trailers end to
end (h2 <-> h2), retries of streams an HTTP/2 upstream never processed (REFUSED_STREAM) or
could not be connected to, a queue-full stream answered on its own while the connection's
other streams carry on, and graceful GOAWAY on drain and on a reload that turns h2c off."""

from __future__ import annotations

import json
import signal
import socket
import ssl
import urllib.request
from collections.abc import Iterator
from typing import Any

import h2.errors
import httpx
import pytest
import yaml
from hyperframe.frame import GoAwayFrame

from tests.support.certs import make_ca
from tests.support.h2client import Client
from tests.support.processes import Gateway, H2Upstream, Upstream, gateway, upstreams


@pytest.fixture(scope="module")
def refusing_address() -> Iterator[str]:
    """An address whose connects are refused: bound but not listening, and held for the
    module so no other process can take the port meanwhile."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield f"127.0.0.1:{s.getsockname()[1]}"


@pytest.fixture(scope="module")
def plain() -> Iterator[Upstream]:
    with upstreams("u1") as started:
        yield started[0]


@pytest.fixture(scope="module")
def ok() -> Iterator[H2Upstream]:
    up = H2Upstream("ok")
    try:
        yield up
    finally:
        up.stop()


@pytest.fixture(scope="module")
def refusing() -> Iterator[H2Upstream]:
    up = H2Upstream("refusing", refuse_first=1_000_000)
    try:
        yield up
    finally:
        up.stop()


@pytest.fixture(scope="module")
def gw(
    plain: Upstream,
    ok: H2Upstream,
    refusing: H2Upstream,
    refusing_address: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Gateway]:
    cfg = {
        "listen": {"host": "127.0.0.1", "port": 0, "h2c": True},
        "services": {
            "echo": {"routes": [{"path": "/echo"}], "endpoints": [ok.address], "protocol": "h2c"},
            "refused": {
                "routes": [{"path": "/refused"}],
                "endpoints": [refusing.address, ok.address],
                "protocol": "h2c",
                "balancer": "round_robin",
            },
            "unreachable": {
                "routes": [{"path": "/unreachable"}],
                "endpoints": [refusing_address, ok.address],
                "protocol": "h2c",
                "balancer": "round_robin",
            },
            "only-refusing": {
                "routes": [{"path": "/only-refusing"}],
                "endpoints": [refusing.address],
                "protocol": "h2c",
            },
            "one": {
                "routes": [{"path": "/delay"}],
                "endpoints": [plain.address],
                "limits": {"concurrency_per_replica": 1, "queue": {"max": 0}},
            },
        },
    }
    with gateway(cfg, tmp_path_factory.mktemp("h2streams") / "sluice.yaml") as g:
        yield g


def test_request_trailers_reach_an_h2_upstream_and_response_trailers_come_back(
    gw: Gateway,
) -> None:
    c = Client(gw)
    try:
        sid = c.request(
            "/echo",
            method="POST",
            body=b"x" * 100_000,
            trailers=(("x-checksum", "abc123"), ("x-count", "1")),
        )
        c.pump({sid})
        r = c.responses[sid]
        assert r["headers"][b":status"] == b"200"
        seen = json.loads(r["body"])
        assert seen["body_bytes"] == 100_000
        assert seen["trailers"] == [["x-checksum", "abc123"], ["x-count", "1"]]
        assert r["trailers"] == {b"x-body-bytes": b"100000", b"x-trailer-count": b"2"}
    finally:
        c.close()


def test_a_get_ends_its_upstream_stream(gw: Gateway) -> None:
    """A request without a body (END_STREAM on its HEADERS, or an HTTP/1.1 GET) reaches an
    h2c upstream as a complete stream."""
    c = Client(gw)
    try:
        sid = c.request("/echo?get=1")
        c.pump({sid})
        assert json.loads(c.responses[sid]["body"])["method"] == "GET"
    finally:
        c.close()
    with urllib.request.urlopen(gw.url + "/echo?get=2", timeout=10) as r:
        assert json.loads(r.read())["path"] == "/echo?get=2"


def test_trailers_without_a_body(gw: Gateway) -> None:
    c = Client(gw)
    try:
        sid = c.request("/echo", method="POST", trailers=(("x-only", "trailer"),))
        c.pump({sid})
        seen = json.loads(c.responses[sid]["body"])
        assert seen["body_bytes"] == 0
        assert seen["trailers"] == [["x-only", "trailer"]]
    finally:
        c.close()


def test_refused_streams_are_retried_on_another_endpoint(gw: Gateway, refusing: H2Upstream) -> None:
    """REFUSED_STREAM means the upstream did nothing (RFC 9113 §8.7): even a POST with a
    body is sent again, to the other endpoint."""
    refused_before, retries_before = refused_by(refusing, gw), retries_of(gw, "refused")
    c = Client(gw)
    try:
        sids = [c.request("/refused", method="POST", body=b"b" * 5000) for _ in range(6)]
        c.pump(set(sids))
        for sid in sids:
            r = c.responses[sid]
            assert r["headers"][b":status"] == b"200", r
            assert r["headers"][b"x-upstream"] == b"ok"
            assert json.loads(r["body"])["body_bytes"] == 5000
    finally:
        c.close()
    # Round robin sends some of them to the refusing endpoint (how many depends on when the
    # retries take their turn); every stream it refused was sent again, once.
    refused = refused_by(refusing, gw) - refused_before
    assert refused >= 1
    assert retries_of(gw, "refused") - retries_before == refused


def refused_by(up: H2Upstream, gw: Gateway) -> int:
    """How many streams ``up`` has refused (its ``/_count``, asked directly)."""
    host, port = up.address.rsplit(":", 1)
    c = Client(gw, sock=socket.create_connection((host, int(port)), timeout=10))
    try:
        sid = c.request("/_count")
        c.pump({sid})
        return int(json.loads(c.responses[sid]["body"])["refused"])
    finally:
        c.close()


def retries_of(gw: Gateway, service: str) -> float:
    with httpx.Client(timeout=10) as admin:
        text = admin.get(gw.admin_url + "/metrics").text
    prefix = f'sluice_retries_total{{service="{service}"}} '
    lines = [line for line in text.splitlines() if line.startswith(prefix)]
    return float(lines[0].removeprefix(prefix)) if lines else 0.0


def test_a_stream_refused_by_every_endpoint_is_answered_502(gw: Gateway) -> None:
    c = Client(gw)
    try:
        sid = c.request("/only-refusing")
        c.pump({sid})
        r = c.responses[sid]
        assert r["headers"][b":status"] == b"502"
        assert r["headers"][b"sluice-error"] == b"upstream-reset"
    finally:
        c.close()


def test_connect_failures_are_retried_on_another_endpoint(gw: Gateway) -> None:
    c = Client(gw)
    try:
        sids = [c.request("/unreachable", method="POST", body=b"p" * 1000) for _ in range(4)]
        c.pump(set(sids))
        for sid in sids:
            r = c.responses[sid]
            assert r["headers"][b":status"] == b"200", r
            assert r["headers"][b"x-upstream"] == b"ok"
    finally:
        c.close()
    assert retries_of(gw, "unreachable") >= 1


def test_a_queue_full_stream_is_answered_alone(gw: Gateway) -> None:
    """One slot, no queue: the second stream gets 503 queue-full while the first (on the
    same connection) finishes, and the connection takes new streams afterwards."""
    c = Client(gw)
    try:
        slow = c.request("/delay?s=1")
        refused = c.request("/delay?s=0")
        c.pump({refused})
        r = c.responses[refused]
        assert r["headers"][b":status"] == b"503"
        assert r["headers"][b"sluice-error"] == b"queue-full"
        assert c.responses[slow]["reset"] is None
        c.pump({slow})
        assert c.responses[slow]["headers"][b":status"] == b"200"
        again = c.request("/delay?s=0")
        c.pump({again})
        assert c.responses[again]["headers"][b":status"] == b"200"
        assert c.terminated is None
    finally:
        c.close()


def _config(gw: Gateway) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(gw.config_path.read_text())
    return loaded


def test_a_clients_goaway_lets_its_open_streams_finish(gw: Gateway) -> None:
    """A client's graceful GOAWAY (NO_ERROR) ends the connection once its open streams are
    answered (RFC 9113 §6.8: its last stream id is about streams the gateway would open;
    the client's own streams still get their answers), with the gateway's GOAWAY."""
    c = Client(gw)
    try:
        first = c.request("/echo")
        c.pump({first})
        sid = c.request("/delay?s=1")  # answered after the GOAWAY arrived
        frame = GoAwayFrame(0)
        frame.last_stream_id = 0
        frame.error_code = h2.errors.ErrorCodes.NO_ERROR
        c.sock.sendall(frame.serialize())  # (by hand: h2 would close the client's side too)
        c.pump({sid})
        answer = c.responses[sid]
        assert answer["headers"] is not None
        assert answer["headers"][b":status"] == b"200"
        assert answer["ended"]
        while c._read():  # then the gateway ends the connection
            pass
        assert c.terminated is not None
        assert c.terminated.error_code == h2.errors.ErrorCodes.NO_ERROR
    finally:
        c.close()


def test_drain_sends_goaway_and_finishes_open_streams(
    plain: Upstream, tmp_path_factory: pytest.TempPathFactory
) -> None:
    cfg = {
        "listen": {"host": "127.0.0.1", "port": 0, "h2c": True},
        "shutdown": {"drain_s": 10},
        "services": {"slow": {"routes": [{"path": "/"}], "endpoints": [plain.address]}},
    }
    with gateway(cfg, tmp_path_factory.mktemp("h2drain") / "sluice.yaml") as g:
        c = Client(g)
        try:
            sid = c.request("/delay?s=1")
            first = c.request("/echo")
            c.pump({first})  # the connection is up and serving
            g.signal(signal.SIGTERM)
            while c.terminated is None and c._read():
                pass
            assert c.terminated is not None
            assert c.terminated.error_code == h2.errors.ErrorCodes.NO_ERROR
            assert c.terminated.last_stream_id >= sid
            c.pump({sid})
            assert c.responses[sid]["headers"] is not None, (c.responses, g.output())
            assert c.responses[sid]["headers"][b":status"] == b"200"
            assert c.responses[sid]["ended"]
        finally:
            c.close()
        assert g.wait(15) == 0


def test_reload_turning_h2c_off_sends_goaway(
    plain: Upstream, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A reload that stops serving h2c on the listener: open HTTP/2 connections get GOAWAY
    NO_ERROR, their streams in progress finish; new prefaces are answered 505."""
    cfg = {
        "listen": {"host": "127.0.0.1", "port": 0, "h2c": True},
        "reload": {"watch": False},
        "services": {"slow": {"routes": [{"path": "/"}], "endpoints": [plain.address]}},
    }
    with gateway(cfg, tmp_path_factory.mktemp("h2reload") / "sluice.yaml") as g:
        c = Client(g)
        try:
            sid = c.request("/delay?s=1")
            first = c.request("/echo")
            c.pump({first})
            current = _config(g)
            current["listen"]["h2c"] = False
            g.config_path.write_text(yaml.safe_dump(current))
            with httpx.Client(timeout=10) as admin:
                answer = admin.post(g.admin_url + "/api/reload")
                assert answer.status_code == 200, answer.text
            while c.terminated is None and c._read():
                pass
            assert c.terminated is not None
            assert c.terminated.error_code == h2.errors.ErrorCodes.NO_ERROR
            c.pump({sid})
            assert c.responses[sid]["headers"][b":status"] == b"200"
        finally:
            c.close()
        late = Client(g)
        try:
            assert late.sock.recv(4096).startswith(b"HTTP/1.1 505")
        finally:
            late.close()
        with urllib.request.urlopen(g.url + "/echo", timeout=10) as r:  # HTTP/1.1 goes on
            assert r.status == 200


def test_reload_turning_tls_http2_off_and_on(
    plain: Upstream, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """tls.http2 off by reload: the open h2 connection gets GOAWAY NO_ERROR and finishes its
    stream, new TLS clients get http/1.1 by ALPN; on again: h2 is chosen again."""
    d = tmp_path_factory.mktemp("h2alpn")
    ca = make_ca(d)
    leaf = ca.issue(d, "site", ["site.example.test"])
    cfg = {
        "reload": {"watch": False},
        "tls": {
            "listen": {"host": "127.0.0.1", "port": 0},
            "certificates": [leaf.config()],
            "http2": True,
        },
        "services": {"slow": {"routes": [{"path": "/"}], "endpoints": [plain.address]}},
    }
    with gateway(cfg, d / "sluice.yaml") as g:
        assert g.tls_url is not None
        port = int(g.tls_url.rpartition(":")[2])
        ctx = ssl.create_default_context(cafile=str(ca.ca_file))
        ctx.set_alpn_protocols(["h2", "http/1.1"])

        def connect() -> ssl.SSLSocket:
            raw = socket.create_connection(("127.0.0.1", port), timeout=10)
            return ctx.wrap_socket(raw, server_hostname="site.example.test")

        def reload(http2: bool) -> None:
            current = _config(g)
            current["tls"]["http2"] = http2
            g.config_path.write_text(yaml.safe_dump(current))
            with httpx.Client(timeout=10) as admin:
                answer = admin.post(g.admin_url + "/api/reload")
                assert answer.status_code == 200, answer.text

        sock = connect()
        assert sock.selected_alpn_protocol() == "h2"
        c = Client(g, sock=sock)
        try:
            sid = c.request("/delay?s=1")
            first = c.request("/echo")
            c.pump({first})
            reload(False)
            while c.terminated is None and c._read():
                pass
            assert c.terminated is not None
            assert c.terminated.error_code == h2.errors.ErrorCodes.NO_ERROR
            c.pump({sid})
            assert c.responses[sid]["headers"][b":status"] == b"200"
        finally:
            c.close()
        with connect() as s:
            assert s.selected_alpn_protocol() == "http/1.1"
        reload(True)
        with connect() as s:
            assert s.selected_alpn_protocol() == "h2"
