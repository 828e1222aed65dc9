"""ServiceStats: counters, sliding rate, latency histogram and the ServiceSignals snapshot."""

from __future__ import annotations

import pytest

from gateway.dataplane.stats import ServiceStats, quantile
from scaler.signals import LATENCY_BUCKETS_S


def test_counts_in_flight_arrivals_and_completions_by_code() -> None:
    s = ServiceStats("api")
    s.arrive(0.1)
    s.arrive(0.2)
    s.arrive(0.3)
    assert (s.in_flight, s.arrivals_total) == (3, 3)
    s.complete(200, 0.01, 0.4)
    s.complete(503, 0.02, 0.5)
    assert s.in_flight == 1
    assert s.codes == {200: 1, 503: 1}
    assert s.completions_by_class() == {"2xx": 1, "5xx": 1}
    assert s.errors_total == 1
    s.complete(200, 0.01, 0.6, failed=True)
    assert s.errors_total == 2
    assert s.completions_total == 3


def test_latency_histogram_uses_prometheus_le_buckets() -> None:
    s = ServiceStats("api")
    for latency in (0.0005, 0.0006, 0.001, 100.0):
        s.arrive(0)
        s.complete(200, latency, 0)
    assert s.latency_counts[0] == 1  # <= 0.0005
    assert s.latency_counts[1] == 2  # <= 0.001
    assert s.latency_counts[len(LATENCY_BUCKETS_S)] == 1  # +Inf
    assert s.latency_sum_s == pytest.approx(100.0021)


def test_rate_over_the_sliding_window_of_whole_seconds() -> None:
    s = ServiceStats("api", rate_window_s=10)
    for sec in range(20):
        for _ in range(sec):  # sec arrivals during second sec
            s.arrive(sec + 0.5)
    # At t=20.2 the window is seconds 10..19: 10+11+...+19 = 145.
    assert s.rps(20.2) == pytest.approx(14.5)
    # The current partial second does not count; long-idle slots expire.
    assert s.rps(25.0) == pytest.approx((15 + 16 + 17 + 18 + 19) / 10)
    assert s.rps(100.0) == 0.0


def test_quantiles_interpolate_within_buckets() -> None:
    counts = [0] * (len(LATENCY_BUCKETS_S) + 1)
    assert quantile(counts, 0.5) is None
    counts[4] = 100  # all in (0.005, 0.01]
    assert quantile(counts, 0.5) == pytest.approx(0.0075)
    assert quantile(counts, 0.99) == pytest.approx(0.005 + 0.005 * 0.99)
    counts[-1] = 1000  # mostly beyond the last bound: reported as the last bound
    assert quantile(counts, 0.99) == LATENCY_BUCKETS_S[-1]


def test_snapshot_reports_recent_latency_only() -> None:
    s = ServiceStats("api", latency_window_s=10)
    for _ in range(50):
        s.arrive(1.0)
        s.complete(200, 0.2, 1.0)
    snap = s.snapshot(5.0, ready_replicas=2)
    assert snap.service == "api"
    assert snap.at == 5.0
    assert snap.arrivals_total == 50
    assert snap.completions_total == 50
    assert snap.in_flight == 0
    assert snap.queued == 0
    assert snap.ready_replicas == 2
    assert snap.latency_p50_s is not None and 0.1 < snap.latency_p50_s <= 0.25
    assert s.snapshot(15.0).latency_p50_s is not None  # previous window still counts
    assert s.snapshot(25.0).latency_p50_s is None  # two windows later: no recent samples
    s.arrive(31.0)
    s.complete(200, 0.002, 31.0)  # a gap of windows resets the previous one
    p50 = s.snapshot(31.0).latency_p50_s
    assert p50 is not None and p50 <= 0.0025


def test_bad_windows_rejected() -> None:
    with pytest.raises(ValueError, match="rate_window_s must be >= 1"):
        ServiceStats("x", rate_window_s=0)
    with pytest.raises(ValueError, match="latency_window_s must be > 0"):
        ServiceStats("x", latency_window_s=0)


def test_the_concurrency_integral_follows_the_requests_and_upgrades() -> None:
    s = ServiceStats("svc")
    assert s.snapshot(5.0).concurrency_seconds_total == 0.0
    s.arrive(10.0)
    s.arrive(10.5)
    assert s.snapshot(11.0).concurrency_seconds_total == pytest.approx(1.0 + 0.5)
    s.complete(200, 1.5, 11.5)  # the first: 1.5 s
    s.upgrade_opened(0.1, 10.6)  # the second became a WebSocket: in flight until it closes
    s.upgrade_closed(14.5)
    snap = s.snapshot(20.0)
    assert snap.in_flight == 0
    assert snap.concurrency_seconds_total == pytest.approx(1.5 + 4.0)
    # a snapshot on a clock the requests were not counted on gives no integral, not a negative
    s.arrive(1000.0)
    assert s.snapshot(20.0).concurrency_seconds_total is None


def test_requests_that_leave_as_they_arrive_integrate_to_zero_not_to_nothing() -> None:
    """The sums cancel: three arrivals and a completion at the same instant, read then, leave
    -8.9e-16 in float64 (found by the merge property test in CI); that is 0, not a wrong
    clock."""
    t = 3.428661043016697
    s = ServiceStats("svc")
    for _ in range(3):
        s.arrive(t)
    s.complete(200, 0.0, t)
    assert s.concurrency_base_s + s.in_flight * t < 0.0  # the rounding, as it happens
    assert s.snapshot(t).concurrency_seconds_total == 0.0
    t = 11.078633114627369  # and with all three gone (nothing in flight to scale by)
    s = ServiceStats("svc")
    for _ in range(3):
        s.arrive(t)
    for _ in range(3):
        s.complete(200, 0.0, t)
    assert s.concurrency_base_s < 0.0
    assert s.snapshot(t).concurrency_seconds_total == 0.0
    s.arrive(1000.0)  # a wrong clock is still told apart
    assert s.snapshot(20.0).concurrency_seconds_total is None
