"""The Kubernetes HPA's replica calculator (``replica_calculator.go``), for ``mode: hpa`` (pure).

One form, on arrays: :func:`calculate` answers for many workloads at once from their pods;
:func:`calculate_replicas` / :func:`calculate_utilization_replicas` are it for one pod list.
``behavior`` is :mod:`scaler.hpa_behavior` (:class:`HpaBehaviorState` re-exported here).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import numpy as np

from scaler.explanation import Step
from scaler.hpa_behavior import HpaBehaviorState
from scaler.kpa_batch import BoolArray, FloatArray, IntArray

NO_METRICS, NO_REQUEST, FROM_ZERO, TOLERANCE, RATIO, UTILIZATION, FILLED_KEEP, FLIP_KEEP, FILLED = (
    range(9)
)
"""What the calculator did, per workload (``Calculation.outcome``)."""
_STEP_KINDS = (
    "hpa.no_ready_pods",
    "hpa.no_ready_pods",
    "hpa.from_zero",
    "hpa.tolerance",
    "hpa.ratio",
    "hpa.utilization",
    "hpa.filled_keep",
    "hpa.flip_keep",
    "hpa.filled",
)
_EPS = 1e-9
_BIG = float(2**62)


@dataclass(frozen=True, slots=True)
class PodSample:
    """One pod as the HPA sees it: whether it is ready, and its metric value (``None`` = missing)."""

    ready: bool
    value: float | None


@dataclass(frozen=True, slots=True)
class CpuSample:
    """One pod for the CPU-utilisation path: ready or not, its use (cores; ``None`` =
    missing) and its CPU request (cores)."""

    ready: bool
    used_cores: float | None
    request_cores: float


@dataclass(frozen=True, slots=True)
class Tolerances:
    """Ratios in ``[1 - scale_down, 1 + scale_up]`` change nothing (Kubernetes >= 1.33
    ``behavior.scaleDown.tolerance`` / ``behavior.scaleUp.tolerance``; 0.1 each by default)."""

    scale_down: float = 0.1
    scale_up: float = 0.1

    def within(self, ratio: float) -> bool:
        return 1.0 - self.scale_down <= ratio <= 1.0 + self.scale_up


@dataclass(frozen=True, slots=True)
class HpaResult:
    """The replica calculator's answer for one workload."""

    replicas: int
    usage_ratio: float
    """average of the ready pods' values / target, before missing/unready pods were filled in."""
    step: Step
    """How it was computed (a step of the decision's explanation)."""


class NoMetricsError(ValueError):
    """No ready pod reported the metric (the HPA's 'did not receive metrics for any ready pods')."""


@dataclass(frozen=True, slots=True)
class PodGroups:
    """The pods of many workloads, in groups of identical pods (one entry per group).

    ``total`` is the group's metric (CPU path: cores used), each of its ``count`` pods
    reporting ``total / count``; NaN: the pods report nothing.  ``request_cores`` is each
    pod's CPU request (CPU path only)."""

    workload: IntArray
    count: IntArray
    ready: BoolArray
    total: FloatArray
    request_cores: FloatArray

    @classmethod
    def of(cls, pods: Sequence[tuple[bool, float | None, float]]) -> PodGroups:
        """One workload's pods, each ``(ready, value or None, request_cores)``."""
        n = len(pods)
        return cls(
            workload=np.zeros(n, dtype=np.int64),
            count=np.ones(n, dtype=np.int64),
            ready=np.array([p[0] for p in pods], dtype=bool).reshape(n),
            total=np.array(
                [np.nan if p[1] is None else p[1] for p in pods], dtype=np.float64
            ).reshape(n),
            request_cores=np.array([p[2] for p in pods], dtype=np.float64).reshape(n),
        )


@dataclass(frozen=True, slots=True)
class Calculation:
    """The calculator's answers for many workloads (arrays indexed like them); read-only."""

    replicas: IntArray
    """The desired replicas (the current count when there is no answer: ``outcome`` <= NO_REQUEST)."""
    outcome: IntArray
    usage_ratio: FloatArray
    """The ratio before missing / unready pods were filled in."""
    new_ratio: FloatArray
    utilization: FloatArray
    """CPU path: whole percent."""
    pods: IntArray
    """Pods the ratio that decided was applied to."""
    missing: IntArray
    unready: IntArray
    total: FloatArray
    target: FloatArray
    tolerance_down: FloatArray
    tolerance_up: FloatArray

    def step(self, j: int) -> Step:
        """Workload ``j``'s step of the explanation."""
        outcome = int(self.outcome[j])
        kind = _STEP_KINDS[outcome]
        ratio = float(self.usage_ratio[j])
        values: dict[str, float | int]
        if outcome == FROM_ZERO:
            values = {"total": float(self.total[j]), "target": float(self.target[j])}
        elif outcome == TOLERANCE:
            values = {
                "ratio": ratio,
                "tolerance_down": float(self.tolerance_down[j]),
                "tolerance_up": float(self.tolerance_up[j]),
            }
        elif outcome == RATIO:
            values = {"ratio": ratio, "pods": int(self.pods[j])}
        elif outcome == UTILIZATION:
            values = {
                "utilization": int(self.utilization[j]),
                "target": float(self.target[j]),
                "ratio": ratio,
                "pods": int(self.pods[j]),
            }
        elif outcome == FILLED_KEEP:
            values = {
                "ratio": ratio,
                "new_ratio": float(self.new_ratio[j]),
                "missing": int(self.missing[j]),
                "unready": int(self.unready[j]),
            }
        elif outcome == FILLED:
            values = {
                "new_ratio": float(self.new_ratio[j]),
                "pods": int(self.pods[j]),
                "missing": int(self.missing[j]),
                "unready": int(self.unready[j]),
            }
        else:  # no answer, or the direction would flip
            values = {}
        return Step(kind, values)

    def result(self, j: int) -> HpaResult:
        """Workload ``j``'s answer; :class:`NoMetricsError` when it has none."""
        outcome = int(self.outcome[j])
        if outcome == NO_METRICS:
            raise NoMetricsError("did not receive metrics for any ready pods")
        if outcome == NO_REQUEST:
            raise NoMetricsError("the pods request no CPU")
        return HpaResult(int(self.replicas[j]), float(self.usage_ratio[j]), self.step(j))


def _ceil(values: FloatArray) -> IntArray:
    """``ceil(values - 1e-9)`` as integers (absurdly large values held at 2**62)."""
    return np.ceil(np.clip(values - _EPS, -_BIG, _BIG)).astype(np.int64)


@dataclass(frozen=True, slots=True)
class _Tally:
    """Per workload: its pods counted, and (CPU path) their millicores summed."""

    ready: IntArray
    """Ready pods with a value."""
    missing: IntArray
    """Ready pods without one."""
    unready: IntArray
    total: FloatArray
    """The ready pods' values (plain path)."""
    zero_total: FloatArray
    """Every pod's value (plain path, from zero)."""
    used_m: FloatArray
    requested_m: FloatArray
    missing_used_m: FloatArray
    """What the missing pods count as on a scale-down: max(100 %, target) of their request."""
    missing_req_m: FloatArray
    unready_req_m: FloatArray

    @classmethod
    def of(cls, pods: PodGroups, m: int, target: FloatArray, cpu: bool) -> _Tally:
        w = pods.workload
        count = pods.count
        lacking = np.isnan(pods.total)
        has = ~lacking & (count > 0)
        value = np.where(has, pods.total, 0.0)
        ready = pods.ready
        measured = ready & has
        lacking &= ready

        def per_workload(weights: FloatArray | IntArray) -> FloatArray:
            return cast(FloatArray, np.bincount(w, weights=weights, minlength=m))

        zeros = np.zeros(m)
        cpu_sums = [zeros] * 5
        if cpu:
            # Whole millicores per pod, as Kubernetes counts them (integers held in floats:
            # exact below 2**53, and no overflow above).
            request_m = np.rint(pods.request_cores * 1000)
            used_m = np.rint(value / np.maximum(count, 1) * 1000)
            fallback = np.floor(np.maximum(100.0, target))[w]
            cpu_sums = [
                per_workload(count * np.where(measured, used_m, 0.0)),
                per_workload(count * np.where(measured, request_m, 0.0)),
                per_workload(count * np.where(lacking, request_m * fallback // 100, 0.0)),
                per_workload(count * np.where(lacking, request_m, 0.0)),
                per_workload(count * np.where(ready, 0.0, request_m)),
            ]
        return cls(
            per_workload(count * measured).astype(np.int64),
            per_workload(count * lacking).astype(np.int64),
            per_workload(count * ~ready).astype(np.int64),
            per_workload(np.where(measured, value, 0.0)),
            per_workload(value),
            *cpu_sums,
        )


def calculate(
    pods: PodGroups,
    *,
    current: IntArray,
    target: FloatArray,
    tolerance_down: FloatArray,
    tolerance_up: FloatArray,
    utilization: BoolArray,
) -> Calculation:
    """Desired replicas for each workload, as the HPA's replica calculator.

    ``current``: each workload's replicas; ``target``: the per-pod target value
    (``averageValue``) or, where ``utilization`` is set, the target CPU utilisation in percent
    (``averageUtilization``).

    * Plain per-pod metric: ``ratio = mean(ready pods' values) / target``.  CPU utilisation:
      the ready pods' total use over their total request in *whole* percent (truncated, on
      millicores, as Kubernetes computes it), ``ratio = utilisation / target``.
    * Within ``[1 - tolerance_down, 1 + tolerance_up]`` nothing changes; else
      ``ceil(ratio × ready pods)``.
    * Pods *not ready* are left out, and on a scale-up counted as 0 (for per-pod custom
      metrics the HPA calls a pod unready only while it is Pending; for CPU also during its
      initialisation period -- the caller decides, through ``ready``).  Ready pods *missing*
      a value count on a scale-down as ``target`` (plain path) or ``max(100 %, target)`` of
      their request (CPU path), and 0 on a scale-up (at exactly 1.0 they are left out).  If
      filling them in flips the direction or lands within the tolerances, the current count
      is kept; else ``ceil(new_ratio × pods counted)``.
    * No ready pod reporting a value: no answer (``NO_METRICS``: the HPA does not scale);
      nor on the CPU path when the measured pods request no CPU (``NO_REQUEST``).
    * Plain path at zero replicas: ``ceil(total / target)`` of every pod's value (one
      aggregate pod, say), without tolerance, as the HPA's object-metric path does.
    """
    t = _Tally.of(pods, len(current), target, bool(utilization.any()))
    util = t.used_m * 100 // np.maximum(t.requested_m, 1)
    mean = t.total / np.maximum(t.ready, 1)
    ratio = np.where(utilization, util / target, mean / target)

    def within(r: FloatArray) -> BoolArray:
        return (1.0 - tolerance_down <= r) & (r <= 1.0 + tolerance_up)

    rebalance = (t.unready > 0) & (ratio > 1.0)
    simple = ~rebalance & (t.missing == 0)
    in_band = within(ratio)
    replicas = np.where(in_band, current, _ceil(ratio * t.ready))
    outcome = np.where(in_band, TOLERANCE, np.where(utilization, UTILIZATION, RATIO))
    pods_n = t.ready
    new_ratio = ratio
    if not simple.all():
        # Missing and unready pods filled in, the ratio computed again.
        fill_down = (t.missing > 0) & (ratio < 1.0)
        fill_missing = fill_down | ((t.missing > 0) & (ratio > 1.0))
        filled_n = t.ready + np.where(fill_missing, t.missing, 0)
        filled_n += np.where(rebalance, t.unready, 0)
        filled_used = t.used_m + np.where(fill_down, t.missing_used_m, 0.0)
        filled_req = t.requested_m + np.where(fill_missing, t.missing_req_m, 0.0)
        filled_req += np.where(rebalance, t.unready_req_m, 0.0)
        new_util = filled_used * 100 // np.maximum(filled_req, 1)
        filled_total = t.total + np.where(fill_down, target * t.missing, 0.0)
        new_ratio = np.where(
            utilization, new_util / target, filled_total / np.maximum(filled_n, 1) / target
        )
        keep = within(new_ratio) | ((ratio < 1.0) & (new_ratio > 1.0))
        keep |= (ratio > 1.0) & (new_ratio < 1.0)
        filled = _ceil(new_ratio * filled_n)
        flip = ((new_ratio < 1.0) & (filled > current)) | ((new_ratio > 1.0) & (filled < current))
        replicas = np.where(simple, replicas, np.where(keep | flip, current, filled))
        outcome = np.where(
            simple, outcome, np.where(keep, FILLED_KEEP, np.where(flip, FLIP_KEEP, FILLED))
        )
        pods_n = np.where(simple, pods_n, filled_n)

    outcome = np.where(utilization & (t.requested_m <= 0), NO_REQUEST, outcome)
    outcome = np.where(t.ready == 0, NO_METRICS, outcome)
    replicas = np.where(outcome <= NO_REQUEST, current, replicas)
    from_zero = ~utilization & (current == 0)
    outcome = np.where(from_zero, FROM_ZERO, outcome)
    replicas = np.where(from_zero, _ceil(t.zero_total / target), replicas)
    return Calculation(
        replicas=replicas,
        outcome=outcome,
        usage_ratio=np.where(from_zero, t.zero_total / target, ratio),
        new_ratio=new_ratio,
        utilization=util,
        pods=pods_n,
        missing=t.missing,
        unready=t.unready,
        total=t.zero_total,
        target=target,
        tolerance_down=tolerance_down,
        tolerance_up=tolerance_up,
    )


def _one(
    pods: PodGroups,
    current_replicas: int,
    target: float,
    tolerance: float | Tolerances,
    utilization: bool,
) -> HpaResult:
    if target <= 0:
        name = "target_percent" if utilization else "target"
        raise ValueError(f"{name} must be > 0, got {target!r}")
    tol = tolerance if isinstance(tolerance, Tolerances) else Tolerances(tolerance, tolerance)
    calc = calculate(
        pods,
        current=np.array([current_replicas], dtype=np.int64),
        target=np.array([target], dtype=np.float64),
        tolerance_down=np.array([tol.scale_down], dtype=np.float64),
        tolerance_up=np.array([tol.scale_up], dtype=np.float64),
        utilization=np.array([utilization], dtype=bool),
    )
    return calc.result(0)


def calculate_replicas(
    samples: Sequence[PodSample],
    current_replicas: int,
    target: float,
    tolerance: float | Tolerances = 0.1,
) -> HpaResult:
    """Desired replicas for a per-pod average-value metric: :func:`calculate` for one
    workload whose pods are ``samples``; ``target`` is the per-pod target value
    (``averageValue``).  Raises :class:`NoMetricsError` when no ready pod has a value.

    With ``current_replicas == 0`` (scale from zero) pass one aggregate sample holding the
    total: the result is ``ceil(total / target)``.
    """
    pods = PodGroups.of([(s.ready, s.value, 0.0) for s in samples])
    return _one(pods, current_replicas, target, tolerance, utilization=False)


def calculate_utilization_replicas(
    samples: Sequence[CpuSample],
    current_replicas: int,
    target_percent: float,
    tolerance: float | Tolerances = 0.1,
) -> HpaResult:
    """Desired replicas for CPU utilisation (``target.averageUtilization``), the HPA's
    resource path (``GetResourceReplicas``): :func:`calculate` for one workload whose pods
    are ``samples``.  Raises :class:`NoMetricsError` when no ready pod has a value."""
    pods = PodGroups.of([(s.ready, s.used_cores, s.request_cores) for s in samples])
    return _one(pods, current_replicas, target_percent, tolerance, utilization=True)


__all__ = [
    "Calculation",
    "CpuSample",
    "HpaBehaviorState",
    "HpaResult",
    "NoMetricsError",
    "PodGroups",
    "PodSample",
    "Tolerances",
    "calculate",
    "calculate_replicas",
    "calculate_utilization_replicas",
]
