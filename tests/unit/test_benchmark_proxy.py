"""benchmarks/proxy.py: wrk output parsing and the ratios it reports (no processes started)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_proxy", ROOT / "benchmarks" / "proxy.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


WRK_OUTPUT = """\
Running 3s test @ http://127.0.0.1:41234/
  1 threads and 50 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency     1.38ms  204.31us   6.11ms   92.80%
    Req/Sec    37.68k     1.02k   39.12k    73.33%
  Latency Distribution
     50%    1.36ms
     75%    1.43ms
     90%    1.52ms
     99%    2.21ms
  112476 requests in 3.00s, 17.81MB read
  Socket errors: connect 0, read 2, write 0, timeout 1
  Non-2xx or 3xx responses: 5
Requests/sec:  37492.12
Transfer/sec:      5.94MB
"""


def test_parse_wrk_reads_rate_percentiles_and_errors(bench: ModuleType) -> None:
    result = bench.parse_wrk(WRK_OUTPUT)
    assert result.requests == 112476
    assert result.duration_s == pytest.approx(3.0)
    assert result.rps == pytest.approx(37492.12)
    assert result.p50_ms == pytest.approx(1.36)
    assert result.p90_ms == pytest.approx(1.52)
    assert result.p99_ms == pytest.approx(2.21)
    assert result.errors == 3
    assert result.non_2xx == 5


def test_parse_wrk_converts_units(bench: ModuleType) -> None:
    text = (
        WRK_OUTPUT.replace("1.36ms", "21.00us")
        .replace("2.21ms", "1.50s")
        .replace("3.00s,", "1.00m,")
    )
    result = bench.parse_wrk(text)
    assert result.p50_ms == pytest.approx(0.021)
    assert result.p99_ms == pytest.approx(1500.0)
    assert result.duration_s == pytest.approx(60.0)


def test_parse_wrk_without_latency_distribution_names_what_is_missing(bench: ModuleType) -> None:
    text = "\n".join(line for line in WRK_OUTPUT.splitlines() if "%" not in line or "Stdev" in line)
    with pytest.raises(ValueError, match=r"lacks 50%, 75%, 90%, 99%"):
        bench.parse_wrk(text)


def _sample(
    bench: ModuleType, target: str, rps: float, c1_p50_ms: float, cpu: float | None
) -> object:
    c50 = bench.WrkResult(
        requests=int(rps), duration_s=1, rps=rps, p50_ms=1, p75_ms=1, p90_ms=1, p99_ms=2
    )
    c1 = bench.WrkResult(
        requests=1000,
        duration_s=1,
        rps=1000,
        p50_ms=c1_p50_ms,
        p75_ms=c1_p50_ms,
        p90_ms=c1_p50_ms,
        p99_ms=c1_p50_ms,
    )
    return bench.Sample(target, c50, c1, proxy_cpu_us_per_request=cpu)


def test_medians_and_ratios(bench: ModuleType) -> None:
    samples = [
        _sample(bench, "direct", 90_000, 0.020, None),
        _sample(bench, "nginx", 40_000, 0.070, 25.0),
        _sample(bench, "sluice", 20_000, 0.120, 50.0),
        _sample(bench, "direct", 100_000, 0.022, None),
        _sample(bench, "nginx", 36_000, 0.072, 27.0),
        _sample(bench, "sluice", 22_000, 0.130, 52.0),
        _sample(bench, "direct", 95_000, 0.021, None),
        _sample(bench, "nginx", 38_000, 0.071, 26.0),
        _sample(bench, "sluice", 24_000, 0.125, 54.0),
    ]
    table = bench.summarise(samples)
    assert table["nginx"]["rps"] == 38_000
    assert table["sluice"]["rps"] == 22_000
    assert table["direct"]["cpu_us_per_request"] is None
    ratios = bench.ratios(table)
    assert ratios["rps_sluice_over_nginx"] == pytest.approx(22 / 38)
    assert ratios["cpu_per_request_sluice_over_nginx"] == pytest.approx(52 / 26)
    # added latency: (0.125 - 0.021) / (0.071 - 0.021)
    assert ratios["c1_added_p50_sluice_over_nginx"] == pytest.approx(0.104 / 0.050)


def test_no_ratios_without_sluice(bench: ModuleType) -> None:
    table = bench.summarise(
        [_sample(bench, "direct", 90_000, 0.02, None), _sample(bench, "nginx", 40_000, 0.07, 25.0)]
    )
    assert bench.ratios(table) == {}


def test_every_flag_the_docs_mention_exists(bench: ModuleType) -> None:
    import re

    docs = (ROOT / "docs" / "benchmarks.md").read_text()
    section = docs.split("## Proxy", 1)[1]
    commands = [
        line for line in section.splitlines() if line.startswith("python benchmarks/proxy.py")
    ]
    options = section.split("Options:", 1)[1].split("\n\n", 1)[0]
    flags = set(re.findall(r"(--[a-z][a-z-]+)", "\n".join([*commands, options])))
    assert flags, "docs/benchmarks.md documents no flags"
    known = {opt for action in bench.build_parser()._actions for opt in action.option_strings}
    assert flags <= known, flags - known


def test_saturation_is_reported(bench: ModuleType) -> None:
    samples = [
        _sample(bench, "direct", 90_000, 0.02, None),
        _sample(bench, "nginx", 40_000, 0.07, 25.0),
        _sample(bench, "sluice", 20_000, 0.12, 50.0),
    ]
    samples[1].proxy_core_utilisation = 0.98
    samples[2].proxy_core_utilisation = 0.97
    assert bench.ratios(bench.summarise(samples))["both_proxies_saturated"] is True
    samples[1].proxy_core_utilisation = 0.25  # something else ran on core 0
    assert bench.ratios(bench.summarise(samples))["both_proxies_saturated"] is False


def test_access_log_ratio(bench: ModuleType) -> None:
    samples = [
        _sample(bench, "direct", 90_000, 0.02, None),
        _sample(bench, "nginx", 40_000, 0.07, 25.0),
        _sample(bench, "sluice", 20_000, 0.12, 50.0),
        _sample(bench, "logged", 19_000, 0.12, 52.5),
    ]
    ratios = bench.ratios(bench.summarise(samples))
    assert ratios["rps_logged_over_sluice"] == pytest.approx(0.95)
    assert ratios["cpu_per_request_logged_over_sluice"] == pytest.approx(1.05)


def test_tls_ratios_compare_like_with_like(bench: ModuleType) -> None:
    table = bench.summarise(
        [
            _sample(bench, "direct", 90_000, 0.020, None),
            _sample(bench, "nginx", 40_000, 0.070, 25.0),
            _sample(bench, "nginx-tls", 30_000, 0.090, 33.0),
            _sample(bench, "nginx-hs", 2_000, 1.000, 500.0),
            _sample(bench, "sluice", 30_000, 0.120, 33.0),
            _sample(bench, "sluice-tls", 20_000, 0.140, 50.0),
            _sample(bench, "sluice-hs", 1_500, 1.200, 650.0),
        ]
    )
    ratios = bench.ratios(table)
    assert ratios["rps_sluice_tls_over_nginx_tls"] == pytest.approx(20 / 30)
    assert ratios["cpu_per_request_sluice_tls_over_nginx_tls"] == pytest.approx(50 / 33)
    assert ratios["rps_sluice_hs_over_nginx_hs"] == pytest.approx(1.5 / 2)
    # added latency against the same direct row: (0.140 - 0.020) / (0.090 - 0.020)
    assert ratios["c1_added_p50_sluice_tls_over_nginx_tls"] == pytest.approx(0.12 / 0.07)
    assert bench._how("sluice-hs") == ("https", True)
    assert bench._how("nginx-tls") == ("https", False)
    assert bench._how("sluice") == ("http", False)


def test_workers_rows_compare_with_nginx_workers_and_one_worker(bench: ModuleType) -> None:
    table = bench.summarise(
        [
            _sample(bench, "direct", 90_000, 0.020, None),
            _sample(bench, "nginx", 40_000, 0.070, 25.0),
            _sample(bench, "sluice", 30_000, 0.120, 33.0),
            _sample(bench, "nginx-w2", 60_000, 0.070, 26.0),
            _sample(bench, "sluice-w2", 45_000, 0.120, 36.3),
        ]
    )
    ratios = bench.ratios(table)
    assert ratios["rps_sluice_w2_over_nginx_w2"] == pytest.approx(45 / 60)
    assert ratios["cpu_per_request_sluice_w2_over_nginx_w2"] == pytest.approx(36.3 / 26)
    assert ratios["cpu_per_request_sluice_w2_over_sluice"] == pytest.approx(36.3 / 33)
    assert ratios["rps_sluice_w2_over_sluice"] == pytest.approx(1.5)
    assert bench.load_core("sluice-w2") == bench.ALL_CORES
    assert bench.load_core("sluice") == bench.LOAD_CORE
