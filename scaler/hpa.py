"""The Kubernetes HPA's replica calculation and ``behavior``, for ``mode: hpa`` (pure).

Two parts, mirroring the HPA controller:

* :func:`calculate_replicas` — the replica calculator for a per-pod metric
  (``replica_calculator.go``, plain metric path): ``ratio = average / target``
  over ready pods that reported a value; within ``1 ± tolerance`` nothing changes;
  pods that are *not ready* are left out, and on a scale-up counted as 0 (for per-pod
  custom metrics the HPA calls a pod unready only while it is Pending; for CPU also during
  its initialisation period — the caller decides, through ``PodSample.ready``);
  ready pods *missing* a value count as ``target`` (100 %) on a scale-down and 0 on a
  scale-up (at exactly 1.0 they are left out); if filling them in flips the direction or lands inside the tolerance, the
  current count is kept; the result is ``ceil(new_ratio × pods counted)``.
* :class:`HpaBehaviorState` — ``behavior`` (``horizontal.go``): the recommendation is
  stabilised (scale-up uses the *lowest* recommendation of the last
  ``scale_up.stabilization_window_s`` seconds, scale-down the *highest* of the last
  ``scale_down.stabilization_window_s``), then limited by the rate policies — each
  ``Pods``/``Percent`` policy allows a change relative to the replica count at the start
  of its ``period_s`` (replicas added or removed within the period are taken into
  account); ``select_policy: Max`` picks the policy allowing the biggest change, ``Min``
  the smallest, ``Disabled`` forbids the direction — and finally clamped to
  ``[min_replicas, max_replicas]``.  The default scale-up (100 % or 4 pods per 15 s, Max)
  is the HPA's ``max(2×, +4)``; the default scale-down stabilises over 300 s.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from scaler.explanation import Step, Trace
from scaler.policy import HpaBehavior, HpaScalingRules


@dataclass(frozen=True, slots=True)
class PodSample:
    """One pod as the HPA sees it: whether it is ready, and its metric value (``None`` = missing)."""

    ready: bool
    value: float | None


@dataclass(frozen=True, slots=True)
class Tolerances:
    """Ratios in ``[1 - scale_down, 1 + scale_up]`` change nothing (Kubernetes >= 1.33
    ``behavior.scaleDown.tolerance`` / ``behavior.scaleUp.tolerance``; 0.1 each by default)."""

    scale_down: float = 0.1
    scale_up: float = 0.1

    def within(self, ratio: float) -> bool:
        return 1.0 - self.scale_down <= ratio <= 1.0 + self.scale_up


@dataclass(frozen=True, slots=True)
class CpuSample:
    """One pod for the CPU-utilisation path: ready or not, its use (cores; ``None`` =
    missing) and its CPU request (cores)."""

    ready: bool
    used_cores: float | None
    request_cores: float


@dataclass(frozen=True, slots=True)
class HpaResult:
    """The replica calculator's answer."""

    replicas: int
    usage_ratio: float
    """average of the ready pods' values / target, before missing/unready pods were filled in."""
    step: Step
    """How it was computed (a step of the decision's explanation)."""


class NoMetricsError(ValueError):
    """No ready pod reported the metric (the HPA's 'did not receive metrics for any ready pods')."""


def calculate_replicas(
    samples: Sequence[PodSample],
    current_replicas: int,
    target: float,
    tolerance: float | Tolerances = 0.1,
) -> HpaResult:
    """Desired replicas for a per-pod average-value metric, as the HPA's replica calculator.

    ``samples`` holds one entry per pod of the workload; ``target`` is the per-pod target
    value (``averageValue``); ``tolerance`` the HPA's 0.1 default.  Raises
    :class:`NoMetricsError` when no ready pod has a value (the HPA then does not scale).

    With ``current_replicas == 0`` (scale from zero) pass one aggregate sample holding the
    total: the result is ``ceil(total / target)`` without tolerance, as the HPA's
    object-metric path does for zero replicas.
    """
    if target <= 0:
        raise ValueError(f"target must be > 0, got {target!r}")
    tol = tolerance if isinstance(tolerance, Tolerances) else Tolerances(tolerance, tolerance)
    if current_replicas == 0:
        total = sum(s.value for s in samples if s.value is not None)
        ratio = total / target
        return HpaResult(
            math.ceil(ratio - 1e-9),
            ratio,
            Step("hpa.from_zero", {"total": total, "target": target}),
        )
    values: list[float] = []
    missing = 0
    unready = 0
    for sample in samples:
        if not sample.ready:
            unready += 1
        elif sample.value is None:
            missing += 1
        else:
            values.append(sample.value)
    if not values:
        raise NoMetricsError("did not receive metrics for any ready pods")
    ratio = sum(values) / len(values) / target
    rebalance_unready = unready > 0 and ratio > 1.0
    if not rebalance_unready and missing == 0:
        if tol.within(ratio):
            return HpaResult(
                current_replicas,
                ratio,
                Step("hpa.tolerance", _tolerance_values(ratio, tol)),
            )
        return HpaResult(
            math.ceil(ratio * len(values) - 1e-9),
            ratio,
            Step("hpa.ratio", {"ratio": ratio, "pods": len(values)}),
        )
    filled = list(values)
    if missing and ratio < 1.0:
        filled.extend([target] * missing)
    elif missing and ratio > 1.0:
        filled.extend([0.0] * missing)
    if rebalance_unready:
        filled.extend([0.0] * unready)
    new_ratio = sum(filled) / len(filled) / target
    return _filled_result(current_replicas, ratio, new_ratio, len(filled), missing, unready, tol)


def _tolerance_values(ratio: float, tol: Tolerances) -> dict[str, float]:
    return {"ratio": ratio, "tolerance_down": tol.scale_down, "tolerance_up": tol.scale_up}


def calculate_utilization_replicas(
    samples: Sequence[CpuSample],
    current_replicas: int,
    target_percent: float,
    tolerance: float | Tolerances = 0.1,
) -> HpaResult:
    """Desired replicas for CPU utilisation (``target.averageUtilization``), as the HPA's
    replica calculator's resource path (``GetResourceReplicas``).

    Utilisation is the ready pods' total use over their total request, in *whole* percent
    (truncated, on millicores, as Kubernetes computes it); ``ratio = utilisation / target``.
    Pods not ready are left out (and count 0 on a scale-up); ready pods *missing* a value
    count as ``max(100 %, target)`` of their **request** on a scale-down (the plain-metric
    path uses the target instead) and 0 on a scale-up; if filling them in flips the
    direction or lands within the tolerances, the current count is kept.
    """
    if target_percent <= 0:
        raise ValueError(f"target_percent must be > 0, got {target_percent!r}")
    tol = tolerance if isinstance(tolerance, Tolerances) else Tolerances(tolerance, tolerance)
    used: list[tuple[int, int]] = []  # (millicores used, millicores requested)
    missing: list[int] = []
    unready: list[int] = []
    for sample in samples:
        request_m = round(sample.request_cores * 1000)
        if not sample.ready:
            unready.append(request_m)
        elif sample.used_cores is None:
            missing.append(request_m)
        else:
            used.append((round(sample.used_cores * 1000), request_m))
    if not used:
        raise NoMetricsError("did not receive metrics for any ready pods")

    def ratio_of(pods: list[tuple[int, int]]) -> tuple[float, int]:
        requested = sum(r for _, r in pods)
        if requested <= 0:
            raise NoMetricsError("the pods request no CPU")
        utilization = sum(u for u, _ in pods) * 100 // requested
        return utilization / target_percent, utilization

    ratio, utilization = ratio_of(used)
    rebalance_unready = bool(unready) and ratio > 1.0
    if not rebalance_unready and not missing:
        if tol.within(ratio):
            return HpaResult(
                current_replicas, ratio, Step("hpa.tolerance", _tolerance_values(ratio, tol))
            )
        return HpaResult(
            math.ceil(ratio * len(used) - 1e-9),
            ratio,
            Step(
                "hpa.utilization",
                {
                    "utilization": utilization,
                    "target": target_percent,
                    "ratio": ratio,
                    "pods": len(used),
                },
            ),
        )
    filled = list(used)
    if missing and ratio < 1.0:
        fallback = int(max(100.0, target_percent))
        filled.extend((r * fallback // 100, r) for r in missing)
    elif missing and ratio > 1.0:
        filled.extend((0, r) for r in missing)
    if rebalance_unready:
        filled.extend((0, r) for r in unready)
    new_ratio, _ = ratio_of(filled)
    return _filled_result(
        current_replicas, ratio, new_ratio, len(filled), len(missing), len(unready), tol
    )


def _filled_result(  # noqa: PLR0917 - the calculator's figures, in its order
    current_replicas: int,
    ratio: float,
    new_ratio: float,
    pods: int,
    missing: int,
    unready: int,
    tol: Tolerances,
) -> HpaResult:
    """The end of both paths: the ratio re-run with missing / unready pods filled in."""
    if tol.within(new_ratio) or (ratio < 1.0 < new_ratio) or (ratio > 1.0 > new_ratio):
        return HpaResult(
            current_replicas,
            ratio,
            Step(
                "hpa.filled_keep",
                {"ratio": ratio, "new_ratio": new_ratio, "missing": missing, "unready": unready},
            ),
        )
    replicas = math.ceil(new_ratio * pods - 1e-9)
    if (new_ratio < 1.0 and replicas > current_replicas) or (
        new_ratio > 1.0 and replicas < current_replicas
    ):
        return HpaResult(current_replicas, ratio, Step("hpa.flip_keep"))
    return HpaResult(
        replicas,
        ratio,
        Step(
            "hpa.filled",
            {"new_ratio": new_ratio, "pods": pods, "missing": missing, "unready": unready},
        ),
    )


def _change_in_period(events: deque[tuple[float, int]], now: float, period_s: float) -> int:
    """Replicas changed in the ``period_s`` ending at ``now`` (events oldest first)."""
    cutoff = now - period_s
    total = 0
    for at, change in reversed(events):
        if at <= cutoff:
            break
        total += change
    return total


def scale_up_limit(
    current: int,
    now: float,
    rules: HpaScalingRules,
    up_events: deque[tuple[float, int]],
    down_events: deque[tuple[float, int]],
) -> int:
    """Most replicas the scale-up policies allow now (``current`` when Disabled)."""
    if rules.select_policy == "Disabled":
        return current
    pick = min if rules.select_policy == "Min" else max
    result: int | None = None
    for policy in rules.policies:
        added = _change_in_period(up_events, now, policy.period_s)
        removed = _change_in_period(down_events, now, policy.period_s)
        start = current - added + removed
        if policy.type == "Pods":
            proposed = start + policy.value
        else:
            proposed = math.ceil(start * (1 + policy.value / 100) - 1e-9)
        result = proposed if result is None else pick(result, proposed)
    return max(current, result if result is not None else current)


def scale_down_limit(
    current: int,
    now: float,
    rules: HpaScalingRules,
    up_events: deque[tuple[float, int]],
    down_events: deque[tuple[float, int]],
) -> int:
    """Fewest replicas the scale-down policies allow now (``current`` when Disabled)."""
    if rules.select_policy == "Disabled":
        return current
    # Min = the policy allowing the smallest change = the highest lower limit.
    pick = max if rules.select_policy == "Min" else min
    result: int | None = None
    for policy in rules.policies:
        added = _change_in_period(up_events, now, policy.period_s)
        removed = _change_in_period(down_events, now, policy.period_s)
        start = current - added + removed
        if policy.type == "Pods":
            proposed = start - policy.value
        else:
            proposed = math.floor(start * (1 - policy.value / 100) + 1e-9)
        result = proposed if result is None else pick(result, proposed)
    return min(current, result if result is not None else current)


class HpaBehaviorState:
    """Stabilisation windows and rate policies for one workload (the HPA controller's memory)."""

    __slots__ = (
        "_down_events",
        "_down_max",
        "_down_window_s",
        "_longest_s",
        "_up_events",
        "_up_min",
        "_up_window_s",
        "behavior",
    )

    def __init__(self, behavior: HpaBehavior) -> None:
        self.behavior = behavior
        self._up_window_s = behavior.scale_up.stabilization_window_s
        self._down_window_s = behavior.scale_down.stabilization_window_s
        # Past recommendations as monotonic deques: the lowest of the scale-up window and the
        # highest of the scale-down window are at the front, O(1) amortised per tick.
        self._up_min: deque[tuple[float, int]] = deque()
        self._down_max: deque[tuple[float, int]] = deque()
        self._up_events: deque[tuple[float, int]] = deque()
        self._down_events: deque[tuple[float, int]] = deque()
        # Scale events matter only within a rate policy's period (the stabilisation windows
        # keep their own deques).
        self._longest_s = max(
            [p.period_s for p in behavior.scale_up.policies]
            + [p.period_s for p in behavior.scale_down.policies]
            + [0.0]
        )

    def __repr__(self) -> str:
        return (
            f"HpaBehaviorState(up_min={len(self._up_min)}, down_max={len(self._down_max)}, "
            f"up_events={len(self._up_events)}, down_events={len(self._down_events)})"
        )

    def record_scale(self, now: float, old: int, new: int) -> None:
        """Remember that the workload went from ``old`` to ``new`` replicas at ``now`` (and
        forget the events no rate policy's period reaches any more)."""
        if new == old:
            return
        events = self._up_events if new > old else self._down_events
        cutoff = now - self._longest_s
        while events and events[0][0] <= cutoff:
            events.popleft()
        events.append((now, abs(new - old)))

    def normalize(
        self,
        now: float,
        *,
        current: int,
        desired: int,
        min_replicas: int,
        max_replicas: int,
        reasons: Trace,
    ) -> int:
        """Stabilise, rate-limit and clamp ``desired`` (the calculator's answer) as the HPA does."""
        up_min, down_max = self._up_min, self._down_max
        cutoff = now - self._up_window_s
        while up_min and up_min[0][0] <= cutoff:
            up_min.popleft()
        cutoff = now - self._down_window_s
        while down_max and down_max[0][0] <= cutoff:
            down_max.popleft()
        up_rec = up_min[0][1] if up_min and up_min[0][1] < desired else desired
        down_rec = down_max[0][1] if down_max and down_max[0][1] > desired else desired
        while up_min and up_min[-1][1] >= desired:
            up_min.pop()
        entry = (now, desired)
        up_min.append(entry)
        while down_max and down_max[-1][1] <= desired:
            down_max.pop()
        down_max.append(entry)
        stabilized = min(max(current, up_rec), down_rec)
        if stabilized != desired:
            reasons.clamp("replicas", desired, stabilized, "stabilization")
        result = stabilized
        behavior = self.behavior
        if result > current:
            limit = scale_up_limit(
                current, now, behavior.scale_up, self._up_events, self._down_events
            )
            if limit < max_replicas and result > limit:
                reasons.clamp("replicas", result, limit, "behavior.scale_up")
                result = limit
        elif result < current:
            limit = scale_down_limit(
                current, now, behavior.scale_down, self._up_events, self._down_events
            )
            if limit > min_replicas and result < limit:
                reasons.clamp("replicas", result, limit, "behavior.scale_down")
                result = limit
        if result > max_replicas:
            reasons.clamp("replicas", result, max_replicas, "max_replicas")
            result = max_replicas
        elif result < min_replicas:
            reasons.clamp("replicas", result, min_replicas, "min_replicas")
            result = min_replicas
        return result
