"""Scaling policy models, owned by the scaler and composed into the gateway's root config.

Every field carries a description: it feeds the JSON Schema (``sluice schema``) and the
README's config reference.  Cross-field rules raise :class:`KeyedValueError` so the error
message names the exact key (``services.api.scaling.max_replicas: ...``).
"""

from __future__ import annotations

from typing import Literal, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator


class KeyedValueError(ValueError):
    """A validation error about one named key below the model that raised it."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key}: {message}")
        self.key = key
        self.message = message


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class HpaScalingPolicy(_Model):
    """One HPA ``behavior`` policy: at most ``value`` pods (or percent) per ``period_s``."""

    type: Literal["Pods", "Percent"] = Field(
        description="Pods: an absolute count; Percent: of the current replicas."
    )
    value: int = Field(
        gt=0, description="How many pods (or percent of current pods) may change per period."
    )
    period_s: float = Field(
        gt=0, le=1800, description="The window, in seconds, the policy applies to."
    )


class HpaScalingRules(_Model):
    """HPA ``behavior.scaleUp`` / ``behavior.scaleDown``."""

    stabilization_window_s: float = Field(
        ge=0,
        le=3600,
        description="Use the most conservative recommendation seen over this many seconds.",
    )
    policies: list[HpaScalingPolicy] = Field(
        description="Rate limits on how fast replicas may change."
    )
    select_policy: Literal["Max", "Min", "Disabled"] = Field(
        default="Max",
        description="Max: the policy allowing the largest change wins; Min: the smallest; Disabled: no change in this direction.",
    )
    tolerance: float | None = Field(
        default=None,
        ge=0,
        lt=1,
        description=(
            "Ratios within this much of 1 in this direction change nothing (Kubernetes >= 1.33 "
            "behavior.*.tolerance); default: the policy's tolerance."
        ),
    )


def _default_scale_up() -> HpaScalingRules:
    return HpaScalingRules(
        stabilization_window_s=0,
        policies=[
            HpaScalingPolicy(type="Percent", value=100, period_s=15),
            HpaScalingPolicy(type="Pods", value=4, period_s=15),
        ],
        select_policy="Max",
    )


def _default_scale_down() -> HpaScalingRules:
    return HpaScalingRules(
        stabilization_window_s=300,
        policies=[HpaScalingPolicy(type="Percent", value=100, period_s=15)],
        select_policy="Max",
    )


class HpaBehavior(_Model):
    """HPA-compatible ``behavior`` (defaults are the Kubernetes defaults)."""

    scale_up: HpaScalingRules = Field(
        default_factory=_default_scale_up, description="Rules for scaling up."
    )
    scale_down: HpaScalingRules = Field(
        default_factory=_default_scale_down, description="Rules for scaling down."
    )


class CpuPolicy(_Model):
    """CPU per replica, in cores."""

    min: float = Field(default=0.1, gt=0, description="Least CPU (cores) a replica is ever given.")
    max: float = Field(default=1.0, gt=0, description="Most CPU (cores) a replica is ever given.")
    request: float | None = Field(
        default=None,
        gt=0,
        description="CPU (cores) a replica is given when nothing else is known; defaults to min.",
    )

    @model_validator(mode="after")
    def _check(self) -> Self:
        if self.max < self.min:
            raise KeyedValueError("max", f"must be >= min ({self.min:g}), got {self.max:g}")
        if self.request is not None and not self.min <= self.request <= self.max:
            raise KeyedValueError(
                "request",
                f"must be within [min, max] = [{self.min:g}, {self.max:g}], got {self.request:g}",
            )
        return self

    @property
    def initial_cores(self) -> float:
        return self.request if self.request is not None else self.min


class ScalingPolicy(_Model):
    """How one service scales: horizontally (replicas) and vertically (CPU per replica)."""

    mode: Literal["kpa", "hpa"] = Field(
        default="kpa",
        description="kpa: Knative-style stable/panic windows; hpa: the Kubernetes HPA calculation.",
    )
    metric: Literal["concurrency", "rps", "cpu"] = Field(
        default="concurrency",
        description=(
            "concurrency: requests in flight plus queued; rps: arrivals per second; cpu (mode: "
            "hpa, needs measured CPU): CPU utilisation in percent of cpu.request."
        ),
    )
    target: float = Field(
        default=10.0,
        gt=0,
        description="Target value of the metric per replica (metric: cpu: percent of cpu.request).",
    )
    target_utilization: float = Field(
        default=0.7,
        gt=0,
        le=1,
        description="Fraction of target to aim at, leaving headroom for bursts.",
    )
    min_replicas: int = Field(
        default=1, ge=0, description="Fewest replicas; 0 allows scale to zero."
    )
    max_replicas: int = Field(default=10, ge=1, description="Most replicas.")
    stable_window_s: float = Field(
        default=60.0, ge=1, le=3600, description="KPA stable window (seconds)."
    )
    panic_window_s: float = Field(
        default=6.0, ge=1, description="KPA panic window (seconds); <= stable_window_s."
    )
    panic_threshold: float = Field(
        default=2.0,
        gt=1,
        description="Enter panic when panic-window demand reaches this multiple of current capacity.",
    )
    max_scale_up_rate: float = Field(
        default=1000.0, gt=1, description="At most this factor more replicas per tick."
    )
    max_scale_down_rate: float = Field(
        default=2.0, gt=1, description="At most this factor fewer replicas per tick."
    )
    scale_to_zero_grace_s: float = Field(
        default=30.0,
        ge=0,
        description="After a whole idle stable window, wait this long more before going to zero.",
    )
    tolerance: float = Field(
        default=0.1, ge=0, lt=1, description="HPA mode: ignore ratios within 1 ± tolerance."
    )
    behavior: HpaBehavior = Field(
        default_factory=HpaBehavior, description="HPA mode: scale-up/down behaviour."
    )
    cpu: CpuPolicy = Field(default_factory=CpuPolicy, description="CPU per replica (cores).")
    weight: float = Field(
        default=1.0, gt=0, description="Share of spare budget relative to other services."
    )
    guaranteed_cpu: float | None = Field(
        default=None,
        ge=0,
        description="CPU (cores) this service always keeps; default min_replicas × cpu.min.",
    )
    prefer: Literal["vertical", "horizontal"] = Field(
        default="vertical",
        description="vertical: grow CPU per replica up to cpu.max before adding replicas; horizontal: add replicas first.",
    )

    @model_validator(mode="after")
    def _check(self) -> Self:
        if self.max_replicas < self.min_replicas:
            raise KeyedValueError(
                "max_replicas",
                f"must be >= min_replicas ({self.min_replicas}), got {self.max_replicas}",
            )
        if self.metric == "cpu" and self.mode != "hpa":
            raise KeyedValueError("metric", "cpu utilisation is an HPA metric: needs mode: hpa")
        if self.metric == "cpu" and self.min_replicas < 1:
            raise KeyedValueError(
                "min_replicas", "must be >= 1 with metric: cpu (no CPU is measured at zero)"
            )
        if self.panic_window_s > self.stable_window_s:
            raise KeyedValueError(
                "panic_window_s",
                f"must be <= stable_window_s ({self.stable_window_s:g}), got {self.panic_window_s:g}",
            )
        if self.guaranteed_cpu is not None:
            least = self.min_replicas * self.cpu.min
            if self.guaranteed_cpu < least - 1e-9:
                raise KeyedValueError(
                    "guaranteed_cpu",
                    f"must be >= min_replicas × cpu.min ({least:g}), got {self.guaranteed_cpu:g}",
                )
        return self

    @property
    def floor_cores(self) -> float:
        """CPU this service always keeps (its guarantee)."""
        if self.guaranteed_cpu is not None:
            return self.guaranteed_cpu
        return self.min_replicas * self.cpu.min


class BudgetConfig(_Model):
    """The one CPU budget all services share."""

    cpu: float = Field(default=2.0, gt=0, description="Total CPU (cores) shared by every service.")
    arbitration: Literal["shared", "independent"] = Field(
        default="shared",
        description=(
            "shared: floors, weighted fair lending and reclaim; independent: every service scales on its own, "
            "first come first served on the budget (the one-HPA-per-service baseline)."
        ),
    )
    enforcement: Literal["limit", "share"] = Field(
        default="limit",
        description=(
            "How a replica's decided CPU is enforced. limit (default): the decided CPU is a hard "
            "cap (CFS quota; Kubernetes limits = requests), so a service's guaranteed CPU is "
            "exact, and idle CPU is lent by the next decision and, with lending, between ticks. share: it is the replica's "
            "guaranteed share (cgroup cpu.shares/cpu.weight; Kubernetes requests), the replica may "
            "use idle CPU up to cpu.max and the kernel lends and reclaims it within microseconds; "
            "the budget caps the total (a parent cgroup quota on the local platform). With a "
            "budget below the machine's CPUs that quota throttles every replica alike and weakens "
            "the guarantee; use share when the budget is the whole machine or node."
        ),
    )
    lending: bool = Field(
        default=True,
        description=(
            "limit enforcement: between ticks, lend the quota of a service that has had no "
            "request in flight or queued for lend_after_idle_s to the busy services (by weight, "
            "each replica up to cpu.max; the idle one keeps cpu.min per replica), and take it "
            "back at its next request (scaler/lending.py). Applied by the local platform with "
            "arbitration: shared; the Kubernetes platform cannot resize pods that fast and "
            "lends at ticks only."
        ),
    )
    lend_after_idle_s: float = Field(
        default=0.02,
        ge=0,
        le=10,
        description="How long a service must be idle before its quota is lent (hysteresis).",
    )
    early_ticks: bool = Field(
        default=True,
        description=(
            "Tick early when a service's concurrency reaches the level its last decision cannot "
            "absorb (Decision.wake_concurrency), instead of waiting for the next regular tick."
        ),
    )
    early_tick_gap_s: float = Field(
        default=0.1,
        gt=0,
        le=10,
        description="Shortest time between two ticks when ticking early (rate limit on wakes).",
    )


def check_floors(budget: BudgetConfig, policies: dict[str, ScalingPolicy]) -> None:
    """Raise :class:`KeyedValueError` (keyed ``budget.cpu``) when the floors do not fit the budget."""
    total = sum(p.floor_cores for p in policies.values())
    if total > budget.cpu + 1e-9:
        detail = ", ".join(f"{name}={p.floor_cores:g}" for name, p in sorted(policies.items()))
        raise KeyedValueError(
            "cpu",
            f"the services' guaranteed CPU ({total:g} cores: {detail}) exceeds the budget ({budget.cpu:g})",
        )
