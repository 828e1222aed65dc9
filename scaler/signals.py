"""What the scaler is told each tick: a plain-data snapshot of one service's live load.

The gateway builds these (``gateway.dataplane.stats``); the platform may add CPU figures.  Nothing
here knows where they came from, so the scaler can be fed by a simulator just the same.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

LATENCY_BUCKETS_S: tuple[float, ...] = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
)
"""Upper bounds of the gateway's latency histogram (Prometheus ``le``; one more bucket is
+Inf): the buckets of ``ServiceSignals.latency_counts`` as the data plane and the simulator
report them."""


@dataclass(frozen=True, slots=True)
class ServiceSignals:
    """One service's load at time ``at`` (seconds on the injected clock).

    Counters named ``*_total`` are monotonic since the gateway started; rates and
    windows are derived by the scaler from successive snapshots.
    """

    service: str
    at: float
    in_flight: int = 0
    """Requests forwarded to an upstream and not yet answered."""
    queued: int = 0
    """Requests admitted but waiting in the gateway for a slot or a replica."""
    arrivals_total: int = 0
    completions_total: int = 0
    errors_total: int = 0
    """5xx answers and failed forwards."""
    rps: float = 0.0
    """Arrival rate over the gateway's short sliding window."""
    latency_p50_s: float | None = None
    latency_p99_s: float | None = None
    ready_replicas: int | None = None
    """Endpoints currently routable, if the gateway knows them."""
    cpu_seconds_total: float | None = None
    """CPU consumed by all replicas (cgroup usage), if the platform measures it."""
    cpu_throttled_seconds_total: float | None = None
    """Time the replicas spent throttled by their CPU limit, if measured."""
    app_metrics: dict[str, float] | None = None
    """``app`` metrics (``scaling.metrics``) by name: the service's value now (its replicas'
    last header values combined, or the last push); a metric with no recent value is absent."""
    latency_counts: tuple[int, ...] | None = None
    """The latency histogram since start (monotonic counts per bucket, the last one +Inf),
    when a ``latency`` metric needs it."""
    latency_bounds_s: tuple[float, ...] | None = None
    """Upper bounds (seconds) of ``latency_counts``' buckets but the last."""
    concurrency_seconds_total: float | None = None
    """``concurrency`` integrated over time since the source started (request-seconds), if the
    source keeps it: its increase over the time between two snapshots is the mean
    concurrency between them, which the KPA's windows record."""

    @property
    def concurrency(self) -> int:
        """In flight at the upstreams plus queued in the gateway (the ``concurrency`` metric)."""
        return self.in_flight + self.queued


class BucketedWindow:
    """Values over time in whole ``granularity_s`` buckets, for windowed averages and maxima.

    ``record(now, value)`` adds a value to the bucket holding ``now`` (several values in one
    bucket are averaged).  ``average(now)`` and ``max(now)`` look at the buckets of the last
    ``window_s`` seconds ending at ``now``.  Buckets with no value are *not* counted as zero:
    missing data is not "no load" (a frozen service must not look idle when data returns).

    The configured window is kept as a running sum, so ``record`` and ``average`` are O(1)
    amortised; ``average(now, window_s)`` for a shorter window scans its buckets.
    """

    __slots__ = ("_buckets", "_granularity_s", "_nonzero", "_total", "_window_buckets", "window_s")

    def __init__(self, window_s: float, granularity_s: float = 1.0) -> None:
        if window_s <= 0 or granularity_s <= 0:
            raise ValueError(
                f"window_s and granularity_s must be > 0, got {window_s!r}, {granularity_s!r}"
            )
        self.window_s = window_s
        self._granularity_s = granularity_s
        self._window_buckets = max(1, math.ceil(window_s / granularity_s - 1e-9))
        # Each bucket: [index, sum, count, max]; oldest first.
        self._buckets: deque[list[float]] = deque()
        self._total = 0.0
        """Sum of the bucket means currently held."""
        self._nonzero = 0
        """Buckets whose mean is not zero (an all-zero window averages to exactly 0.0)."""

    def __repr__(self) -> str:
        return (
            f"BucketedWindow(window_s={self.window_s:g}, buckets={len(self._buckets)}, "
            f"total={self._total:.3f})"
        )

    def _index(self, now: float) -> int:
        return math.floor(now / self._granularity_s)

    def _evict(self, newest: int) -> None:
        oldest_kept = newest - self._window_buckets + 1
        buckets = self._buckets
        while buckets and buckets[0][0] < oldest_kept:
            _, total, count, _ = buckets.popleft()
            mean = total / count
            self._total -= mean
            if mean != 0.0:
                self._nonzero -= 1
        if not buckets or self._nonzero == 0:
            self._total = 0.0

    def record(self, now: float, value: float) -> None:
        """Add ``value`` observed at ``now``.  Times must not go backwards by more than a bucket."""
        index = self._index(now)
        buckets = self._buckets
        if buckets and buckets[-1][0] >= index:
            last = buckets[-1]
            old_mean = last[1] / last[2]
            last[1] += value
            last[2] += 1
            last[3] = max(last[3], value)
            new_mean = last[1] / last[2]
            self._total += new_mean - old_mean
            self._nonzero += (new_mean != 0.0) - (old_mean != 0.0)
            return
        buckets.append([index, value, 1, value])
        self._total += value
        if value != 0.0:
            self._nonzero += 1
        self._evict(index)

    def covered_s(self, now: float) -> float:
        """How many seconds of the window ending at ``now`` have data since the first record."""
        self._evict(self._index(now))
        if not self._buckets:
            return 0.0
        first = self._buckets[0][0]
        return (self._index(now) - first + 1) * self._granularity_s

    def average(self, now: float, window_s: float | None = None) -> float | None:
        """Mean of the bucket values in the ``window_s`` (default: the whole window) ending at
        ``now``; ``None`` when no bucket in it has data."""
        newest = self._index(now)
        self._evict(newest)
        buckets = self._buckets
        if not buckets:
            return None
        if window_s is None or window_s >= self.window_s:
            if self._nonzero == 0:
                return 0.0
            return max(0.0, self._total / len(buckets))
        oldest = newest - max(1, math.ceil(window_s / self._granularity_s - 1e-9)) + 1
        total = 0.0
        n = 0
        for bucket in reversed(buckets):
            if bucket[0] < oldest:
                break
            total += bucket[1] / bucket[2]
            n += 1
        return total / n if n else None

    def max(self, now: float, window_s: float | None = None) -> float | None:
        """Largest single value recorded in the window ending at ``now``; ``None`` if none."""
        newest = self._index(now)
        self._evict(newest)
        span = (
            self._window_buckets
            if window_s is None
            else math.ceil(window_s / self._granularity_s - 1e-9)
        )
        oldest = newest - max(1, span) + 1
        best: float | None = None
        for bucket in reversed(self._buckets):
            if bucket[0] < oldest:
                break
            if best is None or bucket[3] > best:
                best = bucket[3]
        return best


class CounterRate:
    """Per-second rate of a monotonic counter from successive ``(now, total)`` readings.

    A counter that goes backwards (the source restarted) restarts the rate; the first reading
    gives no rate.
    """

    __slots__ = ("_at", "_total")

    def __init__(self) -> None:
        self._at: float | None = None
        self._total = 0.0

    def update(self, now: float, total: float) -> float | None:
        """Record a reading; return the rate since the previous one (``None`` if unknown)."""
        at, previous = self._at, self._total
        self._at, self._total = now, total
        if at is None or now <= at or total < previous:
            return None
        return (total - previous) / (now - at)
