"""The scenario suite's one command, run as a user runs it, on one scenario."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_one_command_prints_the_table_and_the_verdict_and_writes_json(tmp_path: Path) -> None:
    out, table = tmp_path / "suite.json", tmp_path / "suite.txt"
    done = subprocess.run(
        [
            sys.executable, str(ROOT / "benchmarks" / "scenarios" / "run.py"),
            "--only", "seed-2c-api-reports", "--jobs", "1", "--out", str(out), "--table", str(table),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    verdict = "verdict (Sluice on share, baselines on limit):"
    for text in ("seed-2c-api-reports", "p99 S/I", "best split", "dir/h", verdict):
        assert text in done.stdout
    doc = json.loads(out.read_text())
    (sc,) = doc["scenarios"]
    assert set(sc["runs"]) == {"sluice", "independent", "static", "best_split", "entitled"}
    assert all(m["p99_reactive_entitled_bound_s"] for m in sc["services"].values())
    assert all(m["p99_alone_s"] > 0 for m in sc["services"].values())
    assert {g["goal"] for g in sc["verdict"]} >= {
        "completed >= independent",
        "seed: CPU in contention >= 90 %",
        "seed: short-lived reports p99 >= 10x lower than independent",
    }
    assert verdict in table.read_text()


def write_two_apis(tmp_path: Path) -> None:
    mine = tmp_path / "mine" / "two-apis-2c"
    mine.mkdir(parents=True)
    (mine / "config.yaml").write_text(
        "budget: {cpu: 2}\n"
        "services:\n"
        "  web: {endpoints: ['127.0.0.1:9001'], scaling: {max_replicas: 2, cpu: {max: 1.0}}}\n"
        "  jobs: {endpoints: ['127.0.0.1:9101'], scaling: {max_replicas: 2, cpu: {max: 1.0}}}\n"
    )
    (mine / "workload.yaml").write_text(
        "duration_s: 120\n"
        "services:\n"
        "  web: {slo_s: 0.5, load: [{at_s: 0, rps: 10, cpu_s: 0.05}]}\n"
        "  jobs:\n"
        "    slo_s: 1.0\n"
        "    load: [{at_s: 0, rps: 0, cpu_s: 0.1}]\n"
        "    bursts: [{every_s: 40, for_s: 10, start_s: 10, rps: 10, cpu_s: 0.1}]\n"
    )


def test_a_users_own_scenarios_run_from_their_directory(tmp_path: Path) -> None:
    write_two_apis(tmp_path)
    out = tmp_path / "suite.json"
    run = [sys.executable, str(ROOT / "benchmarks" / "scenarios" / "run.py"), "--jobs", "1"]
    done = subprocess.run(
        [*run, "--dir", str(tmp_path / "mine"), "--out", str(out)],
        cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "two-apis-2c" in done.stdout
    assert [sc["name"] for sc in json.loads(out.read_text())["scenarios"]] == ["two-apis-2c"]

    missing = subprocess.run(
        [*run, "--dir", str(tmp_path / "nowhere")],
        cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert missing.returncode == 2
    assert "--dir" in missing.stderr and "nowhere" in missing.stderr
    assert "not a directory" in missing.stderr


def test_seeds_run_every_scenario_on_more_random_arrivals(tmp_path: Path) -> None:
    write_two_apis(tmp_path)
    out = tmp_path / "suite.json"
    run = [sys.executable, str(ROOT / "benchmarks" / "scenarios" / "run.py"), "--jobs", "1"]
    done = subprocess.run(
        [*run, "--dir", str(tmp_path / "mine"), "--seeds", "2", "--out", str(out)],
        cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "across seeds" in done.stdout
    assert "misses per seed" in done.stdout
    doc = json.loads(out.read_text())
    # the workload's seed (0 by default) is the table's; 1 and 2 are the others
    assert [sc["seed"] for sc in doc["scenarios"]] == [0]
    assert [sc["seed"] for sc in doc["other_seeds"]] == [1, 2]
    assert all(sc["name"] == "two-apis-2c" and sc["verdict"] for sc in doc["other_seeds"])
    arrivals = {sc["seed"]: sc["runs"]["sluice"]["services"]["web"]["completed"] for sc in
                [*doc["scenarios"], *doc["other_seeds"]]}  # fmt: skip
    assert len(set(arrivals.values())) > 1  # other draws, not the same run three times

    bad = subprocess.run(
        [*run, "--dir", str(tmp_path / "mine"), "--seeds", "-1"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert bad.returncode == 2
    assert "--seeds -1: must be 0 or more" in bad.stderr


def test_limit_with_lending_at_ticks_only_is_named_in_the_verdict_and_the_json(
    tmp_path: Path,
) -> None:
    # --lending off: the Kubernetes platform's limit (quota lent by the decisions only).
    write_two_apis(tmp_path)
    run = [sys.executable, str(ROOT / "benchmarks" / "scenarios" / "run.py"), "--jobs", "1"]
    modes = {}
    for lending in ("on", "off"):
        out = tmp_path / f"suite-{lending}.json"
        done = subprocess.run(
            [*run, "--dir", str(tmp_path / "mine"), "--enforcement", "limit",
             "--lending", lending, "--out", str(out)],
            cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        (sc,) = json.loads(out.read_text())["scenarios"]
        modes[lending] = sc["lending"]
        assert f"Sluice on limit (lending {sc['lending']}), baselines on limit" in done.stdout
    assert modes == {"on": "between ticks", "off": "at ticks only"}

    share = tmp_path / "suite-share.json"
    done = subprocess.run(
        [*run, "--dir", str(tmp_path / "mine"), "--lending", "off", "--out", str(share)],
        cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(share.read_text())["scenarios"][0]["lending"] is None
    assert "verdict (Sluice on share, baselines on limit)" in done.stdout

    bad = subprocess.run(
        [*run, "--lending", "sometimes"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert bad.returncode == 2 and "--lending" in bad.stderr


def test_the_kubernetes_platform_measures_late_or_not_and_lends_at_ticks_only(
    tmp_path: Path,
) -> None:
    write_two_apis(tmp_path)
    run = [sys.executable, str(ROOT / "benchmarks" / "scenarios" / "run.py"), "--jobs", "1"]
    said = {
        "kubernetes": ("as on Kubernetes: ", "PodMetrics: 15 s means, polled every 15 s"),
        "kubernetes-without-metrics-server": (
            "as on Kubernetes without metrics-server: ",
            "none",
        ),
    }
    for platform, (prefix, cpu) in said.items():
        out = tmp_path / f"{platform}.json"
        done = subprocess.run(
            [*run, "--dir", str(tmp_path / "mine"), "--platform", platform,
             "--enforcement", "limit", "--out", str(out)],
            cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        (sc,) = json.loads(out.read_text())["scenarios"]
        assert (sc["platform"], sc["lending"]) == (platform, "at ticks only")
        assert sc["cpu_figures"] == cpu
        assert f"{prefix}Sluice on limit (lending at ticks only)" in done.stdout
