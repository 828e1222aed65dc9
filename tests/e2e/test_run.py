"""``sluice run`` as a user runs it: start from a config file, serve, stop cleanly on a signal."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import yaml

from tests.support.processes import ROOT, Gateway, gateway, upstreams


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_run_serves_and_stops_cleanly_on_signal(tmp_path: Path, sig: signal.Signals) -> None:
    with upstreams("e2e") as (up,):
        cfg = {"services": {"echo": {"routes": [{"path": "/"}], "endpoints": [up.address]}}}
        gw = Gateway(cfg, tmp_path / "sluice.yaml")
        try:
            # The ready line names real ports (port 0 was asked for).
            assert gw.port > 0
            assert gw.admin_url.startswith("http://127.0.0.1:")
            r = httpx.get(gw.url + "/hello", timeout=10)
            assert r.status_code == 200
            assert r.headers["x-upstream"] == "e2e"
            assert httpx.get(gw.admin_url + "/readyz", timeout=10).status_code == 200
            gw.signal(sig)
            assert gw.wait(15) == 0
        finally:
            gw.stop()
        assert "Traceback" not in gw.output()


def test_run_with_a_bad_config_exits_2_naming_the_key(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(
        yaml.safe_dump({"services": {"s": {"routes": [{"path": "/", "path_type": "prefix"}]}}})
    )
    result = subprocess.run(
        [sys.executable, "-m", "gateway", "run", "--config", str(path)],
        cwd=ROOT,
        capture_output=True,
        check=False,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2
    assert (
        f"{path}: services.s.routes[0].path_type: must be one of Exact, Prefix, ImplementationSpecific, got 'prefix'"
        in result.stderr
    )


def test_run_reports_a_port_in_use(tmp_path: Path) -> None:
    with upstreams("busy") as (up,):
        host, port = up.address.rsplit(":", 1)
        path = tmp_path / "sluice.yaml"
        path.write_text(
            yaml.safe_dump(
                {
                    "listen": {"host": host, "port": int(port)},
                    "admin": {"host": "127.0.0.1", "port": 0},
                    "services": {},
                }
            )
        )
        result = subprocess.run(
            [sys.executable, "-m", "gateway", "run", "--config", str(path)],
            cwd=ROOT,
            capture_output=True,
            check=False,
            text=True,
            timeout=30,
        )
    assert result.returncode == 1
    assert "sluice: cannot listen:" in result.stderr


def test_example_static_config_runs(tmp_path: Path) -> None:
    """The shipped example config starts and routes (its endpoints normally do not exist: 502)."""
    example = yaml.safe_load((ROOT / "config" / "examples" / "static.yaml").read_text())
    example.pop("listen", None)
    example.pop("admin", None)
    with gateway(example, tmp_path / "static.yaml") as gw:
        r = httpx.get(gw.url + "/api/health", timeout=10)
        if "sluice-error" in r.headers:  # nothing listens on the example's ports
            assert r.headers["sluice-error"].startswith("upstream-")
        services = httpx.get(gw.admin_url + "/api/services", timeout=10).json()["services"]
        assert set(services) == {"web", "api"}
