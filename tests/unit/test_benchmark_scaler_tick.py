"""benchmarks/scaler_tick.py: the mix it builds, and a tiny run (table and JSON)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    path = ROOT / "benchmarks" / "scaler_tick.py"
    spec = importlib.util.spec_from_file_location("bench_scaler_tick_t", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(("percent", "expected"), [(20, 20), (0, 0), (50, 50), (100, 100)])
def test_the_hpa_share_of_the_mix(bench: ModuleType, percent: int, expected: int) -> None:
    policies = bench.make_policies(100, 7, percent)
    assert sum(p.mode == "hpa" for p in policies.values()) == expected


def test_the_workload_measures_cpu_on_half_and_drops_some_signals(bench: ModuleType) -> None:
    names = [f"svc-{i}" for i in range(400)]
    load = bench.Workload(names, 7)
    assert sum(load.measured.values()) == 200
    seen = [load.signals(float(t)) for t in range(20)]
    missing = sum(len(names) - len(s) for s in seen) / (20 * len(names))
    stale = sum(sig.at < t for t, s in enumerate(seen) for sig in s.values())
    assert 0.01 < missing < 0.05 and stale > 0


def test_a_tiny_run_prints_the_table_and_writes_its_json_where_told(
    bench: ModuleType,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = tmp_path / "tick.json"
    argv = ["scaler_tick.py", "--sizes", "10", "--repeats", "2", "--out", str(out)]
    monkeypatch.setattr(sys, "argv", argv)
    assert bench.main() == 0
    result = json.loads(out.read_text())
    (row,) = result["results"]
    assert row["services"] == 10 and row["sluice_shared_cpu_ms"] > 0
    assert "20 % HPA mode" in result["mix"]
    assert "services |" in capsys.readouterr().out
