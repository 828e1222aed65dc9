"""The default config: the demo, in ./config/ and shipped inside the package (kept equal)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway import cli
from gateway.settings import load_settings

ROOT = Path(__file__).resolve().parents[2]


def test_the_packaged_copy_equals_config_sluice_yaml() -> None:
    shipped = cli.packaged_config()
    assert shipped == ROOT / "gateway" / "data" / "sluice.yaml"
    assert shipped.read_bytes() == (ROOT / "config" / "sluice.yaml").read_bytes(), (
        "copy config/sluice.yaml to gateway/data/sluice.yaml"
    )


def test_the_default_config_is_the_local_demo() -> None:
    settings = load_settings(cli.packaged_config())
    assert settings.platform == "local"
    assert settings.budget.cpu == 2
    assert settings.budget.arbitration == "shared"
    assert set(settings.services) == {"api", "reports"}
    api, reports = settings.services["api"], settings.services["reports"]
    assert api.scaling.min_replicas >= 1  # long-lived
    assert reports.scaling.min_replicas == 0  # periodic: scales to zero between bursts
    for service in (api, reports):
        assert service.replicas is not None
        assert service.replicas.command[:3] == ["{python}", "-m", "gateway.tools.demo"]
        assert "{port}" in service.replicas.command
        assert service.limits.queue.max > 0  # requests wait while scaling from zero


def test_no_config_flag_uses_config_dir_when_present_else_the_packaged_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert cli.default_config() == cli.packaged_config()
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "sluice.yaml").write_text("platform: static\n")
    assert cli.default_config() == Path("config/sluice.yaml")


def test_check_without_config_flag_reads_the_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    assert cli.main(["check"]) == 0
    out = capsys.readouterr().out
    assert "sluice.yaml: ok: platform local, 2 service(s), budget 2 CPU (shared)" in out
    assert "api: */api (Prefix)" in out and "reports: */reports (Prefix)" in out
