"""The simulator's one event loop: every service's replicas on one node, under a CPU rule.

The rule (``budget.enforcement``, plus ``budget.lending`` for Sluice's run) is a strategy of
this loop, not a loop of its own:

* **limit**: a replica's decided CPU (``Replica.cores``) is a hard cap (CFS quota): a replica
  holding ``n`` requests runs at ``x = min(n * request_cores_max, cores)``;
* **limit with lending** (:class:`Lending`, :mod:`scaler.lending`): as limit, but the quotas
  move between ticks.  A service whose concurrency (in flight + queued) has been 0 for
  ``lend_after_idle_s`` is marked idle and lends, and so does a ready replica with nothing
  in flight for as long (:func:`scaler.lending.lend`): each busy replica's quota is its
  decided CPU plus its service's lent share, up to ``cpu.max``.  An arrival for an
  idle-marked service, or a request dispatched to an idle-marked replica, takes it back
  before it runs, as the local platform does (reclaim modelled as instant: the platform
  writes a few cgroup files).  A starting replica never lends;
* **share**: CPU is shared by weight, work-conserving: a replica is capped only at its
  service's ``cpu.max`` and the node (``budget.cpu``) caps the total; a replica holding ``n >
  0`` requests can use ``d = min(n * request_cores_max, cpu.max)`` cores, and the node's ``B``
  cores go to the busy replicas by weighted max-min water-filling (:func:`water_fill`, the
  kernel's rule): ``x = min(d, lambda * w)`` with ``sum x = min(B, sum
  d)``.  The weights are either each replica's decided CPU (``w = cores``: cgroup
  ``cpu.weight`` per replica, Kubernetes requests -- the baselines), or, with
  ``entitlements`` (Sluice's local platform), two levels: each service's entitlement (its fair
  share of the budget) among the services with busy replicas, then its busy replicas equally
  (a cgroup per service holding its replicas' cgroups).  Either way the weights fit ``B``, so
  a busy replica (service) gets at least ``min(d, w)``.

Within a replica, processor sharing: each request gets ``x / n``, with virtual-time finish
tags.  Rates change only at events (an arrival, a completion, a replica becoming ready, a
lending timer, a tick), so the loop is exact.  Under limit an event touches only its own
replica; under share, while ``sum d <= B`` too, and the water-filling is recomputed only when
the node is (or becomes) oversubscribed and a replica's demand changes, rescheduling only
the replicas whose rate moved.

With entitlements, every replica of a service that its share does not meet whole gets the
same rate, the service's **level** (:class:`scaler.simulate.model.Level`), and any event
elsewhere on an oversubscribed node moves every level.  So such a replica is scheduled on
its level's clock (the CPU one replica at the level has had), not in seconds: its first
request finishes when the clock has grown by its remaining work times its requests,
whatever the level does meanwhile.  An event then costs the water-filling over the
services and over the few demand values within each (``k * request_cores_max`` up to
``cpu.max``), one reschedule per level that moved, and one per replica that crossed a level
(met whole before, not after, or the reverse) -- not one per busy replica of the node.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from scaler.lending import Holding, idle_floor, lend
from scaler.simulate.model import (
    DRAINING,
    PENDING,
    READY,
    STARTING,
    Admission,
    Level,
    Replica,
    ServiceModel,
)

_EPS = 1e-9


def water_fill(
    capacity_cores: float, demands: Sequence[float], weights: Sequence[float]
) -> list[float]:
    """Share enforcement's rates, as the kernel shares a node by ``cpu.weight``: weighted
    max-min fair with no floor, each replica up to its demand, ``x_i = min(d_i, lambda * w_i)``
    and ``sum x = min(capacity, sum d)``.  ``weights`` must be > 0.

    The kernel's rule, not Sluice's arbiter (:func:`scaler.arbiter.water_fill`, the same
    maths with floors, on numpy arrays): a change to how Sluice arbitrates must not change
    the node it is measured on.  Plain Python: it runs on a handful of busy replicas at
    every arrival and completion of an oversubscribed node, where numpy's cost per call
    would be most of a run's time.  Demands in ascending order of ``d / w`` are met whole
    while the level the rest would share reaches them; the others get the level."""
    total = math.fsum(demands)
    if total <= capacity_cores:
        return list(demands)
    n = len(demands)
    order = sorted(range(n), key=lambda i: demands[i] / weights[i])
    left = capacity_cores
    weight = math.fsum(weights)
    out = [0.0] * n
    for k, i in enumerate(order):
        d, w = demands[i], weights[i]
        if d * weight <= left * w:  # d / w <= the level left / weight: met whole
            out[i] = d
            left -= d
            weight -= w
            continue
        rest = order[k:]
        level = max(left, 0.0) / math.fsum(weights[i2] for i2 in rest)
        for i2 in rest:
            out[i2] = level * weights[i2]
        break
    return out


@dataclass(frozen=True, slots=True)
class Lending:
    """Limit enforcement with lending: the hold and each service's floor and weight."""

    after_idle_s: float
    floor_cores: Mapping[str, float]
    """Per service, the CPU it always keeps (its floor): kept while idle, over its replicas."""
    weights: Mapping[str, float]
    keep_cores: float = 0.01
    """``budget.lend_keep_cores``: the least an idle replica keeps (:func:`idle_floor`)."""
    replicas: bool = False
    """``budget.lend_replicas``: idle ready replicas of a busy service lend too."""


Rule = Literal["limit", "share"]
"""The node's CPU rule (``budget.enforcement``); lending is limit's option (:class:`Lending`)."""


class EventLoop:
    """All services' models on one node, simulated together under one CPU ``rule``.

    :meth:`run` advances every model at once (under share or lending the rates of one
    service's replicas depend on the others').  Ticks, targets and the node's reservations
    (:class:`scaler.simulate.model.Node`) work on the models' replicas between runs.
    """

    def __init__(
        self,
        capacity_cores: float,
        models: Mapping[str, ServiceModel],
        *,
        rule: Rule = "limit",
        lending: Lending | None = None,
        entitlements: Mapping[str, float] | None = None,
    ) -> None:
        if lending is not None and rule != "limit":
            raise ValueError("lending is limit enforcement's option")
        if entitlements is not None and rule != "share":
            raise ValueError("entitlements are share enforcement's weights")
        self.rule = rule
        self.capacity_cores = capacity_cores
        self.models = list(models.values())
        self.lending = lending
        self.clock = 0.0
        n = len(self.models)
        self._extra = [0.0] * n
        """Lending: cores lent to each replica of a service now (0 when not borrowing)."""
        self._quiet_since: list[float | None] = [None] * n
        """Lending: since when a service has had no request in flight or queued."""
        self._idle: set[int] = set()
        """Lending: services marked idle (lending all above their floor)."""
        self._timers: list[tuple[float, int, int, Replica | None]] = []
        self._tseq = 0
        self._ridle: list[set[Replica]] = [set() for _ in range(n)]
        """Lending per replica: each service's ready replicas marked idle."""
        self._rquiet: dict[Replica, float] = {}
        """Lending per replica: since when a ready replica has had nothing in flight."""
        self._held: tuple[dict[str, Holding], list[float], list[float]] | None = None
        self.lends = 0
        """Lending: how many times the quotas were recomputed (a cost figure)."""
        self._busy: dict[Replica, int] = {}
        """Replicas holding requests -> index of their model (insertion ordered: deterministic)."""
        self._sum_d = 0.0
        self._heap: list[tuple[float, int, int, Replica | Level]] = []
        self._seq = 0
        self.recomputes = 0
        """How many times the water-filling ran (a cost figure, for profiling)."""
        self.entitlements: list[float] | None = None
        """Share: each service's weight (its entitlement, in model order), its replicas equal;
        None: each replica weighs its decided CPU."""
        if entitlements is not None:
            self.entitlements = [float(entitlements[m.name]) for m in self.models]
            if not all(e > 0.0 for e in self.entitlements):
                raise ValueError(f"entitlements must be > 0, got {dict(entitlements)!r}")
        self._levels = [Level(j, 0.0) for j in range(n)]
        """Share by entitlement: each service's level (:class:`Level`)."""
        self._mu = [math.inf] * n
        """Share by entitlement: each service's level now (inf: every busy replica met whole)."""
        self._buckets: list[dict[float, dict[Replica, None]]] = [{} for _ in range(n)]
        """Share by entitlement: each service's busy replicas by their demand (a handful of
        values: ``k * request_cores_max`` up to ``cpu.max``)."""
        self._dirty: set[int] = set()
        """Share by entitlement: services whose level's next completion must be rescheduled."""
        self._totals = [0.0] * n
        """Share by entitlement: each service's busy replicas' demands together."""

    def __repr__(self) -> str:
        return (
            f"EventLoop({self.rule}, {self.capacity_cores:g} cores, t={self.clock:g}, "
            f"{len(self._busy)} busy replicas, demand {self._sum_d:g})"
        )

    def rates(self) -> dict[str, list[float]]:
        """Cores each replica gets now, per service (replicas in model order; idle ones 0)."""
        return {
            m.name: [
                (r.level.mu if r.level is not None else r.x) if r.tags else 0.0 for r in m.replicas
            ]
            for m in self.models
        }

    # ---- rates ------------------------------------------------------------------------------

    def _schedule(self, r: Replica, x: float, m: ServiceModel) -> None:
        """Give busy ``r`` (already flowed to now) ``x`` cores and (re)schedule its next completion.

        Throttled time counts while it is held at its own ``cpu.max`` with requests that could
        use more, as the kernel counts a cgroup's own quota (``cpu.stat`` ``throttled_usec``;
        cAdvisor's ``cfs_throttled_seconds``): getting less by weight under contention, or by
        the budget's parent quota, is not the replica's throttling."""
        n = len(r.tags)
        r.x = x
        r.per = per = x / n
        r.capped = x >= m.cores_max - _EPS and n * m.cap > m.cores_max + _EPS
        r.ver += 1
        self._seq += 1
        # per > 0: a busy replica gets at least min(d, w) > 0 (inf guards rounding only)
        done = r.t + max(r.tags[0][0] - r.v, 0.0) / per if per > 0.0 else math.inf
        heapq.heappush(self._heap, (done, self._seq, r.ver, r))

    def _changed(self, r: Replica, j: int, t: float) -> None:
        """``r`` (flowed to ``t``) gained or lost requests at ``t``: update the rates."""
        m = self.models[j]
        n = len(r.tags)
        if self.rule == "limit":
            if n:
                self._busy[r] = j
                self._schedule_capped(r, j)
            else:
                self._busy.pop(r, None)
                r.x = r.per = 0.0
                r.capped = False
            return
        d = min(n * m.cap, m.cores_max) if n else 0.0
        old = r.d
        if n:
            self._busy[r] = j
        else:
            self._busy.pop(r, None)
            r.x = r.per = 0.0
            r.capped = False
        if self.entitlements is not None:
            self._changed_by_service(r, j, t, d, old)
            return
        if d == old:  # its demand and so every rate is unchanged; only its per-request rate
            if n:
                self._schedule(r, r.x, m)
            return
        r.d = d
        total = self._sum_d - old + d
        if self._sum_d <= self.capacity_cores and total <= self.capacity_cores:
            # the node is not oversubscribed, before or after: r gets its demand
            self._sum_d = total
            if n:
                self._schedule(r, d, m)
            return
        self._refill(t, r)

    # ---- share by entitlement: a level per service -----------------------------------------

    def _changed_by_service(self, r: Replica, j: int, t: float, d: float, old: float) -> None:
        """Share by entitlement: ``r`` (flowed to ``t``) of service ``j`` now demands ``d``
        (was ``old``): re-level the node if that can move a level, then reschedule ``r``."""
        if d != old:
            bucket = self._buckets[j]
            if old:
                holders = bucket[old]
                del holders[r]
                if not holders:
                    del bucket[old]
            if d:
                bucket.setdefault(d, {})[r] = None
            r.d = d
            self._totals[j] = _demand_of(bucket)
            total = self._sum_d - old + d
            capacity = self.capacity_cores
            if self._sum_d > capacity or total > capacity:
                self._relevel(t, r, j)
                return
            self._sum_d = total  # not oversubscribed, before or after: every level is inf
        if d:
            self._place(r, j, t)
        else:
            r.level = None
            r.ver += 1  # its pending completion, if any, is void
        self._push_levels()

    def _place(self, r: Replica, j: int, t: float) -> None:
        """Schedule busy ``r`` (flowed to ``t``) of service ``j`` at its rate under the service's
        level: its demand when that is met whole, else the level (on the level's clock)."""
        mu = self._mu[j]
        m = self.models[j]
        if r.d <= mu:
            r.level = None
            self._schedule(r, r.d, m)
            return
        level = self._levels[j]
        level.move(t)
        n = len(r.tags)
        r.level = level
        r.u0 = level.u
        r.x = mu
        r.per = mu / n
        r.capped = mu >= m.cores_max - _EPS and n * m.cap > m.cores_max + _EPS
        r.ver += 1
        self._seq += 1
        due = level.u + max(r.tags[0][0] - r.v, 0.0) * n
        heapq.heappush(level.heap, (due, self._seq, r.ver, r))
        self._dirty.add(j)

    def _push_levels(self) -> None:
        """(Re)schedule the next completion at each changed level: the replica first to finish
        on the level's clock, at the time the clock reaches it at the level in force."""
        for j in self._dirty:
            level = self._levels[j]
            heap = level.heap
            while heap and heap[0][2] != heap[0][3].ver:
                heapq.heappop(heap)  # rescheduled or gone since
            level.ver += 1
            if heap and level.mu > 0.0:
                due, seq, _, _ = heap[0]
                level.pushed = seq
                self._seq += 1
                done = level.t + max(due - level.u, 0.0) / level.mu
                heapq.heappush(self._heap, (done, self._seq, level.ver, level))
        self._dirty.clear()

    def _level_of(self, j: int, got: float) -> float:
        """The level at which service ``j``'s busy replicas, weighted equally, share ``got``
        cores (less than they demand together): demands below it met whole (weighted max-min,
        as :func:`water_fill` with equal weights)."""
        holders = self._buckets[j]
        count = sum(len(rs) for rs in holders.values())
        left = got
        for d in sorted(holders):
            c = len(holders[d])
            if d * count <= left:  # d <= the level the rest would share: met whole
                left -= d * c
                count -= c
                continue
            return max(left, 0.0) / count
        return math.inf

    def _relevel(
        self, t: float, changed: Replica | None, cj: int = -1, *, everyone: bool = False
    ) -> None:
        """Share by entitlement: the node's cores water-filled over the services with busy
        replicas (weight: the entitlement; demand: their replicas' together), then each
        service's cores over its busy replicas equally: each service's level.  Replicas whose
        class (met whole or at the level) moved are rescheduled, and ``changed`` (of service
        ``cj``), or every busy replica; those that stay at a level that moved are not."""
        self.recomputes += 1
        n = len(self.models)
        if everyone:  # a tick: decisions, replicas and demands may have changed
            self._buckets = [{} for _ in range(n)]
            for r, j in self._busy.items():
                self._buckets[j].setdefault(r.d, {})[r] = None
            self._levels = [Level(j, t) for j in range(n)]
            self._mu = [math.inf] * n
            self._dirty.clear()
            self._totals = [_demand_of(bucket) for bucket in self._buckets]
        assert self.entitlements is not None
        busy = [j for j in range(n) if self._buckets[j]]
        totals = [self._totals[j] for j in busy]
        self._sum_d = math.fsum(totals)
        mus = [math.inf] * n
        if self._sum_d > self.capacity_cores:
            got = water_fill(self.capacity_cores, totals, [self.entitlements[j] for j in busy])
            for j, g, total in zip(busy, got, totals, strict=True):
                if g < total - _EPS:
                    mus[j] = self._level_of(j, g)
        for j in range(n):
            old, new = self._mu[j], mus[j]
            if old == new:
                continue
            level = self._levels[j]
            level.move(t)
            self._mu[j] = new
            level.mu = new if new != math.inf else 0.0
            self._dirty.add(j)
            if everyone:
                continue
            low, high = min(old, new), max(old, new)
            for d, holders in self._buckets[j].items():
                if low < d <= high:  # met whole under one level, at the level under the other
                    for r in holders:
                        if r is not changed:
                            r.flow(t)
                            self._place(r, j, t)
        if everyone:
            for r, j in self._busy.items():
                r.flow(t)
                self._place(r, j, t)
        elif changed is not None and changed.tags:
            self._place(changed, cj, t)
        elif changed is not None:
            changed.level = None
            changed.ver += 1
        self._push_levels()

    def _refill(self, t: float, changed: Replica | None, *, everyone: bool = False) -> None:
        """Water-fill the node over the busy replicas at ``t``; reschedule those whose rate
        moved (and ``changed``, whose requests did), or every one."""
        if self.rule == "limit":
            if self.lending is not None:
                self._relend(t, changed, everyone=everyone)
                return
            for r, j in self._busy.items():
                if everyone or r is changed:
                    r.flow(t)
                    self._schedule_capped(r, j)
            return
        if self.entitlements is not None:
            self._relevel(t, changed, everyone=everyone)
            return
        self.recomputes += 1
        items = list(self._busy.items())
        demands = [r.d for r, _ in items]
        xs = water_fill(self.capacity_cores, demands, [r.cores for r, _ in items])
        self._sum_d = math.fsum(demands)
        models = self.models
        for (r, j), x in zip(items, xs, strict=True):
            if everyone or x != r.x or r is changed:
                r.flow(t)
                self._schedule(r, x, models[j])

    # ---- limit enforcement, lending ---------------------------------------------------------

    def _schedule_capped(self, r: Replica, j: int) -> None:
        """Limit: give busy ``r`` (flowed to now) what its quota (with lending: its decided CPU
        plus what it borrows) allows its requests."""
        m = self.models[j]
        extra = self._extra[j]
        quota = min(r.cores + extra, m.cores_max) if extra > 0.0 else r.cores
        demand = len(r.tags) * m.cap
        self._schedule(r, min(demand, quota), m)
        r.capped = demand > quota + _EPS  # held at its own quota: throttled

    def _holdings(self) -> tuple[dict[str, Holding], list[float], list[float]]:
        """Lending: what each service holds now, its mean quota per replica and what it would
        lend idle (cached until a tick or a replica leaves)."""
        if self._held is None:
            assert self.lending is not None
            holdings: dict[str, Holding] = {}
            means: list[float] = []
            lendable: list[float] = []
            for m in self.models:
                held = [r.cores for r in m.replicas if r.phase != PENDING]
                mean = math.fsum(held) / len(held) if held else 0.0
                floor = idle_floor(
                    len(held), self.lending.floor_cores[m.name], self.lending.keep_cores
                )
                means.append(mean)
                lendable.append(len(held) * max(mean - floor, 0.0))
                holdings[m.name] = Holding(
                    len(held), mean, floor, max(m.cores_max, mean), self.lending.weights[m.name]
                )
            self._held = (holdings, means, lendable)
        return self._held

    def _relend(self, t: float, changed: Replica | None, *, everyone: bool = False) -> None:
        """Lending: recompute what the idle services lend and reschedule the busy replicas
        whose quota moved (and ``changed``, or every one)."""
        if everyone:
            self._held = None  # a tick: decisions and replicas may have changed
            for j, m in enumerate(self.models):
                live = set(m.replicas)
                self._ridle[j] = {r for r in self._ridle[j] if r in live and r.phase == READY}
        holdings, means, _ = self._holdings()
        self.lends += 1
        idle: dict[str, int] = {}
        for j, m in enumerate(self.models):
            if j in self._idle:
                idle[m.name] = holdings[m.name].replicas
            elif self._ridle[j]:
                idle[m.name] = len(self._ridle[j])
        quota = lend(holdings, idle)
        moved: set[int] = set()
        for j, m in enumerate(self.models):
            extra = 0.0 if j in self._idle else max(quota[m.name] - means[j], 0.0)
            if extra != self._extra[j]:
                self._extra[j] = extra
                moved.add(j)
        for r, j in self._busy.items():
            if everyone or j in moved or r is changed:
                r.flow(t)
                self._schedule_capped(r, j)

    def _lends_nothing(self, j: int) -> bool:
        """Lending: whether marking ``j`` idle or busy leaves every quota as it is (nothing is
        lent by the others and ``j`` has nothing to lend)."""
        _, _, lendable = self._holdings()
        if lendable[j] > _EPS:
            return False
        if any(self._ridle[i] and lendable[i] > _EPS for i in range(len(self.models)) if i != j):
            return False  # replicas of others lend: whether j borrows changes their quotas
        return all(lendable[i] <= _EPS for i in self._idle if i != j)

    def _quiet(self, j: int, t: float) -> None:
        """Lending: service ``j`` has nothing in flight or queued from ``t``: arm its idle timer."""
        assert self.lending is not None
        self._quiet_since[j] = t
        self._tseq += 1
        heapq.heappush(self._timers, (t + self.lending.after_idle_s, self._tseq, j, None))

    def _replica_quiet(self, r: Replica, j: int, t: float) -> None:
        """Lending per replica: ready ``r`` has nothing in flight from ``t``: arm its timer."""
        assert self.lending is not None
        if not self.lending.replicas:
            return
        self._rquiet[r] = t
        self._tseq += 1
        heapq.heappush(self._timers, (t + self.lending.after_idle_s, self._tseq, j, r))

    def _replica_wake(self, r: Replica, j: int, t: float) -> None:
        """Lending per replica: a request goes to ``r`` at ``t``: an idle-marked one takes
        its quota back before the request runs."""
        self._rquiet.pop(r, None)
        if r in self._ridle[j]:
            self._ridle[j].discard(r)
            if j not in self._idle:
                self._relend(t, None)

    def _replica_timer(self, at: float, j: int, r: Replica) -> None:
        """Lending per replica: ``r``'s idle timer is due at ``at``: mark it idle if it stayed
        ready and empty."""
        assert self.lending is not None
        since = self._rquiet.get(r)
        if since is None or r.tags or r.phase != READY or since + self.lending.after_idle_s != at:
            return
        if r in self._ridle[j]:
            return
        self._ridle[j].add(r)
        if j not in self._idle:
            self._relend(at, None)

    def _wake(self, j: int, t: float) -> None:
        """Lending: a request arrived for service ``j`` at ``t``: it is busy; an idle-marked
        one takes its quota back before the request is dispatched."""
        self._quiet_since[j] = None
        if j in self._idle:
            self._idle.discard(j)
            # every replica's quota back; those the request does not go to lend again after
            # the hold (as the local platform does)
            for r in self._ridle[j]:
                self._replica_quiet(r, j, t)
            self._ridle[j].clear()
            if not self._lends_nothing(j):
                self._relend(t, None)

    def _timer(self, at: float, j: int) -> None:
        """Lending: ``j``'s idle timer is due at ``at``: mark it idle if it stayed quiet."""
        assert self.lending is not None
        since = self._quiet_since[j]
        if since is None or j in self._idle or since + self.lending.after_idle_s != at:
            return  # busy again since, or an older timer
        self._idle.add(j)
        if not self._lends_nothing(j):
            self._relend(at, None)

    # ---- traffic ----------------------------------------------------------------------------

    def run(
        self, t1: float, *, levels: Mapping[str, float] | None = None
    ) -> tuple[str, float] | None:
        """Simulate every service over ``[clock, t1)``: arrivals, dispatch, shared CPU, completions.

        With ``levels`` (wake levels per service), stop right after the arrival that brings a
        service's concurrency (in flight + queued) to its level, and return (service, time);
        ``None`` when no level is reached.  Every model is then settled at the returned time
        (or ``t1``): its replicas' CPU counted up to it, its :attr:`ServiceModel.clock` there.
        """
        t0 = self.clock
        models = self.models
        wake = [math.inf] * len(models)
        if levels:
            for j, m in enumerate(models):
                wake[j] = levels.get(m.name, math.inf)
        ready_of: list[list[Replica]] = []
        conc: list[int] = []
        firsts: list[int] = []
        lats: list[list[float]] = []
        starting: list[tuple[float, int, int, Replica]] = []
        arrivals: list[tuple[float, int]] = []
        self._busy = {}
        self._heap = []
        for j, m in enumerate(models):
            if m.queue:
                m.expire(t0)
            for r in m.replicas:
                r.flow(t0)  # a no-op when settled (the last run ended at t0)
                if r.phase == STARTING:
                    if r.ready_at <= t0:
                        r.phase = READY
                    elif r.ready_at < t1:
                        starting.append((r.ready_at, j, r.rid, r))
                if r.tags:
                    self._busy[r] = j
                    r.d = min(len(r.tags) * m.cap, m.cores_max)
                else:
                    r.d = r.x = r.per = 0.0
            ready_of.append([r for r in m.replicas if r.phase == READY])
            conc.append(m.concurrency)
            firsts.append(m.next_arrival)
            lats.append([])
            i = m.next_arrival
            if i < len(m.times) and m.times[i] < t1:
                arrivals.append((m.times[i], j))
        starting.sort()
        heapq.heapify(arrivals)
        lending = self.lending is not None
        if lending:
            for j in range(len(models)):
                if conc[j] == 0 and self._quiet_since[j] is None and j not in self._idle:
                    self._quiet(j, t0)
                for r in models[j].replicas:
                    if (
                        r.phase == READY
                        and not r.tags
                        and r not in self._rquiet
                        and r not in self._ridle[j]
                    ):
                        self._replica_quiet(r, j, t0)
        timers = self._timers
        self._refill(t0, None, everyone=True)  # weights and replicas may have changed at a tick
        for j, m in enumerate(models):
            if m.queue and ready_of[j]:
                conc[j] -= self._flush(j, ready_of[j], t0)
        stop: tuple[str, float] | None = None
        for j, m in enumerate(models):
            if conc[j] >= wake[j]:
                stop = (m.name, t0)
                t1 = t0
                break
        heap = self._heap
        heappop = heapq.heappop
        inf = math.inf
        s_i = 0
        while stop is None:
            ta = arrivals[0][0] if arrivals else inf
            tr = starting[s_i][0] if s_i < len(starting) else inf
            tc = heap[0][0] if heap else inf
            tt = timers[0][0] if timers else inf
            if tc < t1 and tc <= ta and tc <= tr and tc <= tt:
                _, _, ver, due = heappop(heap)
                if ver != due.ver:
                    continue
                if isinstance(due, Level):  # the first replica on a level's clock
                    top = due.heap
                    if not top or top[0][1] != due.pushed or top[0][2] != top[0][3].ver:
                        self._dirty.add(due.j)  # not the replica it was computed for
                        self._push_levels()
                        continue
                    r = heappop(top)[3]
                    self._dirty.add(due.j)  # its event is spent: the next one is due
                else:
                    r = due
                j = self._busy[r]
                r.flow(tc)
                tag, arrived = heappop(r.tags)
                r.v = max(r.v, tag)
                lats[j].append(tc - arrived)
                mj = models[j]
                mj.in_system_arrivals -= arrived
                mj.residence_total_s += tc - arrived
                conc[j] -= 1
                if not r.tags and r.phase == DRAINING:
                    models[j].remove(r)
                    self._held = None  # it no longer holds CPU
                self._changed(r, j, tc)
                if models[j].queue and r.phase == READY:
                    conc[j] -= self._flush(j, [r], tc)  # the freed slot takes the oldest
                if lending and conc[j] == 0:
                    self._quiet(j, tc)
                if lending and not r.tags and r.phase == READY:
                    self._replica_quiet(r, j, tc)
            elif tr < t1 and tr <= ta and tr <= tt:
                _, j, _, r = starting[s_i]
                s_i += 1
                if r.phase == STARTING:
                    r.phase = READY
                    r.t = tr
                    ready_of[j].append(r)
                    if models[j].queue:
                        conc[j] -= self._flush(j, ready_of[j], tr)
            elif tt < t1 and tt <= ta:
                _, _, j, quiet = heappop(timers)
                if quiet is None:
                    self._timer(tt, j)
                else:
                    self._replica_timer(tt, j, quiet)
            elif ta < t1:
                _, j = arrivals[0]
                m = models[j]
                i = m.next_arrival
                m.next_arrival = i + 1
                if i + 1 < len(m.times) and m.times[i + 1] < t1:
                    heapq.heapreplace(arrivals, (m.times[i + 1], j))
                else:
                    heappop(arrivals)
                conc[j] += 1
                if lending and conc[j] == 1:
                    self._wake(j, ta)
                ready = ready_of[j]
                adm = m.admission
                if m.queue:
                    conc[j] -= m.expire(ta)
                # First come first served: nobody passes a request already waiting.
                to = None if m.queue else _free(ready, adm.slots_per_replica)
                if to is not None:
                    if lending:
                        self._replica_wake(to, j, ta)
                    to.flow(ta)
                    heapq.heappush(to.tags, (to.v + m.works[i], ta))
                    m.in_system_arrivals += ta
                    self._changed(to, j, ta)
                elif (bound := _queue_bound(adm, ready)) is not None and len(m.queue) >= bound:
                    m.rejected_queue_full += 1  # 503 queue-full, at once
                    conc[j] -= 1
                    if lending and conc[j] == 0:
                        self._quiet(j, ta)
                else:
                    m.enqueue(ta, m.works[i], cold=not ready)
                if conc[j] >= wake[j]:
                    stop = (m.name, ta)
                    t1 = ta
            else:
                break
        for j, m in enumerate(models):
            if m.queue:
                m.expire(t1)  # the queue a tick's signals read holds no expired request
            for r in list(m.replicas):
                r.flow(t1)
                if r.level is not None:  # its rate in force, off the level's clock
                    r.x = r.level.mu
                    r.per = r.x / len(r.tags)
                    r.level = None
                if r.phase == DRAINING and not r.tags:
                    m.remove(r)
            m.clock = t1
            arrived = m.next_arrival - firsts[j]
            m.arrivals_total += arrived
            m.tick_arrivals += arrived
            m.completions_total += len(lats[j])
            m.tick_latencies += lats[j]
            m.latencies += lats[j]
        self.clock = t1
        return stop

    def _flush(self, j: int, ready: list[Replica], t: float) -> int:
        """Hand the requests waiting in service ``j``'s gateway queue, oldest first, to its
        least-loaded ready replicas (with admission slots: while one has a free slot).
        Returns how many timed out in the queue instead (rejected)."""
        m = self.models[j]
        queue, slots = m.queue, m.admission.slots_per_replica
        expired = m.expire(t)
        while queue:
            r = _free(ready, slots)
            if r is None:
                break
            arrived, w = m.dequeue()
            if self.lending is not None:
                self._replica_wake(r, j, t)
            r.flow(t)
            heapq.heappush(r.tags, (r.v + w, arrived))
            self._changed(r, j, t)
        return expired


def _demand_of(bucket: dict[float, dict[Replica, None]]) -> float:
    """Share by entitlement: a service's busy replicas' demands together (by demand value)."""
    return math.fsum(d * len(rs) for d, rs in bucket.items())


def _queue_bound(adm: Admission, ready: list[Replica]) -> int | None:
    """Most requests the gateway's queue holds now: ``cold_start_max`` while no replica is
    ready (a cold start), ``queue_max`` otherwise; None: unbounded."""
    return adm.queue_max if ready else adm.cold_start_max


def _free(ready: list[Replica], slots: int | None) -> Replica | None:
    """The ready replica with the fewest in flight (ties: the oldest), among those with a
    free slot when ``slots`` is set; None when there is none."""
    best: Replica | None = None
    for r in ready:
        n = len(r.tags)
        if (slots is None or n < slots) and (best is None or n < len(best.tags)):
            best = r
    return best
