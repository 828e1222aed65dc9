"""`sluice run` (platform local): scale from zero and back, decisions visible.

A service at 0 replicas holds its requests in its admission queue, the scaler is woken at
once, the first ready replica answers them; after the idle grace it goes back to zero, and
the next requests are held and answered again.  ``GET /api/decisions`` and ``/metrics``
show what the scaler decided and why.
"""

from __future__ import annotations

import random
import signal
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from tests.support.localpool import REPLICA_USER_FIELDS, ROOT, needs_cgroups
from tests.support.processes import Gateway
from tests.support.procs import MARKER_VAR, pids_with_marker, wait_until
from tests.support.strict_json import ADMIN_JSON_PATHS, strict_json


def zero_config(marker: str) -> dict[str, Any]:
    start = random.randrange(20000, 60000, 100)
    return {
        "platform": "local",
        "budget": {"cpu": 2},
        "services": {
            "reports": {
                "routes": [{"path": "/reports", "path_type": "Prefix"}],
                "replicas": {
                    "command": ["{python}", "-m", "gateway.tools.demo", "--port", "{port}"],
                    "port_range": [start, start + 20],
                    "env": {MARKER_VAR: marker, "PYTHONPATH": str(ROOT)},
                    "grace_s": 5,
                    **REPLICA_USER_FIELDS,
                },
                "limits": {"queue": {"max": 50, "timeout_s": 60}},
                "scaling": {
                    "target": 4,
                    "min_replicas": 0,
                    "max_replicas": 2,
                    "stable_window_s": 2,
                    "panic_window_s": 1,
                    "scale_to_zero_grace_s": 1,
                    "cpu": {"min": 0.2, "max": 1.0, "request": 0.5},
                },
            }
        },
    }


def burst(url: str, n: int) -> list[httpx.Response]:
    def one(i: int) -> httpx.Response:
        with httpx.Client(timeout=90) as c:
            return c.get(f"{url}/reports/r{i}?cpu_ms=5")

    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(one, range(n)))


def decisions(gw: Gateway, **params: str) -> dict[str, Any]:
    r = httpx.get(f"{gw.admin_url}/api/decisions", params=params, timeout=10)
    r.raise_for_status()
    body: dict[str, Any] = r.json()
    return body


@needs_cgroups
def test_scale_from_zero_and_back_answers_every_held_request(tmp_path: Path) -> None:
    marker = uuid.uuid4().hex
    gw = Gateway(zero_config(marker), tmp_path / "zero.yaml")
    try:
        # min_replicas 0: nothing runs until a request comes.
        assert pids_with_marker(marker) == []
        for round_no in (1, 2):
            answers = burst(gw.url, 6)
            assert [r.status_code for r in answers] == [200] * 6, [
                (r.status_code, r.headers.get("sluice-error"), r.text[:80]) for r in answers
            ]
            assert all(r.json()["cpu_ms"] == 5 for r in answers)
            assert pids_with_marker(marker), "a replica answered, so one runs"
            # The held requests waited in the queue: the queue metric saw them.
            metrics = httpx.get(f"{gw.admin_url}/metrics", timeout=10).text
            assert 'sluice_queue_wait_seconds_count{service="reports"}' in metrics
            # Idle: back to zero replicas after the grace, every replica process gone.
            assert wait_until(lambda: pids_with_marker(marker) == [], timeout_s=40), (
                f"round {round_no}: still running after the idle grace\n{gw.output()[-3000:]}"
            )
        body = decisions(gw, service="reports")
        recent = body["recent"]
        assert recent, body
        assert all(d["service"] == "reports" for d in recent)
        # Newest first: the latest change took reports to zero; an earlier one from zero up.
        assert recent[0]["replicas"] == 0
        assert any(d["replicas"] >= 1 for d in recent[1:])
        assert all(d["reasons"] and d["rule"] for d in recent)
        assert body["latest"]["reports"]["replicas"] == 0
        assert body["applied"] is True and body["budget"]["cpu"] == 2
        rejected = httpx.get(f"{gw.admin_url}/metrics", timeout=10).text
        assert 'sluice_admission_rejected_total{cause="queue-timeout",service="reports"} 0.0' in (
            rejected
        )
        assert 'sluice_replicas{service="reports"} 0.0' in rejected
        assert "sluice_budget_cpu_cores 2.0" in rejected
    finally:
        gw.signal(signal.SIGTERM)
        code = gw.wait(30)
    assert code == 0, gw.output()[-3000:]
    assert wait_until(lambda: pids_with_marker(marker) == [], timeout_s=10)


@needs_cgroups
def test_a_lone_request_wakes_a_service_at_zero_next_to_a_busy_one(tmp_path: Path) -> None:
    """A busy neighbour takes the whole budget; then one request alone comes for a service
    at zero.  At target 4 one request reads as less work than cpu.min (CPU is measured: the
    cgroup counter stays at zero replicas), and with no spare CPU that fitted no replica:
    the request waited in the queue for a second one until it timed out.  Now it starts a
    replica at cpu.min and is answered."""
    marker = uuid.uuid4().hex
    config = zero_config(marker)
    reports = config["services"]["reports"]
    start = reports["replicas"]["port_range"][1] + 1
    config["services"]["busy"] = {
        "routes": [{"path": "/busy", "path_type": "Prefix"}],
        "replicas": {**reports["replicas"], "port_range": [start, start + 20]},
        "scaling": {"target": 1, "max_replicas": 8, "cpu": {"min": 0.2, "max": 1.0}},
    }
    gw = Gateway(config, tmp_path / "zero.yaml")
    stop = threading.Event()

    def hammer() -> None:
        with httpx.Client(timeout=30) as c:
            while not stop.is_set():
                c.get(f"{gw.url}/busy/x?cpu_ms=200")

    pool = ThreadPoolExecutor(16)
    try:
        for _ in range(16):
            pool.submit(hammer)
        # the neighbour's demand covers the budget before the lone request comes
        assert wait_until(
            lambda: decisions(gw)["latest"].get("busy", {}).get("allocated_cores", 0) >= 1.9,
            timeout_s=30,
        ), decisions(gw)["latest"]
        assert pids_with_marker(marker), "busy runs"
        with httpx.Client(timeout=90) as c:
            answer = c.get(f"{gw.url}/reports/alone?cpu_ms=5")
        assert answer.status_code == 200, (answer.headers.get("sluice-error"), answer.text[:200])
        assert answer.json()["cpu_ms"] == 5
    finally:
        stop.set()
        pool.shutdown(wait=True)
        gw.signal(signal.SIGTERM)
        code = gw.wait(30)
    assert code == 0, gw.output()[-3000:]


@needs_cgroups
def test_admin_json_is_finite_before_any_request(tmp_path: Path) -> None:
    """platform local, a service at zero that never had a request: every admin JSON endpoint
    parses strictly (no NaN / Infinity)."""
    marker = uuid.uuid4().hex
    gw = Gateway(zero_config(marker), tmp_path / "zero.yaml")
    try:
        assert wait_until(lambda: decisions(gw)["ticks"] >= 2, timeout_s=20)
        assert "reports" in decisions(gw)["latest"]
        for path in ADMIN_JSON_PATHS:
            answer = httpx.get(f"{gw.admin_url}{path}", timeout=10)
            assert answer.status_code == 200, (path, answer.text[:200])
            strict_json(answer.text)
    finally:
        gw.signal(signal.SIGTERM)
        code = gw.wait(30)
    assert code == 0, gw.output()[-3000:]


@needs_cgroups
def test_a_cold_start_longer_than_the_queue_timeout_is_held_not_refused(tmp_path: Path) -> None:
    """A replica that takes 12 s to start (heavy imports), the queue at its defaults
    (``timeout_s`` 10): requests that came to a service at zero are held through the cold
    start (``cold_start_timeout_s``, 300 s) and answered, none 503."""
    marker = uuid.uuid4().hex
    config = zero_config(marker)
    reports = config["services"]["reports"]
    del reports["limits"]  # the defaults, as a user who set nothing has them
    replicas = reports["replicas"]
    replicas["command"] = [
        "sh",
        "-c",
        "sleep 12; exec {python} -m gateway.tools.demo --port {port}",
    ]
    gw = Gateway(config, tmp_path / "zero.yaml")
    try:
        answers = burst(gw.url, 3)
        assert [r.status_code for r in answers] == [200] * 3, [
            (r.status_code, r.headers.get("sluice-error"), r.text[:80]) for r in answers
        ]
        assert all(r.elapsed.total_seconds() >= 11 for r in answers)  # they waited for it
        metrics = httpx.get(f"{gw.admin_url}/metrics", timeout=10).text
        assert 'sluice_admission_rejected_total{cause="queue-timeout",service="reports"} 0.0' in (
            metrics
        )
    finally:
        gw.signal(signal.SIGTERM)
        code = gw.wait(30)
    assert code == 0, gw.output()[-3000:]
