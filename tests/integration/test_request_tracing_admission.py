"""Admission and retries in request traces (issue 4's queue and retries, seen as spans)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.support.processes import Gateway, Upstream, gateway, upstreams

CALLER_SPAN = "00f067aa0ba902b7"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def up() -> Iterator[Upstream]:
    with upstreams("u1") as started:
        yield started[0]


@pytest.fixture(scope="module")
def dead() -> str:
    return f"127.0.0.1:{free_port()}"


@pytest.fixture(scope="module")
def gw(up: Upstream, dead: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    cfg = {
        "services": {
            "queued": {
                "routes": [{"path": "/delay"}],
                "endpoints": [up.address],
                "limits": {"concurrency_per_replica": 1, "queue": {"max": 5, "timeout_s": 30}},
            },
            "retried": {
                "routes": [{"path": "/r"}],
                "endpoints": [dead, up.address],
                "balancer": "round_robin",
                "retries": {"max_attempts": 2, "budget_percent": 100, "budget_min": 10},
                "outlier_detection": {"enabled": False},
            },
        },
        "telemetry": {"traces": {"enabled": True, "exporter": "none"}},
    }
    with gateway(cfg, tmp_path_factory.mktemp("adm") / "sluice.yaml") as g:
        yield g


def trace(gw: Gateway, trace_id: str) -> dict[str, object]:
    deadline = time.monotonic() + 10
    while True:
        found = httpx.get(f"{gw.admin_url}/api/traces", params={"trace_id": trace_id}).json()
        if found["traces"]:
            result: dict[str, object] = found["traces"][0]
            return result
        assert time.monotonic() < deadline, f"trace {trace_id} never showed up"
        time.sleep(0.05)


def in_flight(gw: Gateway, service: str) -> int:
    signals = httpx.get(f"{gw.admin_url}/api/signals").json()["signals"]
    return int(signals[service]["in_flight"])


def test_the_admission_queue_wait_is_a_child_span(gw: Gateway) -> None:
    first_done = threading.Event()

    def occupy() -> None:
        httpx.get(f"{gw.url}/delay", params={"s": "2.0"}, timeout=30)
        first_done.set()

    holder = threading.Thread(target=occupy)
    holder.start()
    deadline = time.monotonic() + 10
    while in_flight(gw, "queued") < 1:  # the one slot is taken
        assert time.monotonic() < deadline
        time.sleep(0.02)
    trace_id = "6" * 32
    r = httpx.get(
        f"{gw.url}/delay",
        params={"s": "0"},
        headers={"traceparent": f"00-{trace_id}-{CALLER_SPAN}-01"},
        timeout=30,
    )
    holder.join(30)
    assert r.status_code == 200 and first_done.is_set()
    t = trace(gw, trace_id)
    spans = t["spans"]
    assert isinstance(spans, list)
    server = next(s for s in spans if s["kind"] == "SERVER")
    queue = next(s for s in spans if s["name"] == "sluice.admission.queue")
    client = next(s for s in spans if s["kind"] == "CLIENT")
    assert queue["parent_span_id"] == server["span_id"]
    assert client["parent_span_id"] == server["span_id"]
    assert queue["duration_ms"] > 0
    assert server["attributes"]["sluice.admission.queue_wait_s"] > 0
    assert queue["end_unix_nano"] <= client["start_unix_nano"], "the attempt starts after the wait"


def test_a_connect_failure_retried_elsewhere_shows_two_attempts(gw: Gateway, dead: str) -> None:
    ids = [f"{i:032x}" for i in range(0x700, 0x704)]
    for trace_id in ids:
        r = httpx.get(f"{gw.url}/r/x", headers={"traceparent": f"00-{trace_id}-{CALLER_SPAN}-01"})
        assert r.status_code == 200
    retried = []
    for trace_id in ids:
        spans = trace(gw, trace_id)["spans"]
        assert isinstance(spans, list)
        attempts = sorted(
            (s for s in spans if s["kind"] == "CLIENT"),
            key=lambda s: s["attributes"]["sluice.upstream.attempt"],
        )
        if len(attempts) == 2:
            retried.append(attempts)
    assert retried, "round robin over [dead, live] sends some first attempts to the dead one"
    for first, second in retried:
        a, b = first["attributes"], second["attributes"]
        assert f"{a['server.address']}:{a['server.port']}" == dead
        assert first["status"] == "ERROR" and a["error.type"] == "upstream-connect-failed"
        assert b["sluice.upstream.attempt"] == 2
        assert b["http.request.resend_count"] == 1
        assert b["sluice.retry.reason"] == "upstream-connect-failed"
        assert b["http.response.status_code"] == 200
        assert f"{b['server.address']}:{b['server.port']}" != dead
