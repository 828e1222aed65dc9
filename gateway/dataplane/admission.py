"""Admission control for one service: rate limit, concurrency slots and a bounded FIFO queue.

A request is admitted in three steps, all on the event loop, none needing a task:

1. **rate limit** (``limits.rate_limit``, aiolimiter's leaky bucket: ``burst`` at once,
   ``rps`` sustained): over the limit -> :class:`RateLimited` (429 + Retry-After);
2. **a concurrency slot** (``limits.concurrency_per_replica`` × ready endpoints): a free one
   is taken at once and :meth:`Admission.admit` returns ``None`` — the uncontended path is
   two comparisons and an increment;
3. otherwise the request **waits in the queue** (``limits.queue``): first in, first out; a
   full queue -> :class:`QueueFull` (503) at once, a wait longer than ``timeout_s`` ->
   :class:`QueueTimeout` (503), both with Retry-After.  When a slot frees (``release``) or
   capacity grows (``set_replicas``) the oldest waiter's ``on_admit(wait_s)`` is called from
   its own loop callback (never nested inside the caller that freed the slot).

**Scale from zero** (:meth:`Admission.hold_at_zero`, for the services the platform names:
every one on ``platform: local``, those with ``min_replicas: 0`` on ``kubernetes``): while a
service has no endpoint at all its capacity is 0, so requests wait in the same bounded queue
instead of getting 503 at once; ``on_hold`` wakes the scaler, and the first ready endpoint
(``set_replicas``) dispatches them in order.  A request that starts waiting then is held
through the cold start: up to ``cold_start_timeout_s`` (default 300 s, Knative's revision
timeout), not ``timeout_s``, since a replica's start-up routinely takes longer than a wait for
a slot should, and up to ``cold_start_max`` of them (default 10,000, the depth of Knative's
activator queue), not ``max``, since a burst's first seconds arrive before any replica can
serve (Knative's activator and KEDA's interceptor hold such requests too).

**Early ticks** (:meth:`Admission.arm_early_wake`): after each scaler tick the service is
armed with its decision's ``wake_concurrency``; the request that takes the concurrency (slots
taken + queued) to that level calls ``on_early_wake`` once (the scaler ticks early, so a burst
gets its CPU at once instead of at the next regular tick).  On the hot path this is one
comparison.

**Busy and idle** (:meth:`Admission.watch_busy`): ``on_busy_change(True)`` is called when the
concurrency (slots taken + queued) leaves 0 and ``on_busy_change(False)`` when it comes back
to 0 — by a release, a queued request abandoned or timed out — never on other changes (the
platform lends an idle service's CPU between ticks and takes it back on the first request,
synchronously, before that request goes on).  On the hot path this is one comparison.

Whoever got a slot (at once or through ``on_admit``) calls :meth:`Admission.release` exactly
once when the request ends.  A client that leaves while queued calls :meth:`abandon`.

The queue depth feeds the live signals (``ServiceStats.queued`` counts towards the scaler's
concurrency) and ``/metrics`` (``sluice_queue_depth{service}``,
``sluice_queue_wait_seconds{service}``, ``sluice_admission_rejected_total{service,cause}``).
Timers come from the event loop (``loop.call_at``), like aiolimiter's clock, so tests step
the loop's clock instead of sleeping.
"""

from __future__ import annotations

import asyncio
import math
from bisect import bisect_left
from collections import deque
from collections.abc import Callable
from typing import Protocol

from aiolimiter import AsyncLimiter

from gateway.dataplane.shared_admission import ADMITTED, FULL, LIMITED, SharedRow
from gateway.settings import ServiceLimits

QUEUE_WAIT_BUCKETS_S: tuple[float, ...] = (
    0.001,
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
)
"""Upper bounds of the queue-wait histogram (Prometheus ``le``); one more bucket is +Inf."""

QUEUE_RETRY_AFTER_S = 1
"""Retry-After for a full queue or a queue timeout: the condition is transient."""


class AdmissionError(Exception):
    """A request was not admitted; ``status``, ``code`` (the Sluice-Error value), Retry-After."""

    status = 503
    code = "admission"

    def __init__(self, service: str, retry_after_s: int, detail: str) -> None:
        super().__init__(f"{service}: {self.code}: {detail}")
        self.service = service
        self.retry_after_s = retry_after_s


class RateLimited(AdmissionError):
    status = 429
    code = "rate-limited"


class QueueFull(AdmissionError):
    status = 503
    code = "queue-full"


class QueueTimeout(AdmissionError):
    status = 503
    code = "queue-timeout"


class QueueGauge(Protocol):
    """Where the queue depth is published (``gateway.dataplane.stats.ServiceStats`` has ``queued``)."""

    queued: int


class Waiter:
    """One queued request: its callbacks, when it was queued, its timeout timer."""

    __slots__ = ("cold", "enqueued_at", "live", "on_admit", "on_reject", "timer")

    def __init__(
        self,
        on_admit: Callable[[float], None],
        on_reject: Callable[[AdmissionError], None],
        enqueued_at: float,
        cold: bool = False,
    ) -> None:
        self.on_admit = on_admit
        self.on_reject = on_reject
        self.enqueued_at = enqueued_at
        self.cold = cold
        """Queued while the service had no endpoint (held through a cold start)."""
        self.live = True
        self.timer: asyncio.TimerHandle | None = None

    def __repr__(self) -> str:
        return f"Waiter(enqueued_at={self.enqueued_at:.3f}, live={self.live})"


class Admission:
    """One service's admission state.  Single event loop, no locks."""

    __slots__ = (
        "_limiter",
        "_loop",
        "_queue",
        "_rate_interval_s",
        "_rate_retry_after_s",
        "_rate_tolerance_s",
        "_wake_scheduled",
        "capacity",
        "cold_start_max",
        "cold_start_timeout_s",
        "early_wake_at",
        "gated",
        "gauge",
        "hold_when_empty",
        "in_use",
        "max_body_bytes",
        "on_busy_change",
        "on_early_wake",
        "on_hold",
        "per_replica",
        "queue_max",
        "queue_timeout_s",
        "queued",
        "rejected",
        "releasing",
        "replicas",
        "service",
        "shared",
        "shared_held",
        "wait_counts",
        "wait_sum_s",
    )

    def __init__(
        self,
        service: str,
        limits: ServiceLimits | None = None,
        replicas: int = 0,
        gauge: QueueGauge | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        self.service = service
        self._loop = loop
        self.gauge = gauge
        self.in_use = 0
        """Slots taken: requests admitted and not yet released."""
        self.queued = 0
        """Live waiters in the queue."""
        self._queue: deque[Waiter] = deque()
        self._wake_scheduled = False
        self.replicas = replicas
        self.hold_when_empty = False
        """Scale from zero: with no endpoint at all, requests wait in the queue (instead of
        being dispatched to a 503) until the first replica is ready or their timeout passes."""
        self.on_hold: Callable[[], None] | None = None
        """Called when a request starts waiting while the service has no endpoint (the
        platform wakes its scaler at once)."""
        self.early_wake_at = math.inf
        """Concurrency (slots taken + queued) at which ``on_early_wake`` is called, once."""
        self.on_early_wake: Callable[[], None] | None = None
        self.on_busy_change: Callable[[bool], None] | None = None
        """Called with True when the concurrency leaves 0, with False when it returns to 0."""
        self.wait_counts = [0] * (len(QUEUE_WAIT_BUCKETS_S) + 1)
        self.wait_sum_s = 0.0
        self.rejected: dict[str, int] = {
            RateLimited.code: 0,
            QueueFull.code: 0,
            QueueTimeout.code: 0,
        }
        self.per_replica: int | None = None
        self.capacity = math.inf
        self.queue_max = 0
        self.queue_timeout_s = 0.0
        self.cold_start_timeout_s = 0.0
        self.cold_start_max = 0
        self.max_body_bytes: int | None = None
        self._limiter: AsyncLimiter | None = None
        self._rate_retry_after_s = 1
        self._rate_interval_s = 0.0
        self._rate_tolerance_s = 0.0
        self.shared: SharedRow | None = None
        """The service's row shared with the other data-plane workers (``workers: N``): the
        slots, the queue bound and the rate limit then hold for all of them together."""
        self.shared_held = 0
        """Slots this worker holds in the shared row."""
        self.releasing = 0
        """Slots released this loop round, given back to the shared row at its end."""
        self.gated = False
        """The fast path (:meth:`try_take`) does not apply: a rate limit, or shared slots."""
        self.configure(limits or ServiceLimits())

    # -- configuration (startup and hot reload) ---------------------------------------------

    def configure(self, limits: ServiceLimits) -> None:
        """Apply (new) limits; slots taken and queued requests are kept."""
        self.per_replica = limits.concurrency_per_replica
        self.queue_max = limits.queue.max
        self.queue_timeout_s = limits.queue.timeout_s
        self.cold_start_timeout_s = limits.queue.cold_start_timeout_s
        self.cold_start_max = limits.queue.cold_start_max
        self.max_body_bytes = limits.max_body_bytes
        rate = limits.rate_limit
        if rate is None:
            self._limiter = None
        else:
            burst = rate.burst_requests
            old = self._limiter
            if old is None or old.max_rate != burst or old.time_period != burst / rate.rps:
                self._limiter = AsyncLimiter(burst, burst / rate.rps)
            self._rate_retry_after_s = max(1, math.ceil(1 / rate.rps))
            self._rate_interval_s = 1 / rate.rps
            self._rate_tolerance_s = (burst - 1) / rate.rps
        self.set_replicas(self.replicas)

    def share(self, row: SharedRow | None) -> None:
        """Enforce the limits together with the other workers through ``row`` (``None``:
        alone).  Requests queued or holding slots now keep them."""
        self.shared = row
        self.set_replicas(self.replicas)

    def hold_at_zero(self, on_hold: Callable[[], None] | None) -> None:
        """Scale from zero: hold requests while there is no endpoint; ``on_hold`` is called
        each time one starts waiting then (``None``: answer 503 no-endpoints at once)."""
        self.hold_when_empty = on_hold is not None
        self.on_hold = on_hold
        self.set_replicas(self.replicas)

    def arm_early_wake(self, level: float, on_wake: Callable[[], None] | None) -> None:
        """Call ``on_wake`` once when the concurrency (slots taken + queued) reaches ``level``
        (the scaler's latest ``Decision.wake_concurrency``; inf disarms)."""
        self.early_wake_at = level if on_wake is not None else math.inf
        self.on_early_wake = on_wake

    def watch_busy(self, on_change: Callable[[bool], None] | None) -> None:
        """Call ``on_change(True)`` each time the concurrency (slots taken + queued) leaves 0
        and ``on_change(False)`` each time it returns to 0 (``None``: stop watching)."""
        self.on_busy_change = on_change

    @property
    def busy(self) -> bool:
        """A request holds a slot or waits in the queue."""
        return self.in_use + self.queued > 0

    def set_replicas(self, replicas: int) -> None:
        """The number of endpoints taking requests changed: recompute the slots."""
        self.replicas = replicas
        per = self.per_replica
        if replicas == 0 and self.hold_when_empty:
            self.capacity = 0
        else:
            self.capacity = math.inf if per is None else per * replicas
        shared = self.shared
        self.gated = self._limiter is not None or (shared is not None and self.capacity != math.inf)
        if shared is not None:
            if self.capacity != math.inf:
                shared.grow(self.capacity)
            elif self.queued and not self._wake_scheduled:
                self._schedule_wake()
        elif self.queued and self.in_use < self.capacity:
            self._schedule_wake()

    # -- hot path -------------------------------------------------------------------------

    def admit(
        self,
        on_admit: Callable[[float], None],
        on_reject: Callable[[AdmissionError], None],
    ) -> Waiter | None:
        """Admit a request now (``None``: a slot is taken), or queue it (the :class:`Waiter`).

        Raises :class:`RateLimited` or :class:`QueueFull` when it is refused at once.  A queued
        request later gets exactly one of ``on_admit(wait_s)`` (it then holds a slot) or
        ``on_reject(error)``, unless it is :meth:`abandon`\\ ed first.
        """
        if self.shared is not None:
            return self._admit_shared(on_admit, on_reject)
        if self._limiter is not None:
            self._take_token()
        if self.in_use < self.capacity and not self.queued:
            self.in_use += 1
            if self.in_use == 1 and self.on_busy_change is not None:
                self.on_busy_change(True)
            if self.in_use >= self.early_wake_at:
                self._wake_early()
            return None
        waiter = self._enqueue(on_admit, on_reject)
        if self.in_use + self.queued >= self.early_wake_at:
            self._wake_early()
        return waiter

    def try_take(self) -> bool:
        """Take a slot at once when one is free, nobody queues and no rate limit applies.

        The data plane's fast path (no callbacks to create); on False it calls :meth:`admit`.
        """
        if not self.gated and self.in_use < self.capacity and not self.queued:
            self.in_use += 1
            if self.in_use == 1 and self.on_busy_change is not None:
                self.on_busy_change(True)
            if self.in_use >= self.early_wake_at:
                self._wake_early()
            return True
        return False

    def release(self) -> None:
        """A request that held a slot has finished."""
        self.in_use -= 1
        if self.shared_held:
            self._release_shared()
        elif self.queued:
            if not self._wake_scheduled:
                self._schedule_wake()
        elif not self.in_use and self.on_busy_change is not None:
            self.on_busy_change(False)

    def abandon(self, waiter: Waiter) -> None:
        """A queued request's client went away: drop it from the queue (no callback)."""
        if waiter.live:
            self._drop(waiter)
            if self.shared is not None:
                self._leave_shared()
            self._maybe_idle()

    # -- slow paths -----------------------------------------------------------------------

    def _wake_early(self) -> None:
        """The load reached what the scaler's last decision can absorb: tell it, once."""
        self.early_wake_at = math.inf
        if self.on_early_wake is not None:
            self.on_early_wake()

    def _maybe_idle(self) -> None:
        """A queued request left without a slot: the service may have become idle."""
        if not self.in_use and not self.queued and self.on_busy_change is not None:
            self.on_busy_change(False)

    def _loop_now(self) -> asyncio.AbstractEventLoop:
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        return loop

    def _take_token(self) -> None:
        limiter = self._limiter
        assert limiter is not None
        if not limiter.has_capacity():
            self.rejected[RateLimited.code] += 1
            raise RateLimited(
                self.service,
                self._rate_retry_after_s,
                f"over {limiter.max_rate:g} requests per {limiter.time_period:g}s",
            )
        # There is capacity, so acquire() completes without suspending: drive it by hand
        # instead of paying for a task (aiolimiter's public API, no private state touched).
        coro = limiter.acquire()
        try:
            coro.send(None)
        except StopIteration:
            return
        coro.close()  # pragma: no cover - has_capacity() just said it would not wait
        raise AssertionError("aiolimiter waited although it had capacity")  # pragma: no cover

    @property
    def cold(self) -> bool:
        """No endpoint, and requests are held for one (scale from zero): a cold start."""
        return self.replicas == 0 and self.hold_when_empty

    def _queue_bound(self) -> int:
        """Most requests waiting at once now: ``cold_start_max`` through a cold start."""
        return self.cold_start_max if self.cold else self.queue_max

    def _queue_full(self) -> QueueFull:
        self.rejected[QueueFull.code] += 1
        if self.cold:
            n = self.cold_start_max
            why = f"{n} request(s) already held for a cold start (queue.cold_start_max {n})"
        else:
            why = f"{self.queue_max} request(s) already waiting (queue.max {self.queue_max})"
        return QueueFull(self.service, QUEUE_RETRY_AFTER_S, why)

    def _enqueue(
        self,
        on_admit: Callable[[float], None],
        on_reject: Callable[[AdmissionError], None],
        now: float | None = None,
    ) -> Waiter:
        if now is None and self.queued >= self._queue_bound():
            raise self._queue_full()
        loop = self._loop_now()
        if now is None:
            now = loop.time()
        cold = self.cold
        waiter = Waiter(on_admit, on_reject, now, cold)
        timeout = self.cold_start_timeout_s if cold else self.queue_timeout_s
        waiter.timer = loop.call_at(now + timeout, self._expire, waiter)
        self._queue.append(waiter)
        self.queued += 1
        if self.gauge is not None:
            self.gauge.queued = self.queued
        if self.queued == 1 and not self.in_use and self.on_busy_change is not None:
            self.on_busy_change(True)
        if self.shared is not None:
            if self.replicas == 0 and self.on_hold is not None:
                self.on_hold()
        elif self.in_use < self.capacity:
            self._schedule_wake()
        elif self.replicas == 0 and self.on_hold is not None:
            self.on_hold()
        return waiter

    def _drop(self, waiter: Waiter) -> None:
        waiter.live = False
        if waiter.timer is not None:
            waiter.timer.cancel()
            waiter.timer = None
        self.queued -= 1
        if self.gauge is not None:
            self.gauge.queued = self.queued
        queue = self._queue
        while queue and not queue[0].live:
            queue.popleft()

    def _expire(self, waiter: Waiter) -> None:
        if not waiter.live:
            return
        waiter.timer = None
        self._drop(waiter)
        if self.shared is not None:
            self._leave_shared()
        self._maybe_idle()
        self.rejected[QueueTimeout.code] += 1
        self._observe_wait(self._loop_now().time() - waiter.enqueued_at)
        if waiter.cold:
            why = f"no endpoint ready within queue.cold_start_timeout_s ({self.cold_start_timeout_s:g}s)"
        else:
            why = f"no free slot within queue.timeout_s ({self.queue_timeout_s:g}s)"
        waiter.on_reject(QueueTimeout(self.service, QUEUE_RETRY_AFTER_S, why))

    def _schedule_wake(self) -> None:
        self._wake_scheduled = True
        self._loop_now().call_soon(self._wake)

    def _wake(self) -> None:
        self._wake_scheduled = False
        if self.shared is not None:
            self._wake_shared()
            return
        queue = self._queue
        now = self._loop_now().time()
        # ``queue``, not only ``queued``: with ``workers: N`` the main process's admission
        # mirrors the workers' counts and holds no waiter of its own
        while queue and self.queued and self.in_use < self.capacity:
            waiter = queue[0]
            if not waiter.live:  # pragma: no cover - _drop trims dead heads
                queue.popleft()
                continue
            self._drop(waiter)
            self.in_use += 1
            wait_s = now - waiter.enqueued_at
            self._observe_wait(wait_s)
            waiter.on_admit(wait_s)

    # -- shared with the other workers (``workers: N``) -----------------------------------

    def _admit_shared(
        self,
        on_admit: Callable[[float], None],
        on_reject: Callable[[AdmissionError], None],
    ) -> Waiter | None:
        row = self.shared
        assert row is not None
        now = self._loop_now().time()
        limiter = self._limiter
        verdict = row.enter(
            self.capacity,
            self._queue_bound(),
            now,
            0.0 if limiter is None else self._rate_interval_s,
            self._rate_tolerance_s,
        )
        if verdict == LIMITED:
            assert limiter is not None
            self.rejected[RateLimited.code] += 1
            raise RateLimited(
                self.service,
                self._rate_retry_after_s,
                f"over {limiter.max_rate:g} requests per {limiter.time_period:g}s",
            )
        if verdict == FULL:
            raise self._queue_full()
        if verdict == ADMITTED:
            if self.capacity != math.inf:
                self.shared_held += 1
            self.in_use += 1
            if self.in_use == 1 and not self.queued and self.on_busy_change is not None:
                self.on_busy_change(True)
            if self.in_use + self.queued >= self.early_wake_at:
                self._wake_early()
            return None
        waiter = self._enqueue(on_admit, on_reject, now)
        if self.in_use + self.queued >= self.early_wake_at:
            self._wake_early()
        return waiter

    def _release_shared(self) -> None:
        self.shared_held -= 1
        if self.shared is not None:
            # Given back once per loop round for every request of the round that ended (one
            # lock instead of one per request; a slot freed now is only seen taken a little
            # longer by the others, never over-admitted).
            self.releasing += 1
            if self.releasing == 1:
                self._loop_now().call_soon(self.flush_releases)
        if not self.in_use and not self.queued and self.on_busy_change is not None:
            self.on_busy_change(False)

    def flush_releases(self) -> None:
        """Give the slots released this loop round back to the shared row."""
        count, self.releasing = self.releasing, 0
        row = self.shared
        if count and row is not None:
            row.release(self.capacity, count)

    def _leave_shared(self) -> None:
        row = self.shared
        assert row is not None
        if self.capacity != math.inf:
            row.leave(self.capacity, self._head_after)

    def _head_after(self, skip: int) -> float:
        """Enqueue time of the live waiter after the first ``skip`` (inf when none)."""
        for waiter in self._queue:
            if waiter.live:
                if not skip:
                    return waiter.enqueued_at
                skip -= 1
        return math.inf

    def wake_shared(self) -> None:
        """Another worker may have granted this one slots (its pipe was written)."""
        if self.shared is not None and not self._wake_scheduled:
            self._wake_shared()

    def _wake_shared(self) -> None:
        row = self.shared
        assert row is not None
        queue = self._queue
        now = self._loop_now().time()
        if self.capacity == math.inf:  # the limit went away: everybody in
            granted = self.queued
            if granted:
                row.forget_queue()
        else:
            granted = row.consume(self._head_after)
            self.shared_held += granted
        while granted and queue and self.queued:
            waiter = queue[0]
            self._drop(waiter)
            self.in_use += 1
            granted -= 1
            wait_s = now - waiter.enqueued_at
            self._observe_wait(wait_s)
            waiter.on_admit(wait_s)
        while granted:  # pragma: no cover - a grant always has its request (leave() frees)
            granted -= 1
            self.in_use += 1
            self.release()

    def _observe_wait(self, wait_s: float) -> None:
        self.wait_counts[bisect_left(QUEUE_WAIT_BUCKETS_S, wait_s)] += 1
        self.wait_sum_s += wait_s

    def __repr__(self) -> str:
        cap = "unlimited" if self.capacity == math.inf else f"{self.capacity:g}"
        rate = (
            f", rate {self._limiter.max_rate:g}/{self._limiter.time_period:g}s"
            if self._limiter
            else ""
        )
        return (
            f"Admission({self.service}, slots {self.in_use}/{cap}, "
            f"queued {self.queued}/{self.queue_max}{rate})"
        )
