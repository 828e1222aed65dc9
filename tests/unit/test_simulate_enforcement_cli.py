"""``sluice simulate --enforcement``, in process, on a short run of the shipped seed scenario."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from gateway.cli import main

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "benchmarks" / "workloads" / "long_short.config.yaml"
WORKLOAD = ROOT / "benchmarks" / "workloads" / "long_short.yaml"


def simulate(out: Path, *extra: str) -> dict[str, object]:
    args = ["simulate", "--config", str(CONFIG), "--workload", str(WORKLOAD)]
    code = main([*args, "--duration", "100", "--out", str(out), "--no-progress", *extra])
    assert code == 0
    report: dict[str, object] = json.loads((out / "report.json").read_text())
    return report


def test_share_from_the_command_line_writes_report_and_png(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = simulate(tmp_path, "--enforcement", "share", "--baseline-enforcement", "share")
    printed = capsys.readouterr().out
    assert report["enforcement"] == "share"
    assert "node model: share enforcement" in printed
    assert "every run on this node model" in printed
    runs = report["runs"]
    assert isinstance(runs, dict) and set(runs) == {"sluice", "independent"}
    series = report["series"]
    assert isinstance(series, dict)
    api, reports = (series["sluice"][s]["used_cores"] for s in ("api", "reports"))
    used = [a + r for a, r in zip(api, reports, strict=True)]
    assert len(used) == 100 and max(used) <= 2 + 1e-6
    # work-conserving: some tick a service used more than its guaranteed CPU
    assert any(
        u > a + 1e-6
        for s in ("api", "reports")
        for u, a in zip(
            series["sluice"][s]["used_cores"], series["sluice"][s]["allocated_cores"], strict=True
        )
    )
    png = (tmp_path / "report.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 10_000


def assert_hard_capped(run: dict[str, dict[str, list[float]]]) -> None:
    """No service of ``run`` used more than it was decided (figures rounded to 1e-6)."""
    for s in ("api", "reports"):
        for u, a in zip(run[s]["used_cores"], run[s]["allocated_cores"], strict=True):
            assert u <= a + 1e-6, (s, u, a)


def test_auto_is_share_for_sluice_and_the_baseline_runs_under_limit(tmp_path: Path) -> None:
    report = simulate(tmp_path)  # the config leaves budget.enforcement at its default (auto)
    assert report["enforcement"] == "share"  # the simulated node is the budget
    assert report["node_models"] == {"sluice": "share", "independent": "limit"}
    assert report["lend_after_idle_s"] == {"sluice": None, "independent": None}
    series = report["series"]
    assert isinstance(series, dict)
    assert_hard_capped(series["independent"])  # the baseline's decided CPU is a hard cap
    # Sluice's replicas use CPU the others leave idle beyond their guaranteed share
    assert any(
        u > a + 1e-6
        for s in ("api", "reports")
        for u, a in zip(
            series["sluice"][s]["used_cores"], series["sluice"][s]["allocated_cores"], strict=True
        )
    )


def test_limit_lends_idle_quota_between_ticks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = simulate(tmp_path, "--enforcement", "limit")
    assert report["enforcement"] == "limit"
    printed = capsys.readouterr().out
    assert "node model: limit enforcement" in printed
    assert "sluice lends the quota of a service idle for 0.02 s" in printed
    assert report["lend_after_idle_s"] == {"sluice": 0.02, "independent": None}
    series = report["series"]
    assert isinstance(series, dict)
    assert_hard_capped(series["independent"])  # the baseline's decided CPU is a hard cap
    # Sluice lends idle quota between ticks: a borrower may use more than its decision, never
    # the services together more than their decisions hold
    sluice = series["sluice"]
    used = [
        a + r for a, r in zip(*(sluice[s]["used_cores"] for s in ("api", "reports")), strict=True)
    ]
    held = [
        a + r
        for a, r in zip(*(sluice[s]["allocated_cores"] for s in ("api", "reports")), strict=True)
    ]
    assert all(u <= h + 2e-6 for u, h in zip(used, held, strict=True))
    assert any(
        u > a + 1e-6
        for u, a in zip(
            series["sluice"]["api"]["used_cores"],
            series["sluice"]["api"]["allocated_cores"],
            strict=True,
        )
    )


def test_lending_can_be_turned_off(tmp_path: Path) -> None:
    config = tmp_path / "no-lending.yaml"
    config.write_text(
        CONFIG.read_text().replace(
            "budget: {cpu: 2}", "budget: {cpu: 2, enforcement: limit, lending: false}"
        )
    )
    args = ["simulate", "--config", str(config), "--workload", str(WORKLOAD), "--duration", "100"]
    assert main([*args, "--out", str(tmp_path / "out"), "--no-progress"]) == 0
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["lend_after_idle_s"] == {"sluice": None, "independent": None}
    assert_hard_capped(report["series"]["sluice"])  # nothing lent: the decision is a cap


def test_a_bad_enforcement_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(
            [
                "simulate",
                "--config",
                str(CONFIG),
                "--workload",
                str(WORKLOAD),
                "--enforcement",
                "soft",
            ]
        )
    assert exited.value.code == 2
    assert "invalid choice: 'soft'" in capsys.readouterr().err


def test_the_baseline_can_run_on_another_node_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Sluice under share against pods with limits = requests (the baseline under limit)."""
    report = simulate(tmp_path, "--enforcement", "share", "--baseline-enforcement", "limit")
    printed = capsys.readouterr().out
    assert report["enforcement"] == "share"
    assert report["node_models"] == {"sluice": "share", "independent": "limit"}
    assert "runs on different node models" in printed
    series = report["series"]
    assert isinstance(series, dict)

    def borrowed(run: str) -> bool:
        return any(
            u > a + 1e-6
            for s in ("api", "reports")
            for u, a in zip(
                series[run][s]["used_cores"], series[run][s]["allocated_cores"], strict=True
            )
        )

    # Sluice's replicas use idle CPU beyond their guarantee; the baseline's never exceed
    # their hard caps.
    assert borrowed("sluice")
    assert not borrowed("independent")


def test_the_figures_are_a_summary_and_a_zoom(tmp_path: Path) -> None:
    report = simulate(tmp_path)
    for name in ("report.png", "zoom.png"):
        png = (tmp_path / name).read_bytes()
        assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 10_000
    runs = report["runs"]
    assert isinstance(runs, dict)
    cdf = runs["sluice"]["services"]["reports"]["latency_cdf_s"]
    assert cdf == sorted(cdf) and len(cdf) == len(report["scenario"]["latency_cdf_levels"])  # type: ignore[index]


def test_without_matplotlib_it_says_how_to_install_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    simulate(tmp_path)
    err = capsys.readouterr().err
    assert "pip install 'sluice[sim]'" in err
    assert (tmp_path / "report.json").is_file()
    assert not (tmp_path / "report.png").exists()


def test_plot_without_matplotlib_fails_at_once_saying_how_to_install_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    args = ["simulate", "--config", str(CONFIG), "--workload", str(WORKLOAD), "--plot"]
    assert main([*args, "--out", str(tmp_path), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "--plot" in err and "pip install 'sluice[sim]'" in err
    assert not (tmp_path / "report.json").exists()  # nothing was run


def test_no_plot_writes_the_json_only(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    simulate(tmp_path, "--no-plot")
    assert (tmp_path / "report.json").is_file()
    assert not (tmp_path / "report.png").exists() and not (tmp_path / "zoom.png").exists()
    assert "sluice[sim]" not in capsys.readouterr().err
