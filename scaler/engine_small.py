"""The engine's tick for a few services, in plain Python floats (pure).

Why a second form: the array form (``Engine.tick`` on numpy arrays) costs a few hundred
numpy calls per tick whatever the number of services, about half a millisecond, which is
most of a tick for ten services (and of ``sluice simulate``, which ticks the engine tens of
thousands of times, early ticks included).  For a few services, one Python loop per step
over the services does the same arithmetic in a fraction of that.

Each function here mirrors one array function, named in its docstring, operation for
operation and in the same order, so both forms give the same decisions bit for bit
(IEEE-754 arithmetic on Python floats is numpy's on float64; ``np.maximum(a, b)`` is
``a if a >= b else b`` as no NaN reaches those spots; sums over the services follow numpy's
pairwise order, :func:`_sum`).  ``max()``/``min()`` calls are written as conditional
expressions in the loops: a builtin call costs several times more.

An engine picks its form once (``Engine.small``) and keeps its memory between ticks in that
form: :class:`Counters` and :class:`KpaWindows` here, the arrays there.
``tests/unit/test_engine_small.py`` and ``benchmarks/engine_equivalence.py`` hold the two
forms equal: a change to the engine's decisions goes into both.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from math import isnan
from typing import TYPE_CHECKING

import numpy as np

from scaler.decision import Decision, Explanation, ServiceState
from scaler.explain import FROZEN_REASONS, TickView
from scaler.kpa_batch import IDLE_GRACE, NO_DATA, PANIC, RULES, STABLE, TO_ZERO, KpaBatch, KpaTick
from scaler.signals import ServiceSignals

if TYPE_CHECKING:
    from scaler.engine import Engine

SMALL_MAX_SERVICES = 32
"""Engines with at most this many services tick in this form (about where the two cost the
same: ``benchmarks/scaler_tick.py``)."""

_EPS = 1e-9
_NAN = math.nan
_INF = math.inf
_NOT_FROZEN, _MISSING, _STALE, _NO_DATA = 0, 1, 2, 3


def _sum(values: Sequence[float]) -> float:
    """``float(np.add.reduce(array))``, which is not a left fold: numpy sums pairwise, here
    (up to 128 values) from -0.0 below 8 values, else in 8 interleaved partial sums.
    ``tests/unit/test_engine_small.py`` checks this against numpy itself."""
    n = len(values)
    if n < 8:
        total = -0.0
        for x in values:
            total += x
        return total
    if n > 128:
        return float(np.add.reduce(np.array(values, dtype=np.float64)))
    r0, r1, r2, r3, r4, r5, r6, r7 = values[:8]
    whole = n - n % 8
    for i in range(8, whole, 8):
        r0 += values[i]
        r1 += values[i + 1]
        r2 += values[i + 2]
        r3 += values[i + 3]
        r4 += values[i + 4]
        r5 += values[i + 5]
        r6 += values[i + 6]
        r7 += values[i + 7]
    total = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    for i in range(whole, n):
        total += values[i]
    return total


@dataclass(frozen=True, slots=True)
class EngineLists:
    """An engine's per-service constants as Python lists (indexed like the policies)."""

    cpu_ref: list[float]
    cpu_min: list[float]
    cpu_max: list[float]
    min_r: list[int]
    max_r: list[int]
    weight: list[float]
    minimum: list[float]
    floor: list[float]
    cap: list[float]
    target_utilization: list[float]
    fair: list[float]
    horizontal: list[bool]
    is_rps: list[bool]
    kpa_index: list[int]

    @classmethod
    def of(cls, e: Engine) -> EngineLists:
        return cls(
            cpu_ref=e.cpu_ref.tolist(),
            cpu_min=e.cpu_min.tolist(),
            cpu_max=e.cpu_max.tolist(),
            min_r=e.min_r.tolist(),
            max_r=e.max_r.tolist(),
            weight=e.weight.tolist(),
            minimum=e.minimum.tolist(),
            floor=e.floor.tolist(),
            cap=e.cap.tolist(),
            target_utilization=e.target_utilization.tolist(),
            fair=e.fair.tolist(),
            horizontal=e.horizontal.tolist(),
            is_rps=e.is_rps.tolist(),
            kpa_index=e.kpa_index.tolist(),
        )


@dataclass(frozen=True, slots=True)
class KpaLists:
    """A KPA batch's per-service constants as Python lists."""

    target_value: list[float]
    up_rate: list[float]
    down_rate: list[float]
    threshold: list[float]
    stable_s: list[float]
    min_r: list[int]
    max_r: list[int]
    zero_after_s: list[float]

    @classmethod
    def of(cls, k: KpaBatch) -> KpaLists:
        return cls(
            target_value=k.target_value.tolist(),
            up_rate=k.up_rate.tolist(),
            down_rate=k.down_rate.tolist(),
            threshold=k.threshold.tolist(),
            stable_s=k.stable_s.tolist(),
            min_r=k.min_r.tolist(),
            max_r=k.max_r.tolist(),
            zero_after_s=k.zero_after_s.tolist(),
        )


def fits(e: Engine) -> bool:
    """Whether ``e`` may use this form: few services, and rate limits Python can round (an
    infinite ``max_scale_up_rate`` has no integer ceiling; the array form copes)."""
    return e.n <= SMALL_MAX_SERVICES and all(math.isfinite(x) for x in e.kpa.up_rate.tolist())


class Counters:
    """The engine's memory between ticks (``Engine._last_at`` ... ``_allocation``), as lists."""

    __slots__ = (
        "allocation",
        "arrivals",
        "arrivals_at",
        "cpu_at",
        "cpu_total",
        "cpu_used",
        "last_at",
        "rps",
        "thr_at",
        "thr_rate",
        "thr_total",
    )

    def __init__(self, n: int) -> None:
        self.last_at = [_NAN] * n
        self.arrivals_at = [_NAN] * n
        self.arrivals = [0.0] * n
        self.rps = [0.0] * n
        self.cpu_at = [_NAN] * n
        self.cpu_total = [_NAN] * n
        self.cpu_used = [_NAN] * n
        self.thr_at = [_NAN] * n
        self.thr_total = [_NAN] * n
        self.thr_rate = [_NAN] * n
        self.allocation = [_NAN] * n


class KpaWindows:
    """:class:`KpaBatch`'s windows and decision state, as lists (its constants stay there)."""

    __slots__ = (
        "bucket",
        "col_bucket",
        "counts",
        "first_at",
        "last_active",
        "max_panic",
        "n",
        "panic_b",
        "panic_n",
        "panic_nz",
        "panic_since",
        "panic_sum",
        "stable_b",
        "stable_n",
        "stable_nz",
        "stable_sum",
        "sums",
        "width",
    )

    def __init__(self, kpa: KpaBatch) -> None:
        n = self.n = kpa.n
        self.width = kpa.width
        self.stable_b: list[int] = kpa.stable_b.tolist()
        self.panic_b: list[int] = kpa.panic_b.tolist()
        self.sums = [[0.0] * kpa.width for _ in range(n)]
        self.counts = [[0] * kpa.width for _ in range(n)]
        self.col_bucket = [-(2**62)] * kpa.width
        self.bucket: int | None = None
        self.stable_sum = [0.0] * n
        self.stable_n = [0] * n
        self.stable_nz = [0] * n
        self.panic_sum = [0.0] * n
        self.panic_n = [0] * n
        self.panic_nz = [0] * n
        self.panic_since = [_NAN] * n
        self.max_panic = [0] * n
        self.last_active = [-_INF] * n
        self.first_at = [_INF] * n

    def _leave(
        self, bucket: int, depth: list[int], total: list[float], n: list[int], nz: list[int]
    ) -> None:
        """:meth:`KpaBatch._leave`."""
        width, col_bucket = self.width, self.col_bucket
        for i in range(self.n):
            leaving = bucket - depth[i]
            col = leaving % width
            count = self.counts[i][col]
            if col_bucket[col] == leaving and count > 0:
                mean = self.sums[i][col] / count
                total[i] -= mean
                n[i] -= 1
                if mean != 0.0:
                    nz[i] -= 1

    def advance(self, bucket: int) -> None:
        """:meth:`KpaBatch._advance`."""
        last = self.bucket
        if last is not None and bucket <= last:
            return
        start = bucket if last is None else last + 1
        width = self.width
        if bucket - start >= width:  # a long silence: everything has left every window
            for row in self.sums:
                row[:] = [0.0] * width
            for counts in self.counts:
                counts[:] = [0] * width
            self.col_bucket = [-(2**62)] * width
            self.stable_sum = [0.0] * self.n
            self.panic_sum = [0.0] * self.n
            for values in (self.stable_n, self.stable_nz, self.panic_n, self.panic_nz):
                values[:] = [0] * self.n
            start = bucket
        for b in range(start, bucket + 1):
            self._leave(b, self.stable_b, self.stable_sum, self.stable_n, self.stable_nz)
            self._leave(b, self.panic_b, self.panic_sum, self.panic_n, self.panic_nz)
            col = b % width
            for i in range(self.n):
                self.sums[i][col] = 0.0
                self.counts[i][col] = 0
            self.col_bucket[col] = b
        self.bucket = bucket
        # An all-zero window averages to exactly 0: drop float dust.
        for i in range(self.n):
            if self.stable_nz[i] == 0:
                self.stable_sum[i] = 0.0
            if self.panic_nz[i] == 0:
                self.panic_sum[i] = 0.0

    def observe(
        self, now: float, granularity_s: float, values: list[float], fresh: list[bool]
    ) -> None:
        """:meth:`KpaBatch.observe`."""
        bucket = math.floor(now / granularity_s)
        self.advance(bucket)
        col = (self.bucket if self.bucket is not None else bucket) % self.width
        stable_sum, panic_sum = self.stable_sum, self.panic_sum
        for i, f in enumerate(fresh):
            if not f:
                continue
            sums, counts = self.sums[i], self.counts[i]
            s, c = sums[col], counts[col]
            had = c > 0
            old = s / c if had else 0.0
            s_new = s + values[i]
            c_new = c + 1
            new = s_new / c_new
            delta = new - old
            sums[col] = s_new
            counts[col] = c_new
            stable_sum[i] += delta
            panic_sum[i] += delta
            if not had:
                self.stable_n[i] += 1
                self.panic_n[i] += 1
            nz_delta = (new != 0.0) - (had and old != 0.0)
            self.stable_nz[i] += nz_delta
            self.panic_nz[i] += nz_delta
            if self.first_at[i] == _INF:
                self.first_at[i] = now
            if values[i] > 0:
                self.last_active[i] = now


# ---- the tick ---------------------------------------------------------------------------------


def tick_small(
    engine: Engine,
    now: float,
    signals: Mapping[str, ServiceSignals],
    states: Mapping[str, ServiceState],
) -> dict[str, Decision]:
    """:meth:`Engine.tick` for a few services, step for step."""
    e = engine
    m = e.counters
    windows = e.kpa_windows
    if m is None or windows is None:
        raise RuntimeError("this engine ticks in the array form")
    n = e.n
    c = e.lists
    cpu_ref = c.cpu_ref
    stale_before = now - e.staleness_s
    sigs: list[ServiceSignals | None] = []
    cur_r: list[int] = []
    ready: list[float] = []
    cur_cpu: list[float] = []
    blocked: list[bool] = []
    present: list[bool] = []
    active: list[bool] = []
    fresh: list[bool] = []
    concurrency: list[float] = []
    at: list[float] = []
    last_at = m.last_at
    for i, name in enumerate(e.names):  # the inputs, one pass (Engine.tick's first lines)
        s = signals.get(name)
        st = states.get(name)
        sigs.append(s)
        if st is not None:
            cur_r.append(st.replicas)
            ready.append(float(st.ready_replicas))
            x = float(st.cpu_per_replica_cores)
            cur_cpu.append(x if not isnan(x) else cpu_ref[i])
            blocked.append(st.resize_blocked)
        else:
            cur_r.append(0)
            ready.append(0.0)
            cur_cpu.append(cpu_ref[i])
            blocked.append(False)
        if s is not None:
            a = float(s.at)
            act = a >= stale_before
            f = act and a != last_at[i]
            if f:
                last_at[i] = a
            at.append(a)
            present.append(True)
            active.append(act)
            fresh.append(f)
            concurrency.append(float(s.in_flight + s.queued))
        else:
            at.append(-_INF)
            present.append(False)
            active.append(False)
            fresh.append(False)
            concurrency.append(0.0)
    if any(fresh):
        _rates(m, sigs, at, fresh)
    value = [r if rate else x for rate, r, x in zip(c.is_rps, m.rps, concurrency, strict=True)]

    wanted = list(cur_r)
    load = list(cur_r)
    hold = [0] * n
    valid = [False] * n
    kpa_tick: KpaTick | None = None
    ki = c.kpa_index
    if ki:
        granularity_s = e.kpa.granularity_s
        windows.observe(now, granularity_s, [value[i] for i in ki], [fresh[i] for i in ki])
        kpa_tick = _kpa_recommend(
            windows,
            e.kpa_lists,
            now=now,
            granularity_s=granularity_s,
            ready=[ready[i] * cur_cpu[i] / cpu_ref[i] for i in ki],  # capacity
            current=[cur_r[i] for i in ki],
            active=[active[i] for i in ki],
            instant=[value[i] for i in ki],
        )
        for j, i in enumerate(ki):
            wanted[i] = kpa_tick.replicas[j]
            load[i] = kpa_tick.load[j]
            hold[i] = kpa_tick.hold[j]
            valid[i] = kpa_tick.active[j]
    hpa_notes: dict[int, tuple[str, Explanation, dict[str, float]]] = {}
    for i, track in e.hpa.items():
        if active[i]:
            r, rule, notes, inputs = e._recommend_hpa(
                i, track, now, (value[i], fresh[i]), (cur_r[i], ready[i], cur_cpu[i])
            )
            wanted[i] = load[i] = r
            valid[i] = rule != "no-data"
            hpa_notes[i] = (rule, notes, inputs)

    frozen_code = [
        _MISSING if not p else _STALE if not a else _NO_DATA if not v else _NOT_FROZEN
        for p, a, v in zip(present, active, valid, strict=True)
    ]
    frozen = [code != _NOT_FROZEN for code in frozen_code]
    demand, frozen_hold = _demand(c, m, wanted, load, cur_r, cur_cpu, frozen)
    soft: list[float] = []
    previous: list[float] = []
    for i in range(n):
        d = demand[i]
        if frozen[i]:
            soft.append(d)
        else:
            x = hold[i] * cpu_ref[i]
            x = d if d >= x else x
            top = c.cap[i]
            soft.append(x if x <= top else top)
        a = m.allocation[i]
        previous.append(cur_r[i] * cur_cpu[i] if isnan(a) else a)

    pending: dict[int, Explanation]
    if e.budget.arbitration == "independent":
        rep_arr, cpu_arr, pending = e._independent(
            np.array(wanted, dtype=np.int64), np.array(cur_r, dtype=np.int64), np.array(frozen)
        )
        replicas: list[int] = rep_arr.tolist()
        cpu: list[float] = cpu_arr.tolist()
        cores = ideal = taken = [r * x for r, x in zip(replicas, cpu, strict=True)]
        split_note = [0] * n
    else:
        cores, ideal, taken = _arbitrate(e, demand, frozen_hold, previous, soft)
        replicas, cpu, split_note = _split(
            c,
            cores,
            cur_r,
            squeezed=[fz or a < h - 1e-6 for fz, a, h in zip(frozen, cores, soft, strict=True)],
            fixed_cpu=[
                x if b and r > 0 and not fz else _NAN
                for b, r, fz, x in zip(blocked, cur_r, frozen, cur_cpu, strict=True)
            ],
            ready=[r if fz else int(rd) for fz, r, rd in zip(frozen, cur_r, ready, strict=True)],
        )
        pending = {}
    allocated = [r * x for r, x in zip(replicas, cpu, strict=True)]
    m.allocation = allocated
    wake = _wake_levels(e, allocated, concurrency, frozen)
    e._record_hpa_scales(now, cur_r, cur_cpu, allocated, frozen)

    view = TickView(
        engine=e,
        now=now,
        kpa=kpa_tick,
        hpa=hpa_notes,
        value=value,
        frozen_code=frozen_code,
        current=cur_r,
        current_cpu=cur_cpu,
        wanted=wanted,
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
        used=list(m.cpu_used),
        throttled=list(m.thr_rate),
        wake=wake,
    )
    rules = [""] * n
    if kpa_tick is not None:
        for j, i in enumerate(ki):
            rules[i] = RULES[kpa_tick.rule[j]]
    for i, (rule, _, _) in hpa_notes.items():
        rules[i] = rule
    for i, code in enumerate(frozen_code):
        if code:
            rules[i] = FROZEN_REASONS[code]
    return e.decisions(now, view, replicas, cpu, allocated, rules, frozen, wake)


# ---- pieces -----------------------------------------------------------------------------------


def _rates(
    m: Counters, sigs: list[ServiceSignals | None], at: list[float], fresh: list[bool]
) -> None:
    """:meth:`Engine._rates`."""
    rps, arrivals, arrivals_at = m.rps, m.arrivals, m.arrivals_at
    for i, s in enumerate(sigs):
        if not fresh[i] or s is None:
            continue
        t = at[i]
        a = float(s.arrivals_total)
        dt = t - arrivals_at[i]
        rps[i] = (a - arrivals[i]) / dt if dt > 0 and a >= arrivals[i] else float(s.rps)
        arrivals[i] = a
        arrivals_at[i] = t
        total = s.cpu_seconds_total
        if total is not None and not isnan(total):
            total = float(total)
            dt = t - m.cpu_at[i]
            good = dt > 0 and total >= m.cpu_total[i]
            m.cpu_used[i] = (total - m.cpu_total[i]) / dt if good else _NAN
            m.cpu_total[i] = total
            m.cpu_at[i] = t
        total = s.cpu_throttled_seconds_total
        if total is not None and not isnan(total):
            total = float(total)
            dt = t - m.thr_at[i]
            good = dt > 0 and total >= m.thr_total[i]
            m.thr_rate[i] = (total - m.thr_total[i]) / dt if good else _NAN
            m.thr_total[i] = total
            m.thr_at[i] = t


def _kpa_recommend(
    w: KpaWindows,
    c: KpaLists,
    *,
    now: float,
    granularity_s: float,
    ready: list[float],
    current: list[int],
    active: list[bool],
    instant: list[float],
) -> KpaTick:
    """:meth:`KpaBatch.recommend` (with ``instant``) and :meth:`KpaBatch.averages`."""
    w.advance(math.floor(now / granularity_s))
    stable_sum, stable_n, stable_nz = w.stable_sum, w.stable_n, w.stable_nz
    panic_sum, panic_n, panic_nz = w.panic_sum, w.panic_n, w.panic_nz
    panic_since, max_panic_in = w.panic_since, w.max_panic
    last_active, first_at = w.last_active, w.first_at
    ceil, floor = math.ceil, math.floor
    target_value, up_rate, down_rate = c.target_value, c.up_rate, c.down_rate
    threshold, stable_s, max_r, min_r, zero_after_s = (
        c.threshold,
        c.stable_s,
        c.max_r,
        c.min_r,
        c.zero_after_s,
    )
    rows: list[tuple[float | int | bool, ...]] = []
    for i in range(w.n):
        n_s, n_p = stable_n[i], panic_n[i]
        # averages(): NaN where a window has no data; never below 0
        if n_s > 0:
            stable = stable_sum[i] / n_s if stable_nz[i] > 0 else 0.0
            stable = stable if stable >= 0.0 else 0.0
        else:
            stable = _NAN
        if n_p > 0:
            panic = panic_sum[i] / n_p if panic_nz[i] > 0 else 0.0
            panic = panic if panic >= 0.0 else 0.0
        else:
            panic = _NAN
        has_stable = n_s > 0
        valid = active[i] and has_stable and n_p > 0
        st = stable if has_stable else 0.0
        pa = panic if valid else 0.0
        tv = target_value[i]
        r = ready[i]
        ready_count = r if r >= 1.0 else 1.0
        max_up = ceil(up_rate[i] * ready_count - _EPS)
        max_down = floor(ready_count / down_rate[i] + _EPS)
        want_s = ceil(st / tv - _EPS)
        want_s = want_s if want_s >= 0 else 0
        want_p = ceil(pa / tv - _EPS)
        want_p = want_p if want_p >= 0 else 0
        des_s = want_s if want_s >= max_down else max_down
        des_s = des_s if des_s <= max_up else max_up
        des_p = want_p if want_p >= max_down else max_down
        des_p = des_p if des_p <= max_up else max_up

        over = valid and want_p / ready_count >= threshold[i]
        since = panic_since[i]
        was_panicking = not isnan(since)
        entered = over and not was_panicking
        left = valid and not over and was_panicking and now - since > stable_s[i]
        since = now if over else (_NAN if left else since)
        max_panic = 0 if left else max_panic_in[i]
        in_panic = valid and not isnan(since)

        desired = (des_s if des_s >= des_p else des_p) if in_panic else des_s
        held = in_panic and desired < max_panic
        if in_panic:
            max_panic = max_panic if max_panic >= desired else desired
            desired = max_panic
        rate_limited = not in_panic and desired != want_s

        if valid:
            want_i = ceil(instant[i] / tv - _EPS)
            want_i = want_i if want_i >= 0 else 0
        else:
            want_i = 0
        top = max_r[i]
        load = want_p if want_p >= want_i else want_i
        load = load if load <= top else top
        kept = desired if desired <= top else top
        zero = desired == 0
        idle_for = now - last_active[i]
        covered = now - first_at[i]
        zero_after = zero_after_s[i]
        least = min_r[i]
        to_zero = zero and least == 0 and idle_for >= zero_after and covered >= zero_after
        hold = zero and not to_zero and current[i] > 0 and least == 0
        if hold:
            desired = 1
        unclamped = desired
        desired = desired if desired >= least else least
        desired = desired if desired <= top else top

        rule = PANIC if in_panic else STABLE
        rule = TO_ZERO if to_zero else (IDLE_GRACE if hold else rule)
        rule = rule if valid else NO_DATA
        if valid:
            panic_since[i] = since
            max_panic_in[i] = max_panic
        rows.append(  # in KpaTick's field order
            (
                desired if valid else current[i],  # replicas
                load if valid else current[i],  # load
                want_i,  # want_instant
                kept if valid else 0,  # hold
                rule,
                stable,
                panic,
                ready[i],
                want_s,  # want_stable
                want_p,  # want_panic
                des_s,  # desired_stable
                unclamped,
                entered and valid,  # entered_panic
                left and valid,  # left_panic
                held and valid,  # held_in_panic
                max_panic,
                rate_limited and valid,
                idle_for,
                valid,  # active
            )
        )
    # one tuple per field, in order
    return KpaTick(*zip(*rows, strict=True))


def _demand(  # noqa: PLR0917
    c: EngineLists,
    m: Counters,
    wanted: list[int],
    load: list[int],
    cur_r: list[int],
    cur_cpu: list[float],
    frozen: list[bool],
) -> tuple[list[float], list[float]]:
    """:meth:`Engine._demand`."""
    used = m.cpu_used
    thr = m.thr_rate
    demand: list[float] = []
    hold: list[float] = []
    for i, want in enumerate(wanted):
        ref, cpu_min = c.cpu_ref[i], c.cpu_min[i]
        least = (want if want <= 1 else 1) * cpu_min
        d = load[i] * ref
        d = d if d >= least else least
        u = used[i]
        r = cur_r[i]
        if not isnan(u) and load[i] > 0 and r > 0:
            capacity_ref = r * cur_cpu[i] / ref
            growth = 1.0
            if capacity_ref > 0:
                growth = load[i] / capacity_ref
                growth = 1.0 if growth <= 1.0 else growth  # np.maximum(1.0, g)
            t = thr[i]
            throttled = (0.0 if isnan(t) else t) / (r if r >= 1 else 1)
            boost = 1.0 + (1.0 if throttled >= 1.0 else throttled)  # np.minimum(1.0, t)
            measured = u / c.target_utilization[i] * growth * boost
            d = measured if measured >= least else least
        held_r = r if r >= c.min_r[i] else c.min_r[i]
        held_r = held_r if held_r <= c.max_r[i] else c.max_r[i]
        if frozen[i]:
            x = cur_cpu[i]
            x = x if x >= cpu_min else cpu_min
            d = held_r * (x if x <= c.cpu_max[i] else c.cpu_max[i])
        top = c.cap[i]
        demand.append(d if d <= top else top)
        hold.append(held_r * cpu_min if frozen[i] else 0.0)
    return demand, hold


def _arbitrate(
    e: Engine,
    demand: list[float],
    hold: list[float],
    previous: list[float],
    soft: list[float],
) -> tuple[list[float], list[float], list[float]]:
    """:func:`scaler.budget.arbitrate_arrays` with the engine's bounds."""
    c = e.lists
    n = e.n
    budget = e.budget.cpu
    cap = c.cap
    guarantee: list[float] = []
    low: list[float] = []
    for i, d in enumerate(demand):
        f = c.floor[i]
        g = d if d <= f else f
        g = c.minimum[i] if c.minimum[i] >= g else g
        guarantee.append(g)
        h = hold[i]
        if h > g:
            x = d if d >= g else g
            low.append(h if h <= x else x)
        else:
            low.append(g)
    taken = [0.0] * n
    excess = _sum(low) - budget
    if excess > 0:  # frozen holds give way to floors, in order
        before = 0.0
        for i in range(n):
            extra = low[i] - guarantee[i]
            x = excess - before
            x = x if x >= 0.0 else 0.0
            taken[i] = x if x <= extra else extra
            before += extra
            low[i] = low[i] - taken[i]
    high: list[float] = []
    for d, lo, top in zip(demand, low, cap, strict=True):
        x = d if d >= lo else lo
        y = top if top >= lo else lo
        high.append(x if x <= y else y)
    weight = c.weight
    ideal = _water_fill(budget, low, high, weight)
    room: list[float] = []
    for h, top, x in zip(soft, cap, ideal, strict=True):
        y = (h if h <= top else top) - x
        room.append(y if y >= 0.0 else 0.0)
    left = budget - _sum(ideal)
    if left > _EPS and any(r != 0.0 for r in room):
        more = _water_fill(left, [0.0] * n, room, weight)
        ideal = [x + y for x, y in zip(ideal, more, strict=True)]
        for i in range(n):
            top, lo = cap[i], low[i]
            y = top if top >= lo else lo
            y = soft[i] if soft[i] <= y else y
            high[i] = high[i] if high[i] >= y else y
    keep: list[bool] = []
    hc, hr = e.hysteresis_cores, e.hysteresis_ratio
    for i in range(n):
        p, x = previous[i], ideal[i]
        band = hr * p
        band = hc if hc >= band else band
        d, f = demand[i], c.fair[i]
        keep.append(
            p != x
            and abs(x - p) <= band
            and low[i] <= p
            and p <= high[i]
            and not (p < x and p < (d if d <= f else f) - _EPS)
        )
    if not any(keep):
        return ideal, ideal, taken
    cores = [p if k else x for k, p, x in zip(keep, previous, ideal, strict=True)]
    if _sum(cores) > budget:
        cores = [a if a <= x else x for a, x in zip(cores, ideal, strict=True)]
    return cores, ideal, taken


def _water_fill(
    budget: float, lows: list[float], highs: list[float], weights: list[float]
) -> list[float]:
    """:func:`scaler.budget.water_fill_array`."""
    if _sum(highs) <= budget:
        return list(highs)
    total_low = _sum(lows)
    if total_low >= budget:
        return list(lows)
    moving = [i for i, (lo, hi) in enumerate(zip(lows, highs, strict=True)) if hi > lo]
    points = [lows[i] / weights[i] for i in moving] + [highs[i] / weights[i] for i in moving]
    slopes = [weights[i] for i in moving] + [-weights[i] for i in moving]
    order = sorted(range(len(points)), key=points.__getitem__)  # stable, as argsort's
    points = [points[k] for k in order]
    slope_after: list[float] = []
    acc = 0.0
    for k in order:  # np.cumsum: a left fold
        acc += slopes[k]
        slope_after.append(acc)
    totals = [total_low + 0.0]
    acc = 0.0
    for j in range(len(points) - 1):
        acc += slope_after[j] * (points[j + 1] - points[j])
        totals.append(total_low + acc)
    k = bisect_right(totals, budget) - 1  # np.searchsorted(side="right")
    k = min(max(k, 0), len(points) - 1)
    slope = slope_after[k]
    lam = points[k] + ((budget - totals[k]) / slope if slope > 0 else 0.0)
    out: list[float] = []
    for w, lo, hi in zip(weights, lows, highs, strict=True):
        x = lam * w
        x = x if x >= lo else lo
        out.append(x if x <= hi else hi)
    excess = _sum(out) - budget
    if excess > 0:  # floating point: never more than the budget
        room = [o - lo for o, lo in zip(out, lows, strict=True)]
        order_desc = sorted(range(len(room)), key=lambda i: -room[i])
        before = 0.0
        for i in order_desc:
            x = excess - before
            x = 0.0 if x <= 0.0 else x  # np.maximum(0.0, x)
            out[i] -= room[i] if room[i] <= x else x
            before += room[i]
    return out


def _split(
    c: EngineLists,
    cores: list[float],
    current: list[int],
    *,
    squeezed: list[bool],
    fixed_cpu: list[float],
    ready: list[int],
) -> tuple[list[int], list[float], list[int]]:
    """:func:`scaler.budget.split_arrays` with the engine's bounds."""
    eps = _EPS
    floor, ceil = math.floor, math.ceil
    replicas: list[int] = []
    cpus: list[float] = []
    notes: list[int] = []
    for i, a in enumerate(cores):
        cpu_min, cpu_max, ref = c.cpu_min[i], c.cpu_max[i], c.cpu_ref[i]
        min_r, max_r = c.min_r[i], c.max_r[i]
        whole = floor(a / cpu_max + eps)
        r_vertical = whole + (a - whole * cpu_max >= cpu_min - eps)
        r = ceil(a / ref - eps) if c.horizontal[i] else r_vertical
        sq = squeezed[i] and current[i] > 0
        if sq:
            kept = current[i] if current[i] <= ready[i] else ready[i]
            r = kept if kept >= r_vertical else r_vertical
        r = r if r >= min_r else min_r
        r = r if r <= max_r else max_r
        note = 1 if sq and r > 0 else 0
        if r > 0 and a / r < cpu_min - eps:
            fewer = floor(a / cpu_min + eps)
            r = min_r if min_r >= fewer else fewer
            note = 2
        cpu = a / (r if r >= 1 else 1)
        cpu = cpu if cpu <= cpu_max else cpu_max
        if cpu < cpu_min and r * cpu_min <= a + eps:
            cpu = cpu_min
        if r <= 0:
            cpu = ref
        fixed = fixed_cpu[i]
        if not isnan(fixed):  # a blocked resize: keep the CPU, change the replicas
            fc = fixed if fixed >= cpu_min else cpu_min
            fc = fc if fc <= cpu_max else cpu_max
            rf = floor(a / fc + eps)
            rf = rf if rf >= min_r else min_r
            rf = rf if rf <= max_r else max_r
            cut = rf > 0 and rf * fc > a + eps
            r = rf
            cpu = (a / rf if cut else fc) if rf > 0 else ref
            note = 4 if cut else 3
        replicas.append(r)
        cpus.append(cpu)
        notes.append(note)
    return replicas, cpus, notes


def _wake_levels(
    e: Engine, allocated: list[float], concurrency: list[float], frozen: list[bool]
) -> list[float]:
    """:meth:`Engine._wake_levels`."""
    wake = [_INF] * e.n
    c = e.lists
    ki = c.kpa_index
    budget = e.budget
    if not ki or budget.arbitration == "independent" or not budget.early_ticks:
        return wake
    k = e.kpa_lists
    ceil = math.ceil
    for j, i in enumerate(ki):
        if frozen[i] or c.is_rps[i]:
            continue
        capacity = allocated[i] / c.cpu_ref[i]
        if not capacity > 0:
            wake[i] = 1.0
            continue
        level = k.threshold[j] * k.target_value[j] * (capacity if capacity >= 1.0 else 1.0)
        busy = k.threshold[j] * concurrency[i]
        level = float(ceil((level if level >= busy else busy) - _EPS))
        wake[i] = level if level >= 1.0 else 1.0
    return wake
