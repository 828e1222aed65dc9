"""Hot reload and graceful shutdown of the real gateway process, under load."""

from __future__ import annotations

import signal
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.support.processes import Gateway, Upstream, gateway, upstreams


@pytest.fixture(scope="module")
def ups() -> Iterator[list[Upstream]]:
    with upstreams("u1", "u2") as started:
        yield started


def config(endpoints: list[str], queue_max: int = 100, **top: Any) -> dict[str, Any]:
    return {
        "listen": {"host": "127.0.0.1", "port": 0},
        "admin": {"host": "127.0.0.1", "port": 0},
        "reload": {"watch": False},
        **top,
        "services": {
            "svc": {
                "routes": [{"path": "/"}],
                "endpoints": endpoints,
                "limits": {"concurrency_per_replica": 50, "queue": {"max": queue_max}},
            }
        },
    }


def rewrite(g: Gateway, cfg: dict[str, Any]) -> None:
    tmp = g.config_path.with_suffix(".tmp")
    # ``workers`` as the gateway was started with (it cannot change on reload).
    started = yaml.safe_load(g.config_path.read_text())
    tmp.write_text(yaml.safe_dump({"workers": started["workers"], **cfg}))
    tmp.replace(g.config_path)  # atomic, like an editor or a ConfigMap update


def endpoints_of(g: Gateway) -> list[str]:
    data = httpx.get(g.admin_url + "/api/services", timeout=10).json()
    return sorted(
        ep["address"] for ep in data["services"]["svc"]["endpoints"] if ep["state"] == "ready"
    )


class Load:
    """``threads`` clients sending GETs back to back until stopped; counts every outcome."""

    def __init__(self, url: str, threads: int = 4, path: str = "/echo") -> None:
        self.url = url
        self.path = path
        self.ok = 0
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run) for _ in range(threads)]

    def _run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=30) as client:
            while not self._stop.is_set():
                try:
                    r = client.get(self.path)
                except httpx.HTTPError as e:
                    with self._lock:
                        self.failures.append(repr(e))
                    continue
                with self._lock:
                    if r.status_code == 200:
                        self.ok += 1
                    else:
                        self.failures.append(f"{r.status_code} {r.headers.get('sluice-error')}")

    def __enter__(self) -> Load:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(30)


def test_100_reloads_under_load_fail_no_request(ups: list[Upstream], tmp_path: Path) -> None:
    a, b = ups[0].address, ups[1].address
    with gateway(config([a]), tmp_path / "s.yaml") as g:
        with Load(g.url) as load, httpx.Client(base_url=g.admin_url, timeout=30) as admin:
            for i in range(100):
                # Alternate the endpoints (the removed one drains) and a limit.
                eps = [b] if i % 2 == 0 else [a, b] if i % 3 == 0 else [a]
                rewrite(g, config(eps, queue_max=100 + i))
                r = admin.post("/api/reload")
                assert r.status_code == 200, r.text
                assert r.json()["ok"] is True
            time.sleep(0.2)
        generation = r.json()["generation"]
    assert load.failures == []
    assert load.ok > 100
    assert generation == 1 + sum(1 for _ in range(100))  # every reload applied a change
    print(f"{load.ok} requests, 0 failed, across 100 reloads")


def test_invalid_reload_is_rejected_and_the_old_config_keeps_serving(
    ups: list[Upstream], tmp_path: Path
) -> None:
    a = ups[0].address
    with gateway(config([a]), tmp_path / "s.yaml") as g:
        bad = config([a])
        bad["services"]["svc"]["limits"]["queue"]["max"] = -1
        bad["services"]["svc"]["balancer"] = "fastest"
        rewrite(g, bad)
        r = httpx.post(g.admin_url + "/api/reload", timeout=10)
        assert r.status_code == 422
        assert r.json() == {
            "ok": False,
            "generation": 1,
            "errors": [
                f"{g.config_path}: services.svc.balancer: must be one of round_robin, "
                "least_request, peak_ewma, got 'fastest'",
                f"{g.config_path}: services.svc.limits.queue.max: must be >= 0, got -1",
            ],
        }
        assert httpx.get(g.url + "/echo", timeout=10).status_code == 200
        assert endpoints_of(g) == [a]
        moved = config([a], listen={"host": "127.0.0.1", "port": 1})
        rewrite(g, moved)
        r = httpx.post(g.admin_url + "/api/reload", timeout=10)
        assert r.status_code == 422
        assert r.json()["errors"] == [
            f"{g.config_path}: listen: cannot change while running (restart Sluice to apply it)"
        ]
    assert any("config reload (POST /api/reload) rejected" in line for line in g.stderr_lines)


def wait_for(predicate: Any, timeout_s: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def test_sighup_reloads(ups: list[Upstream], tmp_path: Path) -> None:
    a, b = ups[0].address, ups[1].address
    with gateway(config([a]), tmp_path / "s.yaml") as g:
        rewrite(g, config([a, b]))
        g.signal(signal.SIGHUP)
        assert wait_for(lambda: endpoints_of(g) == sorted([a, b]))


def test_file_change_reloads(ups: list[Upstream], tmp_path: Path) -> None:
    a, b = ups[0].address, ups[1].address
    watched = {"reload": {"watch": True, "interval_s": 0.1}}
    cfg = config([a])
    cfg.update(watched)
    with gateway(cfg, tmp_path / "s.yaml") as g:
        new = config([b])
        new.update(watched)
        rewrite(g, new)
        assert wait_for(lambda: endpoints_of(g) == [b])
        assert httpx.get(g.url + "/echo", timeout=10).headers["x-upstream"] == "u2"


# -- graceful shutdown ------------------------------------------------------------------------


def test_sigterm_drains_in_flight_requests_and_exits_0(ups: list[Upstream], tmp_path: Path) -> None:
    g = Gateway(config([ups[0].address], shutdown={"drain_s": 30}), tmp_path / "s.yaml")
    try:
        with ThreadPoolExecutor(10) as pool:
            futures = [
                pool.submit(lambda: httpx.get(g.url + "/delay?s=4", timeout=60)) for _ in range(10)
            ]

            def in_flight() -> int:
                data = httpx.get(g.admin_url + "/api/signals", timeout=10).json()
                return int(data["signals"]["svc"]["in_flight"])

            assert wait_for(lambda: in_flight() == 10, timeout_s=30)
            assert httpx.get(g.admin_url + "/readyz", timeout=10).status_code == 200
            g.signal(signal.SIGTERM)
            assert wait_for(
                lambda: httpx.get(g.admin_url + "/readyz", timeout=10).status_code == 503
            )
            assert wait_for(lambda: refused(g))  # the listener is closed
            statuses = [f.result().status_code for f in futures]
        assert statuses == [200] * 10
        assert g.wait(30) == 0
    finally:
        g.stop()


def refused(g: Gateway) -> bool:
    try:
        with socket.create_connection((g.host, g.port), timeout=1):
            return False
    except OSError:
        return True


def test_drain_is_bounded_by_drain_s(ups: list[Upstream], tmp_path: Path) -> None:
    g = Gateway(config([ups[0].address], shutdown={"drain_s": 0.5}), tmp_path / "s.yaml")
    try:
        with ThreadPoolExecutor(1) as pool:
            slow = pool.submit(lambda: httpx.get(g.url + "/delay?s=30", timeout=60))
            assert wait_for(
                lambda: (
                    httpx.get(g.admin_url + "/api/signals", timeout=10).json()["signals"]["svc"][
                        "in_flight"
                    ]
                    == 1
                )
            )
            start = time.monotonic()
            g.signal(signal.SIGTERM)
            assert g.wait(30) == 0
            took_s = time.monotonic() - start
            with pytest.raises(httpx.HTTPError):
                slow.result()
        assert 0.5 <= took_s < 10
    finally:
        g.stop()
