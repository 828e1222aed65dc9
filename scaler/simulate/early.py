"""Early ticks in the simulator: when the next one falls, and every model advanced exactly to it.

The gateway wakes the scaler before the next regular tick when a service's concurrency (in
flight + queued) reaches the ``wake_concurrency`` of its latest decision (``budget.early_ticks``).
The semantics modelled here are the gateway's:

* regular ticks stay on their grid (every ``tick_s``);
* a service's level fires at most once per decision; the early tick runs at the moment the
  level is reached, or ``early_tick_gap_s`` after the previous tick (regular or early) when
  that is later;
* if the next regular tick is due first, it covers the wake;
* an early tick is a full tick: every service's model is advanced exactly to its time first
  (none runs past it with the CPU of the old decision).

Exact and cheap: concurrency only rises at arrivals, and the arrivals are known in advance, so
a service cannot reach its level before its (level - concurrency)-th next arrival
(:meth:`ServiceModel.wake_bound`).  The service with the earliest such bound is simulated,
watching its level, up to the next earliest bound of the others; either it reaches its level
there (the earliest of all), or its bound moves on and the next service is looked at.
Services whose levels stay far away are simulated in one piece per tick, as without early
ticks; the pieces of a tick without an early tick are not settled in between
(:meth:`ServiceModel.run`), so such a tick gives bit for bit what it gives with early ticks off.

That search is limit enforcement's (each service simulated on its own).  Under share
enforcement the services' rates are coupled, so :func:`next_early_tick_shared` runs them all
in one event loop (:class:`SharedCpu`) that stops at the first arrival reaching a level; the
semantics above are the same.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from scaler.simulate.gps import SharedCpu
from scaler.simulate.model import ServiceModel


def next_early_tick(
    models: Mapping[str, ServiceModel],
    levels: dict[str, float],
    t_end: float,
    not_before: float,
) -> float | None:
    """Advance the models to the next early tick before ``t_end`` and return its time.

    ``levels``: the armed wake levels (finite) per service; a level that fires is removed.
    ``not_before``: the previous tick's time plus the gap.  Returns ``None`` when no early
    tick falls before ``t_end`` (the models are then somewhere before ``t_end``, each at its
    :attr:`ServiceModel.clock`; the caller simulates the rest of the tick).
    """
    bounds = {s: models[s].wake_bound(level) for s, level in levels.items()}
    while bounds:
        s = min(bounds, key=bounds.__getitem__)
        if bounds[s] >= t_end:
            return None
        m = models[s]
        level = levels[s]
        # The others cannot reach their levels before their bounds: simulate s up to the
        # earliest of them (events at that very time included, so every round moves on).
        others = min((b for o, b in bounds.items() if o != s), default=math.inf)
        if m.concurrency >= level:
            reached: float | None = m.clock
        elif others < t_end:
            reached = m.run(m.clock, others, wake_level=level, through=True, settle=False)
        else:
            reached = m.run(m.clock, t_end, wake_level=level, settle=False)
        if reached is None:
            bounds[s] = m.wake_bound(level)
            continue
        del levels[s]  # fires once per decision
        at = max(reached, not_before)
        if at >= t_end:
            return None  # the regular tick comes first and covers it
        for other in models.values():  # every model exactly at ``at``, settled
            other.run(other.clock, at)
        return at
    return None


def next_early_tick_shared(
    cpu: SharedCpu, levels: dict[str, float], t_end: float, not_before: float
) -> float | None:
    """:func:`next_early_tick` under share enforcement: every model advanced together.

    Returns ``None`` when no early tick falls before ``t_end`` (the models are then at
    ``t_end``, or at a level reached too late for an early tick: the caller runs the rest)."""
    hit = cpu.run(t_end, levels=levels)
    if hit is None:
        return None
    service, reached = hit
    del levels[service]  # fires once per decision
    at = max(reached, not_before)
    if at >= t_end:
        return None  # the regular tick comes first and covers it
    cpu.run(at)  # every model exactly at ``at``, settled
    return at
