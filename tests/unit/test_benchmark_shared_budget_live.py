"""benchmarks/shared_budget_live.py: its config per enforcement and its contention figures
(no processes started)."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from gateway.settings import parse_settings

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "bench_shared_budget_live", ROOT / "benchmarks" / "shared_budget_live.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def args(**over: float) -> argparse.Namespace:
    values = {
        "budget_cpu": 1.5,
        "duration": 120.0,
        "period_s": 40.0,
        "first_burst_s": 20.0,
        "burst_s": 10.0,
    }
    values.update(over)
    return argparse.Namespace(**values)


@pytest.mark.parametrize("enforcement", ["share", "limit"])
def test_the_scenario_is_a_valid_config_with_the_enforcement(
    bench: ModuleType, enforcement: str
) -> None:
    settings = parse_settings(bench.scenario_config(args(), "shared", enforcement))
    assert settings.budget.enforcement == enforcement
    assert settings.budget.arbitration == "shared"
    assert settings.budget.cpu == 1.5


def test_fixed_size_gives_replicas_one_size_and_no_floor_beyond_min_replicas(
    bench: ModuleType,
) -> None:
    settings = parse_settings(bench.scenario_config(args(fixed_size=True), "shared", "share"))
    sizes = {name: svc.scaling.cpu for name, svc in settings.services.items()}
    assert {n: (c.min, c.max) for n, c in sizes.items()} == {
        "api": (0.5, 0.5),
        "reports": (0.25, 0.25),
    }
    assert all(svc.scaling.guaranteed_cpu is None for svc in settings.services.values())


def test_burst_windows_follow_the_schedule(bench: ModuleType) -> None:
    assert bench.burst_windows(args()) == [(20.0, 30.0), (60.0, 70.0), (100.0, 110.0)]
    assert bench.burst_windows(args(duration=25.0)) == [(20.0, 25.0)]


def test_contention_utilisation_counts_only_intervals_inside_bursts(bench: ModuleType) -> None:
    # 1 core used per second outside the burst, 1.5 (the whole budget) inside it.
    samples = [(0.0, 0.0), (1.0, 1.0), (2.0, 2.5), (3.0, 4.0), (4.0, 5.0)]
    assert bench.contention_utilisation(samples, [(1.0, 3.0)], 1.5) == pytest.approx(1.0)
    assert bench.contention_utilisation(samples, [(0.0, 4.0)], 1.5) == pytest.approx(5 / 6)
    assert bench.contention_utilisation(samples, [(10.0, 20.0)], 1.5) is None
