"""The shared-CPU arbiter: demands in, allocations out, never more than the budget (pure).

``shared`` arbitration, each tick:

1. every service's *low* bound is its hard minimum (``min_replicas × cpu.min``) raised to
   ``min(demand, guaranteed_cpu)``: floors first (they always fit: config validation);
2. the rest of the budget is water-filled by weight: ``allocation = clamp(λ × weight, low,
   demand)`` with one λ for everyone, so CPU nobody demands goes to whoever wants more
   (work-conserving) and nobody gets more than it asks for;
   a frozen service (stale signals) demands what it holds and keeps at least its replicas ×
   ``cpu.min``, unless another service's floor needs it; a service deciding normally keeps
   its serving replicas at ``cpu.min`` the same way, unless another service's floor or
   claim (its fair share) needs it: such a hold yields whole replicas' worth (under limit
   the replicas go; under share they stay, see :func:`size_arrays`), and the claims are met
   before the water-fill shares the rest;
3. hysteresis: a service keeps last tick's allocation when the new one is within the band
   (``max(hysteresis_cores, hysteresis_ratio × previous)``) and within ``[low, demand]`` —
   in practice a borrower does not creep up by small amounts — unless it is below
   ``min(demand, fair share)`` or the budget would overrun;
4. a service's *fair share* is what water-filling gives it when every service demands all
   it could use; a service above it is borrowing, one below it lends the difference.
   Because a demand rise lowers λ for everyone at once, a service whose demand rises gets
   ``min(demand, fair share)`` in the very tick it asks — taken from the borrowers.

``independent`` arbitration (the one-autoscaler-per-service baseline): replicas of a fixed
size (``cpu.request``), first come first served in config order: running replicas are kept,
new ones start only while the budget has room, nothing is ever reclaimed.

:func:`water_fill` is the one water-fill of Sluice's decisions (the engine and the lending
rule call it; the simulator's node shares CPU by the kernel's rule, its own);
:func:`arbitrate_arrays` is the shared arbitration on per-service arrays and
:func:`size_arrays` gives each service's recommended replicas its allocation as ``(replicas,
cpu per replica)``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from scaler.explanation import Trace
from scaler.policy import ScalingPolicy

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

_EPS = 1e-9
WEIGHT_MIN_CORES = 0.001
"""The least CPU per replica a replica kept in place under share is decided at (a weight:
Kubernetes' smallest CPU request, 1m)."""


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
    explain: Sequence[Trace] | None = None,
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
                explain[i].step("independent.pending", replicas=more - got, cpu_ref=c.cpu_ref)
    out: list[tuple[int, float]] = []
    for i, c in enumerate(claims):
        replicas = c.policy.min_replicas + extra[i]
        cpu = mins_cpu[i] if extra[i] == 0 else c.cpu_ref
        out.append((replicas, cpu))
    return out


def water_fill(
    budget: float,
    lows: FloatArray | Sequence[float],
    highs: FloatArray | Sequence[float],
    weights: FloatArray | Sequence[float],
) -> FloatArray:
    """Weighted max-min fair allocation: ``clamp(λ·w, low, high)`` summing to at most ``budget``.

    The one water-fill of Sluice's decisions: the engine's arbitration and the lending rule
    call it.  ``lows`` must fit the budget and each ``low <= high`` (when they do not fit,
    everyone gets their low).  One sort, one cumulative sum.
    """
    lows = np.asarray(lows, dtype=np.float64)
    highs = np.asarray(highs, dtype=np.float64)
    weights = np.asarray(weights, dtype=np.float64)
    total_high = float(highs.sum())
    if total_high <= budget:
        return highs.copy()
    total_low = float(lows.sum())
    if total_low >= budget:
        return lows.copy()
    moving = highs > lows
    w = weights[moving]
    points = np.concatenate((lows[moving] / w, highs[moving] / w))
    slopes = np.concatenate((w, -w))
    order = np.argsort(points, kind="stable")
    points = points[order]
    slope_after = np.cumsum(slopes[order])
    gains = slope_after[:-1] * np.diff(points)
    totals = total_low + np.concatenate(([0.0], np.cumsum(gains)))
    k = int(np.searchsorted(totals, budget, side="right")) - 1
    k = min(max(k, 0), len(points) - 1)
    slope = slope_after[k]
    lam = points[k] + ((budget - totals[k]) / slope if slope > 0 else 0.0)
    out: FloatArray = np.minimum(np.maximum(lam * weights, lows), highs)
    excess = float(out.sum()) - budget
    if excess > 0:  # floating point: never more than the budget
        room = out - lows
        order_desc = np.argsort(-room, kind="stable")
        take = np.minimum(
            room[order_desc],
            np.maximum(0.0, excess - np.concatenate(([0.0], np.cumsum(room[order_desc])[:-1]))),
        )
        out[order_desc] -= take
    return out


def fair_shares(budget: float, policies: Sequence[ScalingPolicy]) -> FloatArray:
    """Each service's share under full contention (everyone demands all it could use)."""
    lows = np.array([max(p.min_replicas * p.cpu.min, p.floor_cores) for p in policies])
    highs = np.maximum(lows, np.array([p.max_replicas * p.cpu.max for p in policies]))
    return water_fill(budget, lows, highs, np.array([p.weight for p in policies]))


def arbitrate_arrays(
    budget: float,
    *,
    demand: FloatArray,
    minimum: FloatArray,
    floor: FloatArray,
    cap: FloatArray,
    weight: FloatArray,
    fair: FloatArray,
    previous: FloatArray,
    hold: FloatArray,
    hysteresis_cores: float,
    hysteresis_ratio: float,
    soft: FloatArray | None = None,
    yielding: BoolArray | None = None,
    step: FloatArray | None = None,
) -> tuple[FloatArray, FloatArray, FloatArray]:
    """Shared arbitration (see the module docstring) on arrays.

    ``hold``: cores a service keeps (its serving replicas × cpu.min, or under share what
    replicas kept in place below it run on), floors permitting.  Where ``yielding`` is set
    (a service deciding normally, not frozen) its hold also gives way to the others'
    reclaim: every service gets its claim, ``min(demand, fair share)``, before a hold keeps
    more than its holder's own -- a replica kept at ``cpu.min`` never takes what another may
    claim (a frozen service's hold yields to floors only).  ``step`` (``cpu.min`` per
    service): a hold that gives way to a claim keeps whole replicas' worth (a part of one
    would hold CPU no replica runs on; the rest is water-filled with everything else).
    ``soft``: demand beyond ``demand`` that is only served from what is left once every
    ``demand`` is met (a panicking service's held replicas: it keeps them, but their CPU is
    lent while its load is lower, and comes back in one tick when the load returns).
    Returns ``(cores, ideal, taken_for_floors)``: the allocation, the water-filled ideal
    before hysteresis, and cores taken from frozen services' holds for others' floors.
    """
    guarantee = np.maximum(minimum, np.minimum(demand, floor))
    low = np.where(hold > guarantee, np.minimum(hold, np.maximum(demand, guarantee)), guarantee)
    taken = np.zeros_like(low)
    claimed: FloatArray | None = None
    if yielding is not None and yielding.any():
        # The others' reclaim first: what the services below min(demand, fair share) need
        # beyond the CPU the lows leave free comes out of the yielding holds above their
        # holders' own, in proportion.
        entitled = np.maximum(guarantee, np.minimum(demand, fair))
        gap = np.maximum(entitled - low, 0.0)
        short = float(gap.sum())
        need = short - (budget - float(low.sum()))
        spare = np.where(yielding, np.maximum(low - entitled, 0.0), 0.0)
        total = float(spare.sum())
        if short > _EPS and total > _EPS:
            if need > _EPS:
                cut = low - spare * min(1.0, need / total)
                if step is not None:
                    whole = np.floor(cut / step + 1e-9) * step
                    cut = np.where(spare > 0.0, np.maximum(whole, guarantee), cut)
                low = cut
            # ... and the claims keep what the holds leave them (max-min by weight when it is
            # less than they claim): the water-fill below shares by its level alone, and a
            # claim above that level (a holder's lows keep it down) would go short of it.
            free = budget - float(low.sum())
            if free > _EPS:
                claimed = low + water_fill(free, np.zeros_like(gap), gap, weight)
    excess = float(low.sum()) - budget
    if excess > 0:
        # Holds give way to floors, in order (a frozen service's to floors only).
        extra = low - guarantee
        before = np.concatenate(([0.0], np.cumsum(extra)[:-1]))
        taken = np.clip(excess - before, 0.0, extra)
        low = low - taken
    high = np.minimum(np.maximum(demand, low), np.maximum(cap, low))
    ideal = water_fill(budget, low, high, weight)
    if claimed is not None and bool((ideal < claimed - _EPS).any()):
        # Only then: claims the water-fill meets anyway leave it unchanged as lows.
        low = np.maximum(low, claimed)
        high = np.minimum(np.maximum(demand, low), np.maximum(cap, low))
        ideal = water_fill(budget, low, high, weight)
    if soft is not None:
        room = np.maximum(np.minimum(soft, cap) - ideal, 0.0)
        left = budget - float(ideal.sum())
        if left > _EPS and room.any():
            ideal = ideal + water_fill(left, np.zeros_like(room), room, weight)
            high = np.maximum(high, np.minimum(soft, np.maximum(cap, low)))
    band = np.maximum(hysteresis_cores, hysteresis_ratio * previous)
    keep = (
        (previous != ideal)
        & (np.abs(ideal - previous) <= band)
        & (low <= previous)
        & (previous <= high)
        & ~((previous < ideal) & (previous < np.minimum(demand, fair) - _EPS))
    )
    if not keep.any():
        return ideal, ideal, taken
    cores = np.where(keep, previous, ideal)
    if float(cores.sum()) > budget:
        cores = np.minimum(cores, ideal)
    return cores, ideal, taken


def _fills(cores: FloatArray, unit: FloatArray, cpu_min: FloatArray) -> IntArray:
    """Replicas ``cores`` fill at full size (``unit``), one more for a remainder worth
    ``cpu.min``."""
    whole = np.floor(cores / unit + _EPS)
    return (whole + (cores - whole * unit >= cpu_min - _EPS)).astype(np.int64)


def size_arrays(
    cores: FloatArray,
    *,
    want: IntArray,
    current: IntArray,
    unit: FloatArray,
    cpu_min: FloatArray,
    cpu_max: FloatArray,
    cpu_ref: FloatArray,
    min_r: IntArray,
    max_r: IntArray,
    fixed_cpu: FloatArray,
    claimed: FloatArray | None = None,
    usable: FloatArray | None = None,
    one_more: BoolArray | None = None,
    in_place: BoolArray | None = None,
) -> tuple[IntArray, FloatArray, IntArray]:
    """Give each service's ``want`` replicas its ``cores``: ``(replicas, cpu per replica)``.

    The replica count comes from the horizontal recommendation (``want``), not from the
    cores: CPU moves in place every tick, replicas follow the recommender's windows.  The
    cores only bound it two ways: a service adds replicas only as far as its cores fill
    them at full size (``unit``: ``cpu.request`` horizontal, ``cpu.max`` vertical; one more
    for a remainder worth ``cpu.min``) -- a replica started without CPU to serve with holds
    CPU while it starts, taken from the serving ones -- and never keeps more than its cores
    give ``cpu.min`` each.  CPU per replica is the cores
    shared equally, within ``[cpu.min, cpu.max]``.  ``fixed_cpu`` is NaN where a resize is
    possible, else the CPU per replica to keep (a blocked resize: only the count changes).
    ``claimed`` caps the cores new replicas may start on (what the service surely keeps);
    ``usable`` (share enforcement: measured use plus the node's idle CPU) raises it again:
    a replica that starts into idle CPU takes from the serving ones only what its start-up
    burns.  ``one_more`` (share enforcement, per service): where set, a service that wants
    more replicas than its cores fill runs one more than they fill -- its weight is its
    cores however many replicas share them, so the extra replica takes nothing another
    service is entitled to; it only lets the service use CPU the others leave idle, which
    replicas capped at ``cpu.max`` could not.  ``in_place`` (share enforcement, per
    service): where set, the replicas it runs now are kept when its cores no longer give
    each ``cpu.min``, at the cores shared equally (down to :data:`WEIGHT_MIN_CORES` each):
    the decided CPU is then a weight, the kernel takes the CPU back in place, and no replica
    is removed to restart after another service's burst.

    Returns ``(replicas, cpu per replica, note)`` with note codes 0 none, 1 replicas kept in
    place below ``cpu.min`` (``in_place``, a blocked resize's too), 2 fewer replicas
    fit at cpu.min, 3 resize blocked, 4 resize blocked and CPU cut, 6 new replicas held
    back by the cores, 9 new replicas started into idle CPU (``usable``), 10 one replica
    more than the cores fill (``one_more``).
    """
    eps = _EPS
    r = np.minimum(np.maximum(want, min_r), max_r)
    base = cores if claimed is None else np.minimum(cores, claimed)
    room = np.maximum(current, _fills(base, unit, cpu_min))
    idle = np.zeros(r.shape, dtype=bool)
    if usable is not None:
        wider = np.maximum(room, _fills(usable, unit, cpu_min))
        idle = (r > room) & (wider > room)
        room = wider
    extra = np.zeros(r.shape, dtype=bool)
    if one_more is not None and one_more.any():
        more = (r > room) & one_more
        wider = np.where(more, np.maximum(room, _fills(base, unit, cpu_min) + 1), room)
        extra = (r > current) & (wider > room)
        room = wider
    held = (r > current) & (r > room)
    r = np.where(held, room, r)
    note = np.where(extra, 10, np.where(idle, 9, np.where(held, 6, 0)))
    fit = np.maximum(min_r, np.floor(cores / cpu_min + eps).astype(np.int64))
    kept = np.zeros(r.shape, dtype=bool)
    if in_place is not None and in_place.any():
        weights = np.floor(cores / WEIGHT_MIN_CORES + eps).astype(np.int64)
        kept_r = np.where(in_place, np.minimum(np.minimum(r, current), weights), 0)
        kept = kept_r > fit
        fit = np.maximum(fit, kept_r)
    thin = r > fit
    r = np.where(thin, fit, r)
    note = np.where(thin, 2, note)
    r = np.minimum(np.maximum(r, min_r), max_r)
    per = cores / np.maximum(r, 1)
    cpu = np.minimum(np.maximum(per, cpu_min), cpu_max)
    below = kept & (per < cpu_min - eps)
    cpu = np.where(below, per, cpu)
    note = np.where(below, 1, note)
    cpu = np.where(r > 0, cpu, cpu_ref)
    fixed = ~np.isnan(fixed_cpu)
    if fixed.any():
        # A blocked resize cannot grow a replica in place: CPU beyond what the replicas hold
        # at the CPU in force becomes more replicas of that CPU.  Less CPU is a shrink in
        # place on the replicas it has (a decrease frees node CPU: it is not refused for
        # capacity) -- never a serving replica removed because a resize up is pending.
        # The replicas (``r``: no more than the cores give cpu.min each, or kept in place
        # under share) share the cores down to the least each may run on: cpu.min, or a
        # weight where kept in place -- never more than the cores, a blocked resize included.
        fc = np.minimum(np.maximum(np.where(fixed, fixed_cpu, 1.0), cpu_min), cpu_max)
        least = cpu_min if in_place is None else np.where(in_place, WEIGHT_MIN_CORES, cpu_min)
        room_r = np.floor(cores / fc + eps).astype(np.int64)
        rf = np.maximum(np.minimum(np.minimum(np.maximum(room_r, current), r), max_r), min_r)
        cut = (rf > 0) & (rf * fc > cores + eps)
        cf = np.where(cut, np.maximum(cores / np.maximum(rf, 1), least), fc)
        r = np.where(fixed, rf, r)
        cpu = np.where(fixed, np.where(rf > 0, cf, cpu_ref), cpu)
        squeezed = cut & (cf < cpu_min - eps)
        note = np.where(fixed, np.where(squeezed, 1, np.where(cut, 4, 3)), note)
    return r, cpu, note
