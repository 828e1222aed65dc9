"""The real ``/metrics`` exposition: valid for ``promtool check metrics`` (Debian's
``prometheus`` package) and carrying the gateway's own series (build info, process and
Python collectors, unmatched requests, config reloads, scaler observed vs target)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.support.processes import gateway, upstreams
from tests.support.procs import wait_until

PROMTOOL = "/usr/bin/promtool"


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }


@pytest.mark.skipif(
    not os.access(PROMTOOL, os.X_OK), reason="promtool not installed (apt-get install prometheus)"
)
def test_the_exposition_passes_promtool_and_has_the_gateways_own_series(tmp_path: Path) -> None:
    with upstreams("m1") as ups:
        cfg = {
            "platform": "static",
            "budget": {"cpu": 2},
            "services": {
                "api": {
                    "routes": [{"path": "/api", "path_type": "Prefix"}],
                    "endpoints": [ups[0].address],
                    "scaling": {"min_replicas": 1, "max_replicas": 3, "target": 2},
                },
            },
        }
        path = tmp_path / "metrics.yaml"
        with gateway(cfg, path) as g:
            with httpx.Client(base_url=g.url, timeout=10) as client:
                assert client.get("/api/x").status_code == 200
                assert client.get("/nowhere").status_code == 404
                assert client.get("/nowhere/else").status_code == 404
            admin = httpx.Client(base_url=g.admin_url, timeout=10)
            assert wait_until(
                lambda: admin.get("/api/decisions").json()["ticks"] >= 1, timeout_s=20
            )
            # One reload that applies a change, one that is rejected.
            changed = {
                **cfg,
                "services": {"api": {**cfg["services"]["api"], "balancer": "peak_ewma"}},
            }
            path.write_text(yaml.safe_dump({**yaml.safe_load(path.read_text()), **changed}))
            assert admin.post("/api/reload").json()["ok"] is True
            path.write_text("services: [not, a, mapping]\n")
            assert admin.post("/api/reload").status_code == 422
            text = admin.get("/metrics").text
            admin.close()
    check = subprocess.run(
        [PROMTOOL, "check", "metrics"],
        input=text,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert check.returncode == 0, check.stdout + check.stderr
    found = samples(text)
    names = {name for name, _ in found}
    assert {"process_cpu_seconds_total", "process_resident_memory_bytes"} <= names
    assert "python_info" in names and "python_gc_collections_total" in names
    build = [labels for name, labels in found if name == "sluice_build_info"]
    assert len(build) == 1 and dict(build[0])["version"]
    assert found[("sluice_unmatched_requests_total", ())] == 2
    assert found[("sluice_config_reloads_total", (("result", "success"),))] == 1
    assert found[("sluice_config_reloads_total", (("result", "failure"),))] == 1
    assert found[("sluice_config_last_reload_successful", ())] == 0
    assert found[("sluice_config_generation", ())] == 2
    assert found[("sluice_config_last_reload_success_timestamp_seconds", ())] > 1.7e9
    api = (("service", "api"),)
    assert found[("sluice_scaler_target", (("metric", "concurrency"), ("service", "api")))] == 2
    assert found[("sluice_scaler_min_replicas", api)] == 1
    assert found[("sluice_scaler_max_replicas", api)] == 3
    assert (
        "sluice_scaler_observed",
        (("metric", "concurrency"), ("service", "api"), ("window", "stable")),
    ) in found
    assert found[("sluice_scaler_leader", ())] == 1
    # Gone: a duplicate of rate(sluice_arrivals_total) and a gauge named like a counter.
    assert "sluice_request_rate_rps" not in names
    assert "sluice_budget_cpu_allocated_total_cores" not in names
