"""ServiceStats' windows against a naive model that keeps every event (monotonic clock).

The hot path records arrivals per second and latencies per window with one comparison per
call (the ring and the windows move once per second / window); whatever the spacing of
events, the rate and the recent latency histogram must equal what counting every event
gives.
"""

from __future__ import annotations

from bisect import bisect_left

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.dataplane.stats import ServiceStats
from scaler.signals import LATENCY_BUCKETS_S

# (gap to the previous event in seconds, is an arrival, latency of a completion)
EVENTS = st.lists(
    st.tuples(
        st.one_of(st.floats(0, 0.3), st.floats(0, 3), st.floats(0, 40)),
        st.booleans(),
        st.floats(0, 70),
    ),
    max_size=120,
)


def naive_rps(arrivals: list[float], now: float, window_s: int) -> float:
    sec = int(now)
    return sum(1 for t in arrivals if sec - window_s <= int(t) < sec) / window_s


def naive_recent(done: list[tuple[float, float]], now: float, window_s: float) -> list[int]:
    counts = [0] * (len(LATENCY_BUCKETS_S) + 1)
    if not done:
        return counts
    last = int(done[-1][0] / window_s)  # the window of the latest completion
    epoch = int(now / window_s)
    if epoch == last:
        keep = {last, last - 1}
    elif epoch == last + 1:
        keep = {last}
    else:
        keep = set()
    for t, latency in done:
        if int(t / window_s) in keep:
            counts[bisect_left(LATENCY_BUCKETS_S, latency)] += 1
    return counts


@settings(max_examples=300, deadline=None)
@given(
    events=EVENTS,
    rate_window_s=st.sampled_from([1, 3, 10]),
    latency_window_s=st.sampled_from([0.1, 0.5, 1.0, 10.0]),
    start=st.floats(0, 1000),
    ahead=st.floats(0, 30),
)
def test_rate_and_recent_latency_equal_counting_every_event(
    events: list[tuple[float, bool, float]],
    rate_window_s: int,
    latency_window_s: float,
    start: float,
    ahead: float,
) -> None:
    stats = ServiceStats("s", rate_window_s, latency_window_s)
    arrivals: list[float] = []
    done: list[tuple[float, float]] = []
    now = start
    for gap, arrival, latency in events:
        now += gap
        if arrival:
            stats.arrive(now)
            arrivals.append(now)
        else:
            stats.complete(200, latency, now)
            done.append((now, latency))
        for q in (now, now + ahead):
            assert stats.rps(q) == naive_rps(arrivals, q, rate_window_s)
            assert stats.recent_latency_counts(q) == naive_recent(done, q, latency_window_s)
    assert stats.arrivals_total == len(arrivals)
    assert sum(stats.latency_counts) == len(done)
