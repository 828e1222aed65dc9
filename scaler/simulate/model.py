"""The queueing model: replicas with the CPU they are given, on a node of ``capacity_cores``.

Assumptions (docs/simulate.md repeats them):

* **Processor sharing per replica.**  Under limit enforcement (``budget.enforcement:
  limit``) a replica with ``c`` cores serving ``n`` requests gives
  each ``min(request_cores_max, c / n)`` cores (egalitarian sharing, as the kernel shares a
  CPU quota between busy threads), so a request needing ``s`` CPU-seconds alone on a
  replica finishes after ``s / min(request_cores_max, c)`` seconds and a saturated replica
  completes ``c / s`` requests per second.  Simulated exactly, event by event, with a
  virtual clock per replica (a request's finish tag is the replica's virtual time at
  arrival plus its CPU-seconds), so the cost is O(log n) per request.
* **Dispatch** like the gateway's ``least_request``: an arrival goes to the ready replica
  with the fewest requests in flight (ties: the oldest replica; the gateway picks the less
  loaded of two at random, the same with two replicas).  With no ready replica it
  waits in the gateway's queue (FIFO) until one becomes ready.
* **Admission** like the gateway's (:class:`Admission`, from the service's ``limits``): with
  ``concurrency_per_replica`` an arrival goes only to a ready replica with a free slot, else
  it waits in the queue, and a freed slot takes the oldest waiter; the queue (also where
  requests wait while no replica is ready, as on ``platform: local``) holds at most
  ``queue.max`` requests -- one more is rejected at once (503 queue-full) -- and a request
  that has waited ``queue.timeout_s`` is rejected (503 queue-timeout); while no replica is
  ready the queue holds up to ``queue.cold_start_max`` requests, each through the cold start,
  up to ``queue.cold_start_timeout_s``.  Without limits
  (:data:`UNBOUNDED`) nothing is rejected.
* **The CPU rule** is a strategy of the one event loop that drives these models
  (:mod:`scaler.simulate.loop`): limit as above, limit with lending, or share (a replica's
  cores are its guaranteed share of the node, which the busy replicas of every service
  share by weight up to their ``cpu.max``).
* **The node** has ``capacity_cores`` (the budget).  A replica's CPU is reserved from the
  moment it is scheduled; a replica (or an in-place CPU increase) that does not fit waits,
  first come first served, as a Kubernetes pod stays Pending (or a resize Deferred).
* **New replicas** become ready ``startup_s`` after they are scheduled.  **CPU decreases
  and increases that fit apply in place at once**, to replicas that are serving (the point
  of in-place resize).  A replica removed on scale-down first stops receiving requests,
  finishes what it holds (draining), and only then frees its CPU.
* Nothing is dropped: every arrival is completed, rejected by admission, or still
  queued/in flight at the end.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import chain

from scaler.decision import ServiceState
from scaler.signals import LATENCY_BUCKETS_S, ServiceSignals
from scaler.simulate.arrivals import Arrivals

PENDING, STARTING, READY, DRAINING = "pending", "starting", "ready", "draining"
_EPS = 1e-9


@dataclass(frozen=True)
class Admission:
    """The gateway's admission control for one service, as the model follows it (the
    service's ``limits`` in a Sluice config; the gateway turns them into this)."""

    slots_per_replica: int | None = None
    """Requests forwarded at once per ready replica; None: unlimited."""
    queue_max: int | None = None
    """Most requests waiting at once; None: unbounded."""
    queue_timeout_s: float = math.inf
    """Longest wait in the queue before a 503."""
    cold_start_timeout_s: float = math.inf
    """Longest wait for a request that arrived while no replica was ready (a cold start)."""
    cold_start_max: int | None = None
    """Most requests waiting at once while no replica is ready; None: unbounded."""


UNBOUNDED = Admission()
"""No admission control: every request forwarded at once, held without bound at zero."""


class Replica:
    """One replica's processor-sharing server state (advanced lazily to ``t``)."""

    __slots__ = (
        "capped",
        "claim_seq",
        "cores",
        "cpu_s",
        "d",
        "level",
        "per",
        "phase",
        "ready_at",
        "rid",
        "t",
        "tags",
        "target_cores",
        "throttled_s",
        "u0",
        "v",
        "ver",
        "x",
    )

    def __init__(self, rid: int, cores: float, claim_seq: int) -> None:
        self.rid = rid
        self.phase = PENDING
        self.cores = cores
        """CPU limit in force (cores); for a pending replica, what it will get."""
        self.target_cores = cores
        self.claim_seq = claim_seq
        self.ready_at = math.inf
        self.v = 0.0
        """Virtual time: CPU-seconds each resident request has received since the replica began."""
        self.t = 0.0
        self.tags: list[tuple[float, float]] = []
        """Heap of (finish tag on the virtual clock, arrival time) of the requests it holds."""
        self.cpu_s = 0.0
        self.throttled_s = 0.0
        self.ver = 0
        # the rates in force since ``t`` (set by scaler.simulate.loop)
        self.d = 0.0
        """Cores its requests could use now: min(n * request_cores_max, cpu.max)."""
        self.x = 0.0
        """Cores it gets now."""
        self.per = 0.0
        """Cores each resident request gets now (``x / n``)."""
        self.capped = False
        """Held at its service's cpu.max while its requests could use more (throttled time)."""
        self.level: Level | None = None
        """Share by entitlement: while it gets its service's level (less than its requests could
        use), that level's clock; its rate then moves with the level, without a reschedule."""
        self.u0 = 0.0
        """With :attr:`level`: the level's clock at :attr:`t`."""

    def __repr__(self) -> str:
        return (
            f"Replica({self.rid}, {self.phase}, {self.cores:g} cores, {len(self.tags)} in flight)"
        )

    def flow(self, t: float) -> None:
        """Move this replica's clock to ``t`` at the rates in force: resident requests progress,
        CPU (and throttled time) is counted."""
        if self.tags and t > self.t:
            level = self.level
            if level is not None:  # it got the level since t: the CPU the level's clock counted
                u = level.u + level.mu * (t - level.t)
                du = u - self.u0
                self.u0 = u
                self.v += du / len(self.tags)
                self.cpu_s += du
            else:
                dt = t - self.t
                self.v += self.per * dt
                self.cpu_s += self.x * dt
                if self.capped:
                    self.throttled_s += dt
        self.t = t


class Level:
    """Share by entitlement: the cores each busy replica of one service gets when its share
    does not meet every replica whole (``mu``, the same for all such replicas), and a clock
    of the CPU one of them has had since the run began (``u`` at ``t``, growing at ``mu``).

    A replica at the level finishes its first request when the clock has grown by its
    remaining work times its requests (they share it equally), whatever ``mu`` does
    meanwhile, so a change of the level moves one clock, not every replica's schedule
    (:mod:`scaler.simulate.loop`)."""

    __slots__ = ("heap", "j", "mu", "pushed", "t", "u", "ver")

    def __init__(self, j: int, t: float) -> None:
        self.j = j
        """The service's index in the loop."""
        self.u = 0.0
        self.t = t
        self.mu = 0.0
        self.heap: list[tuple[float, int, int, Replica]] = []
        """(the clock when it finishes its first request, seq, its version, replica)."""
        self.ver = 0
        self.pushed = -1
        """The seq of the heap entry the loop's pending event for this level was computed from."""

    def __repr__(self) -> str:
        return f"Level(mu={self.mu:g}, u={self.u:g} at t={self.t:g}, {len(self.heap)} queued)"

    def move(self, t: float) -> None:
        """Advance the clock to ``t`` at the level in force (before the level changes)."""
        if t > self.t:
            self.u += self.mu * (t - self.t)
            self.t = t


def _quantile(ordered: list[float], q: float) -> float:
    """Nearest-rank quantile of an ascending, non-empty list."""
    return ordered[max(math.ceil(q * len(ordered)) - 1, 0)]


class ServiceModel:
    """One service: its replicas, the gateway queue in front of them, and its counters."""

    def __init__(
        self,
        name: str,
        arrivals: Arrivals,
        *,
        startup_s: float,
        request_cores_max: float,
        cores_max: float = math.inf,
        signal_window_s: float = 10.0,
        tick_s: float = 1.0,
        app: Mapping[str, Sequence[tuple[float, float]]] | None = None,
        admission: Admission = UNBOUNDED,
        latency_histogram: bool = False,
    ) -> None:
        self.name = name
        self.admission = admission
        self.rejected_queue_full = 0
        """Arrivals rejected at once: the queue held ``queue_max`` already (503 queue-full)."""
        self.rejected_timeout = 0
        """Requests rejected after waiting ``queue_timeout_s`` in the queue (503 queue-timeout)."""
        self.app = {k: list(v) for k, v in (app or {}).items()}
        """App metrics the service reports: per name, (from time, value) steps."""
        self.times = arrivals.times_s.tolist()
        self.works = arrivals.cpu_s.tolist()
        self.next_arrival = 0
        self.startup_s = startup_s
        self.cap = request_cores_max
        self.cores_max = cores_max
        """Share enforcement: the most CPU one replica may use (the service's ``cpu.max``)."""
        self.replicas: list[Replica] = []
        self.queue: deque[tuple[float, float, float, bool]] = deque()
        """Requests waiting in the gateway: (arrival time, CPU-seconds, deadline, cold), in
        arrival order; ``cold``: it arrived while no replica was ready (:meth:`enqueue`)."""
        self._cold_queued = 0
        """Cold requests in :attr:`queue`: while there are any, deadlines are not in order."""
        self._expiry = math.inf
        """While cold requests wait: no queued request's deadline is before this."""
        self._timeout_waits: list[float] = []
        """How long each request rejected by a queue timeout had waited."""
        self.arrivals_total = 0
        self.completions_total = 0
        self.in_system_arrivals = 0.0
        """Sum of the arrival times of the requests in the system (queued or in flight)."""
        self.residence_total_s = 0.0
        """Time spent in the system by the requests that left it (served or timed out)."""
        self.removed_cpu_s = 0.0
        self.removed_throttled_s = 0.0
        self.desired_cores = 0.0
        self.clock = 0.0
        """The time the model has been simulated to."""
        self.tick_latencies: list[float] = []
        """Latencies of the requests completed in the current tick (until :meth:`close_tick`)."""
        self.tick_arrivals = 0
        """Arrivals in the current tick (until :meth:`close_tick`)."""
        self.latencies: list[float] = []
        """Latencies of every completed request, in completion order."""
        self._latency_counts = [0] * (len(LATENCY_BUCKETS_S) + 1) if latency_histogram else None
        """With ``latency_histogram`` (a ``latency`` metric needs it, as the gateway counts it
        only then): the gateway's latency histogram of every completed request so far."""
        self._latency_counted = (0, 0, 0)
        """What :attr:`_latency_counts` holds: how many of :attr:`latencies`, of the requests
        rejected at once (queue full: 0 s) and of those that timed out in the queue (after
        their wait) -- the gateway records its own 503s in the histogram too."""
        self._window_ticks = max(1, round(signal_window_s / tick_s))
        self._window_s = self._window_ticks * tick_s
        self._arrivals_window: deque[int] = deque(maxlen=self._window_ticks)
        self._latency_window: deque[list[float]] = deque(maxlen=self._window_ticks)
        self._window_stats: tuple[float, float | None, float | None] | None = None
        self._target: tuple[int, float] | None = None
        self.removed_while_starting = 0
        """Replicas removed by a decision while they were starting (scheduled, not yet ready)."""
        self.replica_reversals = 0
        """Times the replicas asked for changed direction (up after down, or down after up)."""
        self._direction = 0

    def __repr__(self) -> str:
        phases = [r.phase for r in self.replicas]
        return f"ServiceModel({self.name}, replicas={phases}, queued={len(self.queue)})"

    # ---- what the platform and the gateway would report ---------------------------------

    @property
    def in_flight(self) -> int:
        return sum(len(r.tags) for r in self.replicas)

    @property
    def concurrency(self) -> int:
        """In flight plus queued in the gateway (what a decision's wake level is compared with)."""
        return sum(len(r.tags) for r in self.replicas) + len(self.queue)

    @property
    def cpu_seconds_total(self) -> float:
        return self.removed_cpu_s + sum(r.cpu_s for r in self.replicas)

    @property
    def throttled_seconds_total(self) -> float:
        return self.removed_throttled_s + sum(r.throttled_s for r in self.replicas)

    def active(self) -> list[Replica]:
        """Replicas asked for: pending, starting and ready (not draining)."""
        return [r for r in self.replicas if r.phase != DRAINING]

    def reserved_cores(self) -> float:
        """CPU held on the node: every scheduled replica's limit (draining ones included)."""
        total = 0.0
        for r in self.replicas:
            if r.phase != PENDING:
                total += r.cores
        return total

    @property
    def rejected_total(self) -> int:
        return self.rejected_queue_full + self.rejected_timeout

    def enqueue(self, t: float, work: float, *, cold: bool) -> None:
        """Queue a request arriving at ``t``; ``cold``: no replica is ready, so it is held
        through the start-up (``cold_start_timeout_s``) rather than ``queue_timeout_s``."""
        adm = self.admission
        deadline = t + (adm.cold_start_timeout_s if cold else adm.queue_timeout_s)
        if cold:
            if not self._cold_queued:  # the oldest waiter has the earliest deadline so far
                self._expiry = self.queue[0][2] if self.queue else math.inf
            self._cold_queued += 1
        if self._cold_queued and deadline < self._expiry:
            self._expiry = deadline
        self.queue.append((t, work, deadline, cold))
        self.in_system_arrivals += t

    def dequeue(self) -> tuple[float, float]:
        """The oldest queued request, handed to a replica: (arrival time, CPU-seconds)."""
        arrived, work, _, cold = self.queue.popleft()
        if cold:
            self._cold_queued -= 1
        return arrived, work

    def expire(self, t: float) -> int:
        """Reject the queued requests whose wait reached its bound by ``t`` (``queue_timeout_s``,
        or ``cold_start_timeout_s`` for those held through a cold start); returns how many."""
        queue = self.queue
        n = 0
        if not self._cold_queued:  # one bound for all: the deadlines are in arrival order
            while queue and queue[0][2] <= t:
                arrived, _, deadline, _ = queue.popleft()
                self._timed_out(arrived, deadline)
                n += 1
        elif t >= self._expiry:
            kept = []
            for item in queue:
                arrived, _, deadline, cold = item
                if deadline > t:
                    kept.append(item)
                    continue
                self._timed_out(arrived, deadline)
                self._cold_queued -= cold
                n += 1
            queue.clear()
            queue.extend(kept)
            self._expiry = min((item[2] for item in kept), default=math.inf)
        self.rejected_timeout += n
        return n

    def _timed_out(self, arrived: float, deadline: float) -> None:
        self.in_system_arrivals -= arrived
        self.residence_total_s += deadline - arrived  # it left when it timed out
        self._timeout_waits.append(deadline - arrived)

    def count(self, phase: str) -> int:
        return sum(1 for r in self.replicas if r.phase == phase)

    def oldest_arrival(self) -> float | None:
        """Arrival time of the oldest request still waiting or in flight."""
        oldest = self.queue[0][0] if self.queue else math.inf  # arrival order
        for r in self.replicas:
            if r.tags:
                oldest = min(oldest, *(a for _, a in r.tags))
        return None if oldest == math.inf else oldest

    def _windowed(self) -> tuple[float, float | None, float | None]:
        """rps and latency p50/p99 over the signal window (the last whole ticks), computed
        once per tick however many (early) ticks read them."""
        if self._window_stats is None:
            recent = list(chain.from_iterable(self._latency_window))
            recent.sort()
            self._window_stats = (
                sum(self._arrivals_window) / self._window_s,
                _quantile(recent, 0.5) if recent else None,
                _quantile(recent, 0.99) if recent else None,
            )
        return self._window_stats

    def signals(self, now: float) -> ServiceSignals:
        """The snapshot the gateway (and the platform's CPU accounting) would hand the scaler.

        Counters are exact at ``now``; rps and latency percentiles cover the last whole ticks
        (at an early tick, not the part of the current tick before it)."""
        in_flight = ready = 0
        cpu_s = throttled_s = 0.0
        for r in self.replicas:
            in_flight += len(r.tags)
            ready += r.phase == READY
            cpu_s += r.cpu_s
            throttled_s += r.throttled_s
        rps, p50, p99 = self._windowed()
        counts = self._latency_counts
        if counts is not None:
            served, full, timed_out = self._latency_counted
            for latency in self.latencies[served:]:
                counts[bisect_left(LATENCY_BUCKETS_S, latency)] += 1
            counts[0] += self.rejected_queue_full - full
            for waited in self._timeout_waits[timed_out:]:
                counts[bisect_left(LATENCY_BUCKETS_S, waited)] += 1
            self._latency_counted = (
                len(self.latencies),
                self.rejected_queue_full,
                self.rejected_timeout,
            )
        return ServiceSignals(  # positional (in field order): this runs at every tick
            self.name,
            now,
            in_flight,
            len(self.queue),
            self.arrivals_total,
            self.completions_total,
            0,  # errors_total: the model fails nothing
            rps,
            p50,
            p99,
            ready,
            self.removed_cpu_s + cpu_s,
            self.removed_throttled_s + throttled_s,
            self._app_values(now) if self.app else None,
            None if counts is None else tuple(counts),
            None if counts is None else LATENCY_BUCKETS_S,
            # concurrency_seconds_total: the time every request has spent in the system so
            # far (those gone, plus the age of those still in it), as the gateway counts it
            self.residence_total_s + (in_flight + len(self.queue)) * now - self.in_system_arrivals,
        )

    def _app_values(self, now: float) -> dict[str, float]:
        """Each app metric's value at ``now`` (the last step started by then)."""
        out: dict[str, float] = {}
        for name, steps in self.app.items():
            value = steps[0][1]
            for at_s, v in steps:
                if at_s > now:
                    break
                value = v
            out[name] = value
        return out

    def state(self) -> ServiceState:
        """What the platform reports: replicas asked for, ready, CPU in force, blocked resizes."""
        replicas = ready = 0
        least = math.inf
        blocked = False
        for r in self.replicas:
            phase = r.phase
            if phase == DRAINING:
                continue
            replicas += 1
            if phase == PENDING:
                continue
            ready += phase == READY
            least = r.cores if r.cores < least else least
            blocked = blocked or r.target_cores > r.cores + _EPS
        return ServiceState(
            self.name,
            replicas,
            ready,
            least if least != math.inf else self.desired_cores,
            blocked,
        )

    # ---- applying a decision --------------------------------------------------------------

    def set_target(self, replicas: int, cores: float, claims: Iterable[int]) -> None:
        """Ask for ``replicas`` replicas of ``cores`` each.

        Decreases apply at once (CPU shrinks in place; surplus replicas are cancelled if not
        yet serving, else drained); increases become claims the node grants when they fit.
        ``claims`` yields increasing sequence numbers (first come, first served).
        """
        if (replicas, cores) == self._target:
            return  # the same target again changes nothing (only set_target moves it)
        if self._target is not None and replicas != self._target[0]:
            direction = 1 if replicas > self._target[0] else -1
            if self._direction and direction != self._direction:
                self.replica_reversals += 1
            self._direction = direction
        self._target = (replicas, cores)
        seq = iter(claims)
        self.desired_cores = cores
        for r in self.replicas:
            if r.phase == PENDING:
                r.cores = r.target_cores = cores
                continue
            if cores < r.cores - _EPS:
                r.cores = cores
            if r.phase != DRAINING and abs(cores - r.target_cores) > _EPS:
                r.target_cores = cores
                if cores > r.cores + _EPS:
                    r.claim_seq = next(seq)
        active = self.active()
        if len(active) < replicas:
            for _ in range(replicas - len(active)):
                rid = max((r.rid for r in self.replicas), default=-1) + 1
                self.replicas.append(Replica(rid, cores, next(seq)))
        elif len(active) > replicas:
            order = {PENDING: 0, STARTING: 1, READY: 2}
            victims = sorted(active, key=lambda r: (order[r.phase], len(r.tags), -r.rid))
            for r in victims[: len(active) - replicas]:
                if r.phase == STARTING:
                    self.removed_while_starting += 1
                if r.tags:
                    r.phase = DRAINING
                else:
                    self.remove(r)

    def remove(self, r: Replica) -> None:
        """Forget a replica that left (its CPU counters stay in the service's totals)."""
        self.removed_cpu_s += r.cpu_s
        self.removed_throttled_s += r.throttled_s
        self.replicas.remove(r)

    def start(self, r: Replica, now: float) -> None:
        """The node scheduled ``r``: it serves once its start-up delay has passed."""
        r.phase = STARTING
        r.ready_at = now + self.startup_s
        r.t = now

    # ---- traffic --------------------------------------------------------------------------

    def close_tick(self) -> None:
        """End the current regular tick: its arrivals and latencies join the signal windows."""
        self._arrivals_window.append(self.tick_arrivals)
        self._latency_window.append(self.tick_latencies)
        self._window_stats = None
        self.tick_arrivals = 0
        self.tick_latencies = []


class Node:
    """The machine (or cluster) the services share: ``capacity_cores`` of CPU, first come first served."""

    def __init__(self, capacity_cores: float, services: dict[str, ServiceModel]) -> None:
        self.capacity_cores = capacity_cores
        self.services = services
        self._seq = 0

    def claims(self) -> Iterable[int]:
        """Increasing sequence numbers for new claims on the node's CPU."""
        while True:
            self._seq += 1
            yield self._seq

    def reserved_cores(self) -> float:
        return sum(s.reserved_cores() for s in self.services.values())

    def schedule(self, now: float) -> None:
        """Grant waiting claims (new replicas, in-place CPU increases) in arrival order, as they fit."""
        waiting: list[tuple[int, ServiceModel, Replica]] = []
        for svc in self.services.values():
            for r in svc.replicas:
                if r.phase == PENDING or (r.phase != DRAINING and r.target_cores > r.cores + _EPS):
                    waiting.append((r.claim_seq, svc, r))
        if not waiting:
            return
        waiting.sort(key=lambda x: x[0])
        free = self.capacity_cores - self.reserved_cores()
        for _, svc, r in waiting:
            if r.phase == PENDING:
                if r.cores <= free + _EPS:
                    free -= r.cores
                    svc.start(r, now)
            else:
                delta = r.target_cores - r.cores
                if delta <= free + _EPS:
                    free -= delta
                    r.cores = r.target_cores
