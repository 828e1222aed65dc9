"""Several processes' counters merged (``workers: N``) equal one process that saw every request;
the concurrency integral is every request's time in the gateway."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.dataplane.stats import ServiceStats

# (worker, arrival time, latency, status, completes)
Request = tuple[int, float, float, int, bool]

requests = st.lists(
    st.tuples(
        st.integers(0, 2),
        st.floats(0, 40, allow_nan=False),
        st.floats(0, 3, allow_nan=False),
        st.sampled_from([200, 404, 503]),
        st.booleans(),
    ),
    max_size=60,
)


def feed(stats: ServiceStats, reqs: list[Request]) -> None:
    """Arrivals and completions in time order (as one event loop sees them)."""
    events: list[tuple[float, int, int, float]] = []  # (time, 0 arrive | 1 complete, ...)
    for _, at, latency, status, completes in reqs:
        events.append((at, 0, 0, 0.0))
        if completes:
            events.append((at + latency, 1, status, latency))
    for at, kind, status, latency in sorted(events):
        if kind == 0:
            stats.arrive(at)
        else:
            stats.complete(status, latency, at)


@given(requests, st.floats(0, 15, allow_nan=False))
def test_merged_workers_equal_one_process(reqs: list[Request], later_s: float) -> None:
    now = max((r[1] + r[2] for r in reqs), default=0.0) + later_s  # read after the last
    whole = ServiceStats("svc")
    feed(whole, reqs)
    parts = []
    for w in range(3):
        part = ServiceStats("svc")
        feed(part, [r for r in reqs if r[0] == w])
        parts.append(part.state())
    merged = ServiceStats.merged("svc", parts)
    # The concurrency integral: every request's time in the gateway up to now, summed.
    spent = sum(
        min(at + latency, now) - at if completes else now - at
        for _, at, latency, _, completes in reqs
    )
    for stats in (whole, merged):
        area = stats.snapshot(now).concurrency_seconds_total
        assert area == pytest.approx(spent, rel=1e-9, abs=1e-9)
    assert merged.arrivals_total == whole.arrivals_total
    assert merged.in_flight == whole.in_flight
    assert merged.codes == whole.codes
    assert merged.errors_total == whole.errors_total
    assert merged.latency_counts == whole.latency_counts
    assert merged.rps(now) == whole.rps(now)
    assert merged.recent_latency_counts(now) == whole.recent_latency_counts(now)


def test_a_retired_worker_keeps_its_counts_but_not_its_gauges() -> None:
    live, gone = ServiceStats("svc"), ServiceStats("svc")
    for s in (live, gone):
        s.arrive(10.0)
        s.arrive(10.5)
        s.complete(200, 0.01, 10.6)
    merged = ServiceStats.merged("svc", [live.state(), gone.state().retired(11.0)])
    # the dead worker's request counts in the concurrency integral until it died (11.0)
    area = merged.snapshot(12.0).concurrency_seconds_total
    assert area == pytest.approx((0.6 + 1.5) + (0.6 + 0.5))  # 10.0-10.6 and 10.5-12 (11)
    assert merged.arrivals_total == 4
    assert merged.in_flight == 1  # the dead worker's request in flight is over
    assert merged.codes == {200: 2}
    assert merged.rps(11.0) == 4 / merged.rate_window_s
