"""The chart's probe paths are served by the real admin plane, with the chart's token.

Sluice is started from the CLI with the chart's rendered config and the token from the
chart's Secret in the variable the config names, changed only where a test must: loopback
and free ports, and the static platform instead of kubernetes (no API server here; the
admin plane does not depend on the platform).  The probes send no token, so /healthz and
/readyz must answer without one; /metrics (the ServiceMonitor) needs it.
"""

from __future__ import annotations

import base64
import http.client
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import helm_python as helm
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "sluice"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _get(port: int, path: str, token: str | None = None) -> int | None:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
        conn.request("GET", path, headers=headers)
        status = conn.getresponse().status
        conn.close()
        return status
    except OSError:
        return None


def test_probe_paths_answer_200_on_the_admin_port(tmp_path: Path) -> None:
    with helm.Chart.load(CHART) as chart:
        rendered = chart.render(
            {"adminToken": {"value": "e2e" + "0123456789" * 4}}, name="gw", namespace="edge"
        )
    deployment = yaml.safe_load(rendered["sluice/templates/deployment.yaml"])
    configmap = yaml.safe_load(rendered["sluice/templates/configmap.yaml"])
    secret = yaml.safe_load(rendered["sluice/templates/secret.yaml"])
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    probes = [container[p]["httpGet"] for p in ("startupProbe", "livenessProbe", "readinessProbe")]
    config = yaml.safe_load(configmap["data"]["sluice.yaml"])
    assert {p["port"] for p in probes} == {"admin"}
    assert ports["admin"] == config["admin"]["port"]

    env = {e["name"]: e for e in container["env"]}
    variable = config["admin"]["token_env"]
    ref = env[variable]["valueFrom"]["secretKeyRef"]
    assert ref["name"] == secret["metadata"]["name"]
    token = base64.b64decode(secret["data"][ref["key"]]).decode()

    admin_port = _free_port()
    config["listen"] = {"host": "127.0.0.1", "port": _free_port()}
    config["admin"] = {**config["admin"], "host": "127.0.0.1", "port": admin_port}
    config["platform"] = "static"
    config.pop("kubernetes", None)
    path = tmp_path / "sluice.yaml"
    path.write_text(yaml.safe_dump(config))
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway", "run", "--config", str(path)],
        cwd=ROOT,
        env={**os.environ, variable: token},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        statuses: dict[str, int | None] = {}
        for _ in range(300):  # bounded polling until every probe path answers 200
            assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else ""
            statuses = {p["path"]: _get(admin_port, p["path"]) for p in probes}
            if set(statuses.values()) == {200}:
                break
            time.sleep(0.1)
        assert statuses == {"/healthz": 200, "/readyz": 200}
        assert _get(admin_port, "/metrics") == 401
        assert _get(admin_port, "/metrics", token) == 200
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        if proc.stdout is not None:
            proc.stdout.close()
