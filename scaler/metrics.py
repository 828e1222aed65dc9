"""Several metrics per service (``scaling.metrics``): each metric's answer, the largest wins (pure).

The primary metric (the first concurrency/rps entry) is decided by the engine's KPA/HPA windows;
every other entry has a :class:`MetricTrack` here: its value averaged over its ``window_s``,
mapped to reference replicas (a target per replica with a tolerance, or a steps table), and a
lower answer held for its ``stabilization_window_s``.  :func:`combine` takes the largest answer;
a metric without data never lets the service scale down (the HPA's rule).  Latency comes last:
above its target it asks for capacity in proportion, never less than the others' answer.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from scaler.explanation import Explanation
from scaler.policy import PRIMARY_TYPES, MetricSpec, MetricStep, MetricStepsThen, ScalingPolicy
from scaler.signals import BucketedWindow, ServiceSignals

_EPS = 1e-9
LATENCY_WINDOW_S = 30.0
"""Default window of a latency metric (its percentile is over the requests of this window)."""
LATENCY_MIN_REQUESTS = 10
"""Fewer completions than this in the window: the percentile is not trusted (no data)."""
LATENCY_MAX_STEP = 2.0
"""A latency answer asks for at most this factor more capacity than the replicas ready now."""


def steps_replicas(value: float, steps: Sequence[MetricStep], then: MetricStepsThen | None) -> int:
    """Replicas a steps table gives ``value``: the first row whose ``below`` is above it; at or
    beyond the last row, its replicas plus ``then.add`` for every whole ``then.every`` past it.

    With rows ``below 1000 -> 2, below 10000 -> 3`` and ``every 20000 add 1``: 999 -> 2,
    1000 -> 3, 29999 -> 3, 30000 -> 4, 49999 -> 4, 50000 -> 5.
    """
    for row in steps:
        if value < row.below:
            return row.replicas
    last = steps[-1]
    if then is None:
        return last.replicas
    return last.replicas + math.floor((value - last.below) / then.every + _EPS) * then.add


@dataclass(frozen=True, slots=True)
class MetricAnswer:
    """One metric's answer this tick."""

    name: str
    type: str
    value: float | None
    """The metric's figure (None: no data)."""
    replicas: int | None
    """The reference replicas it asks for (None: no data, or no opinion)."""
    note: str = ""
    """How the answer came about (for the explanation)."""


@dataclass(frozen=True, slots=True)
class MetricsVerdict:
    """The metrics' combined answer for one service."""

    replicas: int
    winner: str
    """The metric whose answer was taken ("" when held for missing data or nothing answered)."""
    held_by: tuple[str, ...]
    """Metrics without data that kept the service from scaling down."""
    answers: tuple[MetricAnswer, ...]


def combine(current: int, answers: Sequence[MetricAnswer]) -> tuple[int, str, tuple[str, ...]]:
    """The largest answer and the metric that gave it (the first of equals); a metric with no
    data never lets the result fall below ``current`` (it is then current, and the metrics
    without data are named).  Latency answers never hold (no requests is no latency)."""
    best: int | None = None
    winner = ""
    missing: list[str] = []
    for a in answers:
        if a.replicas is None:
            if a.value is None and a.type != "latency":
                missing.append(a.name)
            continue
        if best is None or a.replicas > best:
            best, winner = a.replicas, a.name
    if best is None:
        return current, "", tuple(missing)
    if missing and best < current:
        return current, "", tuple(missing)
    return best, winner, ()


@dataclass(frozen=True, slots=True)
class MetricInputs:
    """What one tick knows of a service, for its metrics."""

    signals: ServiceSignals | None
    """This tick's snapshot (None: missing or stale)."""
    fresh: bool
    """The snapshot is new this tick (its figures enter the windows)."""
    current: int
    """Reference replicas held now."""
    ready: float
    """Ready capacity, in reference replicas."""
    rps: float
    cpu_used_cores: float
    """Measured CPU use (NaN: not measured)."""
    cpu_held_cores: float
    """CPU the ready replicas hold."""
    primary: int | None = None
    """The engine's own answer when the primary metric is listed."""
    primary_value: float | None = None
    """The primary metric's figure this tick."""


class MetricTrack:
    """One metric of one service: its window and its recent answers (scale-down delay)."""

    __slots__ = (
        "_answers",
        "_hist",
        "_raised_at",
        "_raised_to",
        "max_replicas",
        "spec",
        "stabilization_s",
        "target",
        "tolerance",
        "window",
    )

    def __init__(self, spec: MetricSpec, policy: ScalingPolicy, max_replicas: int) -> None:
        self.spec = spec
        self.max_replicas = max_replicas
        window_s = spec.window_s
        if window_s is None:
            window_s = LATENCY_WINDOW_S if spec.type == "latency" else policy.panic_window_s
        self.window = BucketedWindow(window_s)
        stab = spec.stabilization_window_s
        if stab is None:
            stab = (
                policy.behavior.scale_down.stabilization_window_s
                if policy.mode == "hpa"
                else policy.stable_window_s
            )
        self.stabilization_s = stab
        self.tolerance = spec.tolerance if spec.tolerance is not None else policy.tolerance
        target = spec.target or 0.0
        if spec.type in PRIMARY_TYPES and policy.mode == "kpa":
            target *= policy.target_utilization  # as the KPA aims below its target
        self.target = target
        self._answers: deque[tuple[float, int]] = deque()
        self._hist: deque[tuple[float, tuple[int, ...]]] = deque()
        """latency: (at, cumulative histogram) over the window."""
        self._raised_at = -math.inf
        self._raised_to = 0

    def __repr__(self) -> str:
        return f"MetricTrack({self.spec.key}, {self.spec.type}, {self.window!r})"

    # -- the metric's figure -----------------------------------------------------------------

    def _sample(self, now: float, inputs: MetricInputs) -> float | None:
        """This tick's figure (None: none measured)."""
        sig = inputs.signals
        if sig is None:
            return None
        kind = self.spec.type
        if kind == "concurrency":
            return float(sig.in_flight + sig.queued)
        if kind == "rps":
            return inputs.rps
        if kind == "cpu_utilization":
            used, held = inputs.cpu_used_cores, inputs.cpu_held_cores
            if math.isnan(used) or held <= 0:
                return None
            return 100.0 * used / held
        if kind == "app":
            values = sig.app_metrics
            return None if values is None else values.get(self.spec.key)
        return None

    def _latency(self, now: float, sig: ServiceSignals | None) -> float | None:
        """The percentile over the window's completions (None: too few, or not reported)."""
        hist = self._hist
        if sig is not None and sig.latency_counts is not None and sig.latency_bounds_s is not None:
            counts = sig.latency_counts
            if hist and (
                len(hist[-1][1]) != len(counts)
                or any(a < b for a, b in zip(counts, hist[-1][1], strict=True))
            ):
                hist.clear()  # the counters restarted
            hist.append((now, counts))
        while len(hist) > 1 and hist[1][0] <= now - self.window.window_s:
            hist.popleft()
        if len(hist) < 2 or sig is None or sig.latency_bounds_s is None:
            return None
        first, last = hist[0][1], hist[-1][1]
        window = [b - a for a, b in zip(first, last, strict=True)]
        if sum(window) < LATENCY_MIN_REQUESTS:
            return None
        return histogram_quantile(
            window, (self.spec.percentile or 50.0) / 100.0, sig.latency_bounds_s
        )

    # -- the answer ----------------------------------------------------------------------------

    def answer(self, now: float, inputs: MetricInputs, base: int) -> MetricAnswer:
        """This tick's answer; ``base`` is the other metrics' combined answer (latency only)."""
        spec = self.spec
        if spec.type == "latency":
            return self._answer_latency(now, inputs, base)
        if inputs.fresh:
            sample = self._sample(now, inputs)
            if sample is not None and math.isfinite(sample):
                self.window.record(now, max(sample, 0.0))
        value = self.window.average(now) if inputs.signals is not None else None
        if value is None:
            return MetricAnswer(spec.key, spec.type, None, None, "no data" + self._missing_why())
        if spec.steps is not None:
            raw = steps_replicas(value, spec.steps, spec.then)
            note = f"steps: {value:g} -> {raw}"
        else:
            raw, note = self._by_target(value, inputs)
        replicas = self._stabilized(now, raw)
        if replicas != raw:
            note += f"; held at {replicas} for {self.stabilization_s:g}s (scale-down delay)"
        return MetricAnswer(spec.key, spec.type, value, replicas, note)

    def _missing_why(self) -> str:
        if self.spec.type == "cpu_utilization":
            return (
                ": CPU not measured (local: cgroup usage; kubernetes: metrics.k8s.io "
                "PodMetrics, when metrics-server answers and reports the ready pods)"
            )
        if self.spec.type == "app":
            source = self.spec.source
            how = f"header {source.header}" if source and source.header else "push"
            return f": no value from {how} in the last {source.max_age_s if source else 0:g}s"
        return ""

    def _by_target(self, value: float, inputs: MetricInputs) -> tuple[int, str]:
        """HPA's calculation: ``ceil(ratio × ready)``, ratio within 1 ± tolerance keeps current."""
        current, ready = inputs.current, inputs.ready
        if self.spec.type == "cpu_utilization":
            target = self.spec.target or 100.0
            ratio = value / target
            per = f"{value:.1f}% / {target:g}%"
        else:
            target = self.target
            ratio = value / (ready * target) if ready > 0 else math.inf
            per = f"{value:.2f} / ({ready:g} × {target:g})"
        if ready <= 0:
            want = (
                max(0, math.ceil(value / target - _EPS))
                if self.spec.type != "cpu_utilization"
                else current
            )
            return want, f"from zero: ceil({value:.2f} / {target:g}) = {want}"
        if abs(ratio - 1.0) <= self.tolerance:
            return (
                current,
                f"ratio {per} = {ratio:.3f} within tolerance {self.tolerance:g}: {current}",
            )
        want = max(0, math.ceil(ratio * ready - _EPS))
        return want, f"ceil({per} × {ready:g}) = {want}"

    def _stabilized(self, now: float, raw: int) -> int:
        """The largest answer of the stabilization window (a lower one counts only after it)."""
        answers = self._answers  # decreasing answers, oldest first: the front is the max
        while answers and answers[-1][1] <= raw:
            answers.pop()
        answers.append((now, raw))
        while answers[0][0] < now - self.stabilization_s - _EPS:
            answers.popleft()
        return answers[0][1]

    def _answer_latency(self, now: float, inputs: MetricInputs, base: int) -> MetricAnswer:
        """Above target: ``ceil(ready × min(p / target, 2))``, never below ``base``.

        Latency lags: the window still holds requests served before capacity was added.  So
        after asking for more it waits a whole window (two while the replicas it asked for are
        not all ready) before it reads the percentile again, holding its answer; once the
        percentile is back under target its answer still holds for the stabilization window
        after the last raise.  Below target it has no opinion."""
        spec = self.spec
        p = self._latency(now, inputs.signals if inputs.fresh else None)
        target = spec.target_s or 0.0
        label = f"p{spec.percentile:g}"
        shown = "-" if p is None else f"{p:.3f}s"
        raised = self._raised_to if self._raised_to > base else None
        wait_s = self.window.window_s * (2.0 if inputs.ready < self._raised_to else 1.0)
        if now < self._raised_at + wait_s:
            note = (
                f"{label} {shown}: damped, {self._raised_to} asked {now - self._raised_at:.0f}s ago"
            )
            return MetricAnswer(spec.key, spec.type, p, raised, note)
        if p is None or p <= target * (1.0 + self.tolerance):
            if now <= self._raised_at + self.stabilization_s and raised is not None:
                note = f"{label} {shown} <= {target:g}s; held at {raised} (scale-down delay)"
                return MetricAnswer(spec.key, spec.type, p, raised, note)
            why = (
                "too few requests in the window" if p is None else f"{label} {shown} <= {target:g}s"
            )
            return MetricAnswer(spec.key, spec.type, p, None, why)
        ratio = min(p / target, LATENCY_MAX_STEP)
        ready = max(inputs.ready, 1.0)
        want = min(max(base, math.ceil(ready * ratio - _EPS)), self.max_replicas)
        self._raised_at, self._raised_to = now, want
        note = f"{label} {shown} > {target:g}s: ceil({ready:g} × {ratio:.2f}) = {want}"
        return MetricAnswer(spec.key, spec.type, p, want, note)


def histogram_quantile(counts: Sequence[int], q: float, bounds: Sequence[float]) -> float | None:
    """The ``q`` quantile of a bucketed histogram (``len(bounds) + 1`` counts, the last +Inf),
    linear within a bucket; None when empty."""
    total = sum(counts)
    if total <= 0:
        return None
    rank = q * total
    seen = 0
    for i, n in enumerate(counts):
        if n and seen + n >= rank:
            if i >= len(bounds):
                return float(bounds[-1])
            lower = bounds[i - 1] if i else 0.0
            return float(lower + (bounds[i] - lower) * max(rank - seen, 0.0) / n)
        seen += n
    return float(bounds[-1])


class ServiceMetrics:
    """One service's metrics besides the primary: their tracks and the combined verdict."""

    __slots__ = (
        "latency",
        "max_replicas",
        "min_replicas",
        "mode",
        "others",
        "primary_listed",
        "primary_name",
        "primary_type",
    )

    def __init__(self, policy: ScalingPolicy, max_replicas: int) -> None:
        tracks = [MetricTrack(m, policy, max_replicas) for m in policy.extra_metrics]
        self.others = [t for t in tracks if t.spec.type != "latency"]
        self.latency = [t for t in tracks if t.spec.type == "latency"]
        self.primary_listed = policy.primary_listed
        primary = next((m for m in policy.metrics if m.type in PRIMARY_TYPES), None)
        self.primary_name = primary.key if primary is not None else policy.metric
        self.primary_type: str = policy.metric
        self.mode = policy.mode
        self.min_replicas = policy.min_replicas
        self.max_replicas = max_replicas

    def __repr__(self) -> str:
        names = [t.spec.key for t in (*self.others, *self.latency)]
        return f"ServiceMetrics(primary_listed={self.primary_listed}, metrics={names})"

    def verdict(self, now: float, inputs: MetricInputs) -> MetricsVerdict:
        answers: list[MetricAnswer] = []
        if self.primary_listed and inputs.primary is not None:
            answers.append(
                MetricAnswer(
                    self.primary_name,
                    self.primary_type,
                    inputs.primary_value,
                    inputs.primary,
                    f"{self.mode} windows",
                )
            )
        answers.extend(t.answer(now, inputs, 0) for t in self.others)
        replicas, winner, held = combine(inputs.current, answers)
        for track in self.latency:
            a = track.answer(now, inputs, replicas)
            answers.append(a)
            if a.replicas is not None and a.replicas > replicas:
                replicas, winner = a.replicas, a.name
        bounded = min(max(replicas, self.min_replicas), self.max_replicas)
        return MetricsVerdict(bounded, winner, held, tuple(answers))


def metrics_of(explanation: Explanation) -> dict[str, Any] | None:
    """A decision's ``scaling.metrics`` part as JSON: each metric's answer, the winner, and the
    metrics without data that held the service (None when it has no ``metrics``)."""
    answers: list[dict[str, Any]] = []
    out: dict[str, Any] = {"winner": None, "held_by": [], "replicas": None, "answers": answers}
    found = False
    for step in explanation.steps:
        v = step.values
        if step.kind == "metrics.answer":
            found = True
            value, replicas = v["value"], v["replicas"]
            answers.append(
                {
                    "name": v["name"],
                    "type": v["type"],
                    "value": None if value == "-" else float(value),
                    "replicas": None if replicas == "-" else replicas,
                    "note": v["note"],
                }
            )
        elif step.kind == "metrics.won":
            out["winner"] = None if v["name"] == "-" else v["name"]
            out["replicas"] = v["replicas"]
        elif step.kind == "metrics.held":
            out["held_by"] = str(v["missing"]).split(", ")
            out["replicas"] = v["replicas"]
    return out if found else None
