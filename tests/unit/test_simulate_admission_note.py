"""``sluice simulate`` says which of the config's admission settings its model does not follow."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.cli import admission_not_modelled, main
from gateway.settings import load_settings

CONFIG = """\
budget: {cpu: 2}
services:
  api:
    endpoints: ["127.0.0.1:9001"]
    limits: {concurrency_per_replica: 4, queue: {max: 20, timeout_s: 2}, rate_limit: {rps: 50}}
  hook:
    endpoints: ["127.0.0.1:9101"]
    scaling: {min_replicas: 0, max_replicas: 2}
  plain:
    endpoints: ["127.0.0.1:9201"]
"""


def test_each_setting_the_model_does_not_follow_is_named_by_its_key(tmp_path: Path) -> None:
    path = tmp_path / "sluice.yaml"
    path.write_text(CONFIG)
    lines = admission_not_modelled(load_settings(path))
    assert len(lines) == 3
    slots, rate, zero = lines
    assert slots.startswith("services.api.limits.concurrency_per_replica: not modelled")
    assert "4 request(s) at once per replica" in slots
    assert "limits.queue (max 20, timeout_s 2)" in slots
    assert rate.startswith("services.api.limits.rate_limit: not modelled") and "429" in rate
    assert zero.startswith("services.hook.scaling.min_replicas: 0")
    assert "(platform local) holds requests in limits.queue (max 100, timeout_s 10)" in zero
    assert not any("services.plain" in line for line in lines)


def test_on_kubernetes_a_service_at_zero_gets_503_at_once(tmp_path: Path) -> None:
    path = tmp_path / "sluice.yaml"
    path.write_text(CONFIG)
    settings = load_settings(path).model_copy(update={"platform": "kubernetes"})
    (zero,) = (line for line in admission_not_modelled(settings) if "services.hook" in line)
    assert "answers 503 (no-endpoints) at once" in zero


def test_the_shipped_seed_config_has_nothing_to_say(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = Path(__file__).resolve().parents[2] / "benchmarks" / "workloads"
    args = ["simulate", "--config", str(root / "long_short.config.yaml")]
    args += ["--workload", str(root / "long_short.yaml"), "--duration", "20"]
    assert main([*args, "--out", str(tmp_path), "--no-progress", "--no-plot"]) == 0
    assert "note:" not in capsys.readouterr().err


def test_the_note_goes_to_stderr_with_the_config_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config, workload = tmp_path / "sluice.yaml", tmp_path / "load.yaml"
    config.write_text(CONFIG)
    workload.write_text(
        "duration_s: 20\nservices:\n  api: {slo_s: 1, load: [{at_s: 0, rps: 5, cpu_s: 0.01}]}\n"
    )
    args = ["simulate", "--config", str(config), "--workload", str(workload)]
    assert main([*args, "--out", str(tmp_path / "out"), "--no-progress", "--no-plot"]) == 0
    err = capsys.readouterr().err
    assert f"sluice simulate: note: {config}: services.api.limits.concurrency_per_replica" in err
