"""`sluice traces` as a user runs it, against a running gateway with tracing on."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.processes import ROOT, Gateway, Upstream, gateway, upstreams

OK_TRACE = "a" * 32
FAILED_TRACE = "b" * 32
CALLER_SPAN = "00f067aa0ba902b7"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def sluice(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway", *args],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    with upstreams("u1") as (up,):
        cfg = {
            "services": {
                "api": {"routes": [{"path": "/api"}], "endpoints": [up.address]},
                "dead": {
                    "routes": [{"path": "/dead"}],
                    "endpoints": [f"127.0.0.1:{free_port()}"],
                },
            },
            "telemetry": {"traces": {"enabled": True, "exporter": "none"}},
        }
        with gateway(cfg, tmp_path_factory.mktemp("cli") / "sluice.yaml") as g:
            traffic(g, up)
            yield g


def traffic(g: Gateway, up: Upstream) -> None:
    r = httpx.get(f"{g.url}/api/orders", headers={"traceparent": f"00-{OK_TRACE}-{CALLER_SPAN}-01"})
    assert r.status_code == 200
    r = httpx.get(f"{g.url}/dead/x", headers={"traceparent": f"00-{FAILED_TRACE}-{CALLER_SPAN}-01"})
    assert r.status_code == 502


def test_traces_prints_a_waterfall_tree_per_trace(gw: Gateway) -> None:
    result = sluice("traces", "--admin", gw.admin_url, "--width", "160")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    # Both traces, newest first, each with a header line a person can scan.
    ok_at = out.index(f"trace {OK_TRACE}")
    failed_at = out.index(f"trace {FAILED_TRACE}")
    assert failed_at < ok_at
    ok_block = out[ok_at:]
    failed_block = out[failed_at:ok_at]
    assert re.search(
        rf"trace {OK_TRACE}  GET  [\d.]+ (ms|µs|s)  2 span\(s\)  OK  services: api", out
    )
    assert re.search(
        rf"trace {FAILED_TRACE}  GET  [\d.]+ (ms|µs|s)  2 span\(s\)  ERROR  services: dead", out
    )
    # The tree: the SERVER span at the root, the CLIENT attempt under it, with a bar each.
    lines = ok_block.splitlines()
    server_line = next(line for line in lines if " SERVER " in line)
    client_line = next(line for line in lines if " CLIENT " in line)
    assert server_line.startswith("GET ")
    assert client_line.startswith("└─ GET ")
    assert "█" in server_line and "█" in client_line
    assert "service=api" in server_line and "path=/api/orders" in server_line
    assert "status=200" in server_line
    assert "attempt 1" in client_line and "status=200" in client_line
    assert re.search(r"→ 127\.0\.0\.1:\d+", client_line)
    failed_client = next(line for line in failed_block.splitlines() if " CLIENT " in line)
    assert "error=upstream-connect-failed" in failed_client


def test_filters_narrow_the_list(gw: Gateway) -> None:
    errors = sluice("traces", "--admin", gw.admin_url, "--status", "error", "--width", "160")
    assert errors.returncode == 0, errors.stderr
    assert FAILED_TRACE in errors.stdout and OK_TRACE not in errors.stdout

    api = sluice("traces", "--admin", gw.admin_url, "--service", "api", "--width", "160")
    assert OK_TRACE in api.stdout and FAILED_TRACE not in api.stdout

    one = sluice("traces", "--admin", gw.admin_url, "--trace-id", OK_TRACE, "--json")
    body = json.loads(one.stdout)
    assert [t["trace_id"] for t in body["traces"]] == [OK_TRACE]

    slow = sluice("traces", "--admin", gw.admin_url, "--min-duration-ms", "600000")
    assert slow.returncode == 0
    assert "no traces match" in slow.stdout


def test_bad_input_and_unreachable_admin_are_clear(gw: Gateway) -> None:
    bad = sluice("traces", "--admin", gw.admin_url, "--trace-id", "xyz")
    assert bad.returncode == 2
    assert "trace_id: must be 32 hex digits, got 'xyz'" in bad.stderr

    nowhere = f"http://127.0.0.1:{free_port()}"
    down = sluice("traces", "--admin", nowhere)
    assert down.returncode == 1
    assert f"cannot reach the admin API at {nowhere}" in down.stderr


def test_tracing_off_says_so(tmp_path: Path) -> None:
    with upstreams("u2") as (up,):
        cfg = {"services": {"api": {"routes": [{"path": "/"}], "endpoints": [up.address]}}}
        with gateway(cfg, tmp_path / "sluice.yaml") as g:
            httpx.get(f"{g.url}/x")
            result = sluice("traces", "--admin", g.admin_url)
    assert result.returncode == 0
    assert "tracing is off" in result.stdout
