"""The access log against the requests sent: one line each (proxied, upgraded, refused), in
JSON and text, and reopened on SIGUSR1 after the file was moved away (logrotate)."""

from __future__ import annotations

import json
import re
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.sync.client import connect

from tests.support.processes import Gateway, Upstream, WsUpstream, gateway, upstreams

WAIT_S = 20.0
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest.fixture(scope="module")
def up() -> Iterator[Upstream]:
    with upstreams("a") as started:
        yield started[0]


@pytest.fixture(scope="module")
def ws_up() -> Iterator[WsUpstream]:
    ws = WsUpstream()
    try:
        yield ws
    finally:
        ws.stop()


def config(up: Upstream, ws_up: WsUpstream, fmt: str, path: Path) -> dict[str, Any]:
    return {
        "access_log": {"enabled": True, "format": fmt, "path": str(path)},
        "services": {
            "api": {"routes": [{"host": "api.test"}], "endpoints": [up.address]},
            "limited": {
                "routes": [{"host": "limited.test"}],
                "endpoints": [up.address],
                "limits": {"rate_limit": {"rps": 0.01, "burst": 1}},
            },
            "empty": {"routes": [{"host": "empty.test"}], "endpoints": []},
            "chat": {"routes": [{"host": "chat.test"}], "endpoints": [ws_up.address]},
        },
    }


def read_lines(path: Path, n: int) -> list[str]:
    """The log's lines once there are ``n`` (bounded wait: lines are written after the
    response, at the end of the gateway's loop round)."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        lines = path.read_text().splitlines() if path.exists() else []
        if len(lines) >= n:
            return lines
        time.sleep(0.02)
    raise AssertionError(f"{path}: expected {n} lines, got {lines}")


def raw(gw: Gateway, request: bytes) -> bytes:
    with socket.create_connection((gw.host, gw.port), timeout=WAIT_S) as s:
        s.sendall(request)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
        return data


def send_everything(gw: Gateway) -> None:
    with httpx.Client(base_url=gw.url, timeout=WAIT_S) as client:
        r = client.post(
            "/echo/x?q=1&b=%22",
            headers={"Host": "api.test", "traceparent": TRACEPARENT},
            content=b"12345",
        )
        assert r.status_code == 200
        assert client.get("/nowhere", headers={"Host": "nobody.test"}).status_code == 404
        assert client.get("/", headers={"Host": "limited.test"}).status_code == 200
        assert client.get("/", headers={"Host": "limited.test"}).status_code == 429
        assert client.get("/", headers={"Host": "empty.test"}).status_code == 503
    assert raw(gw, b"GET /bad HTTP/1.1\r\nHost: api.test\r\nBad Header\r\n\r\n").startswith(
        b"HTTP/1.1 400 "
    )
    with connect(
        f"ws://chat.test:{gw.port}/echo", sock=socket.create_connection((gw.host, gw.port))
    ) as ws:
        ws.send("hello")
        assert ws.recv() == "hello"


def test_json_lines_match_the_requests(up: Upstream, ws_up: WsUpstream, tmp_path: Path) -> None:
    log_path = tmp_path / "access.log"
    with gateway(config(up, ws_up, "json", log_path), tmp_path / "sluice.yaml") as gw:
        send_everything(gw)
        lines = [json.loads(line) for line in read_lines(log_path, 7)]
    assert len(lines) == 7
    keys = {
        "time", "client", "method", "host", "path", "query", "status", "bytes_in",
        "bytes_out", "duration_s", "upstream", "upstream_s", "service", "retries", "cause",
        "trace_id", "upgraded",
    }  # fmt: skip
    assert all(set(line) == keys for line in lines)
    by_status = {line["status"]: line for line in lines}
    ok = next(line for line in lines if line["host"] == "api.test" and line["status"] == 200)
    assert ok["method"] == "POST"
    assert ok["host"] == "api.test"
    assert ok["path"] == "/echo/x"
    assert ok["query"] == "q=1&b=%22"
    assert ok["client"] == "127.0.0.1"
    assert ok["bytes_in"] == 5
    assert ok["bytes_out"] > 0
    assert ok["service"] == "api"
    assert ok["upstream"] == up.address
    assert ok["upstream_s"] is not None
    assert ok["upstream_s"] <= ok["duration_s"]
    assert ok["trace_id"] == TRACEPARENT[3:35]
    assert ok["cause"] is None
    assert ok["retries"] == 0
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", ok["time"])
    assert by_status[404]["cause"] == "no-route"
    assert by_status[404]["service"] is None
    assert by_status[429]["cause"] == "rate-limited"
    assert by_status[429]["service"] == "limited"
    assert by_status[503]["cause"] == "no-endpoints"
    assert by_status[400]["cause"] == "bad-request"
    assert by_status[400]["path"] == "/bad"
    ws = by_status[101]
    assert ws["upgraded"] is True
    assert ws["service"] == "chat"
    assert ws["bytes_in"] > len("hello") and ws["bytes_out"] > len("hello")  # frames
    assert [line["status"] for line in lines].count(200) == 2  # api, then limited's first


def test_text_lines_and_reopen_on_sigusr1(up: Upstream, ws_up: WsUpstream, tmp_path: Path) -> None:
    log_path = tmp_path / "access.log"
    rotated = tmp_path / "access.log.1"
    with gateway(config(up, ws_up, "text", log_path), tmp_path / "sluice.yaml") as gw:
        r = httpx.get(gw.url + "/echo?x=1", headers={"Host": "api.test"}, timeout=WAIT_S)
        assert r.status_code == 200
        [line] = read_lines(log_path, 1)
        assert re.match(
            r"127\.0\.0\.1 - - \[\d\d/\w{3}/\d{4}:\d\d:\d\d:\d\d\.\d{3} \+0000\] "
            r'"GET /echo\?x=1 HTTP/1\.1" 200 \d+ in=0 dur=[\d.]+ host=api\.test svc=api '
            rf"up={re.escape(up.address)} up_s=[\d.]+ retries=0 cause=- trace=-$",
            line,
        ), line
        log_path.rename(rotated)
        gw.signal(signal.SIGUSR1)
        deadline = time.monotonic() + WAIT_S
        while not log_path.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert log_path.exists(), "SIGUSR1 did not reopen the log"
        r = httpx.get(gw.url + "/nowhere", headers={"Host": "x.test"}, timeout=WAIT_S)
        assert r.status_code == 404
        [after] = read_lines(log_path, 1)
        assert '"GET /nowhere HTTP/1.1" 404 ' in after
        assert "cause=no-route" in after
    assert len(rotated.read_text().splitlines()) == 1
