"""Scaling policy models, owned by the scaler and composed into the gateway's root config.

Every field carries a description: it feeds the JSON Schema (``sluice schema``) and the
README's config reference.  Cross-field rules raise :class:`KeyedValueError` so the error
message names the exact key (``services.api.scaling.max_replicas: ...``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


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


MetricType = Literal["concurrency", "rps", "cpu_utilization", "latency", "app"]
PRIMARY_TYPES = ("concurrency", "rps")
"""The metric types the engine's own KPA/HPA windows can decide (the first such entry)."""


class AppSource(_Model):
    """Where an ``app`` metric's value comes from: a response header or the push endpoint."""

    header: str | None = Field(
        default=None,
        min_length=1,
        description=(
            "Read this response header as responses pass (e.g. X-Active-Users): the last "
            "value per replica, combined by aggregate; a malformed value is ignored and counted."
        ),
    )
    aggregate: Literal["max", "sum", "avg"] = Field(
        default="avg",
        description="How the replicas' last values combine into the service's value.",
    )
    push: bool = Field(
        default=False,
        description="Take the value from POST /api/metrics/<service> on the admin API.",
    )
    max_age_s: float = Field(
        default=60.0,
        gt=0,
        le=3600,
        description="A value (a replica's last header, or the last push) older than this is dropped.",
    )

    @model_validator(mode="after")
    def _check(self) -> Self:
        if (self.header is None) == (not self.push):
            raise KeyedValueError("header", "give exactly one source: header: NAME or push: true")
        if self.header is not None and not _TOKEN.fullmatch(self.header):
            raise KeyedValueError("header", f"not a valid header name: {self.header!r}")
        return self


_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")


class MetricStep(_Model):
    """One row of a steps table: a value below ``below`` needs ``replicas``."""

    below: float = Field(
        gt=0, description="The row is for values below this (and at or above the previous row's)."
    )
    replicas: int = Field(ge=0, description="Replicas those values need.")


class MetricStepsThen(_Model):
    """Beyond the last row: ``add`` replicas more for every ``every`` above its ``below``."""

    every: float = Field(gt=0, description="Size of each further step of the value.")
    add: int = Field(default=1, ge=1, description="Replicas added per further step.")


class MetricSpec(_Model):
    """One entry of ``scaling.metrics``: a metric with its own target, tolerance and windows."""

    type: MetricType = Field(
        description=(
            "concurrency: in flight + queued; rps: arrivals per second; cpu_utilization: "
            "measured CPU in percent of the CPU the replicas hold; latency: a percentile of the "
            "gateway's latency histogram; app: a number the service reports about itself."
        )
    )
    name: str | None = Field(
        default=None,
        min_length=1,
        max_length=63,
        description="How decisions name this metric (default: its type; required for app).",
    )
    target: float | None = Field(
        default=None,
        gt=0,
        description=(
            "Value per replica to aim at (concurrency, rps, app); cpu_utilization: percent of "
            "the CPU each replica holds."
        ),
    )
    percentile: float | None = Field(
        default=None, gt=0, lt=100, description="latency: the percentile (e.g. 95)."
    )
    target_s: float | None = Field(
        default=None, gt=0, description="latency: the percentile's target in seconds."
    )
    source: AppSource | None = Field(default=None, description="app: where the value comes from.")
    steps: list[MetricStep] | None = Field(
        default=None,
        min_length=1,
        description="app: a table of value -> replicas, instead of target (rows by rising below).",
    )
    then: MetricStepsThen | None = Field(
        default=None, description="app with steps: beyond the last row, add replicas per step."
    )
    tolerance: float | None = Field(
        default=None,
        ge=0,
        lt=1,
        description="Ratios within 1 ± this change nothing (default: the policy's tolerance).",
    )
    window_s: float | None = Field(
        default=None,
        ge=1,
        le=3600,
        description="Average the metric over this many seconds (default: panic_window_s; latency: 30).",
    )
    stabilization_window_s: float | None = Field(
        default=None,
        ge=0,
        le=3600,
        description=(
            "A lower answer counts only after this many seconds (default: stable_window_s; "
            "mode: hpa: behavior.scale_down.stabilization_window_s)."
        ),
    )

    @property
    def key(self) -> str:
        """The metric's name in decisions."""
        return self.name if self.name is not None else self.type

    @model_validator(mode="after")
    def _check(self) -> Self:
        kind = self.type
        if kind == "app":
            self._check_app()
        else:
            for key in ("source", "steps", "then"):
                if getattr(self, key) is not None:
                    raise KeyedValueError(key, f"only for type: app, not {kind}")
        if kind == "latency":
            for key in ("percentile", "target_s"):
                if getattr(self, key) is None:
                    raise KeyedValueError(key, "is required for type: latency")
            if self.target is not None:
                raise KeyedValueError("target", "type: latency takes percentile and target_s")
        else:
            for key in ("percentile", "target_s"):
                if getattr(self, key) is not None:
                    raise KeyedValueError(key, f"only for type: latency, not {kind}")
            if kind != "app" and self.target is None:
                raise KeyedValueError("target", f"is required for type: {kind}")
        return self

    def _check_app(self) -> None:
        if self.name is None:
            raise KeyedValueError("name", "is required for type: app")
        if self.source is None:
            raise KeyedValueError("source", "is required for type: app (header or push)")
        if (self.target is None) == (self.steps is None):
            raise KeyedValueError("target", "give exactly one of target (per replica) or steps")
        if self.then is not None and self.steps is None:
            raise KeyedValueError("then", "needs steps")
        steps = self.steps or []
        for k in range(1, len(steps)):
            before, row = steps[k - 1], steps[k]
            if row.below <= before.below:
                raise KeyedValueError(
                    f"steps.{k}.below",
                    f"must be > the previous row's below ({before.below:g}), got {row.below:g}",
                )
            if row.replicas < before.replicas:
                raise KeyedValueError(
                    f"steps.{k}.replicas",
                    f"must be >= the previous row's replicas ({before.replicas}), got {row.replicas}",
                )


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
    metrics: list[MetricSpec] = Field(
        default_factory=list,
        description=(
            "Several metrics, each with its own answer; the service scales to the largest (a "
            "metric without data never scales it down). The first concurrency or rps entry is "
            "decided by the mode's windows; metric/target is the one-metric shorthand."
        ),
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
    scale_down_delay_s: float = Field(
        default=300.0,
        ge=0,
        le=3600,
        description=(
            "shared arbitration: a service keeps the most replicas it wanted in the last this "
            "many seconds (Knative's scale-down-delay; the HPA's scale-down stabilisation). An "
            "idle replica holds only cpu.min -- the rest of its CPU is lent in place -- so a "
            "periodic burst finds its replicas warm instead of waiting for them to start. Scale "
            "to zero keeps its own rule (an idle stable window + scale_to_zero_grace_s). 0: "
            "replicas follow the recommendation down at once."
        ),
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

    @model_validator(mode="before")
    @classmethod
    def _primary_from_metrics(cls, data: Any) -> Any:
        """With ``metrics``, the first concurrency/rps entry sets ``metric``/``target``."""
        if not isinstance(data, dict) or not data.get("metrics"):
            return data
        entries = data["metrics"]
        if not isinstance(entries, list):
            return data
        primary: tuple[str, Any] | None = None
        for entry in entries:
            kind = (
                entry.type
                if isinstance(entry, MetricSpec)
                else (entry.get("type") if isinstance(entry, dict) else None)
            )
            if kind in PRIMARY_TYPES:
                target = entry.target if isinstance(entry, MetricSpec) else entry.get("target")
                primary = (str(kind), target)
                break
        metric, target = primary if primary is not None else ("concurrency", 10.0)
        for key, value in (("metric", metric), ("target", target)):
            given = data.get(key)
            if given is not None and given != value:
                raise KeyedValueError(
                    key,
                    "give metric/target or metrics, not both (list it as an entry of metrics)",
                )
        if primary is None or target is None:
            return data
        return {**data, "metric": metric, "target": target}

    @property
    def replica_cores(self) -> float:
        """A replica at full size: ``cpu.request`` (``prefer: horizontal``) or ``cpu.max``."""
        return self.cpu.initial_cores if self.prefer == "horizontal" else self.cpu.max

    @property
    def primary_listed(self) -> bool:
        """Whether ``metric``/``target`` count (the shorthand, or listed in ``metrics``)."""
        return not self.metrics or any(m.type in PRIMARY_TYPES for m in self.metrics)

    @property
    def extra_metrics(self) -> list[MetricSpec]:
        """The ``metrics`` entries besides the primary (decided by ``scaler.metrics``)."""
        out: list[MetricSpec] = []
        primary_seen = False
        for m in self.metrics:
            if m.type in PRIMARY_TYPES and not primary_seen:
                primary_seen = True
                continue
            out.append(m)
        return out

    @model_validator(mode="after")
    def _check(self) -> Self:
        self._check_metrics()
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

    def _check_metrics(self) -> None:
        seen: dict[str, int] = {}
        for k, m in enumerate(self.metrics):
            if m.key in seen:
                raise KeyedValueError(
                    f"metrics.{k}.name",
                    f"{m.key!r} is already the name of metrics[{seen[m.key]}] (names must differ)",
                )
            seen[m.key] = k
            if m.type == "cpu_utilization" and self.min_replicas < 1:
                raise KeyedValueError(
                    "min_replicas", "must be >= 1 with cpu_utilization (no CPU is measured at zero)"
                )
        if self.metrics and self.metric == "cpu":
            raise KeyedValueError("metric", "with metrics, list type: cpu_utilization instead")

    @property
    def floor_cores(self) -> float:
        """CPU this service always keeps (its guarantee)."""
        if self.guaranteed_cpu is not None:
            return self.guaranteed_cpu
        return self.min_replicas * self.cpu.min


Enforcement = Literal["limit", "share"]
"""How a replica's decided CPU is enforced, once ``budget.enforcement: auto`` is resolved."""

_ENFORCEMENT_EPS = 1e-6


def cpus_for(cores: float) -> int:
    """The whole CPUs a budget of ``cores`` runs on: rounded up, a budget within 1e-6 of a
    whole number being that number (what ``enforcement: auto`` counts as whole, and the CPUs
    the local platform pins the replicas to)."""
    return max(1, math.ceil(cores - _ENFORCEMENT_EPS))


@dataclass(frozen=True, slots=True)
class BudgetCpu:
    """The budget in force: how many cores, and where that figure came from."""

    cores: float
    source: str
    """``budget.cpu`` for a fixed budget; for ``auto`` what was measured (machine, cgroup,
    nodes and others' requests)."""


class BudgetConfig(_Model):
    """The one CPU budget all services share."""

    cpu: Annotated[float, Field(gt=0)] | Literal["auto"] = Field(
        default=2.0,
        description=(
            "Total CPU (cores) shared by every service, or auto: on local and static the cores "
            "this process may use (its cpuset and cgroup cpu.max) minus reserved; on kubernetes "
            "the allocatable CPU of the nodes the managed workloads run on minus the CPU "
            "requests of the pods Sluice does not manage (and reserved), re-read as nodes and "
            "pods change."
        ),
    )
    reserved: float = Field(
        default=0.0,
        ge=0,
        description="cpu: auto: cores held back from the measured budget (for the gateway, the system...).",
    )
    arbitration: Literal["shared", "independent"] = Field(
        default="shared",
        description=(
            "shared: floors, weighted fair lending and reclaim; independent: every service scales on its own, "
            "first come first served on the budget (the one-HPA-per-service baseline)."
        ),
    )
    enforcement: Literal["auto", "limit", "share"] = Field(
        default="auto",
        description=(
            "How the budget is enforced. share: CPU is shared by weight, work-conserving: on "
            "local each service's cgroup is weighted by its entitlement (its fair share of the "
            "budget), its replicas equal inside it, each capped at cpu.max; on kubernetes a "
            "pod's request is its decided CPU and its limit cpu.max; the kernel lends idle CPU "
            "and gives it back within microseconds; the budget caps the total. limit: the decided CPU is a hard cap "
            "(CFS quota; Kubernetes limits = requests); idle CPU is lent by the next decision "
            "and, with lending, between ticks. auto (default): share where the kernel keeps "
            "the guarantee exact -- on local and static when the budget is the whole machine "
            "(no cap below the CPUs the replicas can run on), on local also when it is a whole "
            "number of CPUs (the replicas pinned to that many CPUs with a cpuset), on "
            "kubernetes (the budget bounds the pods' requests, the kernel's weights; a service "
            "whose pods are Guaranteed keeps requests = limits and is decided as under limit), "
            "and in sluice simulate (the node is the budget); limit otherwise (a fraction of a "
            "CPU below the machine's, or no cpuset controller: a parent quota that throttles "
            "every replica alike)."
        ),
    )
    lending: bool = Field(
        default=True,
        description=(
            "limit enforcement: between ticks, lend the quota of a service that has had no "
            "request in flight or queued for lend_after_idle_s to the busy services (by weight, "
            "each replica up to cpu.max; the idle one keeps its floor, each replica at least "
            "lend_keep_cores), and "
            "take it back at its next request (scaler/lending.py). Applied by the local platform with "
            "arbitration: shared; the Kubernetes platform cannot resize pods that fast and "
            "lends at ticks only."
        ),
    )
    lend_replicas: bool = Field(
        default=True,
        description=(
            "limit enforcement with lending: also lend the quota of a ready replica that has "
            "had no request in flight for lend_after_idle_s (its share of its service's floor "
            "kept), to its busy siblings and the other services' busy replicas, not only a "
            "whole idle service's; the request sent to it takes it back. false: only whole "
            "idle services lend (docs/local-demo.md, lending per replica)."
        ),
    )
    lend_after_idle_s: float = Field(
        default=0.02,
        ge=0,
        le=10,
        description="How long a service must be idle before its quota is lent (hysteresis).",
    )
    lend_keep_cores: float = Field(
        default=0.01,
        ge=0.01,
        le=64,
        description=(
            "The least each replica of an idle service keeps while its quota is lent (cores; "
            "never more than its decided CPU). An idle service keeps its floor (guaranteed_cpu, "
            "default min_replicas x cpu.min) spread over its replicas; warm replicas beyond it "
            "keep this. The default is the kernel's smallest CFS quota (1 ms per 100 ms "
            "period): the service's next request takes the decided quota back before it is "
            "forwarded, so a warm idle replica needs CPU only for what it does on its own "
            "(health checks, timers). Raise it for replicas with background work."
        ),
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

    @field_validator("cpu", mode="before")
    @classmethod
    def _cpu_word(cls, value: object) -> object:
        if value == "auto":
            return value
        try:
            if isinstance(value, bool):
                raise TypeError
            cores = float(value)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            raise ValueError(f"must be a number of cores or auto, got {value!r}") from None
        if not cores > 0:
            raise ValueError(f"must be > 0 (cores) or auto, got {value!r}")
        return cores

    @model_validator(mode="after")
    def _check_cpu(self) -> Self:
        if self.cpu != "auto" and self.reserved:
            raise KeyedValueError("reserved", "only used with cpu: auto")
        return self

    def fixed_cores(self) -> float:
        """``cpu`` as a number; :class:`KeyedValueError` for ``auto`` (what only a platform
        can measure, e.g. for the simulator)."""
        if self.cpu == "auto":
            raise KeyedValueError("cpu", "auto is measured by a platform: give a number of cores")
        return self.cpu

    def fixed(self) -> BudgetCpu | None:
        """The budget when ``cpu`` is a number; None for ``auto`` (the platform measures it)."""
        if self.cpu == "auto":
            return None
        return BudgetCpu(self.cpu, "budget.cpu")

    def auto_enforcement(
        self, machine_cores: float | None, *, pinnable: bool = False
    ) -> Enforcement:
        """What ``enforcement: auto`` means with ``machine_cores`` CPUs for the replicas
        (None: the budget is the whole node, as in the simulator): ``share`` when the budget
        is all of them, or (``pinnable``: the platform can confine the replicas to a set of
        CPUs) a whole number of them; else ``limit``.  An explicit ``enforcement`` is
        returned as is."""
        if self.enforcement != "auto":
            return self.enforcement
        if machine_cores is None:
            return "share"
        cores = machine_cores - self.reserved if self.cpu == "auto" else self.cpu
        if cores >= machine_cores - _ENFORCEMENT_EPS:
            return "share"
        if (
            pinnable
            and cores >= 1 - _ENFORCEMENT_EPS
            and cpus_for(cores) - cores <= _ENFORCEMENT_EPS
        ):
            return "share"
        return "limit"

    def resolved(self, machine_cores: float | None, *, pinnable: bool = False) -> BudgetConfig:
        """This budget with ``enforcement: auto`` decided (:meth:`auto_enforcement`)."""
        if self.enforcement != "auto":
            return self
        rule = self.auto_enforcement(machine_cores, pinnable=pinnable)
        return self.model_copy(update={"enforcement": rule})

    @property
    def rule(self) -> Enforcement:
        """The enforcement in force; ``ValueError`` while ``auto`` is not resolved."""
        if self.enforcement == "auto":
            raise ValueError("budget.enforcement is auto: resolve it first (BudgetConfig.resolved)")
        return self.enforcement


def check_floors(budget: BudgetConfig | BudgetCpu, policies: Mapping[str, ScalingPolicy]) -> None:
    """Raise :class:`KeyedValueError` (keyed ``budget.cpu``) when the floors do not fit the
    budget (a config's ``cpu: auto`` is checked once the platform has measured it)."""
    cores = budget.cores if isinstance(budget, BudgetCpu) else budget.cpu
    if cores == "auto":
        return
    total = sum(p.floor_cores for p in policies.values())
    if total > cores + 1e-9:
        detail = ", ".join(f"{name}={p.floor_cores:g}" for name, p in sorted(policies.items()))
        raise KeyedValueError(
            "cpu",
            f"the services' guaranteed CPU ({total:g} cores: {detail}) exceeds the budget ({cores:g})",
        )


def within_floors(cpu: BudgetCpu, policies: Mapping[str, ScalingPolicy]) -> BudgetCpu:
    """``cpu``, or the services' floors when a measured budget is smaller than they are (the
    guarantees are kept; the source says so)."""
    total = sum(p.floor_cores for p in policies.values())
    if total <= cpu.cores + 1e-9:
        return cpu
    return BudgetCpu(
        total,
        f"{cpu.source}; {cpu.cores:g} cores is below the services' guaranteed CPU: held at {total:g}",
    )
