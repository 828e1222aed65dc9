"""Reasons and inputs of a tick's decisions, rendered from the tick's arrays on demand (pure).

The engine keeps one :class:`TickView` per tick (its arrays, read-only) and hands each
decision a small :class:`_Explained` pointing into it; a decision's ``reasons`` and
``inputs`` are built the first time they are read.  The lines, in order:

1. the horizontal recommender's inputs and rule (KPA windows or the HPA calculation),
   including rate limits and the bound (min/max_replicas) that clamped it;
2. ``frozen: ...`` when signals were missing or stale (the service keeps what it has);
3. the arbiter: hysteresis, what it lends (to whom) or borrows (from whom), what it
   reclaimed (from whom) or gave back (to whom), how the cores were split into replicas;
4. ``budget: demand D cores (floor F, fair share S) -> R×C = A cores``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from scaler.arbiter import IntArray
from scaler.decision import Explanation
from scaler.kpa_batch import RULES, Floats, Ints, KpaTick

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

_SPLIT_NOTES = {
    1: "squeezed: shrinking CPU per replica in place, keeping {r} replicas",
    2: "only {r} replicas fit at cpu.min {cpu_min:g}",
    3: "resize blocked: CPU stays {cpu:.2f}, scaling replicas instead",
    4: "resize blocked, but {r} replicas need CPU cut to {cpu:.2f} to fit",
    5: "keeps {r} replicas while some are starting: a replica is not removed before it is ready",
}


def rule_names(
    kpa: KpaTick | None,
    kpa_index: IntArray,
    hpa: dict[int, tuple[str, Explanation, dict[str, float]]],
    frozen_code: IntArray,
    n: int,
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
    for i, (rule, _, _) in hpa.items():
        rules[i] = rule
    for i in np.nonzero(frozen_code)[0].tolist():
        rules[i] = FROZEN_REASONS[int(frozen_code[i])]
    return rules


def _names(items: list[tuple[float, str]]) -> str:
    items.sort(reverse=True)
    shown = ", ".join(f"{name} {cores:.2f}" for cores, name in items[:3])
    more = len(items) - 3
    return f"{shown} and {more} more" if more > 0 else shown


@dataclass(slots=True)
class TickView:
    """One tick's arrays (or lists, from the small form), kept for rendering reasons later.
    Never mutated."""

    engine: Engine
    rejected: dict[int, list[str]]
    """Per service with invalid signals, the figures refused (``name=value``)."""
    now: float
    kpa: KpaTick | None
    hpa: dict[int, tuple[str, Explanation, dict[str, float]]]
    value: Floats
    frozen_code: Ints
    current: Ints
    current_cpu: Floats
    wanted: Ints
    demand: Floats
    soft: Floats
    previous: Floats
    cores: Floats
    ideal: Floats
    taken: Floats
    replicas: Ints
    cpu: Floats
    split_note: Ints
    pending: dict[int, Explanation]
    used: Floats
    throttled: Floats
    wake: Floats
    _flows: dict[str, str] | None = None
    _kpa_pos: dict[int, int] | None = None

    def flows(self) -> dict[str, str]:
        """Who lends to / borrows from / reclaims from / gives back to whom (computed once)."""
        if self._flows is None:
            e = self.engine
            names = e.names
            fair = e.fair
            lenders: list[tuple[float, str]] = []
            borrowers: list[tuple[float, str]] = []
            gainers: list[tuple[float, str]] = []
            givers: list[tuple[float, str]] = []
            for i in range(e.n):
                a, f, p = float(self.cores[i]), float(fair[i]), float(self.previous[i])
                if f - a > _MOVE:
                    lenders.append((f - a, names[i]))
                elif a - f > _MOVE:
                    borrowers.append((a - f, names[i]))
                if a - p > _MOVE and p < f - _MOVE:
                    gainers.append((a - p, names[i]))
                elif p - a > _MOVE and p > f + _MOVE:
                    givers.append((p - a, names[i]))
            flows: dict[str, str] = {}
            if lenders and borrowers:
                flows["lend_to"] = _names(borrowers)
                flows["borrow_from"] = _names(lenders)
            if gainers and givers:
                flows["reclaim_from"] = _names(givers)
                flows["give_to"] = _names(gainers)
            self._flows = flows
        return self._flows

    def kpa_position(self, i: int) -> int | None:
        if self._kpa_pos is None:
            self._kpa_pos = {int(s): j for j, s in enumerate(self.engine.kpa_index.tolist())}
        return self._kpa_pos.get(i)

    def render(self, i: int) -> tuple[str, ...]:
        e = self.engine
        policy = e._pols[i]
        lines: list[str] = []
        code = int(self.frozen_code[i])
        if code in (0, 3):
            j = self.kpa_position(i)
            if j is not None and self.kpa is not None:
                e.kpa.explain(self.kpa, j, lines)
            elif i in self.hpa:
                lines.extend(self.hpa[i][1].render())
        if i in self.rejected:
            lines.append(f"signals refused (not finite or negative): {', '.join(self.rejected[i])}")
        if code:
            lines.append(
                f"{FROZEN_REASONS[code]}: keeping {self.current[i]}×{self.current_cpu[i]:.2f} cores, "
                "never scaling down on missing data"
            )
        r, cpu = int(self.replicas[i]), float(self.cpu[i])
        if e.budget.arbitration == "independent":
            if i in self.pending:
                lines.extend(self.pending[i].render())
            lines.append(
                f"independent: wants {self.wanted[i]} replicas of {e.cpu_ref[i]:g} cores -> "
                f"{r}×{cpu:.2f} = {r * cpu:.2f} cores"
            )
            return tuple(lines)
        a, ideal = float(self.cores[i]), float(self.ideal[i])
        fair, prev, demand = float(e.fair[i]), float(self.previous[i]), float(self.demand[i])
        if self.taken[i] > 0:
            lines.append(f"frozen, but {self.taken[i]:.2f} cores taken back for others' floors")
        if a != ideal:
            lines.append(
                f"hysteresis: keeping {a:.2f} cores (ideal {ideal:.2f} is within the band)"
            )
        flows = self.flows()
        if "lend_to" in flows:
            if fair - a > _MOVE:
                lines.append(f"lends {fair - a:.2f} cores of its fair share to: {flows['lend_to']}")
            elif a - fair > _MOVE:
                lines.append(
                    f"borrows {a - fair:.2f} cores beyond its fair share {fair:.2f} from: "
                    f"{flows['borrow_from']}"
                )
        if "reclaim_from" in flows:
            if a - prev > _MOVE and prev < fair - _MOVE:
                lines.append(f"reclaimed {a - prev:.2f} cores from: {flows['reclaim_from']}")
            elif prev - a > _MOVE and prev > fair + _MOVE:
                lines.append(f"gave back {prev - a:.2f} borrowed cores to: {flows['give_to']}")
        if a < demand - _MOVE:
            lines.append(f"wants {demand:.2f} cores, budget gives {a:.2f}")
        note = int(self.split_note[i])
        if note:
            lines.append(_SPLIT_NOTES[note].format(r=r, cpu=cpu, cpu_min=policy.cpu.min))
        held = float(self.soft[i])
        if held > demand + _MOVE:
            lines.append(
                f"keeps replicas worth {held:.2f} cores (stable window / panic); the "
                f"{held - demand:.2f} the load does not need now is served only from spare CPU"
            )
        lines.append(
            f"budget: demand {demand:.2f} cores (floor {e.floor[i]:.2f}, fair share {fair:.2f}) "
            f"-> {r}×{cpu:.2f} = {r * cpu:.2f} cores"
        )
        return tuple(lines)

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
        elif i in self.hpa:
            out.update(self.hpa[i][2])
        out["horizontal_replicas"] = float(self.wanted[i])
        out["demand_cores"] = float(self.demand[i])
        out["held_demand_cores"] = float(self.soft[i])
        out["allocation_cores"] = float(self.cores[i])
        out["fair_share_cores"] = float(e.fair[i])
        out["floor_cores"] = float(e.floor[i])
        if not np.isnan(self.used[i]):
            out["cpu_used_cores"] = float(self.used[i])
        if not np.isnan(self.throttled[i]):
            out["cpu_throttled_s_per_s"] = float(self.throttled[i])
        if np.isfinite(self.wake[i]):
            out["wake_concurrency"] = float(self.wake[i])
        return out
