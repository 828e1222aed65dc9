"""Lending idle CPU between ticks, under ``budget.enforcement: limit``.

A decision gives every service CPU per replica, enforced as a hard cap (a CFS quota).  A
quota its owner does not use is lost to everyone until the next decision moves it, and a
decision moves CPU only once a second (or at an early tick).  Bursty services are idle for
most of the milliseconds in between: a service serving 16 requests a second at 80 % of its
CPU has nothing in flight a fifth of the time, in gaps of tens of milliseconds.

The gateway sees those gaps as they happen: a service with no request in flight or queued
is idle.  After it has been idle for ``budget.lend_after_idle_s``, its replicas keep only
its floor (the CPU it always keeps), spread over them, and at least ``budget.lend_keep_cores``
each (by default the kernel's smallest quota: its next request takes the rest back before it
is forwarded, so a warm replica beyond the floor needs CPU only for what it does on its own);
the rest of their quota is *lent*: shared by weight among
the services that are busy, each replica up to its ``cpu.max``.  The owner's next request
takes it back at once, in place (the borrowers' quotas shrink; their requests slow down and
none is stopped).

:func:`lend` is the rule; the local platform applies it to the cgroups and the simulator
to its replicas.  It never hands out more than the idle services hold, so the quotas in force
add up to at most the decided ones and the budget holds (a property test checks it).  Under
``enforcement: share`` the kernel already lends idle CPU (weights are not caps) and this does
not apply.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from scaler.arbiter import water_fill

_EPS = 1e-9


@dataclass(frozen=True, slots=True)
class Holding:
    """What one service holds under its latest decision (per replica, in cores)."""

    replicas: int
    """Replicas holding CPU (scheduled or serving)."""
    cores: float
    """Decided CPU per replica: its quota while the service is busy."""
    floor: float
    """What an idle replica keeps (:func:`idle_floor`)."""
    ceiling: float
    """The most a borrowing replica may have (``cpu.max``)."""
    weight: float = 1.0
    """The service's ``weight``: its share of what is lent."""


def idle_floor(replicas: int, floor_cores: float, keep_cores: float) -> float:
    """What each of ``replicas`` replicas of an idle service keeps: its floor (``floor_cores``,
    the CPU the service always keeps: ``guaranteed_cpu`` or ``min_replicas × cpu.min``) spread
    over them, and at least ``keep_cores`` (``budget.lend_keep_cores``) each.  Warm replicas
    beyond the floor's keep only ``keep_cores``: their next request takes the rest back."""
    return max(keep_cores, floor_cores / replicas) if replicas > 0 else keep_cores


def lend(holdings: Mapping[str, Holding], idle: Collection[str]) -> dict[str, float]:
    """The quota per replica in force for every service while the ``idle`` ones lend.

    An idle service's replicas keep ``min(cores, floor)``.  What they give up is
    water-filled by weight over the busy services with replicas, each up to ``replicas ×
    (ceiling - cores)``, and spread evenly over a borrower's replicas.  Services not lending
    nor borrowing keep ``cores``.  ``sum(replicas × quota) <= sum(replicas × cores)``.
    """
    quota = {name: h.cores for name, h in holdings.items()}
    pool = 0.0
    for name in idle:
        h = holdings.get(name)
        if h is None or h.replicas == 0:
            continue
        keep = min(h.cores, h.floor)
        pool += h.replicas * (h.cores - keep)
        quota[name] = keep
    if pool <= _EPS:
        return quota
    borrowers = [
        (name, h)
        for name, h in holdings.items()
        if name not in idle and h.replicas > 0 and h.ceiling > h.cores + _EPS
    ]
    if not borrowers:
        return quota
    rooms = [h.replicas * (h.ceiling - h.cores) for _, h in borrowers]
    lent = water_fill(pool, [0.0] * len(rooms), rooms, [h.weight for _, h in borrowers])
    for (name, h), extra in zip(borrowers, lent.tolist(), strict=True):
        if extra > _EPS:
            quota[name] = min(h.cores + extra / h.replicas, h.ceiling)
    return quota
