"""Bucketed windows and counter rates: whole-second buckets, methods take `now`."""

from __future__ import annotations

import pytest

from scaler.signals import BucketedWindow, CounterRate, ServiceSignals


def test_concurrency_is_in_flight_plus_queued() -> None:
    assert ServiceSignals("a", 0.0, in_flight=3, queued=4).concurrency == 7


def test_empty_window_has_no_average() -> None:
    w = BucketedWindow(60)
    assert w.average(10.0) is None
    assert w.max(10.0) is None


@pytest.mark.parametrize(
    ("records", "now", "window_s", "average", "maximum"),
    [
        # one value per second: plain mean
        ([(0, 10), (1, 20), (2, 30)], 2.0, None, 20.0, 30),
        # several values in one bucket are averaged first, the max keeps the peak
        ([(0.1, 10), (0.9, 30), (1.5, 40)], 1.9, None, 30.0, 40),
        # values older than the window drop out
        ([(0, 100), (5, 10), (6, 20)], 6.0, None, 15.0, 20),
        # a shorter window over the same buckets
        ([(0, 100), (1, 10), (2, 20)], 2.0, 2.0, 15.0, 20),
        # missing seconds are not zeros (no data is not no load)
        ([(0, 10), (3, 20)], 3.0, None, 15.0, 20),
    ],
)
def test_window_average_and_max(
    records: list[tuple[float, float]],
    now: float,
    window_s: float | None,
    average: float,
    maximum: float,
) -> None:
    w = BucketedWindow(5)
    for at, value in records:
        w.record(at, value)
    assert w.average(now, window_s) == pytest.approx(average)
    assert w.max(now, window_s) == maximum


def test_window_forgets_everything_after_a_whole_window_of_silence() -> None:
    w = BucketedWindow(6)
    w.record(0.0, 5.0)
    assert w.average(5.0) == 5.0
    assert w.average(6.0) is None
    assert w.covered_s(6.0) == 0.0


def test_all_zero_window_averages_to_exactly_zero_after_float_churn() -> None:
    w = BucketedWindow(3)
    for t, v in enumerate([0.1, 0.2, 0.7, 0.3, 0.0, 0.0, 0.0]):
        w.record(float(t), v)
    assert w.average(6.0) == 0.0


def test_running_sum_matches_a_recomputation() -> None:
    w = BucketedWindow(10)
    values = [(t * 7919) % 13 / 3 for t in range(200)]
    for t, v in enumerate(values):
        w.record(float(t), v)
        window = values[max(0, t - 9) : t + 1]
        assert w.average(float(t)) == pytest.approx(sum(window) / len(window))


def test_bad_window_is_refused() -> None:
    with pytest.raises(ValueError, match="window_s"):
        BucketedWindow(0)


def test_counter_rate() -> None:
    r = CounterRate()
    assert r.update(0.0, 100) is None
    assert r.update(2.0, 300) == 100.0
    assert r.update(2.0, 300) is None, "no time passed"
    assert r.update(3.0, 10) is None, "counter reset restarts the rate"
    assert r.update(4.0, 30) == 20.0
