"""KPA-style horizontal recommendation: how many replicas one service needs (pure).

Follows the Knative Pod Autoscaler's decision (``pkg/autoscaler/scaling/autoscaler.go``):

* the metric (concurrency = in flight + queued, or arrivals per second) is averaged over the
  stable window (60 s) and the panic window (6 s);
* ``desired = ceil(observed / (target × target_utilization))`` for each window;
* both are kept within ``[floor(ready / max_scale_down_rate), ceil(ready × max_scale_up_rate)]``
  where ``ready`` is the current capacity in replicas (at least 1);
* panic starts when ``panic desired / ready >= panic_threshold``; each tick still over the
  threshold extends it; it ends only when a whole stable window has passed since the last
  tick over the threshold.  In panic the larger of the two desires is used and the
  recommendation never goes down;
* scale to zero (only with ``min_replicas: 0``) once the metric has been zero for a whole
  stable window plus ``scale_to_zero_grace_s``, and the window is covered by data;
* the result is clamped to ``[min_replicas, max_replicas]``, each clamp named in the reasons.

"Replicas" here are *reference* replicas: one replica at ``cpu.request`` cores (``cpu.min`` when
unset).  The arbiter may run fewer, larger replicas; the engine passes the current capacity in
reference replicas as ``ready`` so panic and rate limits compare like with like.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from scaler.explanation import Trace
from scaler.kpa_batch import NO_DATA, RULES, KpaBatch
from scaler.policy import ScalingPolicy

_EPS = 1e-9


@dataclass(slots=True)
class HorizontalRecommendation:
    """What a horizontal recommender says this tick, before the budget is considered."""

    replicas: int
    """Reference replicas wanted (within min/max replicas)."""
    rule: str
    """kpa: 'stable' | 'panic' | 'scale-to-zero' | 'idle-grace' | 'no-data';
    hpa: 'hpa' | 'hpa-no-ready-pods' | 'no-data'."""
    reasons: Trace = field(default_factory=Trace)
    inputs: dict[str, float] = field(default_factory=dict)
    valid: bool = True
    """False when there was no data to decide on: the engine freezes the service."""
    load_replicas: int | None = None
    """Replicas the load itself needs (before min_replicas and the idle hold); the rest are
    kept for policy reasons and need only ``cpu.min`` each.  ``None``: same as ``replicas``."""


def ceil_div(value: float, per: float) -> int:
    """``ceil(value / per)`` that does not round 14.000000001/7 up to 3."""
    return max(0, math.ceil(value / per - _EPS))


class KpaRecommender:
    """Knative-style stable/panic windows for one service: a :class:`KpaBatch` of one.

    State lives in memory; time is passed in.  The engine runs all KPA services in one batch;
    this wrapper gives the same code a one-service interface (tests, tools).
    """

    __slots__ = ("_batch", "policy")

    def __init__(self, policy: ScalingPolicy, *, adds_need_panic: bool = False) -> None:
        self.policy = policy
        self._batch = KpaBatch([policy], adds_need_panic=adds_need_panic)

    def __repr__(self) -> str:
        mode = "panic" if self.panicking else "stable"
        return f"KpaRecommender({mode}, {self._batch!r})"

    @property
    def panicking(self) -> bool:
        return not bool(np.isnan(self._batch.panic_since[0]))

    def observe(self, now: float, value: float) -> None:
        """Record this tick's metric value (concurrency or rps)."""
        self._batch.observe(now, np.array([float(value)]), np.array([True]))

    def recommend(self, now: float, ready: float, current: int) -> HorizontalRecommendation:
        """The replicas wanted at ``now`` given ``ready`` capacity (reference replicas) and
        ``current`` replicas asked for."""
        tick = self._batch.recommend(
            now,
            np.array([float(ready)]),
            np.array([current], dtype=np.int64),
            np.array([True]),
        )
        reasons = Trace()
        self._batch.explain(tick, 0, reasons)
        rule = int(tick.rule[0])
        return HorizontalRecommendation(
            int(tick.replicas[0]),
            RULES[rule],
            reasons,
            {
                "stable": float(tick.stable[0]),
                "panic": float(tick.panic[0]),
                "target_value": float(self._batch.target_value[0]),
                "capacity_replicas": float(ready),
            },
            rule != NO_DATA,
            int(tick.load[0]),
        )
