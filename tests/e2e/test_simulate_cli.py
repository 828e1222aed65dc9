"""`sluice simulate` run as a user runs it, on a short version of the shipped seed scenario."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "benchmarks" / "workloads" / "long_short.config.yaml"
WORKLOAD = ROOT / "benchmarks" / "workloads" / "long_short.yaml"


def sluice(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway", *map(str, args)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )


def test_the_seed_config_passes_check() -> None:
    done = sluice("check", "--config", CONFIG)
    assert done.returncode == 0, done.stderr
    assert "budget 2 CPU" in done.stdout


def test_simulate_writes_report_and_png(tmp_path: Path) -> None:
    done = sluice(
        "simulate", "--config", CONFIG, "--workload", WORKLOAD,
        "--duration", "100", "--out", tmp_path, "--no-progress",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    for text in ("api", "reports", "p99 latency (s)", "time over SLO (s)", "sluice", "independent"):
        assert text in done.stdout
    report = json.loads((tmp_path / "report.json").read_text())
    assert set(report["runs"]) == {"sluice", "independent"}
    assert report["scenario"]["duration_s"] == 100
    for run in report["runs"].values():
        for figures in run["services"].values():
            assert figures["completed"] + figures["unfinished"] == figures["requests"]
        assert 0 < run["budget"]["utilisation"] <= 1
    assert len(report["series"]["sluice"]["api"]["used_cores"]) == 100
    assert report["runs"]["sluice"]["services"]["reports"]["requests"] > 0  # one burst at t=30
    # the burst wakes the scaler before the next regular tick (budget.early_ticks, the default)
    ticks = {name: run["ticks"] for name, run in report["runs"].items()}
    assert ticks["sluice"]["regular"] == 100 and ticks["sluice"]["early"] > 0
    assert ticks["independent"]["early"] == 0
    assert f"sluice: 100 regular ticks, early ticks: {ticks['sluice']['early']}" in done.stdout
    png = (tmp_path / "report.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 10_000


def test_simulate_static_baseline_and_csv_workload(tmp_path: Path) -> None:
    workload = tmp_path / "w.csv"
    workload.write_text("service,at_s,rps,cpu_s,slo_s\napi,0,5,0.1,1\napi,20,10,0.1,1\n")
    done = sluice(
        "simulate", "--config", CONFIG, "--workload", workload, "--baseline", "static",
        "--duration", "40", "--tick", "0.5", "--seed", "4", "--out", tmp_path / "out", "--no-progress",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert set(report["runs"]) == {"sluice", "static"}
    assert report["runs"]["static"]["services"]["reports"]["requests"] == 0
    assert len(report["series"]["time_s"]) == 80


def test_simulate_bad_workload_exits_2_with_key_path(tmp_path: Path) -> None:
    workload = tmp_path / "w.yaml"
    workload.write_text(
        "services:\n  api: {slo_s: -1, load: [{at_s: 0, rps: 1, cpu_s: 0.1}]}\n  nope: {slo_s: 1, load: [{at_s: 0, rps: 1, cpu_s: 0.1}]}\n"
    )
    done = sluice("simulate", "--config", CONFIG, "--workload", workload, "--out", tmp_path)
    assert done.returncode == 2
    assert f"{workload}: services.api.slo_s: must be > 0, got -1" in done.stderr
    workload.write_text("services:\n  nope: {slo_s: 1, load: [{at_s: 0, rps: 1, cpu_s: 0.1}]}\n")
    done = sluice("simulate", "--config", CONFIG, "--workload", workload, "--out", tmp_path)
    assert done.returncode == 2
    assert "the workload names service(s) the config does not have: nope" in done.stderr


def test_the_whole_seed_scenario_meets_its_goals(tmp_path: Path) -> None:
    """The issue's goals on the shipped scenario (an hour, seed 1), as a user runs it:
    reports' p99 >= 10x lower than one HPA per service, api's throughput >= 95 % of it,
    budget utilisation >= 90 % while the services contend."""
    done = sluice(
        "simulate", "--config", CONFIG, "--workload", WORKLOAD, "--out", tmp_path, "--no-progress",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["scenario"]["duration_s"] == 3600
    # Sluice on its default node model (auto: share, the node is the budget), one HPA per
    # service on replicas whose CPU limit is their request
    assert report["node_models"] == {"sluice": "share", "independent": "limit"}
    sluice_run, independent = report["runs"]["sluice"], report["runs"]["independent"]
    p99 = {
        name: run["services"]["reports"]["latency_p99_s"]
        for name, run in (("sluice", sluice_run), ("independent", independent))
    }
    assert p99["independent"] >= 10 * p99["sluice"], p99
    api = (sluice_run["services"]["api"], independent["services"]["api"])
    assert api[0]["throughput_rps"] >= 0.95 * api[1]["throughput_rps"]
    assert sluice_run["budget"]["utilisation_during_contention"] >= 0.9
    assert (tmp_path / "report.png").stat().st_size > 10_000
