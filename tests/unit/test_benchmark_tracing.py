"""benchmarks/proxy.py --trace-ratio: the traced/untraced ratios it reports (no processes)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_proxy_t", ROOT / "benchmarks" / "proxy.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def sample(bench: ModuleType, target: str, rps: float, cpu: float | None) -> object:
    c50 = bench.WrkResult(
        requests=int(rps), duration_s=1, rps=rps, p50_ms=1, p75_ms=1, p90_ms=1, p99_ms=1
    )
    c1 = bench.WrkResult(
        requests=1000, duration_s=1, rps=1000, p50_ms=0.1, p75_ms=0.1, p90_ms=0.1, p99_ms=0.1
    )
    return bench.Sample(target, c50, c1, proxy_cpu_us_per_request=cpu)


def test_traced_over_untraced_is_reported(
    bench: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    table = bench.summarise(
        [
            sample(bench, "direct", 90_000, None),
            sample(bench, "nginx", 40_000, 25.0),
            sample(bench, "sluice", 20_000, 50.0),
            sample(bench, "traced", 19_400, 51.5),
        ]
    )
    ratios = bench.ratios(table)
    assert ratios["rps_traced_over_sluice"] == pytest.approx(0.97)
    assert ratios["cpu_per_request_traced_over_sluice"] == pytest.approx(1.03)
    bench.print_table(table, ratios)
    out = capsys.readouterr().out
    assert "req/s traced/untraced Sluice (c=50):  0.970  (target >= 0.95: met)" in out


def test_trace_ratio_is_an_option(bench: ModuleType) -> None:
    args = bench.build_parser().parse_args(["--trace-ratio", "0.01"])
    assert args.trace_ratio == 0.01
