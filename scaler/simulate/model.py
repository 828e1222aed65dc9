"""The queueing model: replicas with the CPU they are given, on a node of ``capacity_cores``.

Assumptions (docs/simulate.md repeats them):

* **Processor sharing per replica.**  Under limit enforcement (``budget.enforcement:
  limit``; :meth:`ServiceModel.run`) a replica with ``c`` cores serving ``n`` requests gives
  each ``min(request_cores_max, c / n)`` cores (egalitarian sharing, as the kernel shares a
  CPU quota between busy threads), so a request needing ``s`` CPU-seconds alone on a
  replica finishes after ``s / min(request_cores_max, c)`` seconds and a saturated replica
  completes ``c / s`` requests per second.  Simulated exactly, event by event, with a
  virtual clock per replica (a request's finish tag is the replica's virtual time at
  arrival plus its CPU-seconds), so the cost is O(log n) per request.
* **Dispatch** like the gateway's ``least_request``: an arrival goes to the ready replica
  with the fewest requests in flight (ties: the oldest replica).  With no ready replica it
  waits in the gateway's queue (FIFO) until one becomes ready.
* **Share enforcement** (``budget.enforcement: share``, the default) keeps everything here
  but the rates: a replica's cores are its guaranteed share of the node, which the busy
  replicas of every service share by weight up to their ``cpu.max``
  (:mod:`scaler.simulate.gps`, which drives these models in one event loop).
* **The node** has ``capacity_cores`` (the budget).  A replica's CPU is reserved from the
  moment it is scheduled; a replica (or an in-place CPU increase) that does not fit waits,
  first come first served, as a Kubernetes pod stays Pending (or a resize Deferred).
* **New replicas** become ready ``startup_s`` after they are scheduled.  **CPU decreases
  and increases that fit apply in place at once**, to replicas that are serving (the point
  of in-place resize).  A replica removed on scale-down first stops receiving requests,
  finishes what it holds (draining), and only then frees its CPU.
* Nothing is dropped: every arrival is completed or still queued/in flight at the end.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Iterable
from itertools import chain

from scaler.decision import ServiceState
from scaler.signals import ServiceSignals
from scaler.simulate.arrivals import Arrivals

PENDING, STARTING, READY, DRAINING = "pending", "starting", "ready", "draining"
_EPS = 1e-9


class Replica:
    """One replica's processor-sharing server state (advanced lazily to ``t``)."""

    __slots__ = (
        "capped",
        "claim_seq",
        "cores",
        "cpu_s",
        "d",
        "per",
        "phase",
        "ready_at",
        "rid",
        "t",
        "tags",
        "target_cores",
        "throttled_s",
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
        # share enforcement (scaler.simulate.gps) only: the rates in force since ``t``
        self.d = 0.0
        """Cores its requests could use now: min(n * request_cores_max, cpu.max)."""
        self.x = 0.0
        """Cores it gets now (its share of the node)."""
        self.per = 0.0
        """Cores each resident request gets now (``x / n``)."""
        self.capped = False
        """Held at its service's cpu.max while its requests could use more (throttled time)."""

    def __repr__(self) -> str:
        return (
            f"Replica({self.rid}, {self.phase}, {self.cores:g} cores, {len(self.tags)} in flight)"
        )

    def advance(self, t: float, cap: float) -> None:
        """Move this replica's clock to ``t``: resident requests progress, CPU is counted."""
        n = len(self.tags)
        if n and t > self.t:
            dt = t - self.t
            if cap * n <= self.cores:
                per = cap
            else:
                per = self.cores / n
                self.throttled_s += dt
            self.v += per * dt
            self.cpu_s += per * n * dt
        self.t = t

    def flow(self, t: float) -> None:
        """Share enforcement: move this replica's clock to ``t`` at the rates in force."""
        if self.tags and t > self.t:
            dt = t - self.t
            self.v += self.per * dt
            self.cpu_s += self.x * dt
            if self.capped:
                self.throttled_s += dt
        self.t = t

    def next_done(self, cap: float) -> float:
        """When the request with the smallest finish tag completes if nothing else changes."""
        n = len(self.tags)
        per = cap if cap * n <= self.cores else self.cores / n
        return self.t + max(self.tags[0][0] - self.v, 0.0) / per


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
    ) -> None:
        self.name = name
        self.times = arrivals.times_s.tolist()
        self.works = arrivals.cpu_s.tolist()
        self.next_arrival = 0
        self.startup_s = startup_s
        self.cap = request_cores_max
        self.cores_max = cores_max
        """Share enforcement: the most CPU one replica may use (the service's ``cpu.max``)."""
        self.replicas: list[Replica] = []
        self.queue: deque[tuple[float, float]] = deque()
        """Requests waiting in the gateway: (arrival time, CPU-seconds)."""
        self.arrivals_total = 0
        self.completions_total = 0
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

    def count(self, phase: str) -> int:
        return sum(1 for r in self.replicas if r.phase == phase)

    def oldest_arrival(self) -> float | None:
        """Arrival time of the oldest request still waiting or in flight."""
        oldest = self.queue[0][0] if self.queue else math.inf
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
        )

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

    def run(
        self,
        t0: float,
        t1: float,
        *,
        wake_level: float = math.inf,
        through: bool = False,
        settle: bool = True,
    ) -> float | None:
        """Simulate ``[t0, t1)`` (``[t0, t1]`` with ``through``): arrivals, dispatch, processor
        sharing, completions, under limit enforcement (share: :class:`scaler.simulate.gps.SharedCpu`).  The model is then at ``t1`` (:attr:`clock`).

        Resumable: one regular tick's traffic may be simulated in consecutive pieces (early
        ticks fall between them), each starting where the last ended; arrivals and latencies
        add up in :attr:`tick_arrivals` / :attr:`tick_latencies` until :meth:`close_tick`.
        With ``wake_level``, it stops right after the arrival that brings the concurrency (in
        flight + queued) to that level and returns the arrival's time (the model is then at
        that time); ``None`` when the level is not reached.

        ``settle=False`` leaves each replica's clock at its last event instead of moving it
        to the end: pieces that end with no tick after them then give bit for bit what one
        whole run gives.  Settle (any run to the current :attr:`clock` does) before reading
        CPU counters or changing a replica's CPU.
        """
        cap = self.cap
        reps = self.replicas
        # Events at exactly t1 belong to this piece only with ``through``.
        lim = math.nextafter(t1, math.inf) if through else t1
        for r in reps:
            if r.phase == STARTING and r.ready_at <= t0:
                r.phase = READY
                r.t = t0
        ready = [r for r in reps if r.phase == READY]
        heap: list[tuple[float, int, int, Replica]] = []
        lat: list[float] = []
        queue = self.queue
        if ready and queue:
            self._flush(t0, ready, heap)
        concurrency = len(queue)
        for r in reps:
            if r.tags:
                concurrency += len(r.tags)
                r.ver += 1
                heap.append((r.next_done(cap), r.rid, r.ver, r))
        heapq.heapify(heap)
        # (ready_at, rid) orders them: rids are unique, so the replicas are never compared
        starting = [
            (r.ready_at, r.rid, r) for r in reps if r.phase == STARTING and r.ready_at < lim
        ]
        if len(starting) > 1:
            starting.sort()
        s_i = 0
        times, works = self.times, self.works
        i, n_arr = self.next_arrival, len(times)
        first = i
        inf = math.inf
        stop: float | None = None
        heappush, heappop = heapq.heappush, heapq.heappop
        while True:
            ta = times[i] if i < n_arr and times[i] < lim else inf
            tr = starting[s_i][0] if s_i < len(starting) else inf
            tc = heap[0][0] if heap else inf
            if tc < lim and tc <= ta and tc <= tr:
                _, rid, ver, r = heappop(heap)
                if ver != r.ver:
                    continue
                r.advance(tc, cap)
                tag, arrived = heappop(r.tags)
                r.v = max(r.v, tag)
                lat.append(tc - arrived)
                concurrency -= 1
                if r.tags:
                    r.ver += 1
                    heappush(heap, (r.next_done(cap), rid, r.ver, r))
                elif r.phase == DRAINING:
                    self.remove(r)
            elif tr < lim and tr <= ta:
                r = starting[s_i][2]
                s_i += 1
                if r.phase == STARTING:
                    r.phase = READY
                    r.t = tr
                    ready.append(r)
                    if queue:
                        self._flush(tr, ready, heap)
            elif ta < lim:
                w = works[i]
                i += 1
                concurrency += 1
                if not ready:
                    queue.append((ta, w))
                else:
                    r = ready[0] if len(ready) == 1 else min(ready, key=_in_flight)
                    r.advance(ta, cap)
                    heappush(r.tags, (r.v + w, ta))
                    r.ver += 1
                    heappush(heap, (r.next_done(cap), r.rid, r.ver, r))
                if concurrency >= wake_level:
                    stop = t1 = ta
                    break
            else:
                break
        if settle:
            for r in list(reps):
                r.advance(t1, cap)
                if r.phase == DRAINING and not r.tags:
                    self.remove(r)
        self.clock = t1
        self.next_arrival = i
        self.arrivals_total += i - first
        self.completions_total += len(lat)
        self.tick_arrivals += i - first
        self.tick_latencies += lat
        self.latencies += lat
        return stop

    def close_tick(self) -> None:
        """End the current regular tick: its arrivals and latencies join the signal windows."""
        self._arrivals_window.append(self.tick_arrivals)
        self._latency_window.append(self.tick_latencies)
        self._window_stats = None
        self.tick_arrivals = 0
        self.tick_latencies = []

    def wake_bound(self, level: float) -> float:
        """The earliest time the concurrency can reach ``level`` (``clock`` if it has).

        Concurrency rises only at arrivals, one at a time, and the arrivals are known in
        advance: it cannot reach ``level`` before the (level - concurrency now)-th next one.
        """
        need = math.ceil(level - self.concurrency)
        if need <= 0:
            return self.clock
        k = self.next_arrival + need - 1
        return self.times[k] if k < len(self.times) else math.inf

    def _flush(
        self, t: float, ready: list[Replica], heap: list[tuple[float, int, int, Replica]]
    ) -> None:
        """Hand every request waiting in the gateway to the least-loaded ready replicas at ``t``."""
        cap = self.cap
        touched: set[int] = set()
        by_rid: dict[int, Replica] = {}
        while self.queue:
            arrived, w = self.queue.popleft()
            r = ready[0] if len(ready) == 1 else min(ready, key=_in_flight)
            r.advance(t, cap)
            heapq.heappush(r.tags, (r.v + w, arrived))
            touched.add(r.rid)
            by_rid[r.rid] = r
        for rid in touched:
            r = by_rid[rid]
            r.ver += 1
            heapq.heappush(heap, (r.next_done(cap), rid, r.ver, r))


def _in_flight(r: Replica) -> int:
    return len(r.tags)


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
