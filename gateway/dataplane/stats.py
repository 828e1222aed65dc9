"""Live per-service counters, recorded on the hot path and read by the scaler and /metrics.

Hot-path cost (per request): :meth:`ServiceStats.arrive` is two increments, one float
subtraction and one float comparison (the per-second arrival ring is written once per
second, not per arrival); :meth:`ServiceStats.complete` is a dict increment, one ``bisect``
over the latency bounds, two list increments, one float addition and one float comparison.  No locks (single event loop), no
allocation in the steady state.  Everything else — rates, percentiles, ``ServiceSignals`` — is computed at
read time by :meth:`ServiceStats.snapshot`, which takes ``now`` (the event loop's clock).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass

from scaler.signals import LATENCY_BUCKETS_S, ServiceSignals

_AREA_ROUNDING = 1e-9
"""Relative rounding the concurrency integral's sums may carry (far above float64's)."""

DEFAULT_RATE_WINDOW_S = 10
DEFAULT_LATENCY_WINDOW_S = 10.0


def quantile(
    counts: list[int], q: float, bounds: tuple[float, ...] = LATENCY_BUCKETS_S
) -> float | None:
    """The ``q`` quantile of a bucketed histogram (linear within a bucket); None when empty."""
    total = sum(counts)
    if total == 0:
        return None
    rank = q * total
    seen = 0
    for i, n in enumerate(counts):
        if n and seen + n >= rank:
            if i >= len(bounds):
                return bounds[-1]
            lower = bounds[i - 1] if i else 0.0
            return lower + (bounds[i] - lower) * max(rank - seen, 0.0) / n
        seen += n
    return bounds[-1]


@dataclass(frozen=True, slots=True)
class StatsState:
    """Everything :meth:`ServiceStats.merged` needs of one process's counters (plain data,
    sent by each data-plane worker to the main process; ``gateway.workers``)."""

    arrivals_total: int
    in_flight: int
    queued: int
    upgraded: int
    upgrades_total: int
    errors_total: int
    codes: dict[int, int]
    latency_counts: list[int]
    latency_sum_s: float
    seconds: dict[int, int]
    """Arrivals per whole second, for the seconds the rate ring still holds."""
    latency_epoch: int
    latency_current: list[int]
    latency_previous: list[int]
    concurrency_base_s: float = 0.0
    """See :attr:`ServiceStats.concurrency_base_s`."""

    def retired(self, now: float) -> StatsState:
        """The counters of a process that is gone at ``now``: its gauges (in flight, queued,
        upgraded) are 0, its monotonic counts are kept (so merged totals never go back), and
        its requests in flight count in the concurrency integral until ``now``."""
        return StatsState(
            self.arrivals_total,
            0,
            0,
            0,
            self.upgrades_total,
            self.errors_total,
            self.codes,
            self.latency_counts,
            self.latency_sum_s,
            self.seconds,
            self.latency_epoch,
            self.latency_current,
            self.latency_previous,
            self.concurrency_base_s + self.in_flight * now,
        )


class ServiceStats:
    """One service's counters.  ``in_flight`` and ``queued`` are plain attributes."""

    __slots__ = (
        "_lat_current",
        "_lat_end_s",
        "_lat_epoch",
        "_lat_previous",
        "_lat_start_s",
        "_sec",
        "_sec_base",
        "_sec_end_s",
        "_sec_start_s",
        "_slot_count",
        "_slot_sec",
        "arrivals_total",
        "codes",
        "concurrency_base_s",
        "errors_total",
        "in_flight",
        "latency_counts",
        "latency_sum_s",
        "latency_window_s",
        "queued",
        "rate_window_s",
        "service",
        "upgraded",
        "upgrades_total",
    )

    def __init__(
        self,
        service: str,
        rate_window_s: int = DEFAULT_RATE_WINDOW_S,
        latency_window_s: float = DEFAULT_LATENCY_WINDOW_S,
    ) -> None:
        if rate_window_s < 1:
            raise ValueError(f"rate_window_s must be >= 1, got {rate_window_s}")
        if latency_window_s <= 0:
            raise ValueError(f"latency_window_s must be > 0, got {latency_window_s}")
        self.service = service
        self.in_flight = 0
        self.queued = 0
        """Requests waiting in the gateway (admission queue, issue 4); 0 until then."""
        self.arrivals_total = 0
        self.upgraded = 0
        """Upgraded connections (WebSockets) open now; each is also one of ``in_flight``."""
        self.upgrades_total = 0
        self.errors_total = 0
        self.codes: dict[int, int] = {}
        """Completions by HTTP status (499 = the client went away first)."""
        self.latency_counts = [0] * (len(LATENCY_BUCKETS_S) + 1)
        self.latency_sum_s = 0.0
        self.concurrency_base_s = 0.0
        """The concurrency integral less ``in_flight × now``: the time spent by the requests
        that left, less the arrival times of those in flight.  ``concurrency_base_s +
        in_flight × now`` is the request-seconds spent in the gateway since start (in flight
        or queued), kept with one addition per request; it sums across processes that share
        the clock."""
        self.rate_window_s = rate_window_s
        # Arrivals per whole second: the current second's count is arrivals_total minus
        # _sec_base; finished seconds are in a ring of (second, count) slots.
        self._slot_sec = [-1] * (rate_window_s + 1)
        self._slot_count = [0] * (rate_window_s + 1)
        self._sec = -1
        self._sec_base = 0
        self._sec_start_s = self._sec_end_s = -1.0
        self.latency_window_s = latency_window_s
        self._lat_epoch = -1
        self._lat_start_s = self._lat_end_s = -1.0
        """The current latency window is [_lat_start_s, _lat_end_s) (epoch _lat_epoch)."""
        self._lat_current = [0] * (len(LATENCY_BUCKETS_S) + 1)
        self._lat_previous = [0] * (len(LATENCY_BUCKETS_S) + 1)

    # -- hot path -------------------------------------------------------------------------

    def arrive(self, now: float) -> None:
        """A request for this service arrived (and is being forwarded)."""
        self.arrivals_total += 1
        self.in_flight += 1
        self.concurrency_base_s -= now
        if not self._sec_start_s <= now < self._sec_end_s:
            self._arrive_in_other_second(now)

    def complete(self, status: int, latency_s: float, now: float, failed: bool = False) -> None:
        """A request that :meth:`arrive` counted has finished with ``status``.

        ``failed``: the exchange broke after the status was sent (e.g. a truncated body).
        """
        self.in_flight -= 1
        self.concurrency_base_s += now
        codes = self.codes
        try:
            codes[status] += 1
        except KeyError:
            codes[status] = 1
        if failed or status >= 500:
            self.errors_total += 1
        b = bisect_left(LATENCY_BUCKETS_S, latency_s)
        self.latency_counts[b] += 1
        self.latency_sum_s += latency_s
        if not self._lat_start_s <= now < self._lat_end_s:
            self._rotate_latency(int(now / self.latency_window_s))
        self._lat_current[b] += 1

    def upgrade_opened(self, latency_s: float, now: float) -> None:
        """A request that :meth:`arrive` counted got its 101: the handshake's latency is
        recorded now; the connection stays in flight until :meth:`upgrade_closed`."""
        self.upgraded += 1
        self.upgrades_total += 1
        b = bisect_left(LATENCY_BUCKETS_S, latency_s)
        self.latency_counts[b] += 1
        self.latency_sum_s += latency_s
        if not self._lat_start_s <= now < self._lat_end_s:
            self._rotate_latency(int(now / self.latency_window_s))
        self._lat_current[b] += 1

    def upgrade_closed(self, now: float) -> None:
        """An upgraded connection ended at ``now``: it completes (status 101) and leaves
        in-flight."""
        self.upgraded -= 1
        self.in_flight -= 1
        self.concurrency_base_s += now
        self.codes[101] = self.codes.get(101, 0) + 1

    # -- once per second / window ------------------------------------------------------------

    def _arrive_in_other_second(self, now: float) -> None:
        """The arrival just counted is not in the current second: move on (or look back)."""
        sec = int(now)
        if sec < self._sec:  # an earlier second (a clock that went back): count it there
            self._sec_base += 1  # not the current second's
            self._count_second(sec, 1, add=True)
            return
        if self._sec >= 0:  # the current second is finished: into the ring
            self._count_second(self._sec, self.arrivals_total - 1 - self._sec_base)
        self._sec = sec
        self._sec_base = self.arrivals_total - 1  # this arrival is the new second's first
        self._sec_start_s = float(sec)
        self._sec_end_s = float(sec + 1)

    def _count_second(self, sec: int, n: int, add: bool = False) -> None:
        i = sec % len(self._slot_sec)
        if add and self._slot_sec[i] == sec:
            self._slot_count[i] += n
        else:
            self._slot_sec[i] = sec
            self._slot_count[i] = n

    def _rotate_latency(self, epoch: int) -> None:
        if epoch != self._lat_epoch:
            if epoch == self._lat_epoch + 1:
                self._lat_previous = self._lat_current
            else:
                self._lat_previous = [0] * len(self._lat_current)
            self._lat_current = [0] * len(self._lat_current)
            self._lat_epoch = epoch
        self._lat_start_s = epoch * self.latency_window_s
        self._lat_end_s = (epoch + 1) * self.latency_window_s

    # -- read side ------------------------------------------------------------------------

    def rps(self, now: float) -> float:
        """Arrivals per second over the last ``rate_window_s`` whole seconds before ``now``."""
        sec = int(now)
        oldest = sec - self.rate_window_s
        total = 0
        for s, n in zip(self._slot_sec, self._slot_count, strict=True):
            if oldest <= s < sec and s != self._sec:
                total += n
        if oldest <= self._sec < sec:  # the second in progress, finished by ``now``
            total += self.arrivals_total - self._sec_base
        return total / self.rate_window_s

    def recent_latency_counts(self, now: float) -> list[int]:
        """Latency histogram of the current and previous latency windows (up to 2 windows old)."""
        epoch = int(now / self.latency_window_s)
        if epoch == self._lat_epoch:
            return [a + b for a, b in zip(self._lat_current, self._lat_previous, strict=True)]
        if epoch == self._lat_epoch + 1:
            return list(self._lat_current)
        return [0] * len(self._lat_current)

    def completions_by_class(self) -> dict[str, int]:
        """``{"2xx": n, ...}`` for every class seen."""
        out: dict[str, int] = {}
        for code, n in self.codes.items():
            key = f"{code // 100}xx"
            out[key] = out.get(key, 0) + n
        return out

    @property
    def completions_total(self) -> int:
        return sum(self.codes.values())

    def snapshot(
        self,
        now: float,
        ready_replicas: int | None = None,
        app_metrics: dict[str, float] | None = None,
        latency_histogram: bool = False,
    ) -> ServiceSignals:
        """The signals now; ``app_metrics`` and (with ``latency_histogram``) the latency
        histogram since start are added for the services whose ``scaling.metrics`` read them."""
        recent = self.recent_latency_counts(now)
        return ServiceSignals(
            service=self.service,
            at=now,
            in_flight=self.in_flight - self.queued,
            queued=self.queued,
            arrivals_total=self.arrivals_total,
            completions_total=self.completions_total,
            errors_total=self.errors_total,
            rps=self.rps(now),
            latency_p50_s=quantile(recent, 0.5),
            latency_p99_s=quantile(recent, 0.99),
            ready_replicas=ready_replicas,
            app_metrics=app_metrics,
            latency_counts=tuple(self.latency_counts) if latency_histogram else None,
            latency_bounds_s=LATENCY_BUCKETS_S if latency_histogram else None,
            concurrency_seconds_total=self._area(now),
        )

    def _area(self, now: float) -> float | None:
        """The concurrency integral at ``now``: None when ``now`` is not the clock the
        requests were counted on (the integral would be negative); a rounding error's
        negative (the sums cancel: requests that arrived and left at ``now``) is 0."""
        base = self.concurrency_base_s
        area = base + self.in_flight * now
        if area >= 0.0:
            return area
        # the sums' terms are times of the order of ``now``: their rounding is relative to it
        slack = _AREA_ROUNDING * (abs(base) + abs(now) * (self.in_flight + 1))
        return 0.0 if area >= -slack else None

    # -- across processes (``workers: N``) ----------------------------------------------------

    def state(self) -> StatsState:
        """This process's counters as plain data (copies)."""
        seconds = {
            sec: n for sec, n in zip(self._slot_sec, self._slot_count, strict=True) if sec >= 0
        }
        if self._sec >= 0:
            seconds[self._sec] = self.arrivals_total - self._sec_base
        return StatsState(
            self.arrivals_total,
            self.in_flight,
            self.queued,
            self.upgraded,
            self.upgrades_total,
            self.errors_total,
            dict(self.codes),
            list(self.latency_counts),
            self.latency_sum_s,
            seconds,
            self._lat_epoch,
            list(self._lat_current),
            list(self._lat_previous),
            self.concurrency_base_s,
        )

    @classmethod
    def merged(
        cls,
        service: str,
        states: Sequence[StatsState],
        rate_window_s: int = DEFAULT_RATE_WINDOW_S,
        latency_window_s: float = DEFAULT_LATENCY_WINDOW_S,
    ) -> ServiceStats:
        """The counters of several processes as one: counts and gauges summed, arrivals per
        second summed second by second, latency windows aligned on the newest (the processes
        share the monotonic clock, so their seconds and windows line up)."""
        out = cls(service, rate_window_s, latency_window_s)
        seconds: dict[int, int] = {}
        epoch = max((s.latency_epoch for s in states), default=-1)
        for s in states:
            out.arrivals_total += s.arrivals_total
            out.in_flight += s.in_flight
            out.queued += s.queued
            out.upgraded += s.upgraded
            out.upgrades_total += s.upgrades_total
            out.errors_total += s.errors_total
            for code, n in s.codes.items():
                out.codes[code] = out.codes.get(code, 0) + n
            for i, n in enumerate(s.latency_counts):
                out.latency_counts[i] += n
            out.latency_sum_s += s.latency_sum_s
            out.concurrency_base_s += s.concurrency_base_s
            for sec, n in s.seconds.items():
                seconds[sec] = seconds.get(sec, 0) + n
            if s.latency_epoch == epoch:
                for i, n in enumerate(s.latency_current):
                    out._lat_current[i] += n
                for i, n in enumerate(s.latency_previous):
                    out._lat_previous[i] += n
            elif s.latency_epoch == epoch - 1:
                for i, n in enumerate(s.latency_current):
                    out._lat_previous[i] += n
        newest = max(seconds, default=-1)
        for sec, n in seconds.items():
            if sec > newest - len(out._slot_sec):  # the ring's span: no slot shared
                out._count_second(sec, n)
        out._sec_base = out.arrivals_total  # no second in progress: all of them in the ring
        out._lat_epoch = epoch
        return out

    def __repr__(self) -> str:
        return (
            f"ServiceStats({self.service}, in_flight={self.in_flight}, "
            f"arrivals_total={self.arrivals_total}, completions_total={self.completions_total})"
        )
