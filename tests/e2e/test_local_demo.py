"""The demo as a user drives it: `sluice load`, `sluice top --once`, and reclaim under load.

Everything is started from the CLI (``python -m gateway ...``) with small local configs on
free ports; the checks read what a user reads: the commands' output, the admin API, the
cgroup files and the HTTP answers.
"""

from __future__ import annotations

import random
import re
import signal
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from typing import Any

import httpx

from gateway.platforms.local.cgroup_parent import parent_name_for
from gateway.platforms.local.cgroups import ReplicaCgroup, detect_layout
from tests.support.localpool import REPLICA_USER_FIELDS, ROOT, needs_cgroups
from tests.support.processes import Gateway
from tests.support.procs import MARKER_VAR, pids_with_marker, wait_until

_STARTS_TAKEN: set[int] = set()


def service(prefix: str, marker: str, scaling: dict[str, Any], cpu_ms: int = 5) -> dict[str, Any]:
    # A port range of its own: two services of one config drawing the same range is a config
    # error (overlapping port_range), so never hand out a start twice in this process.
    start = random.choice([s for s in range(20000, 60000, 100) if s not in _STARTS_TAKEN])
    _STARTS_TAKEN.add(start)
    return {
        "routes": [{"path": prefix, "path_type": "Prefix"}],
        "replicas": {
            "command": ["{python}", "-m", "gateway.tools.demo", "--port", "{port}"],
            "port_range": [start, start + 20],
            "env": {MARKER_VAR: marker, "PYTHONPATH": str(ROOT), "DEMO_CPU_MS": str(cpu_ms)},
            "grace_s": 5,
            **REPLICA_USER_FIELDS,
        },
        "limits": {"queue": {"max": 200, "timeout_s": 60}},
        "scaling": scaling,
    }


def run_cli(*args: str, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def stop(gw: Gateway, marker: str) -> None:
    gw.signal(signal.SIGTERM)
    code = gw.wait(30)
    assert code == 0, gw.output()[-3000:]
    # Stop leaves no child process behind.
    assert wait_until(lambda: pids_with_marker(marker) == [], timeout_s=10)


@needs_cgroups
def test_sluice_load_and_sluice_top_as_a_user_reads_them(tmp_path: Path) -> None:
    marker = uuid.uuid4().hex
    config = {
        "platform": "local",
        "budget": {"cpu": 2},
        "services": {
            "api": service("/api", marker, {"target": 4, "min_replicas": 1, "max_replicas": 2}),
            "reports": service(
                "/reports", marker, {"target": 2, "min_replicas": 0, "max_replicas": 2}
            ),
        },
    }
    gw = Gateway(config, tmp_path / "demo.yaml")
    try:
        load = run_cli(
            "load",
            "--config",
            str(gw.config_path),
            "--target",
            f"{gw.host}:{gw.port}",
            "--duration",
            "4",
            "--rps",
            "10",
            "--burst-rps",
            "10",
            "--burst-s",
            "2",
            "--period-s",
            "10",
            "--first-burst-s",
            "1",
            "--json",
            str(tmp_path / "load.json"),
        )
        assert load.returncode == 0, load.stderr
        out = load.stdout
        assert "api: steady 10 rps on /api/load" in out
        assert "reports: bursts of 10 rps for 2s every 10s (first at 1s) on /reports/load" in out
        rows = {
            line.split()[0]: line.split()
            for line in out.splitlines()
            if line.split() and line.split()[0] in ("service", "api", "reports")
        }
        assert rows["service"][:8] == [
            "service",
            "requests",
            "ok",
            "lost",
            "skipped",
            "ok/s",
            "p50",
            "p99",
        ]
        # 4 s at 10 rps, and a 2 s burst at 10 rps (reports scaled from zero for it).
        assert rows["api"][1:4] == ["40", "40", "0"], out
        assert rows["reports"][1:4] == ["20", "20", "0"], out
        assert rows["api"][-1] == "200:40" and rows["reports"][-1] == "200:20"

        top = run_cli("top", "--once", "--admin", gw.admin_url)
        assert top.returncode == 0, top.stderr
        frame = top.stdout
        assert re.search(r"budget \d+\.\d\d of 2 CPU allocated \(shared, applied\)", frame), frame
        for column in (
            "service",
            "rps",
            "err%",
            "in flight",
            "queued",
            "p99",
            "replicas",
            "cpu/replica",
            "budget share",
            "last decision",
        ):
            assert column in frame, (column, frame)
        api_row = next(line for line in frame.splitlines() if "│ api " in line)
        cells = [c.strip() for c in api_row.strip("│ ").split("│")]
        assert cells[0] == "api"
        assert cells[2] == "0.0"  # err%: no request failed
        ready, decided = cells[6].split("/")
        assert int(ready) >= 1 and int(decided) >= 1  # ready / decided replicas
        assert float(cells[7]) > 0  # CPU per replica
        assert "%" in cells[8]  # its budget share
        assert cells[9] and cells[9] != "-"  # the last decision's rule and reason
        assert any("│ reports " in line for line in frame.splitlines())
    finally:
        stop(gw, marker)


@needs_cgroups
def test_reclaim_lowers_the_borrowers_cpu_without_failing_its_in_flight_requests(
    tmp_path: Path,
) -> None:
    marker = uuid.uuid4().hex
    config = {
        "platform": "local",
        "budget": {"cpu": 2, "enforcement": "limit"},
        "services": {
            "api": service(
                "/api",
                marker,
                {
                    "target": 1,
                    "min_replicas": 1,
                    "max_replicas": 1,
                    "cpu": {"min": 0.1, "max": 1.6, "request": 0.5},
                    "guaranteed_cpu": 0.5,
                },
            ),
            "reports": service(
                "/reports",
                marker,
                {
                    "target": 1,
                    "min_replicas": 1,
                    "max_replicas": 1,
                    "cpu": {"min": 0.1, "max": 1.0, "request": 0.25},
                    "guaranteed_cpu": 1.0,
                },
            ),
        },
    }
    layout = detect_layout(Path("/proc/self/mountinfo").read_text())
    gw = Gateway(config, tmp_path / "reclaim.yaml")
    parent = layout.cpu_root / parent_name_for(gw.pid)

    def api_cores() -> float:
        """api's decided CPU: its replica's quota (budget.enforcement: limit)."""
        try:
            return ReplicaCgroup(layout, parent / "api-0", None).read_limit().cores or 0.0
        except (OSError, ValueError):
            return 0.0

    answers: dict[str, list[int]] = {"api": [], "reports": []}
    halt = {"api": threading.Event(), "reports": threading.Event()}

    def client(name: str, cpu_ms: int) -> None:
        with httpx.Client(base_url=gw.url, timeout=120) as c:
            while not halt[name].is_set():
                answers[name].append(c.get(f"/{name}/w?cpu_ms={cpu_ms}").status_code)

    threads: list[threading.Thread] = []
    clients: list[httpx.Client] = []
    try:
        with httpx.Client(base_url=gw.url, timeout=30) as c:
            assert wait_until(lambda: c.get("/api/x").status_code == 200, timeout_s=30)
        # reports must stay idle until its load starts (a warm-up request would already give it
        # its share, leaving nothing to reclaim): wait for its replica through the admin API.
        with httpx.Client(base_url=gw.admin_url, timeout=10) as a:

            def reports_routable() -> bool:
                services = a.get("/api/services").json()["services"]
                return any(e["routable"] for e in services["reports"]["endpoints"])

            assert wait_until(reports_routable, timeout_s=30)
        # api alone is busy: it borrows the CPU reports does not use (beyond its fair share 1.0).
        threads = [threading.Thread(target=client, args=("api", 200)) for _ in range(4)]
        for t in threads:
            t.start()
        assert wait_until(lambda: api_cores() > 1.0 + 1e-6, timeout_s=40), (
            f"api never borrowed: {api_cores()}\n{gw.output()[-3000:]}"
        )
        borrowed = api_cores()
        # reports gets busy: its guarantee is reclaimed from api in place (same replica).
        api_pids = pids_with_marker(marker)
        more = [threading.Thread(target=client, args=("reports", 100)) for _ in range(4)]
        threads += more
        for t in more:
            t.start()
        admin = httpx.Client(base_url=gw.admin_url, timeout=10)
        clients.append(admin)

        def reclaimed_from_api() -> bool:
            recent = admin.get(
                "/api/decisions", params={"service": "reports", "limit": "256"}
            ).json()["recent"]
            return any(
                any("reclaimed" in line and "api" in line for line in d["reasons"]) for d in recent
            )

        assert wait_until(reclaimed_from_api, timeout_s=40, pause_s=0.2), gw.output()[-3000:]
        # reports now holds its guarantee (1.0 of 2): api's replica is down to the rest.
        assert wait_until(lambda: api_cores() <= 1.0 + 1e-6, timeout_s=40), (
            f"api kept {api_cores()} cores\n{gw.output()[-3000:]}"
        )
        reclaimed = api_cores()
        admin.close()
        halt["reports"].set()
        halt["api"].set()
        for t in threads:
            t.join(120)
        # The reclaimed replica kept running (limits change in place) and every request it
        # had in flight, before, during and after the reclaim, was answered.
        assert set(api_pids) <= set(pids_with_marker(marker))
        assert answers["api"] and set(answers["api"]) == {200}, answers["api"]
        assert answers["reports"] and set(answers["reports"]) == {200}
        assert reclaimed < borrowed
    finally:
        for client in clients:
            client.close()
        for e in halt.values():
            e.set()
        for t in threads:
            t.join(120)
        stop(gw, marker)


@needs_cgroups
def test_sluice_run_without_config_runs_the_demo_from_config_dir(tmp_path: Path) -> None:
    """`sluice run` with no --config in a directory holding config/sluice.yaml runs it: the
    shipped demo (ports moved to free ones, so the test binds nothing fixed)."""
    import os

    import yaml

    demo = yaml.safe_load((ROOT / "config" / "sluice.yaml").read_text())
    demo["listen"]["port"] = 0
    demo["admin"]["port"] = 0
    marker = uuid.uuid4().hex
    starts = random.sample(range(20000, 60000, 100), len(demo["services"]))  # distinct
    for svc, start in zip(demo["services"].values(), starts, strict=True):
        svc["replicas"]["port_range"] = [start, start + 20]
        svc["replicas"]["env"] = {**svc["replicas"]["env"], MARKER_VAR: marker}
        svc["replicas"].update(REPLICA_USER_FIELDS)
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "sluice.yaml").write_text(yaml.safe_dump(demo))
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway", "run"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"},
    )
    lines: list[str] = []
    ready = threading.Event()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if Gateway.LINE.search(line):
                ready.set()
        ready.set()

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        assert ready.wait(60), "".join(lines)
        m = next(m for line in lines if (m := Gateway.LINE.search(line)))
        url, admin = m.group(1), m.group(2)
        with httpx.Client(base_url=url, timeout=60) as c:
            assert wait_until(lambda: c.get("/api/hello").status_code == 200, timeout_s=30)
            assert c.get("/reports/q1").status_code == 200  # held, then answered from zero
        assert any("config config/sluice.yaml" in line for line in lines), "".join(lines)
        latest = httpx.get(f"{admin}/api/decisions", timeout=10).json()["latest"]
        assert set(latest) == {"api", "reports"}
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(30)
        reader.join(5)
        assert proc.stdout is not None
        proc.stdout.close()
    assert code == 0, "".join(lines)[-3000:]
    assert wait_until(lambda: pids_with_marker(marker) == [], timeout_s=10)
