"""`sluice run` with isolated replicas, as a user runs it: replicas run as nobody, and one
that goes past its `memory_max` is OOM-killed, shown in `/api/services` and `/metrics`, and
restarted, while the gateway and the other service keep serving."""

from __future__ import annotations

import random
import subprocess
import uuid
from pathlib import Path
from typing import Any

import httpx

from tests.integration.test_local_isolation import UPSTREAM, needs_root_and_system_python
from tests.support.localpool import needs_cgroups
from tests.support.processes import Gateway
from tests.support.procs import MARKER_VAR, pids_with_marker, wait_until

pytestmark = [needs_cgroups, needs_root_and_system_python]


def service(prefix: str, start: int, marker: str) -> dict[str, Any]:
    return {
        "routes": [{"path": prefix, "path_type": "Prefix"}],
        "replicas": {
            "command": UPSTREAM,
            "port_range": [start, start + 9],
            "env": {MARKER_VAR: marker},
            "user": "nobody",
            "memory_max": "48Mi",
            "grace_s": 5,
            "restart_backoff_s": 0.1,
        },
        "scaling": {"min_replicas": 1, "max_replicas": 1, "cpu": {"min": 0.2, "max": 0.5}},
    }


def test_sluice_run_replicas_run_as_nobody_and_an_oom_kill_is_reported_and_restarted(
    tmp_path: Path,
) -> None:
    marker = uuid.uuid4().hex
    start = random.randrange(20000, 60000, 100)
    config = {
        "platform": "local",
        "budget": {"cpu": 2},
        "services": {
            "hog": service("/hog", start, marker),
            "calm": service("/calm", start + 10, marker),
        },
    }
    gw = Gateway(config, tmp_path / "isolated.yaml")
    try:
        with httpx.Client(base_url=gw.url, timeout=30) as client:
            assert wait_until(
                lambda: (
                    client.get("/hog/").status_code == 200
                    and client.get("/calm/").status_code == 200
                ),
                timeout_s=30,
            )
            first_pid = int(client.get("/hog/").text)
            assert first_pid in pids_with_marker(marker)
            user = subprocess.run(
                ["ps", "-o", "user=", "-p", str(first_pid)],
                capture_output=True,
                text=True,
                check=True,
            ).stdout.strip()
            assert user == "nobody"

            hogged = client.get("/hog/alloc?mb=200")
            assert hogged.status_code >= 500

            with httpx.Client(base_url=gw.admin_url, timeout=30) as admin:

                def hog_report() -> dict[str, Any]:
                    services = admin.get("/api/services").json()["services"]
                    report: dict[str, Any] = services["hog"]["replicas"]
                    return report

                assert wait_until(lambda: hog_report()["oom_kills_total"] >= 1, timeout_s=30)
                report = hog_report()
                assert report["user"] == "nobody"
                assert report["memory_max_bytes"] == 48 * 1024 * 1024
                assert report["memory_applied"] is True
                metrics = admin.get("/metrics").text
                assert 'sluice_replica_oom_kills_total{service="hog"} 1.0' in metrics
                assert 'sluice_replica_oom_kills_total{service="calm"} 0.0' in metrics

            # The other service kept serving, and the hog is back with a new process.
            assert client.get("/calm/").status_code == 200
            assert wait_until(
                lambda: (r := client.get("/hog/")).status_code == 200 and int(r.text) != first_pid,
                timeout_s=30,
            )
    finally:
        gw.stop()
    assert wait_until(lambda: pids_with_marker(marker) == [], timeout_s=15)
