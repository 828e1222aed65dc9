"""The engine's HPA-mode services, all at once on arrays (pure): metric windows, the replica
calculation (:mod:`scaler.hpa`) and ``behavior`` (:mod:`scaler.hpa_behavior`).

Each service is a workload of *reference* pods (of ``cpu.request`` cores): its metric,
averaged over ``panic_window_s``, is split evenly over the ready ones; replicas still starting
are the unready pods.  Explanations are built from a tick's arrays when someone reads them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from scaler.explanation import Trace
from scaler.hpa import NO_METRICS, NO_REQUEST, Calculation, PodGroups, calculate
from scaler.hpa_behavior import HpaBehaviorBatch, Normalized
from scaler.kpa_batch import BoolArray, FloatArray, IntArray, KpaBatch, reference_max
from scaler.policy import ScalingPolicy

HPA_RULES = ("hpa", "hpa-no-ready-pods", "no-data")
"""``HpaTick.rule`` indexes this."""
_HPA, _NO_READY_PODS, _NO_DATA = range(3)


@dataclass(frozen=True, slots=True)
class HpaTick:
    """One tick's HPA results (arrays indexed like the batch's policies); read-only."""

    active: BoolArray
    """Evaluated this tick (the others are frozen by the engine)."""
    valid: BoolArray
    """Active, with data in the window."""
    rule: IntArray
    """Index into :data:`HPA_RULES` (where ``active``)."""
    replicas: IntArray
    """The recommendation, in reference replicas (where not active: the current replicas)."""
    average: FloatArray
    current: IntArray
    """Replicas now, in reference replicas."""
    ready: IntArray
    """Ready replicas now, in reference replicas."""
    calculation: Calculation
    normalized: Normalized


class HpaBatch:
    """``mode: hpa`` for ``len(policies)`` services."""

    def __init__(self, policies: Sequence[ScalingPolicy]) -> None:
        ps = list(policies)
        self.policies = ps
        m = len(ps)
        self.m = m

        def arr(values: list[float]) -> FloatArray:
            return np.array(values, dtype=np.float64).reshape(m)

        self.windows = KpaBatch(ps)
        """The metric windows (the panic window's average is the HPA's)."""
        self.behavior = HpaBehaviorBatch([p.behavior for p in ps])
        self.cpu_ref = arr([p.cpu.initial_cores for p in ps])
        self.target = arr([p.target for p in ps])
        self.utilization = np.array([p.metric == "cpu" for p in ps], dtype=bool).reshape(m)
        self.tolerance_down = arr([_or(p.behavior.scale_down.tolerance, p.tolerance) for p in ps])
        self.tolerance_up = arr([_or(p.behavior.scale_up.tolerance, p.tolerance) for p in ps])
        self.min_r = np.array([p.min_replicas for p in ps], dtype=np.int64).reshape(m)
        self.max_r = np.array([reference_max(p) for p in ps], dtype=np.int64).reshape(m)
        self._workload = np.concatenate([np.arange(m), np.arange(m)])
        self._ready = np.concatenate([np.ones(m, dtype=bool), np.zeros(m, dtype=bool)])
        self._unready_value = np.full(m, math.nan)

    def __repr__(self) -> str:
        return f"HpaBatch(services={self.m}, behavior={self.behavior!r})"

    def observe(self, now: float, values: FloatArray, fresh: BoolArray) -> None:
        """Record the metric ``values`` where ``fresh`` is set."""
        self.windows.observe(now, values, fresh)

    def recommend(
        self,
        now: float,
        active: BoolArray,
        replicas: IntArray,
        ready: FloatArray,
        cpu: FloatArray,
    ) -> HpaTick:
        """Each active service's recommendation from its window average; ``replicas``,
        ``ready`` and ``cpu`` (per replica) are the platform's now."""
        _, average = self.windows.averages(now)
        no_data = np.isnan(average)
        avg = np.where(no_data, 0.0, average)
        scale = cpu / self.cpu_ref
        current = np.ceil(replicas * scale - 1e-6).astype(np.int64)
        ready_ref = np.minimum(current, np.rint(ready * scale).astype(np.int64))
        # From zero (plain metric): one aggregate pod holding the whole metric.
        from_zero = ~self.utilization & (current == 0)
        pods = PodGroups(
            workload=self._workload,
            count=np.concatenate([np.where(from_zero, 1, ready_ref), current - ready_ref]),
            ready=self._ready,
            total=np.concatenate([avg, self._unready_value]),
            request_cores=np.concatenate([self.cpu_ref, self.cpu_ref]),
        )
        calc = calculate(
            pods,
            current=current,
            target=self.target,
            tolerance_down=self.tolerance_down,
            tolerance_up=self.tolerance_up,
            utilization=self.utilization,
        )
        on = active & ~no_data
        normalized = self.behavior.normalize(
            now,
            on,
            current=current,
            desired=calc.replicas,
            min_replicas=self.min_r,
            max_replicas=self.max_r,
        )
        no_answer = (calc.outcome == NO_METRICS) | (calc.outcome == NO_REQUEST)
        rule = np.where(no_data, _NO_DATA, np.where(no_answer, _NO_READY_PODS, _HPA))
        return HpaTick(
            active=active,
            valid=on,
            rule=rule,
            replicas=np.where(on, normalized.replicas, replicas),
            average=average,
            current=current,
            ready=ready_ref,
            calculation=calc,
            normalized=normalized,
        )

    def record_scales(self, now: float, on: BoolArray, old: IntArray, new: IntArray) -> None:
        """Tell ``behavior`` what each service (where ``on``) had and now gets, in reference
        replicas."""
        self.behavior.record(now, on, old, new)

    def explain(self, tick: HpaTick, j: int, trace: Trace) -> None:
        """Add service ``j``'s HPA steps and clamps for ``tick`` to ``trace``."""
        if tick.rule[j] == _NO_DATA:
            trace.step("hpa.no_metric")
            return
        p = self.policies[j]
        trace.step(
            "hpa.inputs",
            metric=p.metric,
            average=float(tick.average[j]),
            window_s=p.panic_window_s,
            target=p.target,
            replicas=int(tick.current[j]),
            ready=int(tick.ready[j]),
        )
        trace.parts.append(tick.calculation.step(j))
        tick.normalized.explain(j, trace)

    def inputs(self, tick: HpaTick, j: int) -> dict[str, float]:
        """Service ``j``'s figures for ``tick`` (none without data)."""
        if tick.rule[j] == _NO_DATA:
            return {}
        return {"average": float(tick.average[j]), "capacity_replicas": float(tick.current[j])}


def _or(value: float | None, default: float) -> float:
    return default if value is None else value
