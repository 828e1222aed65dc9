"""cpu_utilization on Kubernetes (pure parts): CPU quantities and durations as metrics-server
writes them, a service's usage over its Ready pods, and the CPU counter the scaler reads."""

from __future__ import annotations

import math

import pytest

from gateway.platforms.kubernetes.model import (
    Pod,
    PodMetrics,
    parse_cpu_cores,
    parse_duration_s,
    pod_from_json,
    pod_metrics_from_json,
)
from gateway.platforms.kubernetes.pod_metrics import CpuCounter, service_usage
from tests.support.kube_objects import pod


@pytest.mark.parametrize(
    ("quantity", "cores"),
    [
        ("250m", 0.25),
        ("1500000n", 0.0015),
        ("1", 1.0),
        ("0", 0.0),
        ("2.5", 2.5),
        ("1200u", 0.0012),
        ("123456789n", 0.123456789),
        ("1k", 1000.0),
        (" 100m ", 0.1),
    ],
)
def test_cpu_quantities(quantity: str, cores: float) -> None:
    assert parse_cpu_cores(quantity) == pytest.approx(cores)


@pytest.mark.parametrize("quantity", ["", "m", "abc", "1x"])
def test_bad_cpu_quantities(quantity: str) -> None:
    with pytest.raises(ValueError):
        parse_cpu_cores(quantity)


@pytest.mark.parametrize(
    ("window", "seconds"),
    [("15.002s", 15.002), ("1m0s", 60.0), ("500ms", 0.5), ("1h2m3s", 3723.0), ("30s", 30.0)],
)
def test_windows(window: str, seconds: float) -> None:
    assert parse_duration_s(window) == pytest.approx(seconds)


@pytest.mark.parametrize("window", ["15", "s", "1.5x"])
def test_bad_windows(window: str) -> None:
    with pytest.raises(ValueError):
        parse_duration_s(window)


def metrics(name: str, **cpu: str) -> PodMetrics:
    return pod_metrics_from_json(
        {
            "metadata": {"name": name, "namespace": "shop"},
            "timestamp": "2026-11-25T17:00:00Z",
            "window": "15.002s",
            "containers": [
                {"name": c, "usage": {"cpu": q, "memory": "1Mi"}} for c, q in cpu.items()
            ],
        }
    )


def test_pod_metrics_items() -> None:
    m = pod_metrics_from_json(
        {
            "metadata": {"name": "web-1", "namespace": "shop"},
            "timestamp": "2026-11-25T17:00:00Z",
            "window": "15.002s",
            "containers": [
                {"name": "app", "usage": {"cpu": "250m", "memory": "10Mi"}},
                {"name": "proxy", "usage": {"cpu": "1500000n"}},
                {"name": "odd", "usage": {"cpu": "lots"}},
                {"name": "none", "usage": {"memory": "1Mi"}},
            ],
        }
    )
    assert m.window_s == pytest.approx(15.002)
    assert m.cpu_cores == pytest.approx({"app": 0.25, "proxy": 0.0015})


RES = {"requests": {"cpu": "500m"}, "limits": {"cpu": "500m"}}


def pods(*ready: bool) -> list[Pod]:
    return [pod_from_json(pod(f"web-{i}", "web", RES, ready=r)) for i, r in enumerate(ready)]


def test_usage_is_the_main_containers_over_the_ready_pods() -> None:
    ps = pods(True, True, False)
    samples = {
        "web-0": metrics("web-0", app="400m", sidecar="900m"),  # the sidecar is not sized
        "web-1": metrics("web-1", app="200m"),
        "web-2": metrics("web-2", app="500m"),  # not ready: not counted
    }
    usage = service_usage(ps, samples)
    assert usage is not None
    assert usage.cores == pytest.approx(0.6)
    assert (usage.measured, usage.ready) == (2, 2)


def test_a_ready_pod_not_measured_yet_counts_at_the_measured_average() -> None:
    ps = pods(True, True, True, True)
    samples = {"web-0": metrics("web-0", app="300m"), "web-1": metrics("web-1", app="100m")}
    usage = service_usage(ps, samples)
    assert usage is not None
    assert usage.cores == pytest.approx(0.8)  # (0.3 + 0.1) / 2 × 4 ready pods
    assert (usage.measured, usage.ready) == (2, 4)


def test_no_measured_ready_pod_is_no_figure() -> None:
    assert service_usage(pods(True, True), {}) is None
    assert service_usage(pods(False), {"web-0": metrics("web-0", app="1")}) is None


def test_the_counter_integrates_the_figure_in_force_over_the_signals_time() -> None:
    c = CpuCounter()
    first = c.update(10.0, 0.5)
    assert first is not None
    assert c.update(12.0, 0.5) == pytest.approx(first + 1.0)
    assert c.update(13.0, 2.0) == pytest.approx(first + 3.0)


def test_a_stopped_measure_resets_once_then_is_missing_and_resumes_from_zero() -> None:
    c = CpuCounter()
    assert c.update(0.0, None) is None  # never measured: missing
    before = c.update(1.0, 1.0)
    assert before is not None and before > 0
    assert c.update(2.0, None) == 0.0  # a step down: the scaler forgets its rate
    assert c.update(3.0, None) is None
    resumed = c.update(5.0, 0.25)  # as if 0.25 cores had held since the reset at 2.0
    assert resumed is not None and resumed == pytest.approx(0.75)
    assert math.isclose((resumed - 0.0) / (5.0 - 2.0), 0.25)
