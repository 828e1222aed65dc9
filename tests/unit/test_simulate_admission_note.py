"""``sluice simulate`` follows the config's admission limits, and names what it does not follow."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from gateway.cli import main, not_modelled, simulated_admission
from gateway.settings import Settings, load_settings
from scaler.simulate.model import Admission

CONFIG = """\
budget: {cpu: 2}
services:
  api:
    endpoints: ["127.0.0.1:9001"]
    limits:
      concurrency_per_replica: 4
      queue: {max: 20, timeout_s: 2, cold_start_timeout_s: 60}
      rate_limit: {rps: 50}
  hook:
    endpoints: ["127.0.0.1:9101"]
    scaling: {min_replicas: 0, max_replicas: 2}
"""


def settings(tmp_path: Path) -> Settings:
    path = tmp_path / "sluice.yaml"
    path.write_text(CONFIG)
    return load_settings(path)


def test_the_model_follows_each_services_slots_and_queue(tmp_path: Path) -> None:
    assert simulated_admission(settings(tmp_path)) == {
        "api": Admission(4, 20, 2.0, cold_start_timeout_s=60.0, cold_start_max=10000),
        "hook": Admission(None, 100, 10.0, cold_start_timeout_s=300.0, cold_start_max=10000),
    }


def test_what_the_model_does_not_follow_is_named_by_its_key(tmp_path: Path) -> None:
    (rate,) = not_modelled(settings(tmp_path))
    assert rate.startswith("services.api.limits.rate_limit: not modelled") and "429" in rate


def test_on_kubernetes_a_service_at_zero_is_held_as_the_model_holds_it(tmp_path: Path) -> None:
    kube = settings(tmp_path).model_copy(update={"platform": "kubernetes"})
    assert not [line for line in not_modelled(kube) if "services.hook" in line]
    assert not [line for line in not_modelled(kube) if line.startswith("platform")]


def test_a_kubernetes_config_is_simulated_with_cpu_use_as_pod_metrics_serve_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    workload = tmp_path / "load.yaml"
    workload.write_text(
        "duration_s: 60\nservices:\n  api: {slo_s: 1, load: [{at_s: 0, rps: 20, cpu_s: 0.05}]}\n"
    )
    configs = {
        "static": 'platform: static\nbudget: {cpu: 2}\nservices:\n  api: {endpoints: ["127.0.0.1:9001"]}\n',
        "kubernetes": "platform: kubernetes\nbudget: {cpu: 2}\nservices:\n  api: {}\n",
    }
    figures = {}
    for platform, text in configs.items():
        config = tmp_path / f"{platform}.yaml"
        config.write_text(text)
        out = tmp_path / platform
        args = ["simulate", "--config", str(config), "--workload", str(workload)]
        assert main([*args, "--out", str(out), "--no-progress", "--no-plot"]) == 0
        figures[platform] = json.loads((out / "report.json").read_text())["meta"]["cpu_figures"]
        said = capsys.readouterr().out
    assert figures == {
        "static": "cgroups: every tick",
        "kubernetes": "PodMetrics: 15 s means, polled every 15 s",
    }
    assert "CPU use as the scaler sees it: PodMetrics" in said


def test_the_shipped_seed_config_has_nothing_to_say(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = Path(__file__).resolve().parents[2] / "benchmarks" / "workloads"
    args = ["simulate", "--config", str(root / "long_short.config.yaml")]
    args += ["--workload", str(root / "long_short.yaml"), "--duration", "20"]
    assert main([*args, "--out", str(tmp_path), "--no-progress", "--no-plot"]) == 0
    assert "note:" not in capsys.readouterr().err


def test_the_note_goes_to_stderr_after_the_figures(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config, workload = tmp_path / "sluice.yaml", tmp_path / "load.yaml"
    config.write_text(CONFIG)
    workload.write_text(
        "duration_s: 20\nservices:\n  api: {slo_s: 1, load: [{at_s: 0, rps: 5, cpu_s: 0.01}]}\n"
    )
    args = ["simulate", "--config", str(config), "--workload", str(workload)]
    assert main([*args, "--out", str(tmp_path / "out"), "--no-progress", "--no-plot"]) == 0
    captured = capsys.readouterr()
    assert f"sluice simulate: note: {config}: services.api.limits.rate_limit" in captured.err
    assert "rejected (503, admission)" in captured.out


def test_a_balancer_the_model_does_not_follow_is_named(tmp_path: Path) -> None:
    base = settings(tmp_path)
    for balancer in ("round_robin", "peak_ewma"):
        api = base.services["api"].model_copy(update={"balancer": balancer})
        changed = base.model_copy(update={"services": {**base.services, "api": api}})
        lines = [line for line in not_modelled(changed) if ".balancer" in line]
        assert lines == [
            f"services.api.balancer: {balancer}: not modelled: the model sends each request "
            "to the ready replica with the fewest requests in flight (least_request picks the "
            "less loaded of two at random)"
        ]
    assert not [line for line in not_modelled(base) if ".balancer" in line]


def test_requests_slower_than_the_gateways_response_timeout_are_counted_per_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An overloaded service (2 cores offered on 1): its backlog makes requests take
    minutes, which the gateway cuts to a 504 at ``timeouts.response_header_s``; the model
    lets them run, and says how many there were in each run."""
    workload = tmp_path / "load.yaml"
    workload.write_text(
        "duration_s: 120\nservices:\n  api: {slo_s: 1, load: [{at_s: 0, rps: 20, cpu_s: 0.1}]}\n"
    )
    said = {}
    for timeouts in ("", ", timeouts: {response_header_s: 600}"):
        config = tmp_path / "sluice.yaml"
        config.write_text(
            'budget: {cpu: 1}\nservices:\n  api: {endpoints: ["127.0.0.1:9001"]'
            f", scaling: {{max_replicas: 1, cpu: {{min: 1, max: 1}}}}{timeouts}}}\n"
        )
        args = ["simulate", "--config", str(config), "--workload", str(workload)]
        assert main([*args, "--out", str(tmp_path / "out"), "--no-progress", "--no-plot"]) == 0
        said[timeouts] = capsys.readouterr().err
    (line,) = (x for x in said[""].splitlines() if "timeouts.response_header_s" in x)
    assert line.startswith(
        f"sluice simulate: note: {config}: services.api.timeouts.response_header_s: 30 s: "
    )
    counts = re.findall(r"([\d,]+) of (Sluice|independent)'s", line)
    assert [name for _, name in counts] == ["Sluice", "independent"]
    assert all(int(n.replace(",", "")) > 0 for n, _ in counts)
    assert "504 at 30 s" in line
    assert "timeouts" not in said[", timeouts: {response_header_s: 600}"]
