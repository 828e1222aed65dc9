"""Admission control through the real gateway: queue bursts, queue timeouts, rate limits,
queued requests in the live signals, body limits, and the admin token."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.support.processes import ROOT, Gateway, Upstream, gateway, upstreams


@pytest.fixture(scope="module")
def up() -> Iterator[Upstream]:
    with upstreams("u1") as started:
        yield started[0]


def one_service(up: Upstream, limits: dict[str, Any]) -> dict[str, Any]:
    return {
        "services": {
            "svc": {
                "routes": [{"path": "/"}],
                "endpoints": [up.address],
                "limits": limits,
            }
        }
    }


def signals(g: Gateway) -> dict[str, Any]:
    data: dict[str, Any] = httpx.get(g.admin_url + "/api/signals", timeout=10).json()
    return data["signals"]["svc"]


def concurrent_gets(g: Gateway, path: str, n: int) -> list[httpx.Response]:
    barrier = threading.Barrier(n)

    def one(_: int) -> httpx.Response:
        with httpx.Client(base_url=g.url, timeout=60) as client:
            barrier.wait()
            return client.get(path)

    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(one, range(n)))


def test_burst_larger_than_the_queue_gets_503_and_the_rest_succeeds(
    up: Upstream, tmp_path: Path
) -> None:
    cfg = one_service(up, {"concurrency_per_replica": 2, "queue": {"max": 5, "timeout_s": 30}})
    with gateway(cfg, tmp_path / "s.yaml") as g:
        seen_queued: list[int] = []
        stop = threading.Event()

        def watch() -> None:
            while not stop.is_set():
                seen_queued.append(signals(g)["queued"])
                time.sleep(0.02)

        watcher = threading.Thread(target=watch)
        watcher.start()
        try:
            responses = concurrent_gets(g, "/delay?s=1", 20)
        finally:
            stop.set()
            watcher.join()
        metrics = httpx.get(g.admin_url + "/metrics", timeout=10).text
        after = signals(g)
    statuses = Counter(r.status_code for r in responses)
    print(f"burst of 20 into 2 slots + queue 5: {dict(statuses)}, queue peak {max(seen_queued)}")
    assert set(statuses) <= {200, 503}, statuses
    rejected = [r for r in responses if r.status_code == 503]
    assert rejected, "20 at once into 2 slots + 5 queue places must overflow"
    assert statuses[200] >= 7  # 2 slots + 5 queued all complete
    for r in rejected:
        assert r.headers["sluice-error"] == "queue-full"
        assert int(r.headers["retry-after"]) >= 1
    assert max(seen_queued) == 5  # the queue filled, and never beyond its max
    assert after["queued"] == 0 and after["in_flight"] == 0
    assert (
        f'sluice_admission_rejected_total{{cause="queue-full",service="svc"}} {len(rejected)}.0'
        in metrics
    )
    waited = re.search(r'sluice_queue_wait_seconds_count\{service="svc"\} ([0-9.]+)', metrics)
    assert waited is not None and float(waited.group(1)) >= 5  # the queued ones were admitted


def test_queued_requests_count_in_concurrency(up: Upstream, tmp_path: Path) -> None:
    cfg = one_service(up, {"concurrency_per_replica": 1, "queue": {"max": 10, "timeout_s": 30}})
    with gateway(cfg, tmp_path / "s.yaml") as g, ThreadPoolExecutor(4) as pool:
        futures = [
            pool.submit(lambda: httpx.get(g.url + "/delay?s=1.5", timeout=60)) for _ in range(4)
        ]
        deadline = time.monotonic() + 10
        snap = signals(g)
        while time.monotonic() < deadline and snap["queued"] < 3:
            time.sleep(0.02)
            snap = signals(g)
        assert snap["in_flight"] == 1 and snap["queued"] == 3
        depth = httpx.get(g.admin_url + "/metrics", timeout=10).text
        assert 'sluice_queue_depth{service="svc"} 3.0' in depth
        assert all(f.result().status_code == 200 for f in futures)


def test_queue_timeout_is_503_with_retry_after(up: Upstream, tmp_path: Path) -> None:
    cfg = one_service(up, {"concurrency_per_replica": 1, "queue": {"max": 10, "timeout_s": 0.3}})
    with gateway(cfg, tmp_path / "s.yaml") as g, ThreadPoolExecutor(1) as pool:
        holder = pool.submit(lambda: httpx.get(g.url + "/delay?s=3", timeout=60))
        deadline = time.monotonic() + 10
        while signals(g)["in_flight"] < 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        start = time.monotonic()
        r = httpx.get(g.url + "/echo", timeout=60)
        took_s = time.monotonic() - start
        assert holder.result().status_code == 200
    assert r.status_code == 503
    assert r.headers["sluice-error"] == "queue-timeout"
    assert int(r.headers["retry-after"]) >= 1
    assert 0.3 <= took_s < 3.0


def test_rate_limit_is_429_with_retry_after(up: Upstream, tmp_path: Path) -> None:
    cfg = one_service(up, {"rate_limit": {"rps": 2, "burst": 5}})
    with gateway(cfg, tmp_path / "s.yaml") as g, httpx.Client(base_url=g.url, timeout=30) as c:
        responses = [c.get("/echo") for _ in range(10)]
    statuses = [r.status_code for r in responses]
    assert statuses[:5] == [200] * 5  # the burst
    limited = [r for r in responses if r.status_code == 429]
    assert len(limited) >= 4
    assert set(statuses) <= {200, 429}
    for r in limited:
        assert r.headers["sluice-error"] == "rate-limited"
        assert int(r.headers["retry-after"]) >= 1


def test_body_limit_is_per_service(up: Upstream, tmp_path: Path) -> None:
    cfg = {
        "services": {
            "small": {
                "routes": [{"path": "/small"}],
                "endpoints": [up.address],
                "limits": {"max_body_bytes": 100},
            },
            "big": {"routes": [{"path": "/"}], "endpoints": [up.address]},
        }
    }
    with gateway(cfg, tmp_path / "s.yaml") as g, httpx.Client(base_url=g.url, timeout=30) as c:
        assert c.post("/small/x", content=b"a" * 100).status_code == 200
        r = c.post("/small/x", content=b"a" * 101)
        assert r.status_code == 413 and r.headers["sluice-error"] == "body-too-large"

        def gen() -> Iterator[bytes]:
            for _ in range(10):
                yield b"b" * 50

        r = c.post("/small/x", content=gen())  # chunked, over the limit as it streams
        assert r.status_code == 413
        assert c.post("/sink", content=b"c" * 100_000).json()["bytes"] == 100_000


# -- admin security ------------------------------------------------------------------------

TOKEN = "s3cret-admin-token-with-32-chars-or-more"


def test_admin_token_is_required_when_set(up: Upstream, tmp_path: Path) -> None:
    cfg = one_service(up, {})
    cfg["admin"] = {"host": "127.0.0.1", "port": 0, "token": TOKEN}
    with gateway(cfg, tmp_path / "s.yaml") as g:
        assert httpx.get(g.admin_url + "/metrics", timeout=10).status_code == 401
        bad = {"Authorization": "Bearer " + TOKEN[:-1] + "x"}
        assert httpx.get(g.admin_url + "/api/services", headers=bad, timeout=10).status_code == 401
        assert httpx.post(g.admin_url + "/api/reload", timeout=10).status_code == 401
        good = {"Authorization": "Bearer " + TOKEN}
        assert httpx.get(g.admin_url + "/metrics", headers=good, timeout=10).status_code == 200
        assert httpx.get(g.admin_url + "/healthz", timeout=10).status_code == 200
        assert httpx.get(g.admin_url + "/readyz", timeout=10).status_code == 200


def test_non_loopback_admin_without_token_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({"admin": {"host": "0.0.0.0"}, "services": {"a": {}}}))
    proc = subprocess.run(
        [sys.executable, "-m", "gateway", "run", "--config", str(path)],
        cwd=ROOT,
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        f"{path}: admin.token: is required when admin.host is not a loopback address "
        "(got host '0.0.0.0')"
    )
