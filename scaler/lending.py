"""Lending idle CPU between ticks, under ``budget.enforcement: limit``.

A decision gives every service CPU per replica, enforced as a hard cap (a CFS quota).  A
quota its owner does not use is lost to everyone until the next decision moves it, and a
decision moves CPU only once a second (or at an early tick).  Bursty services are idle for
most of the milliseconds in between: a service serving 16 requests a second at 80 % of its
CPU has nothing in flight a fifth of the time, in gaps of tens of milliseconds.

The gateway sees those gaps as they happen, per service and per replica: a service with
no request in flight or queued is idle, and so is a ready replica with no request in flight
(a service spreads its load over its replicas, and at 70 % of their CPU each replica is
empty for tens of milliseconds at a time).  After it has been idle for
``budget.lend_after_idle_s``, an idle replica (every replica of an idle service) keeps only
its share of the service's floor (the CPU it always keeps, spread over its replicas), and
at least ``budget.lend_keep_cores`` (by default the kernel's smallest quota: its next request
takes the rest back before it is forwarded, so a warm replica beyond the floor needs CPU
only for what it does on its own); the rest of its quota is *lent*: shared by weight among
the services with busy replicas (its own included), each busy replica up to its
``cpu.max``.  The owner's next request takes it back at once, in place (the borrowers'
quotas shrink; their requests slow down and none is stopped).  A replica still starting
never lends: its start-up needs the CPU.

:func:`lend` is the rule; the local platform applies it to the cgroups and the simulator
to its replicas.  It never hands out more than the idle services hold, so the quotas in force
add up to at most the decided ones and the budget holds (a property test checks it).  Under
``enforcement: share`` the kernel already lends idle CPU (weights are not caps) and this does
not apply.
"""

from __future__ import annotations

from collections.abc import Mapping
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


def kept(holding: Holding) -> float:
    """The quota an idle replica keeps: its decided CPU, down to its floor."""
    return min(holding.cores, holding.floor)


def lend(holdings: Mapping[str, Holding], idle: Mapping[str, int]) -> dict[str, float]:
    """The quota in force per busy replica of every service while ``idle[name]`` replicas of
    each lend (all of them: the service is idle; then the value is what they keep).

    An idle replica keeps :func:`kept`.  What the idle replicas give up is water-filled by
    weight over the services with busy replicas, each up to ``busy × (ceiling - cores)``, and
    spread evenly over a borrower's busy replicas.  Services not lending nor borrowing keep
    ``cores``.  ``sum(busy × quota + idle × kept) <= sum(replicas × cores)``.
    """
    quota = {name: h.cores for name, h in holdings.items()}
    busy = {name: h.replicas for name, h in holdings.items()}
    pool = 0.0
    for name, count in idle.items():
        h = holdings.get(name)
        k = min(count, h.replicas) if h is not None else 0
        if h is None or k <= 0:
            continue
        keep = kept(h)
        pool += k * (h.cores - keep)
        busy[name] = h.replicas - k
        if busy[name] == 0:
            quota[name] = keep
    if pool <= _EPS:
        return quota
    borrowers = [
        (name, h) for name, h in holdings.items() if busy[name] > 0 and h.ceiling > h.cores + _EPS
    ]
    if not borrowers:
        return quota
    rooms = [busy[name] * (h.ceiling - h.cores) for name, h in borrowers]
    lent = water_fill(pool, [0.0] * len(rooms), rooms, [h.weight for _, h in borrowers])
    for (name, h), extra in zip(borrowers, lent.tolist(), strict=True):
        if extra > _EPS:
            quota[name] = min(h.cores + extra / busy[name], h.ceiling)
    return quota
