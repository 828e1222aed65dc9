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

from scaler.decision import Explanation
from scaler.policy import ScalingPolicy
from scaler.signals import BucketedWindow

_EPS = 1e-9


@dataclass(slots=True)
class HorizontalRecommendation:
    """What a horizontal recommender says this tick, before the budget is considered."""

    replicas: int
    """Reference replicas wanted (within min/max replicas)."""
    rule: str
    """kpa: 'stable' | 'panic' | 'scale-to-zero' | 'idle-grace' | 'no-data';
    hpa: 'hpa' | 'hpa-no-ready-pods' | 'no-data'."""
    reasons: Explanation = field(default_factory=Explanation)
    inputs: dict[str, float] = field(default_factory=dict)
    valid: bool = True
    """False when there was no data to decide on: the engine freezes the service."""
    load_replicas: int | None = None
    """Replicas the load itself needs (before min_replicas and the idle hold); the rest are
    kept for policy reasons and need only ``cpu.min`` each.  ``None``: same as ``replicas``."""


def clamp_replicas(
    replicas: int, policy: ScalingPolicy, reasons: Explanation, what: str = "replicas"
) -> int:
    """Keep ``replicas`` within the policy's bounds, saying which bound clamped it."""
    if replicas > policy.max_replicas:
        reasons.add("clamped %s %d -> %d by max_replicas", what, replicas, policy.max_replicas)
        return policy.max_replicas
    if replicas < policy.min_replicas:
        reasons.add("clamped %s %d -> %d by min_replicas", what, replicas, policy.min_replicas)
        return policy.min_replicas
    return replicas


def ceil_div(value: float, per: float) -> int:
    """``ceil(value / per)`` that does not round 14.000000001/7 up to 3."""
    return max(0, math.ceil(value / per - _EPS))


class KpaRecommender:
    """Knative-style stable/panic windows for one service.  State lives in memory; time is passed in."""

    __slots__ = (
        "_first_at",
        "_last_active_at",
        "_max_panic_replicas",
        "_panic",
        "_panic_since",
        "_stable",
        "_target_value",
        "policy",
    )

    def __init__(self, policy: ScalingPolicy) -> None:
        self.policy = policy
        self._stable = BucketedWindow(policy.stable_window_s)
        self._panic = BucketedWindow(policy.panic_window_s)
        self._target_value = policy.target * policy.target_utilization
        self._panic_since: float | None = None
        """Time of the last tick over the panic threshold while panicking (None = stable mode)."""
        self._max_panic_replicas = 0
        self._last_active_at: float | None = None
        self._first_at: float | None = None

    def __repr__(self) -> str:
        mode = "panic" if self._panic_since is not None else "stable"
        return f"KpaRecommender({mode}, stable={self._stable!r}, panic={self._panic!r})"

    @property
    def panicking(self) -> bool:
        return self._panic_since is not None

    def observe(self, now: float, value: float) -> None:
        """Record this tick's metric value (concurrency or rps)."""
        self._stable.record(now, value)
        self._panic.record(now, value)
        if self._first_at is None:
            self._first_at = now
        if value > 0:
            self._last_active_at = now

    def recommend(self, now: float, ready: float, current: int) -> HorizontalRecommendation:
        """The replicas wanted at ``now`` given ``ready`` capacity (reference replicas) and
        ``current`` replicas asked for."""
        policy = self.policy
        stable = self._stable.average(now)
        panic = self._panic.average(now)
        reasons = Explanation()
        if stable is None or panic is None:
            reasons.add("no metric data in the windows: holding")
            return HorizontalRecommendation(current, "no-data", reasons, valid=False)
        target_value = self._target_value
        ready_count = ready if ready > 1.0 else 1.0
        max_up = math.ceil(policy.max_scale_up_rate * ready_count - _EPS)
        max_down = math.floor(ready_count / policy.max_scale_down_rate + _EPS)
        want_stable = ceil_div(stable, target_value)
        want_panic = ceil_div(panic, target_value)
        desired_stable = min(max(want_stable, max_down), max_up)
        desired_panic = min(max(want_panic, max_down), max_up)
        reasons.add(
            "%s stable %.2f over %gs, panic %.2f over %gs; target %g×%g=%g per replica; "
            "capacity %.2f replicas",
            policy.metric,
            stable,
            policy.stable_window_s,
            panic,
            policy.panic_window_s,
            policy.target,
            policy.target_utilization,
            target_value,
            ready,
        )
        if want_panic / ready_count >= policy.panic_threshold:
            if self._panic_since is None:
                reasons.add(
                    "panic: %d wanted over the panic window >= %g× capacity %g",
                    want_panic,
                    policy.panic_threshold,
                    ready_count,
                )
            self._panic_since = now
        elif self._panic_since is not None and now - self._panic_since > policy.stable_window_s:
            reasons.add(
                "panic over: %gs since the last tick over the threshold", policy.stable_window_s
            )
            self._panic_since = None
            self._max_panic_replicas = 0

        if self._panic_since is not None:
            rule = "panic"
            desired = max(desired_stable, desired_panic)
            if desired > self._max_panic_replicas:
                self._max_panic_replicas = desired
            elif desired < self._max_panic_replicas:
                reasons.add(
                    "panic: not scaling down from %d to %d", self._max_panic_replicas, desired
                )
            desired = self._max_panic_replicas
            reasons.add("panic: ceil(%.2f/%g) = %d", panic, target_value, want_panic)
        else:
            rule = "stable"
            desired = desired_stable
            reasons.add("stable: ceil(%.2f/%g) = %d", stable, target_value, want_stable)
            if desired != want_stable:
                bound = "max_scale_up_rate" if desired == max_up else "max_scale_down_rate"
                reasons.add("rate-limited %d -> %d by %s", want_stable, desired, bound)

        load = min(desired, policy.max_replicas)
        if desired == 0:
            last = self._last_active_at
            idle_for = now - last if last is not None else math.inf
            first = self._first_at
            covered = now - first if first is not None else 0.0
            need = policy.stable_window_s + policy.scale_to_zero_grace_s
            if policy.min_replicas == 0 and idle_for >= need and covered >= need:
                rule = "scale-to-zero"
                reasons.add(
                    "scale to zero: idle %.0fs >= stable window %gs + grace %gs",
                    min(idle_for, covered),
                    policy.stable_window_s,
                    policy.scale_to_zero_grace_s,
                )
            elif current > 0 and policy.min_replicas == 0:
                desired = 1
                rule = "idle-grace"
                reasons.add(
                    "idle, holding 1 replica until idle for %gs (stable window + "
                    "scale_to_zero_grace_s)",
                    need,
                )
        if desired > policy.max_replicas or desired < policy.min_replicas:
            desired = clamp_replicas(desired, policy, reasons)
        return HorizontalRecommendation(
            desired,
            rule,
            reasons,
            {
                "stable": stable,
                "panic": panic,
                "target_value": target_value,
                "capacity_replicas": ready,
            },
            True,
            load,
        )
