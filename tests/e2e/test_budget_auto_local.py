"""``budget.cpu: auto`` on ``platform: local``, run as a user would: under ``taskset -c 0`` the
process may use one core, so the budget is 1 core minus ``reserved``; the parent cgroup is
capped at it, and ``/api/decisions`` and the decisions' reasons say where it came from."""

from __future__ import annotations

import sys
import uuid
from pathlib import Path

import httpx
import pytest
import yaml

from gateway.platforms.local.cgroup_parent import parent_name_for
from gateway.platforms.local.cgroups import ReplicaCgroup, detect_layout
from tests.e2e.test_local_run import local_config
from tests.support.localpool import needs_cgroups
from tests.support.processes import Gateway, Process
from tests.support.procs import wait_until


@needs_cgroups
def test_local_auto_budget_is_the_cpuset_minus_reserved(tmp_path: Path) -> None:
    config = {
        **local_config(uuid.uuid4().hex),
        "listen": {"host": "127.0.0.1", "port": 0},
        "admin": {"host": "127.0.0.1", "port": 0},
    }
    config["budget"] = {"cpu": "auto", "reserved": 0.25}
    path = tmp_path / "auto.yaml"
    path.write_text(yaml.safe_dump(config))
    args = ["taskset", "-c", "0", sys.executable, "-m", "gateway", "run", "--config", str(path)]
    gw = Process(args, Gateway.LINE)
    try:
        assert gw.match is not None
        with httpx.Client(base_url=gw.match.group(2), timeout=10) as admin:
            assert wait_until(
                lambda: admin.get("/api/decisions").json()["ticks"] >= 1, timeout_s=30
            )
            body = admin.get("/api/decisions").json()
            budget = body["budget"]
            assert budget["cpu_config"] == "auto"
            assert budget["source"].startswith("auto: 1 cores in the cpuset")
            assert budget["source"].endswith("minus reserved 0.25")
            if "cgroup quota" not in budget["source"]:  # a container may cap it further
                assert budget["cpu"] == pytest.approx(0.75)
            assert budget["cpu"] <= 0.75
            reason = body["latest"]["api"]["reasons"][-1]
            assert f"of {budget['cpu']:g} from auto: 1 cores in the cpuset" in reason
            layout = detect_layout(Path("/proc/self/mountinfo").read_text())
            parent = layout.cpu_root / parent_name_for(gw.pid)
            quota = ReplicaCgroup(layout, parent, None).read_limit().cores
            assert quota == pytest.approx(budget["cpu"], abs=0.01)
    finally:
        gw.stop()
