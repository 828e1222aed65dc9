"""Decisions visible on the static platform (recommend-only): /api/decisions, metrics, logs."""

from __future__ import annotations

from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from gateway.platforms.machine import machine_cpu
from tests.support.processes import gateway, upstreams
from tests.support.procs import wait_until
from tests.support.strict_json import ADMIN_JSON_PATHS, strict_json


def test_static_platform_computes_logs_and_exposes_decisions_without_applying_them(
    tmp_path: Path,
) -> None:
    with upstreams("d1", "d2") as ups:
        cfg = {
            "platform": "static",
            "budget": {"cpu": 2},
            "services": {
                "api": {
                    "routes": [{"path": "/"}],
                    "endpoints": [u.address for u in ups],
                    "scaling": {"min_replicas": 1, "max_replicas": 4, "target": 1},
                },
                "idle": {"routes": [{"path": "/idle"}], "endpoints": []},
            },
        }
        with gateway(cfg, tmp_path / "static.yaml") as g:
            admin = httpx.Client(base_url=g.admin_url, timeout=10)
            assert wait_until(
                lambda: admin.get("/api/decisions").json()["ticks"] >= 1, timeout_s=20
            )
            body = admin.get("/api/decisions").json()
            assert body["platform"] == "static" and body["applied"] is False
            # 'idle' has had no traffic: no admin endpoint emits NaN or Infinity for it
            for path in ADMIN_JSON_PATHS:
                answer = admin.get(path)
                assert answer.status_code == 200, (path, answer.text[:200])
                strict_json(answer.text)
            assert set(body["latest"]) == {"api", "idle"}
            api = body["latest"]["api"]
            assert api["replicas"] >= 1 and api["rule"] and api["reasons"]
            assert api["allocated_cores"] == api["replicas"] * api["cpu_per_replica_cores"]
            assert body["budget"]["cpu"] == 2
            # the default, auto: share when the budget (2) is every CPU this machine gives
            auto = "share" if machine_cpu().cores <= 2 else "limit"
            assert body["budget"]["enforcement"] == auto
            assert body["budget"]["lending"] is False  # only the local platform lends
            assert body["recent"], "the first decision of each service is a change"
            # Filter by service; newest first.
            only = admin.get("/api/decisions", params={"service": "api"}).json()
            assert only["recent"] and {d["service"] for d in only["recent"]} == {"api"}
            ats = [d["at"] for d in only["recent"]]
            assert ats == sorted(ats, reverse=True)
            assert set(only["latest"]) == {"api"}
            assert admin.get("/api/decisions", params={"service": "nope"}).status_code == 404
            bad = admin.get("/api/decisions", params={"limit": "0"})
            assert bad.status_code == 400 and "limit" in bad.json()["error"]

            metrics = {
                (s.name, tuple(sorted(s.labels.items()))): s.value
                for f in text_string_to_metric_families(admin.get("/metrics").text)
                for s in f.samples
            }
            assert metrics[("sluice_replicas", (("service", "api"),))] >= 1
            assert ("sluice_cpu_per_replica_cores", (("service", "api"),)) in metrics
            assert ("sluice_budget_cpu_allocated_cores", (("service", "idle"),)) in metrics
            assert metrics[("sluice_budget_cpu_cores", ())] == 2
            assert metrics[("sluice_scaler_decision_applied", ())] == 0
            admin.close()
        # One log line per service whose decision changed, with the rule's reason (the input
        # recap is left to /api/decisions and DEBUG); the endpoints of the config were not
        # touched (recommend-only).
        lines = [line for line in g.output().splitlines() if "scaler decision api:" in line]
        assert lines and "(stable): stable: ceil(" in lines[0], lines
