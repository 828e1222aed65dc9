"""The shared-CPU arbiter: demands in, allocations out, never more than the budget (pure).

``shared`` arbitration, each tick:

1. every service's *low* bound is its hard minimum (``min_replicas × cpu.min``) raised to
   ``min(demand, guaranteed_cpu)``: floors first (they always fit: config validation);
2. the rest of the budget is water-filled by weight: ``allocation = clamp(λ × weight, low,
   demand)`` with one λ for everyone, so CPU nobody demands goes to whoever wants more
   (work-conserving) and nobody gets more than it asks for;
3. hysteresis: a service keeps last tick's allocation when the new one is within the band
   (``max(hysteresis_cores, hysteresis_ratio × previous)``), unless that would cost another
   service its guarantee or overrun the budget;
4. a service's *fair share* is what water-filling gives it when every service demands all
   it could use; a service above it is borrowing, one below it lends the difference.
   Because a demand rise lowers λ for everyone at once, a service whose demand rises gets
   ``min(demand, fair share)`` in the very tick it asks — taken from the borrowers.

``independent`` arbitration (the one-autoscaler-per-service baseline): replicas of a fixed
size (``cpu.request``), first come first served in config order: running replicas are kept,
new ones start only while the budget has room, nothing is ever reclaimed.

:func:`split_allocation` turns cores into ``(replicas, cpu per replica)`` within the bounds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from scaler.decision import Explanation
from scaler.policy import ScalingPolicy

_EPS = 1e-9


def water_fill(
    budget: float, lows: Sequence[float], highs: Sequence[float], weights: Sequence[float]
) -> list[float]:
    """Weighted max-min fair allocation: ``clamp(λ·w, low, high)`` summing to at most ``budget``.

    ``lows`` must fit the budget and each ``low <= high``.  O(n log n).
    """
    total_high = math.fsum(highs)
    if total_high <= budget:
        return list(highs)
    total_low = math.fsum(lows)
    if total_low >= budget:
        return list(lows)
    # total(λ) = Σ clamp(λ w, low, high) is piecewise linear and non-decreasing in λ.
    events: list[tuple[float, float]] = []
    for low, high, w in zip(lows, highs, weights, strict=True):
        if high > low:
            events.append((low / w, w))
            events.append((high / w, -w))
    events.sort()
    total = total_low
    slope = 0.0
    lam = 0.0
    target = budget
    for at, dw in events:
        if at > lam:
            reach = total + slope * (at - lam)
            if reach >= target:
                lam = lam + (target - total) / slope if slope > 0 else lam
                break
            total = reach
            lam = at
        slope += dw
    else:  # pragma: no cover - total_high > budget guarantees a break
        lam = events[-1][0] if events else 0.0
    out = [min(max(lam * w, low), high) for low, high, w in zip(lows, highs, weights, strict=True)]
    # Floating point: never hand out more than the budget.
    excess = math.fsum(out) - budget
    if excess > 0:
        for i in sorted(range(len(out)), key=lambda k: out[k] - lows[k], reverse=True):
            give = min(excess, out[i] - lows[i])
            out[i] -= give
            excess -= give
            if excess <= 0:
                break
    return out


@dataclass(slots=True)
class Claim:
    """One service's position in this tick's arbitration (cores)."""

    name: str
    weight: float
    minimum: float
    """min_replicas × cpu.min: never less."""
    floor: float
    """guaranteed_cpu (>= minimum)."""
    cap: float
    """max_replicas × cpu.max: never more."""
    demand: float = 0.0
    previous: float = 0.0
    """Allocation in force before this tick."""
    fair_share: float = 0.0
    hold: float = 0.0
    """Cores a frozen service keeps at least (its replicas × cpu.min), floors permitting."""


def fair_shares(budget: float, policies: Sequence[ScalingPolicy]) -> list[float]:
    """Each service's share under full contention (everyone demands all it could use)."""
    lows = [max(p.min_replicas * p.cpu.min, p.floor_cores) for p in policies]
    highs = [max(lo, p.max_replicas * p.cpu.max) for lo, p in zip(lows, policies, strict=True)]
    return water_fill(budget, lows, highs, [p.weight for p in policies])


class _Names:
    """'a 0.40, b 0.10 and 3 more', formatted only if a reason is ever read."""

    __slots__ = ("_items", "_text")

    def __init__(self, items: list[tuple[float, str]]) -> None:
        self._items = items
        self._text: str | None = None

    def __str__(self) -> str:
        if self._text is None:
            items = sorted(self._items, reverse=True)
            shown = ", ".join(f"{n} {c:.2f}" for c, n in items[:3])
            more = len(items) - 3
            self._text = f"{shown} and {more} more" if more > 0 else shown
        return self._text


def arbitrate_shared(
    budget: float,
    claims: Sequence[Claim],
    hysteresis_cores: float = 0.05,
    hysteresis_ratio: float = 0.05,
    explain: Sequence[Explanation] | None = None,
) -> list[float]:
    """Allocate ``budget`` among ``claims`` (see the module docstring); notes go to ``explain``."""
    lows: list[float] = []
    highs: list[float] = []
    holding = False
    for c in claims:
        low = max(c.minimum, min(c.demand, c.floor))
        if c.hold > low:
            low = min(c.hold, max(c.demand, low))
            holding = True
        lows.append(low)
        highs.append(min(max(c.demand, low), max(c.cap, low)))
    if holding:
        # Frozen services keep their replicas at cpu.min, but never at the cost of a floor.
        excess = math.fsum(lows) - budget
        for i, c in enumerate(claims):
            if excess <= 0:
                break
            guarantee = max(c.minimum, min(c.demand, c.floor))
            if lows[i] > guarantee:
                cut = min(lows[i] - guarantee, excess)
                lows[i] -= cut
                excess -= cut
                if explain is not None:
                    explain[i].add("frozen, but %.2f cores taken back for others' floors", cut)
    ideal = water_fill(budget, lows, highs, [c.weight for c in claims])
    cores = list(ideal)
    kept = False
    for i, c in enumerate(claims):
        p = c.previous
        a = ideal[i]
        if p == a:
            continue
        band = max(hysteresis_cores, hysteresis_ratio * p)
        if abs(a - p) <= band and lows[i] <= p <= highs[i]:
            if p < a and p < min(c.demand, c.fair_share) - _EPS:
                continue
            cores[i] = p
            kept = True
    if kept and math.fsum(cores) > budget:
        cores = [min(a, b) for a, b in zip(cores, ideal, strict=True)]
    if explain is None:
        return cores
    lenders: list[tuple[float, str]] = []
    borrowers: list[tuple[float, str]] = []
    gainers: list[tuple[float, str]] = []
    givers: list[tuple[float, str]] = []
    for i, c in enumerate(claims):
        a = cores[i]
        if c.fair_share - a > 0.005:
            lenders.append((c.fair_share - a, c.name))
        elif a - c.fair_share > 0.005:
            borrowers.append((a - c.fair_share, c.name))
        if a - c.previous > 0.005 and c.previous < c.fair_share - 0.005:
            gainers.append((a - c.previous, c.name))
        elif c.previous - a > 0.005 and c.previous > c.fair_share + 0.005:
            givers.append((c.previous - a, c.name))
    lending = bool(lenders and borrowers)
    reclaiming = bool(gainers and givers)
    lend_to, borrow_from = _Names(borrowers), _Names(lenders)
    give_to, reclaim_from = _Names(gainers), _Names(givers)
    for i, c in enumerate(claims):
        a = cores[i]
        note = explain[i]
        if a != ideal[i]:
            note.add("hysteresis: keeping %.2f cores (ideal %.2f is within the band)", a, ideal[i])
        if lending:
            if c.fair_share - a > 0.005:
                note.add("lends %.2f cores of its fair share to: %s", c.fair_share - a, lend_to)
            elif a - c.fair_share > 0.005:
                note.add(
                    "borrows %.2f cores beyond its fair share %.2f from: %s",
                    a - c.fair_share,
                    c.fair_share,
                    borrow_from,
                )
        if reclaiming:
            if a - c.previous > 0.005 and c.previous < c.fair_share - 0.005:
                note.add("reclaimed %.2f cores from: %s", a - c.previous, reclaim_from)
            elif c.previous - a > 0.005 and c.previous > c.fair_share + 0.005:
                note.add("gave back %.2f borrowed cores to: %s", c.previous - a, give_to)
        if a < c.demand - 0.005:
            note.add("wants %.2f cores, budget gives %.2f", c.demand, a)
    return cores


@dataclass(slots=True)
class IndependentClaim:
    """One service in the first-come-first-served baseline (replicas of ``cpu_ref`` cores)."""

    name: str
    policy: ScalingPolicy
    cpu_ref: float
    want_replicas: int
    held_replicas: int
    fixed: bool = False


def arbitrate_independent(
    budget: float,
    claims: Sequence[IndependentClaim],
    explain: Sequence[Explanation] | None = None,
) -> list[tuple[int, float]]:
    """First come first served on the budget, in the given order; nothing is reclaimed.

    Returns ``(replicas, cpu per replica)`` per claim.
    """
    n = len(claims)
    base = [c.policy.min_replicas * c.policy.cpu.min for c in claims]
    free = budget - math.fsum(base)
    # Top the minimum replicas up to the replica size, in order.
    mins_cpu: list[float] = []
    for c, b in zip(claims, base, strict=True):
        need = c.policy.min_replicas * c.cpu_ref - b
        top = min(max(0.0, need), max(0.0, free))
        free -= top
        mins_cpu.append((b + top) / c.policy.min_replicas if c.policy.min_replicas else c.cpu_ref)
    extra = [0] * n

    def grant(i: int, replicas: int) -> int:
        nonlocal free
        c = claims[i]
        if mins_cpu[i] < c.cpu_ref - _EPS:
            return 0
        k = max(0, min(replicas, math.floor(free / c.cpu_ref + _EPS)))
        free -= k * c.cpu_ref
        return k

    # Running replicas keep their place (no reclaim)...
    for i, c in enumerate(claims):
        keep = c.held_replicas if c.fixed else min(c.held_replicas, c.want_replicas)
        keep = min(keep, c.policy.max_replicas) - c.policy.min_replicas
        extra[i] = grant(i, keep)
    # ...then new ones start while there is room.
    for i, c in enumerate(claims):
        if c.fixed:
            continue
        more = min(c.want_replicas, c.policy.max_replicas) - c.policy.min_replicas - extra[i]
        if more > 0:
            got = grant(i, more)
            extra[i] += got
            if got < more and explain is not None:
                explain[i].add(
                    "pending: %d more replicas of %g cores do not fit the budget "
                    "(first come first served, nothing reclaimed)",
                    more - got,
                    c.cpu_ref,
                )
    out: list[tuple[int, float]] = []
    for i, c in enumerate(claims):
        replicas = c.policy.min_replicas + extra[i]
        cpu = mins_cpu[i] if extra[i] == 0 else c.cpu_ref
        out.append((replicas, cpu))
    return out


def split_allocation(
    cores: float,
    policy: ScalingPolicy,
    *,
    cpu_ref: float,
    current_replicas: int,
    squeezed: bool,
    fixed_cpu: float | None = None,
    explain: Explanation | None = None,
) -> tuple[int, float]:
    """Turn ``cores`` into ``(replicas, cpu per replica)`` within the policy's bounds.

    ``replicas × cpu`` never exceeds ``cores`` (given ``cores >= min_replicas × cpu.min``).
    ``squeezed`` (the budget gives less than the demand): keep the current replicas and
    shrink their CPU first, removing replicas only below ``cpu.min``.  Otherwise
    ``prefer: vertical`` grows CPU per replica up to ``cpu.max`` before adding replicas,
    ``horizontal`` adds replicas of ``cpu_ref`` cores.  ``fixed_cpu`` (a resize is blocked)
    keeps the CPU per replica and changes only the replica count.
    """
    cpu_min = policy.cpu.min
    cpu_max = policy.cpu.max
    lo = policy.min_replicas
    hi = policy.max_replicas
    if fixed_cpu is not None:
        cpu = min(max(fixed_cpu, cpu_min), cpu_max)
        replicas = min(max(math.floor(cores / cpu + _EPS), lo), hi)
        if replicas and replicas * cpu > cores + _EPS:
            cpu = cores / replicas
            if explain is not None:
                explain.add(
                    "resize blocked, but %d replicas need CPU cut to %.2f to fit", replicas, cpu
                )
        elif explain is not None:
            explain.add("resize blocked: CPU stays %.2f, scaling replicas instead", cpu)
        return replicas, cpu
    if squeezed and current_replicas > 0:
        replicas = min(max(current_replicas, lo, math.ceil(cores / cpu_max - _EPS)), hi)
        if replicas and explain is not None:
            explain.add(
                "squeezed: shrinking CPU per replica in place, keeping %d replicas", replicas
            )
    elif policy.prefer == "horizontal":
        replicas = min(max(math.ceil(cores / cpu_ref - _EPS), lo), hi)
    else:
        replicas = min(max(math.ceil(cores / cpu_max - _EPS), lo), hi)
    if replicas and cores / replicas < cpu_min - _EPS:
        fewer = max(lo, math.floor(cores / cpu_min + _EPS))
        if explain is not None:
            explain.add("only %d replicas fit at cpu.min %g (of %d)", fewer, cpu_min, replicas)
        replicas = fewer
    if replicas == 0:
        return 0, policy.cpu.initial_cores
    cpu = cores / replicas
    if cpu > cpu_max:
        cpu = cpu_max
    elif cpu < cpu_min:
        cpu = cpu_min if replicas * cpu_min <= cores + _EPS else cpu
    return replicas, cpu
