"""The scaler's output and what it is told of the world: ``Decision`` and ``ServiceState``."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class ServiceState:
    """What the platform reports about one service right now."""

    service: str
    replicas: int
    """Replicas asked for (desired)."""
    ready_replicas: int
    cpu_per_replica_cores: float
    """CPU limit currently in force per replica."""
    resize_blocked: bool = False
    """True when an in-place CPU change cannot be applied now (e.g. PodResizePending Infeasible)."""
    cpu_limits_applied: bool = True
    """False when the platform cannot enforce CPU limits at all (e.g. no writable cgroup): CPU per
    replica is then what was decided, not what is enforced."""


@dataclass(frozen=True, slots=True)
class Decision:
    """One service's decision for one tick, with the reasons a person needs to trust it."""

    service: str
    at: float
    replicas: int
    cpu_per_replica_cores: float
    allocated_cores: float
    """replicas × cpu_per_replica_cores: this service's share of the budget."""
    rule: str
    """The rule that fired, e.g. 'stable', 'panic', 'scale-to-zero', 'frozen: stale signals'."""
    reasons: tuple[str, ...] = ()
    """Human-readable lines: inputs, clamps (which bound), lent/reclaimed CPU to/from whom."""
    inputs: dict[str, float] = field(default_factory=dict)
    frozen: bool = False
    """True when the service's signals were stale or missing: nothing changed."""

    def summary(self) -> str:
        return (
            f"{self.service}: {self.replicas}×{self.cpu_per_replica_cores:.2f} cores ({self.rule})"
        )
