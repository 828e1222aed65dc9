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

Concurrency only rises at arrivals, so the event loop (:class:`EventLoop`) simply stops right
after the first arrival that brings an armed service to its level.
"""

from __future__ import annotations

from scaler.simulate.loop import EventLoop


def next_early_tick(
    loop: EventLoop, levels: dict[str, float], t_end: float, not_before: float
) -> float | None:
    """Advance the models to the next early tick before ``t_end`` and return its time.

    ``levels``: the armed wake levels (finite) per service; a level that fires is removed.
    ``not_before``: the previous tick's time plus the gap.  Returns ``None`` when no early
    tick falls before ``t_end`` (the models are then at ``t_end``, or at a level reached too
    late for an early tick: the caller runs the rest)."""
    hit = loop.run(t_end, levels=levels)
    if hit is None:
        return None
    service, reached = hit
    del levels[service]  # fires once per decision
    at = max(reached, not_before)
    if at >= t_end:
        return None  # the regular tick comes first and covers it
    loop.run(at)  # every model exactly at ``at``, settled
    return at
