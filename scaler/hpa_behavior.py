"""The HPA's ``behavior`` (``horizontal.go``) for many workloads at once, on arrays (pure).

:class:`HpaBehaviorBatch` stabilises, rate-limits and clamps the calculator's answers;
:class:`HpaBehaviorState` is a batch of one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from scaler.explanation import Trace
from scaler.kpa_batch import BoolArray, FloatArray, IntArray
from scaler.policy import HpaBehavior, HpaScalingRules

_NONE_LOW = 2**31 - 1
"""'No recommendation' in the lowest-recommendation table (the tables hold ``int32``)."""
_NONE_HIGH = -(2**31 - 1)
_MAX, _MIN, _DISABLED = 0, 1, 2
_SELECT = {"Max": _MAX, "Min": _MIN, "Disabled": _DISABLED}


@dataclass(frozen=True, slots=True)
class Normalized:
    """One call's answers (arrays indexed like the batch); read-only."""

    current: IntArray
    desired: IntArray
    stabilized: IntArray
    limited: IntArray
    """After the rate policies."""
    replicas: IntArray
    """After the min/max clamp: the answer."""
    max_replicas: IntArray

    def explain(self, j: int, trace: Trace) -> None:
        """Workload ``j``'s clamps: stabilisation, rate policy, bound."""
        desired, stabilized = int(self.desired[j]), int(self.stabilized[j])
        limited, replicas = int(self.limited[j]), int(self.replicas[j])
        if stabilized != desired:
            trace.clamp("replicas", desired, stabilized, "stabilization")
        if limited != stabilized:
            up = stabilized > int(self.current[j])
            trace.clamp(
                "replicas",
                stabilized,
                limited,
                "behavior.scale_up" if up else "behavior.scale_down",
            )
        if replicas != limited:
            bound = "max_replicas" if limited > int(self.max_replicas[j]) else "min_replicas"
            trace.clamp("replicas", limited, replicas, bound)


class _Rules:
    """One direction's rules for every workload, policies padded to the longest list."""

    def __init__(self, rules: Sequence[HpaScalingRules]) -> None:
        m = len(rules)
        k = max([len(r.policies) for r in rules] + [1])
        self.window = np.array([r.stabilization_window_s for r in rules], dtype=np.float64)
        self.select = np.array([_SELECT[r.select_policy] for r in rules], dtype=np.int64)
        self.valid = np.zeros((k, m), dtype=bool)
        self.pods = np.zeros((k, m), dtype=bool)
        self.value = np.zeros((k, m), dtype=np.int64)
        self.period = np.ones((k, m), dtype=np.float64)
        for j, r in enumerate(rules):
            for slot, p in enumerate(r.policies):
                self.valid[slot, j] = True
                self.pods[slot, j] = p.type == "Pods"
                self.value[slot, j] = p.value
                self.period[slot, j] = p.period_s
        self.windows = _groups(self.window)

    def limit(self, start: IntArray, current: IntArray, up: bool) -> IntArray:
        """The most (``up``) or fewest replicas the policies allow now, from each policy's
        replica count at the start of its period (``start``: policies × workloads)."""
        if up:
            proposed = np.where(
                self.pods, start + self.value, np.ceil(start * (1 + self.value / 100) - 1e-9)
            )
        else:
            proposed = np.where(
                self.pods, start - self.value, np.floor(start * (1 - self.value / 100) + 1e-9)
            )
        proposed = proposed.astype(np.int64)
        # Max = the policy allowing the biggest change: up, the highest; down, the lowest.
        biggest = np.where(self.valid, proposed, _NONE_HIGH if up else _NONE_LOW)
        biggest = biggest.max(axis=0) if up else biggest.min(axis=0)
        smallest = np.where(self.valid, proposed, _NONE_LOW if up else _NONE_HIGH)
        smallest = smallest.min(axis=0) if up else smallest.max(axis=0)
        result = np.where(self.select == _MIN, smallest, biggest)
        result = np.where(self.valid.any(axis=0), result, current)
        bounded = np.maximum(current, result) if up else np.minimum(current, result)
        return np.where(self.select == _DISABLED, current, bounded)


def _groups(values: FloatArray) -> list[tuple[float, IntArray | slice]]:
    """Workloads by equal value (a slice when all share it), values > 0 only."""
    distinct = np.unique(values).tolist()
    if len(distinct) == 1:
        return [(distinct[0], slice(None))] if distinct[0] > 0 else []
    return [(v, np.flatnonzero(values == v)) for v in distinct if v > 0]


class _Ring:
    """Tables of ``int32`` columns, one column per distinct time, in time order around a
    ring: a column older than ``horizon`` seconds is reused; when ticks come faster than one
    a second the ring grows."""

    def __init__(self, m: int, horizon: float, fills: dict[str, int]) -> None:
        slots = max(2, math.ceil(horizon) + 2)
        self.m = m
        self.horizon = horizon
        self.fills = fills
        self.times = np.full(slots, -math.inf)
        self.tables = {k: np.full((m, slots), v, dtype=np.int32) for k, v in fills.items()}
        self.col = slots - 1

    def __repr__(self) -> str:
        live = int((self.times > self.times[self.col] - self.horizon).sum())
        return f"{live}/{len(self.times)} columns"

    def column(self, now: float) -> int:
        """The column of ``now`` (a new one unless ``now`` is the latest time)."""
        col = self.col
        if now <= self.times[col]:
            return col
        slots = len(self.times)
        nxt = (col + 1) % slots
        if self.times[nxt] > now - self.horizon:  # still within the horizon: grow
            order = np.r_[nxt:slots, 0:nxt]
            self.times = np.concatenate([self.times[order], np.full(slots, -math.inf)])
            for name, fill in self.fills.items():
                extra = np.full((self.m, slots), fill, dtype=np.int32)
                self.tables[name] = np.concatenate([self.tables[name][:, order], extra], axis=1)
            nxt = slots
        self.times[nxt] = now
        for name, fill in self.fills.items():
            self.tables[name][:, nxt] = fill
        self.col = nxt
        return nxt

    def recent(self, now: float, span: float) -> list[slice]:
        """The columns of the last ``span`` seconds (time > now - span), as at most two
        slices."""
        k = int(np.count_nonzero(self.times > now - span))
        if not k:
            return []
        end = self.col + 1
        start = end - k
        if start >= 0:
            return [slice(start, end)]
        return [slice(start + len(self.times), None), slice(0, end)]


class HpaBehaviorBatch:
    """Stabilisation windows and rate policies for ``len(behaviors)`` workloads.

    As the HPA controller: a recommendation is stabilised (scale-up uses the *lowest*
    recommendation of the last ``scale_up.stabilization_window_s`` seconds, scale-down the
    *highest* of the last ``scale_down.stabilization_window_s``), then limited by the rate
    policies -- each ``Pods``/``Percent`` policy allows a change relative to the replica
    count at the start of its ``period_s`` (replicas added or removed within the period are
    taken into account); ``select_policy: Max`` picks the policy allowing the biggest change,
    ``Min`` the smallest, ``Disabled`` forbids the direction -- and finally clamped to
    ``[min_replicas, max_replicas]``.  The default scale-up (100 % or 4 pods per 15 s, Max)
    is the HPA's ``max(2×, +4)``; the default scale-down stabilises over 300 s.

    Memory: two rings of columns (:class:`_Ring`), one column per distinct time shared by
    all workloads: each workload's lowest and highest recommendation then (kept for the
    longest stabilisation window), and the replicas it added and removed then (kept for the
    longest policy period).  Time never goes back: a call at an earlier time counts at the
    latest.
    """

    def __init__(self, behaviors: Sequence[HpaBehavior]) -> None:
        m = len(behaviors)
        self.m = m
        self.up = _Rules([b.scale_up for b in behaviors])
        self.down = _Rules([b.scale_down for b in behaviors])
        periods = np.concatenate([self.up.period[self.up.valid], self.down.period[self.down.valid]])
        self._periods = np.unique(periods)
        """Every distinct rate-policy period."""
        last = max(len(self._periods) - 1, 0)  # (padding slots: any period, never read)
        self._up_period = np.minimum(np.searchsorted(self._periods, self.up.period), last)
        self._down_period = np.minimum(np.searchsorted(self._periods, self.down.period), last)
        tables = {}
        if self.up.windows:
            tables["low"] = _NONE_LOW
        if self.down.windows:
            tables["high"] = _NONE_HIGH
        windows = [0.0, *self.up.window.tolist(), *self.down.window.tolist()]
        self._recommendations = _Ring(m, max(windows), tables)
        self._events = _Ring(m, max([0.0, *periods.tolist()]), {"added": 0, "removed": 0})
        self._rows = np.arange(m)

    def __repr__(self) -> str:
        return (
            f"HpaBehaviorBatch(workloads={self.m}, recommendations={self._recommendations!r}, "
            f"events={self._events!r})"
        )

    def _reduce(
        self, now: float, groups: list[tuple[float, IntArray | slice]], low: bool
    ) -> IntArray:
        """Per workload, its lowest (``low``) or highest recommendation within its window
        (``groups``: workloads by window); none: the 'no recommendation' value."""
        ring = self._recommendations
        out = np.full(self.m, _NONE_LOW if low else _NONE_HIGH, dtype=np.int64)
        for window, rows in groups:
            for cols in ring.recent(now, window):
                part = ring.tables["low" if low else "high"][rows, cols]
                seen = part.min(axis=1) if low else part.max(axis=1)
                out[rows] = np.minimum(out[rows], seen) if low else np.maximum(out[rows], seen)
        return out

    def _starts(self, now: float, current: IntArray) -> tuple[IntArray, IntArray]:
        """Replicas at the start of each policy's period (policies × workloads), per direction:
        ``current`` less those added, plus those removed, within the period."""
        ring = self._events
        added, removed = ring.tables["added"], ring.tables["removed"]
        change = np.zeros((max(len(self._periods), 1), self.m), dtype=np.int64)
        for k, period in enumerate(self._periods.tolist()):
            for cols in ring.recent(now, period):
                change[k] += added[:, cols].sum(axis=1) - removed[:, cols].sum(axis=1)
        rows = self._rows
        return current - change[self._up_period, rows], current - change[self._down_period, rows]

    def normalize(
        self,
        now: float,
        on: BoolArray,
        *,
        current: IntArray,
        desired: IntArray,
        min_replicas: IntArray,
        max_replicas: IntArray,
    ) -> Normalized:
        """Stabilise, rate-limit and clamp ``desired`` (the calculator's answers) where ``on``
        is set, and remember them; elsewhere the answer is ``current``, nothing remembered."""
        # The lowest recommendation of each scale-up window, the highest of each scale-down
        # window (this one included).
        up_rec = np.minimum(desired, self._reduce(now, self.up.windows, low=True))
        down_rec = np.maximum(desired, self._reduce(now, self.down.windows, low=False))
        ring = self._recommendations
        col = ring.column(now)
        kept = np.clip(desired, _NONE_HIGH + 1, _NONE_LOW - 1)
        for name, pick in (("low", np.minimum), ("high", np.maximum)):
            table = ring.tables.get(name)
            if table is not None:
                table[:, col] = np.where(on, pick(table[:, col], kept), table[:, col])
        stabilized = np.minimum(np.maximum(current, up_rec), down_rec)
        limited = stabilized
        going_up = on & (stabilized > current)
        going_down = on & (stabilized < current)
        if going_up.any() or going_down.any():
            up_start, down_start = self._starts(now, current)
            up_limit = self.up.limit(up_start, current, up=True)
            down_limit = self.down.limit(down_start, current, up=False)
            limited = np.where(
                going_up & (up_limit < max_replicas) & (stabilized > up_limit), up_limit, limited
            )
            limited = np.where(
                going_down & (down_limit > min_replicas) & (stabilized < down_limit),
                down_limit,
                limited,
            )
        replicas = np.where(
            limited > max_replicas,
            max_replicas,
            np.where(limited < min_replicas, min_replicas, limited),
        )
        return Normalized(
            current=current,
            desired=np.where(on, desired, current),
            stabilized=np.where(on, stabilized, current),
            limited=np.where(on, limited, current),
            replicas=np.where(on, replicas, current),
            max_replicas=max_replicas,
        )

    def record(self, now: float, on: BoolArray, old: IntArray, new: IntArray) -> None:
        """Remember that the workloads where ``on`` is set went from ``old`` to ``new``
        replicas at ``now``."""
        moved = on & (new != old)
        if not moved.any():
            return
        ring = self._events
        col = ring.column(now)
        step = np.clip(np.abs(new - old), 0, _NONE_LOW)
        ring.tables["added"][:, col] += np.where(moved & (new > old), step, 0).astype(np.int32)
        ring.tables["removed"][:, col] += np.where(moved & (new < old), step, 0).astype(np.int32)


_ON = np.ones(1, dtype=bool)


class HpaBehaviorState:
    """``behavior`` for one workload (a batch of one)."""

    __slots__ = ("_batch", "behavior")

    def __init__(self, behavior: HpaBehavior) -> None:
        self.behavior = behavior
        self._batch = HpaBehaviorBatch([behavior])

    def __repr__(self) -> str:
        return f"HpaBehaviorState({self._batch!r})"

    def record_scale(self, now: float, old: int, new: int) -> None:
        """Remember that the workload went from ``old`` to ``new`` replicas at ``now``."""
        self._batch.record(now, _ON, _one(old), _one(new))

    def normalize(
        self,
        now: float,
        *,
        current: int,
        desired: int,
        min_replicas: int,
        max_replicas: int,
        reasons: Trace,
    ) -> int:
        """Stabilise, rate-limit and clamp ``desired`` (the calculator's answer) as the HPA does."""
        out = self._batch.normalize(
            now,
            _ON,
            current=_one(current),
            desired=_one(desired),
            min_replicas=_one(min_replicas),
            max_replicas=_one(max_replicas),
        )
        out.explain(0, reasons)
        return int(out.replicas[0])


def _one(value: int) -> IntArray:
    return np.array([value], dtype=np.int64)
