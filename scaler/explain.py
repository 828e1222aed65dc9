"""The explanations of a tick's decisions, built from the tick's arrays on demand (pure).

The engine keeps one :class:`TickView` per tick (its arrays, read-only) and each decision
points into it; a decision's :class:`~scaler.explanation.Explanation` is built the first time
it is read.  Its parts, in order:

1. the horizontal recommender's steps (KPA windows or the HPA calculation), with the rate
   limits and bounds (min/max_replicas) that clamped it;
2. a ``frozen`` step when signals were missing, stale or refused (the service keeps what it
   has);
3. the arbiter: hysteresis and budget clamps, flows (lent to / borrowed from / reclaimed
   from / given back to whom, taken for floors), how the cores were split into replicas;
4. the ``budget`` step: demand, floor, fair share -> replicas × CPU.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from scaler.arbiter import IntArray
from scaler.explanation import Explanation, Trace
from scaler.hpa_batch import HPA_RULES, HpaTick
from scaler.kpa_batch import RULES, Floats, Ints, KpaTick
from scaler.metrics import MetricsVerdict

if TYPE_CHECKING:
    from scaler.engine import Engine

FROZEN_REASONS = (
    "",
    "frozen: missing signals",
    "frozen: stale signals",
    "frozen: no data",
    "frozen: invalid signals",
)
_MOVE = 0.005  # cores: smaller differences are not worth a sentence


def rule_names(
    kpa: KpaTick | None,
    kpa_index: IntArray,
    frozen_code: IntArray,
    n: int,
    *,
    hpa: HpaTick | None,
    hpa_index: IntArray,
) -> list[str]:
    """The rule that fired, per service."""
    rules = [""] * n
    if kpa is not None:
        codes = np.asarray(kpa.rule).tolist()
        if len(codes) == n:  # every service is KPA: positions line up
            rules = [RULES[c] for c in codes]
        else:
            for j, i in enumerate(kpa_index.tolist()):
                rules[i] = RULES[codes[j]]
    if hpa is not None:
        active = np.flatnonzero(hpa.active)
        for i, code in zip(hpa_index[active].tolist(), hpa.rule[active].tolist(), strict=True):
            rules[i] = HPA_RULES[code]
    for i in np.nonzero(frozen_code)[0].tolist():
        rules[i] = FROZEN_REASONS[int(frozen_code[i])]
    return rules


def metric_parts(verdict: MetricsVerdict, trace: Trace) -> None:
    """Each metric's answer, then the one taken (or why the service held)."""
    for a in verdict.answers:
        trace.step(
            "metrics.answer",
            name=a.name,
            type=a.type,
            value="-" if a.value is None else f"{a.value:g}",
            replicas="-" if a.replicas is None else a.replicas,
            note=a.note,
        )
    if verdict.held_by:
        trace.step(
            "metrics.held",
            missing=", ".join(verdict.held_by),
            replicas=verdict.replicas,
        )
    else:
        trace.step("metrics.won", name=verdict.winner or "-", replicas=verdict.replicas)


def _names(items: list[tuple[float, str]]) -> tuple[str, ...]:
    """Peers, the largest first."""
    items.sort(reverse=True)
    return tuple(name for _, name in items)


@dataclass(slots=True)
class TickView:
    """One tick's arrays, kept for rendering reasons later.  Never mutated."""

    engine: Engine
    rejected: dict[int, list[str]]
    """Per service with invalid signals, the figures refused (``name=value``)."""
    now: float
    kpa: KpaTick | None
    hpa: HpaTick | None
    value: Floats
    frozen_code: Ints
    current: Ints
    current_cpu: Floats
    wanted: Ints
    run: Ints
    """Replicas the service runs before the budget's bounds (recommendation, scale-down
    delay, starting replicas)."""
    demand: Floats
    soft: Floats
    previous: Floats
    cores: Floats
    ideal: Floats
    taken: Floats
    replicas: Ints
    cpu: Floats
    split_note: Ints
    pending: dict[int, Trace]
    used: Floats
    used_mean: Floats
    """CPU used over the panic window (what the scale-down floor read)."""
    throttled: Floats
    wake: Floats
    metrics: dict[int, MetricsVerdict] = field(default_factory=dict)
    """Per service with ``scaling.metrics``: each metric's answer and the one taken."""
    capped: frozenset[int] = frozenset()
    """Under share, the services the platform holds at their decided CPU (decided as under
    limit)."""
    full_for: tuple[Floats, Floats] | None = None
    """Under share, per service: seconds its ready replicas have been full (NaN: not full),
    and the seconds they take to drain the work in the system at the rate they complete it."""
    rules: list[str] = field(default_factory=list)
    """The rule that fired, per service (the decisions' ``rule``)."""
    _flows: dict[str, tuple[str, ...]] | None = None
    _kpa_pos: dict[int, int] | None = None
    _hpa_pos: dict[int, int] | None = None

    def flows(self) -> dict[str, tuple[str, ...]]:
        """Who lends / borrows / holds / is held from / gives back / gains this tick
        (computed once per tick).

        A service below its fair share lends what it does not want of it; what it wants but
        does not get (the arbiter's allocation, before hysteresis) is held from it by the
        services above theirs -- their floors and the ``cpu.min`` of the replicas they keep
        serving (the arbiter gives the rest away first) -- and those hold rather than borrow.
        """
        if self._flows is None:
            e = self.engine
            names = e.names
            fair = e.fair
            lenders: list[tuple[float, str]] = []
            borrowers: list[tuple[float, str]] = []
            short: list[tuple[float, str]] = []
            gainers: list[tuple[float, str]] = []
            givers: list[tuple[float, str]] = []
            for i in range(e.n):
                a, f, p = float(self.cores[i]), float(fair[i]), float(self.previous[i])
                want = min(float(self.demand[i]), f)
                if f - max(a, want) > _MOVE:
                    lenders.append((f - max(a, want), names[i]))
                elif a - f > _MOVE:
                    borrowers.append((a - f, names[i]))
                if want - float(self.ideal[i]) > _MOVE:
                    short.append((want - float(self.ideal[i]), names[i]))
                if a - p > _MOVE and p < f - _MOVE:
                    gainers.append((a - p, names[i]))
                elif p - a > _MOVE and p > f + _MOVE:
                    givers.append((p - a, names[i]))
            flows: dict[str, tuple[str, ...]] = {}
            if lenders and borrowers:
                flows["lend_to"] = _names(list(borrowers))
                flows["borrow_from"] = _names(lenders)
            if short and borrowers:
                flows["hold_from"] = _names(short)
                flows["held_by"] = _names(borrowers)
            if gainers and givers:
                flows["reclaim_from"] = _names(givers)
                flows["give_to"] = _names(gainers)
            self._flows = flows
        return self._flows

    def kpa_position(self, i: int) -> int | None:
        if self._kpa_pos is None:
            self._kpa_pos = {int(s): j for j, s in enumerate(self.engine.kpa_index.tolist())}
        return self._kpa_pos.get(i)

    def hpa_position(self, i: int) -> int | None:
        """Service ``i``'s row in the HPA batch, when it is HPA-mode and was evaluated."""
        if self.hpa is None:
            return None
        if self._hpa_pos is None:
            self._hpa_pos = {int(s): j for j, s in enumerate(self.engine.hpa_index.tolist())}
        j = self._hpa_pos.get(i)
        return j if j is not None and self.hpa.active[j] else None

    def explanation(self, i: int) -> Explanation:
        """Service ``i``'s explanation for this tick."""
        e = self.engine
        trace = Trace()
        code = int(self.frozen_code[i])
        rule = self.rules[i]
        if code in (0, 3):
            j = self.kpa_position(i)
            if j is not None and self.kpa is not None:
                e.kpa.explain(self.kpa, j, trace)
            elif self.hpa is not None and (h := self.hpa_position(i)) is not None:
                e.hpa.explain(self.hpa, h, trace)
        verdict = self.metrics.get(i)
        if verdict is not None:
            metric_parts(verdict, trace)
        if i in self.rejected:
            trace.step("signals_refused", fields=", ".join(self.rejected[i]))
        if code:
            trace.step(
                "frozen",
                reason=FROZEN_REASONS[code],
                replicas=int(self.current[i]),
                cpu=float(self.current_cpu[i]),
            )
        r, cpu = int(self.replicas[i]), float(self.cpu[i])
        if e.budget.arbitration == "independent":
            if i in self.pending:
                trace.parts.extend(self.pending[i].parts)
            trace.step(
                "independent",
                wanted=int(self.wanted[i]),
                cpu_ref=float(e.cpu_ref[i]),
                replicas=r,
                cpu=cpu,
                cores=r * cpu,
            )
            return Explanation(rule, self.inputs(i), tuple(trace.parts))
        self._arbiter_parts(i, trace)
        return Explanation(rule, self.inputs(i), tuple(trace.parts))

    def _arbiter_parts(self, i: int, trace: Trace) -> None:
        e = self.engine
        if i in self.capped:
            trace.step("enforcement.capped")
        r, cpu = int(self.replicas[i]), float(self.cpu[i])
        a, ideal = float(self.cores[i]), float(self.ideal[i])
        fair, prev, demand = float(e.fair[i]), float(self.previous[i]), float(self.demand[i])
        if self.taken[i] > 0:
            trace.flow("taken_for_floors", float(self.taken[i]))
        if a != ideal:
            trace.clamp("cores", ideal, a, "hysteresis")
        flows = self.flows()
        want = min(demand, fair)
        if a - fair > _MOVE:
            if "hold_from" in flows:
                trace.flow("held", a - fair, flows["hold_from"])
            elif "borrow_from" in flows:
                trace.flow("borrowed", a - fair, flows["borrow_from"])
        else:
            if "lend_to" in flows and fair - max(a, want) > _MOVE:
                trace.flow("lent", fair - max(a, want), flows["lend_to"])
            if "held_by" in flows and want - ideal > _MOVE:
                trace.flow("held_from", want - ideal, flows["held_by"])
        if "reclaim_from" in flows:
            if a - prev > _MOVE and prev < fair - _MOVE:
                trace.flow("reclaimed", a - prev, flows["reclaim_from"])
            elif prev - a > _MOVE and prev > fair + _MOVE:
                trace.flow("gave_back", prev - a, flows["give_to"])
        if a < demand - _MOVE:
            trace.clamp("cores", demand, a, "budget")
        note = int(self.split_note[i])
        if note == 1:
            trace.step("split.in_place", replicas=r, cpu=cpu, cpu_min=e._pols[i].cpu.min)
        elif note == 2:
            trace.clamp("replicas", int(self.wanted[i]), r, "cpu.min")
        elif note == 3:
            trace.step("split.resize_blocked", cpu=cpu)
        elif note == 4:
            trace.step("split.resize_blocked_cut", replicas=r, cpu=cpu)
        elif note == 5:
            trace.step("split.starting", replicas=r)
        elif note == 6:
            trace.step("split.held_back", replicas=r, wanted=int(self.run[i]))
        elif note == 7:
            delay = e._pols[i].scale_down_delay_s
            trace.step("split.delay", replicas=r, delay_s=delay)
        elif note == 8:
            trace.step(
                "split.cpu_floor",
                replicas=r,
                used=float(self.used_mean[i]),
                utilization=float(e.target_utilization[i]),
            )
        elif note == 10:
            trace.step("split.one_more", replicas=r, wanted=int(self.run[i]))
        elif note == 9:
            assert self.full_for is not None  # replicas into idle CPU: share only
            full, drain = self.full_for
            trace.step(
                "split.into_idle",
                replicas=r,
                wanted=int(self.run[i]),
                used=float(self.used[i]),
                full_s=float(full[i]),
                drain_s=float(drain[i]),
                window_s=float(e._panic_s[i]),
            )
        held = float(self.soft[i])
        if held > demand + _MOVE:
            trace.step("soft_hold", held=held, spare=held - demand)
        trace.step(
            "budget",
            demand=demand,
            floor=float(e.floor[i]),
            fair=fair,
            replicas=r,
            cpu=cpu,
            cores=r * cpu,
            total=e.cpu.cores,
            source=e.cpu.source,
        )

    def inputs(self, i: int) -> dict[str, float]:
        e = self.engine
        policy = e._pols[i]
        out: dict[str, float] = {policy.metric: float(self.value[i])}
        j = self.kpa_position(i)
        if j is not None and self.kpa is not None:
            k = self.kpa
            out["stable"] = float(k.stable[j])
            out["panic"] = float(k.panic[j])
            out["target_value"] = float(e.kpa.target_value[j])
            out["capacity_replicas"] = float(k.ready[j])
        elif self.hpa is not None and (h := self.hpa_position(i)) is not None:
            out.update(e.hpa.inputs(self.hpa, h))
        verdict = self.metrics.get(i)
        if verdict is not None:
            for a in verdict.answers:
                if a.value is not None:
                    out[f"metric.{a.name}"] = float(a.value)
                if a.replicas is not None:
                    out[f"metric.{a.name}.replicas"] = float(a.replicas)
        out["horizontal_replicas"] = float(self.wanted[i])
        out["demand_cores"] = float(self.demand[i])
        out["held_demand_cores"] = float(self.soft[i])
        out["allocation_cores"] = float(self.cores[i])
        out["fair_share_cores"] = float(e.fair[i])
        out["floor_cores"] = float(e.floor[i])
        if not np.isnan(self.used[i]):
            out["cpu_used_cores"] = float(self.used[i])
        if not np.isnan(self.used_mean[i]):
            out["cpu_used_mean_cores"] = float(self.used_mean[i])
        if not np.isnan(self.throttled[i]):
            out["cpu_throttled_s_per_s"] = float(self.throttled[i])
        if np.isfinite(self.wake[i]):
            out["wake_concurrency"] = float(self.wake[i])
        return {k: v for k, v in out.items() if math.isfinite(v)}
