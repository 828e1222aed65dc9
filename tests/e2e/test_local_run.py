"""`sluice run` with `platform: local`: real replicas behind the real gateway, real cgroups.

Started as a user would (``python -m gateway run --config FILE``); the checks read what a
user could read: HTTP answers through the proxy, the cgroup files, and /proc.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.platforms.local.actuator import entitlements
from gateway.platforms.local.cgroup_parent import parent_name_for, sweep_stale
from gateway.platforms.local.cgroups import (
    DEFAULT_WEIGHT_CORES,
    CpuLimit,
    ReplicaCgroup,
    cores_for_weight,
    detect_layout,
    weight_for,
)
from gateway.platforms.machine import cpuset_usable
from scaler.policy import ScalingPolicy
from tests.support.localpool import REPLICA_USER_FIELDS, ROOT, needs_cgroups
from tests.support.processes import Gateway
from tests.support.procs import MARKER_VAR, pids_with_marker, wait_until


def local_config(marker: str, enforcement: str = "limit") -> dict[str, Any]:
    start = random.randrange(20000, 60000, 100)
    return {
        "platform": "local",
        "budget": {"cpu": 2, "enforcement": enforcement},
        "services": {
            "api": {
                "routes": [{"path": "/", "path_type": "Prefix"}],
                "replicas": {
                    "command": ["{python}", "-m", "gateway.tools.demo", "--port", "{port}"],
                    "port_range": [start, start + 20],
                    "env": {MARKER_VAR: marker, "PYTHONPATH": str(ROOT)},
                    "grace_s": 5,
                    **REPLICA_USER_FIELDS,
                },
                "scaling": {
                    "target": 2,
                    "min_replicas": 1,
                    "max_replicas": 3,
                    "cpu": {"min": 0.2, "max": 0.6, "request": 0.25},
                },
            }
        },
    }


def limits(parent: Path) -> dict[str, CpuLimit]:
    layout = detect_layout(Path("/proc/self/mountinfo").read_text())
    out = {}
    for d in sorted(parent.iterdir()) if parent.is_dir() else []:
        if d.is_dir():
            try:
                out[d.name] = ReplicaCgroup(layout, d, None).read_limit()
            except (OSError, ValueError):
                continue  # being created or removed right now
    return out


@needs_cgroups
@pytest.mark.parametrize("enforcement", ["limit", "share"])
def test_sluice_run_local_starts_scales_and_stops_replicas(
    tmp_path: Path, enforcement: str
) -> None:
    marker = uuid.uuid4().hex
    layout = detect_layout(Path("/proc/self/mountinfo").read_text())
    config = local_config(marker, enforcement)
    gw = Gateway(config, tmp_path / "local.yaml")
    admin = httpx.Client(base_url=gw.admin_url, timeout=10)

    def decided(name: str, limit: CpuLimit) -> float:
        """The decided CPU: the quota under limit; under share no cgroup file holds it, the
        scaler's last decision (``/api/decisions``) does."""
        if enforcement == "limit":
            return limit.cores or 0.0
        latest = admin.get("/api/decisions").json()["latest"]
        return float(latest["api"]["cpu_per_replica_cores"]) if "api" in latest else 0.25

    def capped(name: str, limit: CpuLimit) -> bool:
        """limit: quota and weight are the decided CPU; share: the quota is cpu.max (0.6) and
        the weight the default (the service's cgroup has the entitlement)."""
        if enforcement == "limit":
            return cores_for_weight(limit.weight, layout.version) == pytest.approx(
                limit.cores or 0.0, abs=tol
            )
        default = weight_for(DEFAULT_WEIGHT_CORES, layout.version)
        return limit.cores == pytest.approx(0.6) and limit.weight == default

    # The weight is rounded to whole shares (v1: 1/1024 core; v2: 1/100 core).
    tol = 0.006
    try:
        parent = layout.cpu_root / parent_name_for(gw.pid)
        # limit: replicas right below the parent; share: in the service's cgroup.
        holder = parent if enforcement == "limit" else parent / "api"
        # The first replica becomes an endpoint: requests through the proxy reach it.
        with httpx.Client(base_url=gw.url, timeout=30) as client:
            assert wait_until(lambda: client.get("/healthz").status_code == 200, timeout_s=30)
            body = client.get("/work?cpu_ms=5").json()
        assert body["cpu_ms"] == 5
        assert body["pid"] in pids_with_marker(marker)
        first = limits(holder)
        assert list(first) == ["api-0"]
        # Started at cpu.request (0.25); the scaler may already have moved it within its bounds.
        assert 0.2 - tol <= decided("api-0", first["api-0"]) <= 0.6 + tol
        assert capped("api-0", first["api-0"])
        assert ReplicaCgroup(layout, parent, None).read_limit().cores == pytest.approx(2.0)
        if enforcement == "share":
            # The service's cgroup: its entitlement (alone: all it can use, 3 x 0.6) as
            # weight, no quota of its own.
            policy = ScalingPolicy.model_validate(config["services"]["api"]["scaling"])
            entitled = entitlements(2.0, {"api": policy})["api"]
            assert entitled == pytest.approx(1.8)
            service = ReplicaCgroup(layout, holder, None).read_limit()
            assert service.weight == weight_for(entitled, layout.version)
            assert service.quota_us is None
            budget = admin.get("/api/decisions").json()["budget"]
            assert budget["entitlement_cores"] == {"api": pytest.approx(entitled)}
            # below every CPU the replicas run on the budget's own (the highest-numbered)
            allowed = sorted(os.sched_getaffinity(0))
            pinned = allowed[-2:] if len(allowed) > 2 and cpuset_usable() else None
            assert budget["pinned_cpus"] == pinned
        else:
            budget = admin.get("/api/decisions").json()["budget"]
            assert budget["entitlement_cores"] == {}
            assert budget["pinned_cpus"] is None

        # Load: more requests in flight than one replica's target -> more replicas and/or CPU.
        failures: list[str] = []
        stop = threading.Event()

        def client_loop() -> None:
            with httpx.Client(base_url=gw.url, timeout=60) as c:
                while not stop.is_set():
                    r = c.get("/work?cpu_ms=50")
                    if r.status_code != 200:
                        failures.append(f"{r.status_code} {r.text}")

        threads = [threading.Thread(target=client_loop) for _ in range(8)]
        for t in threads:
            t.start()
        try:
            grew = wait_until(
                lambda: (
                    len(limits(holder)) > 1
                    or any(decided(k, v) > 0.25 + tol for k, v in limits(holder).items())
                ),
                timeout_s=40,
            )
            seen = limits(holder)
        finally:
            stop.set()
            for t in threads:
                t.join(60)
        assert grew, f"neither replicas nor CPU grew under load: {seen}\n{gw.output()[-3000:]}"
        assert failures == []
        assert sum(decided(k, v) for k, v in seen.items()) <= 2.0 + tol * len(seen)
        assert all(0.2 - tol <= decided(k, v) <= 0.6 + tol for k, v in seen.items())
        assert all(capped(k, v) for k, v in seen.items())
        assert len(pids_with_marker(marker)) >= 1
    finally:
        admin.close()
        gw.signal(signal.SIGTERM)
        code = gw.wait(30)
    assert code == 0, gw.output()[-3000:]
    # Every replica stopped with Sluice, and its cgroups are gone.
    assert wait_until(lambda: pids_with_marker(marker) == [], timeout_s=10)
    assert not parent.exists()


@needs_cgroups
def test_sluice_killed_takes_its_replicas_with_it(tmp_path: Path) -> None:
    marker = uuid.uuid4().hex
    gw = Gateway(local_config(marker), tmp_path / "local.yaml")
    try:
        with httpx.Client(base_url=gw.url, timeout=30) as client:
            assert wait_until(lambda: client.get("/healthz").status_code == 200, timeout_s=30)
        replicas = pids_with_marker(marker)
        assert replicas
    finally:
        gw.signal(signal.SIGKILL)
        gw.wait(30)
    assert wait_until(lambda: pids_with_marker(marker) == [], timeout_s=10)
    # A killed Sluice leaves its (now empty) cgroup; the next start sweeps it. Do it here.
    layout = detect_layout(Path("/proc/self/mountinfo").read_text())
    sweep_stale(layout)
    assert not (layout.cpu_root / parent_name_for(gw.pid)).exists()
