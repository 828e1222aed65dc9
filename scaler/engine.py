"""The scaler's decision function: ``Engine.tick(now, signals, states) -> decisions`` (pure).

Contract (other parts of Sluice code against it; extend, don't rename):

* ``Engine(policies, budget)`` holds per-service window state in memory; no I/O, no clock.
  Optional keywords: ``staleness_s`` (signals older than this freeze the service, default
  3 s = 3 ticks at 1 s), ``hysteresis_cores`` / ``hysteresis_ratio`` (the arbiter's band).
* ``tick(now, signals, states)`` takes the time on the injected clock, the latest
  ``ServiceSignals`` per service (a service missing from ``signals``, or whose snapshot is
  stale, is frozen, never scaled down) and the platform's ``ServiceState`` per service,
  and returns one ``Decision`` per configured service, in the policies' order.

Per tick and service: the metric (concurrency or rps) is fed to the horizontal recommender
(KPA windows, or the HPA calculation), which says how many *reference replicas* (of
``cpu.request`` cores) are needed: the replicas to run (held warm for
``scale_down_delay_s``; a replica still starting is never removed; a KPA service whose CPU is
measured scales down only to the replicas that hold that CPU at its target utilisation).  The CPU demand is the
work now (when the platform measures CPU: the larger of the use and this tick's metric at the
KPA's aim; else the recommendation's reference replicas × ``cpu.request``); what the replicas
could use beyond it (warm replicas, bigger replicas) is soft demand, served from spare CPU only.
The arbiter (``scaler.arbiter``) turns all demands into allocations under the budget, and
each allocation is given to the replicas (``size_arrays``): new replicas start only on CPU
the service surely keeps (under ``share``: or into idle CPU, once its ready replicas have
been full for a panic window, or hold a backlog they would take one to drain); under
``share`` serving replicas keep ``cpu.min`` each.

Every per-service quantity lives in a numpy array indexed like the policies, so one tick is
a few dozen array operations whatever the number of services; each decision renders its
reasons from the tick's arrays only when someone reads them (``scaler.explain``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from operator import attrgetter

import numpy as np

from scaler.arbiter import (
    BoolArray,
    FloatArray,
    IndependentClaim,
    IntArray,
    arbitrate_arrays,
    arbitrate_independent,
    fair_shares,
    size_arrays,
)
from scaler.decision import Decision, ServiceState
from scaler.explain import FROZEN_REASONS, TickView, rule_names
from scaler.explanation import Trace
from scaler.hpa_batch import HpaBatch, HpaTick
from scaler.kpa_batch import RULES, KpaBatch, reference_max
from scaler.metrics import MetricInputs, MetricsVerdict, ServiceMetrics
from scaler.policy import BudgetConfig, BudgetCpu, ScalingPolicy, check_floors
from scaler.signals import ServiceSignals

_EPS = 1e-9
_THROTTLED_S_PER_S = 0.01
"""Throttled time per second per ready replica above which measured use is capped."""
_NOT_FROZEN, _MISSING, _STALE, _NO_DATA, _INVALID = 0, 1, 2, 3, 4


class _Observed:
    """One tick's signals as arrays, with the services whose figures cannot be used.

    A figure the engine reads (``at``, ``in_flight``, ``queued``, ``arrivals_total``,
    ``completions_total``, ``rps``, ``cpu_seconds_total``, ``cpu_throttled_seconds_total``,
    ``concurrency_seconds_total``) that is not a finite number >= 0 makes the whole snapshot
    *invalid*: that service is frozen, nothing of it enters a
    window or a rate, and the other services decide normally.
    """

    __slots__ = (
        "area",
        "arrivals",
        "at",
        "completions",
        "cpu",
        "given",
        "in_flight",
        "invalid",
        "queued",
        "rps",
        "throttled",
    )

    def __init__(
        self, columns: dict[str, FloatArray], invalid: BoolArray, given: BoolArray
    ) -> None:
        self.at = columns["at"]
        self.in_flight = columns["in_flight"]
        self.queued = columns["queued"]
        self.arrivals = columns["arrivals_total"]
        self.completions = columns["completions_total"]
        self.rps = columns["rps"]
        self.cpu = columns["cpu_seconds_total"]
        self.throttled = columns["cpu_throttled_seconds_total"]
        self.area = columns["concurrency_seconds_total"]
        self.invalid = invalid
        self.given = given
        """A snapshot was handed in (else: missing)."""

    @classmethod
    def of(cls, sigs: list[ServiceSignals | None]) -> _Observed:
        n = len(sigs)
        rows = [_FIELDS(s if s is not None else _ABSENT) for s in sigs]
        # One conversion for every figure (None -> NaN: not measured).
        table = np.array(rows, dtype=np.float64).reshape(n, len(_NAMES))
        columns = {name: table[:, k] for k, name in enumerate(_NAMES)}
        required = table[:, 1 : 1 + len(_REQUIRED)]
        bad = (~(required >= 0.0) | (required == math.inf)).any(axis=1)
        at = columns["at"]
        given = np.array([s is not None for s in sigs], dtype=bool).reshape(n)
        bad |= np.isnan(at) | (at == math.inf) | ((at == -math.inf) & given)
        optional = table[:, 1 + len(_REQUIRED) :]
        if not np.isfinite(optional).all():
            for k, name in enumerate(_OPTIONAL):
                col = optional[:, k]
                odd = ~np.isfinite(col)
                if odd.any():
                    has = [r is not None and getattr(r, name) is not None for r in sigs]
                    bad |= np.array(has, dtype=bool) & odd
        bad |= (optional < 0.0).any(axis=1)
        if bad.any():
            for name, col in columns.items():
                if name != "at":
                    columns[name] = np.where(bad, np.where(np.isnan(col), col, 0.0), col)
        return cls(columns, bad & given, given)


_REQUIRED = ("in_flight", "queued", "arrivals_total", "completions_total", "rps")
_OPTIONAL = ("cpu_seconds_total", "cpu_throttled_seconds_total", "concurrency_seconds_total")
_NAMES = ("at", *_REQUIRED, *_OPTIONAL)
_FIELDS = attrgetter(*_NAMES)
_ABSENT = ServiceSignals("", -math.inf)


def invalid_fields(signals: ServiceSignals) -> list[str]:
    """The figures of ``signals`` the engine refuses (not finite, or negative)."""
    out: list[str] = []
    for name in ("at", *_REQUIRED, *_OPTIONAL):
        value = getattr(signals, name)
        if value is None:
            continue
        if not math.isfinite(value) or (name != "at" and value < 0):
            out.append(f"{name}={value!r}")
    return out


def _per_second(
    total: FloatArray, previous: FloatArray, dt: FloatArray, has: BoolArray
) -> tuple[BoolArray, FloatArray]:
    """A monotonic counter's increase per second since its previous reading, where ``has`` and
    the counter moved forward in time and value (``good``); NaN elsewhere (a counter that went
    back restarted)."""
    good = has & (dt > 0) & (total >= previous)
    return good, np.where(good, (total - previous) / np.where(good, dt, 1.0), math.nan)


class _Peaks:
    """Per service, the most replicas recommended (and run) over the last ``delay`` seconds (a sliding max
    in ``_SLOTS - 1`` to ``_SLOTS`` buckets of ``delay / (_SLOTS - 1)`` seconds)."""

    _SLOTS = 5

    def __init__(self, delay: FloatArray) -> None:
        n = len(delay)
        self.delay = delay
        self.width = np.where(delay > 0, delay / (self._SLOTS - 1), 1.0)
        self.bucket = np.full(n, -(2**62), dtype=np.int64)
        self.peaks = np.zeros((n, self._SLOTS), dtype=np.int64)
        self._rows = np.arange(n)

    def _advance(self, now: float) -> IntArray:
        bucket = np.floor(now / self.width).astype(np.int64)
        moved = bucket != self.bucket
        if moved.any():
            gap = np.minimum(bucket - self.bucket, self._SLOTS)
            for k in range(1, self._SLOTS + 1):  # clear the buckets skipped or reused
                clear = moved & (gap >= k)
                if clear.any():
                    col = (bucket - (k - 1)) % self._SLOTS
                    self.peaks[self._rows[clear], col[clear]] = 0
            self.bucket = np.where(moved, bucket, self.bucket)
        return bucket % self._SLOTS

    def held(self, now: float, want: IntArray) -> IntArray:
        """``want``, raised to the most replicas run within the delay."""
        self._advance(now)
        return np.where(self.delay > 0, np.maximum(self.peaks.max(axis=1), want), want)

    def record(self, now: float, replicas: IntArray, active: BoolArray) -> None:
        col = self._advance(now)
        current = self.peaks[self._rows, col]
        self.peaks[self._rows, col] = np.where(active, np.maximum(current, replicas), current)


class Engine:
    """Signals + policies + platform state -> one explained decision per service, per tick."""

    def __init__(
        self,
        policies: Mapping[str, ScalingPolicy],
        budget: BudgetConfig,
        *,
        staleness_s: float = 3.0,
        hysteresis_cores: float = 0.05,
        hysteresis_ratio: float = 0.05,
        cpu: BudgetCpu | None = None,
    ) -> None:
        if staleness_s <= 0:
            raise ValueError(f"staleness_s must be > 0, got {staleness_s!r}")
        self.policies = dict(policies)
        self.budget = budget
        in_force = cpu or budget.fixed()
        if in_force is None:
            raise ValueError("budget.cpu is auto: pass the measured budget (cpu=BudgetCpu(...))")
        self.cpu = in_force
        """The budget in force (``budget.cpu``, or what the platform measured for auto)."""
        check_floors(in_force, self.policies)
        self.staleness_s = staleness_s
        self.hysteresis_cores = hysteresis_cores
        self.hysteresis_ratio = hysteresis_ratio
        self.share = budget.enforcement == "share"
        """Decided CPU is a weight, not a cap (``budget.enforcement: share``, resolved): a
        serving replica keeps ``cpu.min`` while another service bursts."""
        self.names = list(self.policies)
        pols = list(self.policies.values())
        self._pols = pols
        n = len(pols)
        self.n = n

        def arr(values: list[float]) -> FloatArray:
            return np.array(values, dtype=np.float64).reshape(n)

        def iarr(values: list[int]) -> IntArray:
            return np.array(values, dtype=np.int64).reshape(n)

        self.cpu_ref = arr([p.cpu.initial_cores for p in pols])
        self.cpu_min = arr([p.cpu.min for p in pols])
        self.cpu_max = arr([p.cpu.max for p in pols])
        self.min_r = iarr([p.min_replicas for p in pols])
        self.max_r = iarr([p.max_replicas for p in pols])
        self.weight = arr([p.weight for p in pols])
        self.minimum = self.min_r * self.cpu_min
        self.floor = np.maximum(arr([p.floor_cores for p in pols]), self.minimum)
        self.cap = self.max_r * self.cpu_max
        self.target_utilization = arr([p.target_utilization for p in pols])
        self.target = arr([p.target for p in pols])
        self._aim = self.target * arr(
            [p.target_utilization if p.mode == "kpa" else 1.0 for p in pols]
        )
        """The metric per reference replica the scaling rule aims at: the KPA's target ×
        target_utilization; the HPA's target (its rule has no utilisation headroom)."""
        self.fair = fair_shares(in_force.cores, pols) if n else arr([])
        self.is_rps: BoolArray = np.array([p.metric == "rps" for p in pols], dtype=bool)
        self.is_cpu: BoolArray = np.array([p.metric == "cpu" for p in pols], dtype=bool)
        self.horizontal: BoolArray = np.array([p.prefer == "horizontal" for p in pols], dtype=bool)
        self.unit = (
            self.cpu_ref.copy()
            if budget.arbitration == "independent"
            else arr([p.replica_cores for p in pols])
        )
        """A replica at full size (``ScalingPolicy.replica_cores``); ``independent``: its
        ``cpu.request``, what one autoscaler per service gives each replica (counted at
        ``cpu.max``, the KPA's scale-down rate would read every replica as several and never
        let the count fall)."""
        self._size = self.unit / self.cpu_ref
        """Reference replicas per replica at full size."""
        self.kpa_index = np.array(
            [i for i, p in enumerate(pols) if p.mode == "kpa"], dtype=np.int64
        )
        self.kpa = KpaBatch(
            [pols[i] for i in self.kpa_index],
            adds_need_panic=budget.arbitration != "independent",
            surge_panics=budget.arbitration != "independent" and budget.enforcement == "share",
        )
        is_kpa = np.array([p.mode == "kpa" for p in pols], dtype=bool)
        self._cpu_floored: BoolArray = is_kpa | (budget.arbitration != "independent")
        """Services whose scale-down stops where their measured CPU says: KPA mode, and HPA
        mode under shared arbitration."""
        self.hpa_index = np.array(
            [i for i, p in enumerate(pols) if p.mode == "hpa"], dtype=np.int64
        )
        self.hpa = HpaBatch([pols[i] for i in self.hpa_index])
        self.metrics = {
            i: ServiceMetrics(p, reference_max(p)) for i, p in enumerate(pols) if p.metrics
        }
        """Services with ``scaling.metrics``: their other metrics (``scaler.metrics``)."""
        self._peaks = _Peaks(arr([p.scale_down_delay_s for p in pols]))
        self._by_name = {name: i for i, name in enumerate(self.names)}
        nan = np.full(n, np.nan)
        self._last_at = nan.copy()
        self._arrivals_at = nan.copy()
        self._arrivals = np.zeros(n)
        self._rps = np.zeros(n)
        self._done = np.zeros(n)
        """The completions counter at the latest fresh snapshot."""
        self._full_done = np.zeros(n)
        """Requests completed when each service's ready replicas became full."""
        self._cpu_at = nan.copy()
        self._cpu_total = nan.copy()
        self._cpu_used = nan.copy()
        self._cpu_mean = nan.copy()
        """CPU used, averaged over the panic window (an exponential mean whose time constant
        is ``panic_window_s``): what the scale-down floor reads."""
        self._panic_s = arr([p.panic_window_s for p in pols])
        self._area_at = nan.copy()
        self._area = nan.copy()
        self._conc_mean = nan.copy()
        """Mean concurrency since the previous snapshot, from ``concurrency_seconds_total``
        (NaN: the source keeps no integral, or it went back)."""
        self._thr_at = nan.copy()
        self._thr_total = nan.copy()
        self._thr_rate = nan.copy()
        self._allocation = nan.copy()
        self._granted = np.zeros(n)
        """Last tick's cores from the arbiter, before sizing (what the work was granted)."""
        self._full_since = nan.copy()
        """Since when each service's ready replicas have been full (NaN: not now)."""
        self._full_for: tuple[FloatArray, FloatArray] = (nan.copy(), np.zeros(n))
        """This tick's seconds full so far, and seconds the ready replicas take to drain the
        work in the system at the rate they complete it (0: not measured)."""

    def __repr__(self) -> str:
        return (
            f"Engine(services={self.n}, budget={self.cpu.cores:g} cores, "
            f"arbitration={self.budget.arbitration})"
        )

    def set_cpu(self, cpu: BudgetCpu) -> None:
        """Change the budget in force (``budget.cpu: auto`` re-measured), keeping every window;
        :class:`~scaler.policy.KeyedValueError` when the floors do not fit it."""
        check_floors(cpu, self.policies)
        self.cpu = cpu
        self.fair = fair_shares(cpu.cores, self._pols) if self.n else self.fair

    def fair_share(self, service: str) -> float:
        """Cores ``service`` is entitled to when every service wants all it can use."""
        return float(self.fair[self._by_name[service]])

    # -- the tick --------------------------------------------------------------------

    def tick(
        self,
        now: float,
        signals: Mapping[str, ServiceSignals],
        states: Mapping[str, ServiceState],
    ) -> dict[str, Decision]:
        """Decide every configured service's replicas and CPU for this tick."""
        names = self.names
        n = self.n
        sigs = [signals.get(name) for name in names]
        sts = [states.get(name) for name in names]
        cur_r = np.array([s.replicas if s is not None else 0 for s in sts], dtype=np.int64)
        cur_r = np.maximum(cur_r, 0)
        ready = np.array([s.ready_replicas if s is not None else 0 for s in sts], dtype=np.float64)
        ready = np.clip(np.nan_to_num(ready, nan=0.0), 0.0, cur_r)
        cur_cpu = np.array(
            [s.cpu_per_replica_cores if s is not None else math.nan for s in sts], dtype=np.float64
        )
        cur_cpu = np.where(np.isfinite(cur_cpu) & (cur_cpu > 0), cur_cpu, self.cpu_ref)
        blocked = np.array([s is not None and s.resize_blocked for s in sts], dtype=bool)
        # Under share, each service whose replicas can use idle CPU (a platform may hold some
        # at their decided CPU: Kubernetes pods of Guaranteed QoS); the others decide as
        # under limit.
        weighted = np.zeros(n, dtype=bool)
        if self.share:
            weighted = ~np.array([s is not None and s.cpu_capped for s in sts], dtype=bool)
        observed = _Observed.of(sigs)
        at = observed.at
        invalid = observed.invalid
        present = observed.given
        active = present & ~invalid & (at >= now - self.staleness_s)
        fresh = active & (at != self._last_at)
        self._last_at = np.where(fresh, at, self._last_at)
        if fresh.any():
            self._rates(observed, fresh)
        concurrency = np.where(invalid, 0.0, observed.in_flight + observed.queued)
        value = np.where(self.is_rps, self._rps, concurrency)
        if self.is_cpu.any():
            value = np.where(self.is_cpu, self._cpu_used, value)  # NaN: not measured
        # Ready replicas at full size, in reference replicas: not the CPU they hold this tick
        # (lent or borrowed in place), which would make the windows chase the arbiter.
        capacity = ready * self.unit / self.cpu_ref

        wanted = cur_r.copy()
        load = cur_r.copy()
        now_load = cur_r.copy()
        valid = np.zeros(n, dtype=bool)
        kpa_tick = None
        ki = self.kpa_index
        if len(ki):
            # The KPA's windows record concurrency as the mean since the previous snapshot
            # where the gateway integrates it (as Knative's queue-proxy reports a mean per
            # second), else the count now; the surge rule and CPU read the count now.
            meant = ~self.is_rps & ~self.is_cpu & ~np.isnan(self._conc_mean)
            windowed = np.where(meant, self._conc_mean, value)
            self.kpa.observe(now, windowed[ki], fresh[ki])
            kpa_tick = self.kpa.recommend(
                now,
                capacity[ki],
                cur_r[ki],
                active[ki],
                value[ki],
                size=self._size[ki],
                surging=weighted[ki] if self.share else None,
            )
            wanted[ki] = kpa_tick.replicas
            load[ki] = kpa_tick.load
            now_load[ki] = np.where(kpa_tick.active, 1, 0)
            valid[ki] = kpa_tick.active
        hpa_tick: HpaTick | None = None
        hi = self.hpa_index
        if len(hi):
            observed_value = value[hi]
            recorded = fresh[hi] & np.isfinite(observed_value)
            self.hpa.observe(now, np.where(recorded, observed_value, 0.0), recorded)
            hpa_tick = self.hpa.recommend(now, active[hi], cur_r[hi], ready[hi], cur_cpu[hi])
            wanted[hi] = load[hi] = now_load[hi] = hpa_tick.replicas
            valid[hi] = hpa_tick.valid
        verdicts: dict[int, MetricsVerdict] = {}
        if self.metrics:
            verdicts = self._apply_metrics(
                now,
                sigs,
                flags=(active, fresh),
                out=(wanted, load),
                state=(cur_r, ready, cur_cpu),
                value=value,
            )

        frozen_code = np.where(
            ~present,
            _MISSING,
            np.where(
                invalid,
                _INVALID,
                np.where(~active, _STALE, np.where(~valid, _NO_DATA, _NOT_FROZEN)),
            ),
        )
        frozen = frozen_code != _NOT_FROZEN
        # The replicas each service runs follow its horizontal recommendation (the windows);
        # a replica still starting is never removed (the estimate that asked for it may dip
        # before it serves); a frozen service keeps what it has.
        recommended = self._replicas_for(wanted)
        # Scale down no further than the measured CPU allows: the replicas kept at full size
        # must hold the CPU used over the panic window (the KPA's horizon for taking capacity
        # back) within the KPA's target utilisation (concurrency falls when capacity is
        # added; it comes back when capacity is taken away).  Not one tick's use: over an
        # early tick's fraction of a second it reads every replica busy, and held by
        # scale_down_delay_s that would keep replicas the load never needs.  HPA mode too under
        # shared arbitration: there its ratio counts the reference replicas of the cores it was
        # granted, so while the budget grants less than its replicas could use, a ratio within
        # tolerance hides replicas that are all busy.  `independent` keeps the HPA as it is.
        used = self._cpu_mean
        measured = self._cpu_floored & ~np.isnan(used) & (recommended > 0) & (recommended < cur_r)
        cpu_kept = np.zeros(n, dtype=bool)
        if measured.any():
            need = np.ceil(
                np.where(measured, used, 0.0) / (self.unit * self.target_utilization) - _EPS
            ).astype(np.int64)
            floor_r = np.where(measured, np.minimum(need, cur_r), 0)
            cpu_kept = floor_r > recommended
            recommended = np.maximum(recommended, floor_r)
        starting = ~frozen & (ready < cur_r)
        needed = np.where(starting, np.maximum(recommended, cur_r), recommended)
        needed = np.where(frozen, cur_r, needed)
        needed = np.minimum(np.maximum(needed, self.min_r), self.max_r)
        run = needed
        if self.budget.arbitration != "independent":
            # Warm replicas (scale_down_delay_s): idle, each holds cpu.min, the rest is lent.
            # Not on the way to zero: that has its own idle rule (stable window + grace).
            held = np.minimum(self._peaks.held(now, run), self.max_r)
            run = np.where(frozen | (recommended == 0), run, held)
        kept = (run > recommended) & (run > self.min_r) & ~frozen
        run_note = np.where(kept, np.where(run > needed, 7, 5), np.where(cpu_kept & ~frozen, 8, 0))
        demand, hold = self._demand(
            run, load, (now_load > 0) & (value >= 0), value, (cur_r, cur_cpu, frozen)
        )
        # The replicas a service keeps serving keep cpu.min each instead of being removed for
        # another service's burst, as far as the others' floors and claims (their fair
        # share) leave room (the arbiter's ``yielding`` below).  Where a hold gives way,
        # under limit replicas go; under share they stay and run on less in place (sizing's
        # ``in_place``) and hold what they run on until the CPU comes back.  A frozen
        # service's hold gives way to floors only.
        hold = np.where(frozen, hold, np.minimum(run, cur_r) * self._held_cpu(cur_cpu))
        # CPU the replicas could use beyond the load's demand: served from spare CPU only.
        soft = np.where(frozen, demand, np.minimum(run * self.cpu_max, self.cap))
        soft = np.maximum(soft, demand)
        previous = np.where(np.isnan(self._allocation), cur_r * cur_cpu, self._allocation)

        pending: dict[int, Trace]
        if self.budget.arbitration == "independent":
            replicas, cpu, pending = self._independent(wanted, cur_r, frozen)
            cores = ideal = taken = replicas * cpu
            split_note = np.zeros(n, dtype=np.int64)
        else:
            cores, ideal, taken = arbitrate_arrays(
                self.cpu.cores,
                demand=demand,
                minimum=self.minimum,
                floor=self.floor,
                cap=self.cap,
                weight=self.weight,
                fair=self.fair,
                previous=previous,
                hold=hold,
                hysteresis_cores=self.hysteresis_cores,
                hysteresis_ratio=self.hysteresis_ratio,
                soft=soft,
                yielding=~frozen,
                step=self.cpu_min,
            )
            replicas, cpu, split_note = size_arrays(
                cores,
                want=run,
                current=cur_r,
                unit=self.unit,
                cpu_min=self.cpu_min,
                cpu_max=self.cpu_max,
                cpu_ref=self.cpu_ref,
                min_r=self.min_r,
                max_r=self.max_r,
                # A blocked resize: scale replicas instead -- unless frozen (keep replicas).
                fixed_cpu=np.where(blocked & (cur_r > 0) & ~frozen, cur_cpu, np.nan),
                # New replicas start only on CPU the service surely keeps: its fair share,
                # what its replicas already hold at full size, or what it was granted last
                # tick -- a burst's first tick of borrowed CPU starts nothing that would then
                # share the serving replicas' CPU while it starts.
                claimed=np.maximum(np.maximum(self.fair, self._granted), cur_r * self.unit),
                usable=(
                    np.where(
                        weighted,
                        self._usable(now, previous, frozen, (cur_r, ready), concurrency),
                        0.0,
                    )
                    if self.share
                    else None
                ),
                # Under share a service's weight is its cores however many replicas share them:
                # one replica more than they fill takes nobody's entitlement, it only lets the
                # service use what the others leave idle -- once its ready replicas have been
                # full for a panic window (a cold start's backlog has drained by then).
                one_more=(
                    weighted & (now - self._full_since >= self._panic_s - _EPS)
                    if self.share
                    else None
                ),
                # Under share a weighted service's decided CPU is a weight: when another
                # service claims its fair share back, the replicas running keep running on
                # less (below cpu.min) and the kernel takes the CPU in place, instead of
                # replicas removed now and restarted after the burst.  A frozen service keeps
                # the replicas it runs on what they hold, kept in place or not: missing or
                # invalid signals never remove a replica (its CPU may have become capped since).
                in_place=(weighted | frozen) if self.share else None,
            )
            pending = {}
            split_note = np.where((split_note == 0) & (replicas == run), run_note, split_note)
            # What it was recommended and could run (not what the delay held: that decays).
            self._peaks.record(now, np.minimum(recommended, replicas), ~frozen)
        allocated = replicas * cpu
        self._allocation = allocated
        self._granted = cores
        # Woken at what would panic the KPA on the CPU the work now has (not the spare CPU its
        # replicas hold softly: a burst should get hard CPU before the next tick).
        wake = self._wake_levels(np.minimum(allocated, demand), concurrency, frozen)
        self._record_hpa_scales(now, cur_r, cur_cpu, allocated, frozen)

        rejected = {
            int(i): invalid_fields(sigs[i])  # type: ignore[arg-type]
            for i in np.flatnonzero(invalid).tolist()
        }
        view = TickView(
            engine=self,
            rejected=rejected,
            now=now,
            kpa=kpa_tick,
            hpa=hpa_tick,
            value=value,
            frozen_code=frozen_code,
            current=cur_r,
            current_cpu=cur_cpu,
            wanted=wanted,
            run=run,
            demand=demand,
            soft=soft,
            previous=previous,
            cores=cores,
            ideal=ideal,
            taken=taken,
            replicas=replicas,
            cpu=cpu,
            split_note=split_note,
            pending=pending,
            used=self._cpu_used.copy(),
            used_mean=self._cpu_mean.copy(),
            throttled=self._thr_rate.copy(),
            wake=wake,
            metrics=verdicts,
            capped=frozenset(np.flatnonzero(~weighted).tolist()) if self.share else frozenset(),
            full_for=self._full_for if self.share else None,
        )
        rules = rule_names(
            kpa_tick, self.kpa_index, frozen_code, n, hpa=hpa_tick, hpa_index=self.hpa_index
        )
        view.rules = rules
        return self.decisions(
            now,
            view,
            replicas.tolist(),
            cpu.tolist(),
            allocated.tolist(),
            rules,
            frozen.tolist(),
            wake.tolist(),
        )

    def decisions(  # noqa: PLR0917 - the tick's columns, positional like Decision.explained
        self,
        now: float,
        view: TickView,
        replicas: list[int],
        cpu: list[float],
        allocated: list[float],
        rules: list[str],
        frozen: list[bool],
        wake: list[float],
    ) -> dict[str, Decision]:
        """One decision per service from the tick's columns (reasons rendered from ``view``)."""
        new = object.__new__
        put = object.__setattr__
        out: dict[str, Decision] = {}
        for i, (name, r, c, a, rule, fz, w) in enumerate(
            zip(self.names, replicas, cpu, allocated, rules, frozen, wake, strict=True)
        ):
            # Decision.explained, inlined: this loop is the tick's largest Python cost.
            decision = new(Decision)
            put(
                decision,
                "__dict__",
                {
                    "service": name,
                    "at": now,
                    "replicas": r,
                    "cpu_per_replica_cores": c,
                    "allocated_cores": a,
                    "rule": rule,
                    "frozen": fz,
                    "wake_concurrency": w,
                    "_source": view,
                    "_index": i,
                },
            )
            out[name] = decision
        return out

    # -- pieces ----------------------------------------------------------------------

    def _record_hpa_scales(
        self,
        now: float,
        cur_r: IntArray,
        cur_cpu: FloatArray,
        allocated: FloatArray,
        frozen: BoolArray,
    ) -> None:
        """Tell the HPA-mode services' behavior what each had and now gets, in reference
        replicas."""
        hi = self.hpa_index
        if len(hi):
            ref = self.cpu_ref[hi]
            self.hpa.record_scales(
                now,
                ~frozen[hi],
                np.ceil(cur_r[hi] * cur_cpu[hi] / ref - 1e-6).astype(np.int64),
                np.ceil(allocated[hi] / ref - 1e-6).astype(np.int64),
            )

    def _wake_levels(
        self, allocated: FloatArray, concurrency: FloatArray, frozen: BoolArray
    ) -> FloatArray:
        """Per service, the concurrency at which the data plane should wake the scaler early.

        A tick every second is a second of a burst served at the old CPU; the gateway sees the
        burst at once.  A KPA concurrency service's level is what would panic the KPA at the
        CPU just allocated (``panic_threshold × target × utilisation × cores / cpu.request``,
        counting at least one reference replica: a service lending its CPU away is not woken
        by every second request) or twice the concurrency seen now when that is higher (the
        budget could not give more), and at least 1; a service given nothing wakes on its
        first request.  Frozen, rps, HPA-mode and ``independent`` services never wake early
        (an HPA does not), nor any with ``budget.early_ticks`` off."""
        wake = np.full(self.n, math.inf)
        ki = self.kpa_index
        budget = self.budget
        if not len(ki) or budget.arbitration == "independent" or not budget.early_ticks:
            return wake
        kpa = self.kpa
        capacity = allocated[ki] / self.cpu_ref[ki]
        level = np.maximum(
            kpa.threshold * kpa.target_value * np.maximum(capacity, 1.0),
            kpa.threshold * concurrency[ki],
        )
        level = np.maximum(np.ceil(level - _EPS), 1.0)
        level = np.where(capacity > 0, level, 1.0)
        eligible = ~frozen[ki] & ~self.is_rps[ki]
        wake[ki] = np.where(eligible, level, math.inf)
        return wake

    def _rates(self, observed: _Observed, fresh: BoolArray) -> None:
        """Arrival rate, mean concurrency and CPU use from successive counters (counters going
        back restart)."""
        at = observed.at
        arrivals = observed.arrivals
        ok, rate = _per_second(arrivals, self._arrivals, at - self._arrivals_at, fresh)
        self._rps = np.where(fresh, np.where(ok, rate, observed.rps), self._rps)
        self._arrivals = np.where(fresh, arrivals, self._arrivals)
        self._arrivals_at = np.where(fresh, at, self._arrivals_at)
        self._done = np.where(fresh, observed.completions, self._done)
        area = observed.area
        has = fresh & ~np.isnan(area)
        _, mean = _per_second(area, self._area, at - self._area_at, has)
        self._conc_mean = np.where(fresh, mean, self._conc_mean)
        self._area = np.where(has, area, self._area)
        self._area_at = np.where(has, at, self._area_at)
        for prefix, total in (("_cpu", observed.cpu), ("_thr", observed.throttled)):
            has = fresh & ~np.isnan(total)  # (NaN here: not measured; bad values froze it)
            if not has.any():
                continue
            prev_at = getattr(self, prefix + "_at")
            prev_total = getattr(self, prefix + "_total")
            dt = at - prev_at
            good, per_s = _per_second(total, prev_total, dt, has)
            rate_attr = "_cpu_used" if prefix == "_cpu" else "_thr_rate"
            setattr(self, rate_attr, np.where(has, per_s, getattr(self, rate_attr)))
            if prefix == "_cpu":
                mean = self._cpu_mean
                step = np.where(good, -np.expm1(-np.where(good, dt, 0.0) / self._panic_s), 0.0)
                mean = np.where(np.isnan(mean), per_s, mean + step * (per_s - mean))
                self._cpu_mean = np.where(good, mean, self._cpu_mean)
            setattr(self, prefix + "_total", np.where(has, total, prev_total))
            setattr(self, prefix + "_at", np.where(has, at, prev_at))

    def _apply_metrics(
        self,
        now: float,
        sigs: list[ServiceSignals | None],
        *,
        flags: tuple[BoolArray, BoolArray],
        out: tuple[IntArray, IntArray],
        state: tuple[IntArray, FloatArray, FloatArray],
        value: FloatArray,
    ) -> dict[int, MetricsVerdict]:
        """``scaling.metrics``: each service's metrics answer; the largest becomes ``wanted``
        (and the load its CPU demand counts).  Updates ``out`` = (wanted, load) in place;
        the primary's own answer counts only when it is listed."""
        active, fresh = flags
        wanted, load = out
        cur_r, ready, cur_cpu = state
        verdicts: dict[int, MetricsVerdict] = {}
        for i, metrics in self.metrics.items():
            ref = float(self.cpu_ref[i])
            on = bool(active[i])
            inputs = MetricInputs(
                signals=sigs[i] if on else None,
                fresh=bool(fresh[i]),
                current=math.ceil(int(cur_r[i]) * float(cur_cpu[i]) / ref - 1e-6),
                ready=float(ready[i]) * float(cur_cpu[i]) / ref,
                rps=float(self._rps[i]),
                cpu_used_cores=float(self._cpu_used[i]),
                cpu_held_cores=float(ready[i]) * float(cur_cpu[i]),
                primary=int(wanted[i]) if metrics.primary_listed else None,
                primary_value=float(value[i]),
            )
            verdict = metrics.verdict(now, inputs)
            verdicts[i] = verdict
            if not on:
                continue
            if metrics.primary_listed:
                load[i] = max(int(load[i]), verdict.replicas)
            else:
                load[i] = verdict.replicas
            wanted[i] = verdict.replicas
        return verdicts

    def _held_cpu(self, cur_cpu: FloatArray) -> FloatArray:
        """What each running replica holds against the others: cpu.min, or under share
        what it runs on when kept in place below it."""
        if self.share:
            return np.minimum(cur_cpu, self.cpu_min)
        return self.cpu_min

    def _usable(
        self,
        now: float,
        previous: FloatArray,
        frozen: BoolArray,
        state: tuple[IntArray, FloatArray],
        concurrency: FloatArray,
    ) -> FloatArray:
        """Share: the cores a service whose replicas have been the limit for a panic window
        could use now -- its use last tick plus the node's idle CPU (a service whose CPU is
        not measured counts as using what it was allocated); 0 for the others.  Keeps
        ``_full_since`` up to date (call once per tick).

        Under share a starting replica holds a weight, not CPU: one that starts into idle
        CPU takes from the serving ones only what its own start-up burns.  So a service whose
        ready replicas have been full (using more than the target utilisation of their
        ``cpu.max``) for its panic window -- a backlog its replicas cannot drain, not a cold
        start's backlog, drained by then -- may add the replicas its recommendation asks for
        as far as this fills them at full size.  So may one whose full ready replicas hold
        a backlog they would take a whole panic window to drain (the requests in the system
        ÷ the rate the replicas have completed them since they became full, measured over a
        second at least): a crowd well beyond what they complete starts replicas seconds
        after it is seen, not a window later.  (Completions lag the CPU a growing backlog's
        requests share, so a fast-growing cold start's backlog can qualify too.)  Replicas
        still starting do not restart the clock: they are capacity on its way (counted in
        the replicas it has, each to take a full replica's share of the idle CPU), and
        restarting it would add one replica per start-up plus a window."""
        cur_r, ready = state
        used = self._cpu_used
        unknown = np.isnan(used)
        taken = float(np.where(unknown, previous, used).sum())
        spare = max(0.0, float(self.cpu.cores) - taken)
        full = (
            ~unknown
            & ~frozen
            & (cur_r > 0)
            & (ready > 0)
            & (used >= ready * self.cpu_max * self.target_utilization)
        )
        self._full_since = np.where(
            full, np.where(np.isnan(self._full_since), now, self._full_since), np.nan
        )
        # Or full with a backlog the ready replicas would take a whole panic window to drain
        # at the rate they have completed requests since they became full (measured over a
        # second at least).
        full_for = now - self._full_since
        self._full_done = np.where(full_for == 0.0, self._done, self._full_done)
        span = np.where(full_for >= 1.0 - _EPS, full_for, math.inf)
        rate = (self._done - self._full_done) / span
        drain = np.where(rate > 0, concurrency / np.where(rate > 0, rate, 1.0), 0.0)
        self._full_for = (full_for, drain)  # fresh arrays each tick: the decisions' reasons
        window = self._panic_s - _EPS
        lasting = full & ((full_for >= window) | (drain >= window))
        return np.where(lasting, used + spare, 0.0)

    def _replicas_for(self, wanted: IntArray) -> IntArray:
        """Replicas that serve ``wanted`` reference replicas (of ``cpu.request`` cores):
        as many (``prefer: horizontal``) or as few at ``cpu.max`` as hold them (vertical)."""
        fewest = np.ceil(wanted * self.cpu_ref / self.cpu_max - 1e-6).astype(np.int64)
        return np.where(self.horizontal, wanted, fewest)

    def _demand(
        self,
        run: IntArray,
        load: IntArray,
        kpa_now: BoolArray,
        value: FloatArray,
        state: tuple[IntArray, FloatArray, BoolArray],
    ) -> tuple[FloatArray, FloatArray]:
        """Cores each service needs now, and what a frozen one holds.

        A service whose CPU the platform measures needs the larger of what its replicas
        used last tick and what the work in the system right now needs at its rule's aim
        (this tick's metric ÷ (target × target_utilization) for the KPA, the headroom once;
        ÷ target for the HPA, whose rule has none; in ``cpu.request`` cores): a burst gets
        CPU the tick it is seen, a service whose burst is over gives it back the next tick.
        A throttled use (capped by its quota, it understates the need) counts as
        ``used / target_utilization``.
        Otherwise: the load's reference replicas at ``cpu.request`` (the larger of the panic
        window's want and this tick's; HPA mode: the HPA's replicas), headroom included.
        Never more than the replicas it runs can use (``cpu.max`` each): CPU a service
        cannot use is not taken from the others; at least ``cpu.min`` per replica it runs
        and keeps, and for its first one when it wakes from zero.
        Frozen services: what they hold.  CPU the replicas could use beyond this is the
        caller's soft demand, served from spare CPU only.
        """
        cur_r, cur_cpu, frozen = state
        wanted_cores = load * self.cpu_ref
        used = self._cpu_used
        now = kpa_now & ~np.isnan(used)
        if now.any():
            work = value / self._aim * self.cpu_ref
            # Throttled (its use capped by its quota): the use understates the need, so it
            # gets the target utilisation's headroom on top -- once.
            thr = np.where(np.isnan(self._thr_rate), 0.0, self._thr_rate)
            throttled = thr > _THROTTLED_S_PER_S * np.maximum(cur_r, 1)
            use = np.where(now, used, 0.0)
            use = np.where(throttled, use / self.target_utilization, use)
            now_cores = np.maximum(work, use)
            wanted_cores = np.where(now, now_cores, wanted_cores)
        # cpu.min for each replica it keeps, and for its first one when it has none yet: a
        # service woken from zero by less work than cpu.min would be decided CPU that fits
        # no replica, and its request would wait for more to arrive.
        least = np.maximum(np.minimum(run, cur_r), np.minimum(run, 1)) * self.cpu_min
        demand = np.maximum(np.minimum(wanted_cores, run * self.cpu_max), least)
        held_r = np.minimum(np.maximum(cur_r, self.min_r), self.max_r)
        # A frozen service keeps what it has: under share that may be replicas kept in place
        # below cpu.min (a weight), which hold no more than they run on.
        least_cpu = self._held_cpu(cur_cpu)
        held_cpu = np.minimum(np.maximum(cur_cpu, least_cpu), self.cpu_max)
        demand = np.where(frozen, held_r * held_cpu, demand)
        demand = np.minimum(demand, self.cap)
        hold = np.where(frozen, held_r * least_cpu, 0.0)
        return demand, hold

    def _independent(
        self, wanted: IntArray, cur_r: IntArray, frozen: BoolArray
    ) -> tuple[IntArray, FloatArray, dict[int, Trace]]:
        claims = [
            IndependentClaim(
                name=name,
                policy=self._pols[i],
                cpu_ref=float(self.cpu_ref[i]),
                want_replicas=int(cur_r[i] if frozen[i] else wanted[i]),
                held_replicas=int(cur_r[i]),
                fixed=bool(frozen[i]),
            )
            for i, name in enumerate(self.names)
        ]
        explains = [Trace() for _ in claims]
        granted = arbitrate_independent(self.cpu.cores, claims, explains)
        replicas = np.array([g[0] for g in granted], dtype=np.int64).reshape(self.n)
        cpu = np.array([g[1] for g in granted], dtype=np.float64).reshape(self.n)
        return replicas, cpu, {i: e for i, e in enumerate(explains) if len(e)}


__all__ = ["FROZEN_REASONS", "RULES", "Engine"]
