"""``sluice run --log-format json --log-level debug`` as a user runs it: every line on stderr is
one JSON object, replica output carries the replica's name, the scaler logs every tick at
DEBUG and a changed decision at INFO."""

from __future__ import annotations

import json
import re
import sys
import uuid
from pathlib import Path

import yaml

from tests.e2e.test_local_demo import service
from tests.support.processes import Process
from tests.support.procs import pids_with_marker, wait_until


def test_json_logs_with_replica_names_and_scaler_ticks(tmp_path: Path) -> None:
    marker = uuid.uuid4().hex
    config = {
        "listen": {"host": "127.0.0.1", "port": 0},
        "admin": {"host": "127.0.0.1", "port": 0},
        "platform": "local",
        "budget": {"cpu": 1},
        "services": {
            "api": service("/api", marker, {"target": 4, "min_replicas": 1, "max_replicas": 1}),
        },
    }
    path = tmp_path / "sluice.yaml"
    path.write_text(yaml.safe_dump(config))
    gw = Process(
        [
            sys.executable,
            "-m",
            "gateway",
            "run",
            "--config",
            str(path),
            "--log-format",
            "json",
            "--log-level",
            "debug",
        ],
        re.compile(r"sluice listening"),
    )
    try:

        def records() -> list[dict[str, object]]:
            return [json.loads(line) for line in list(gw.stderr_lines)]

        def seen_all() -> bool:
            # The replica writes stdout and stderr, read apart: wait for its listening line,
            # not only its first line.
            rs = records()
            return (
                any("demo: listening" in str(r["message"]) for r in rs if r.get("replica"))
                and any(str(r["message"]).startswith("scaler tick api:") for r in rs)
                and any(str(r["message"]).startswith("scaler decision api:") for r in rs)
            )

        assert wait_until(seen_all, timeout_s=30), (
            [r for r in records() if r.get("replica")],
            gw.output()[-3000:],
        )
        rs = records()
        replica = next(r for r in rs if "demo: listening" in str(r["message"]))
        name = str(replica["replica"])
        assert re.fullmatch(r"api-\d+", name), replica
        assert replica["message"] == f"[{name}] {replica['message'].split('] ', 1)[1]}"
        assert replica["service"] == "api" and replica["stream"] == "stderr"
        tick = next(r for r in rs if str(r["message"]).startswith("scaler tick api:"))
        assert tick["level"] == "debug" and tick["service"] == "api"
        changed = next(r for r in rs if str(r["message"]).startswith("scaler decision api:"))
        assert changed["level"] == "info" and changed["rule"]
    finally:
        gw.stop()
        assert wait_until(lambda: pids_with_marker(marker) == [], timeout_s=10)
