"""Who decides replicas and CPU in a simulated run: the real engine, or a static split.

* ``sluice``      — :class:`scaler.engine.Engine` with the config's budget (``arbitration: shared``).
* ``independent`` — the same engine with ``budget.arbitration = independent``: one HPA-like
  autoscaler per service, first come first served on the budget.
* ``static``      — no scaling: the budget split equally between the services, fixed.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, Protocol

from scaler.decision import ServiceState
from scaler.engine import Engine
from scaler.policy import BudgetConfig, Enforcement, ScalingPolicy
from scaler.signals import ServiceSignals

RunName = Literal["sluice", "independent", "static"]

BASELINE_ENFORCEMENT: Enforcement = "limit"
"""The baselines' node model unless told otherwise: one autoscaler per service (or a static
split) on replicas whose CPU limit is their request -- Kubernetes pods of Guaranteed QoS, what
an HPA's utilisation is measured against.  ``share`` (replicas without a CPU limit, using idle
CPU by weight) is the other baseline the scenario suite reports."""


@dataclass(frozen=True, slots=True)
class Target:
    """What a controller asks of one service: this many replicas of this much CPU each."""

    replicas: int
    cpu_per_replica_cores: float
    wake_concurrency: float = math.inf
    """Tick early when the service's concurrency reaches this (``Decision.wake_concurrency``)."""


class Controller(Protocol):
    name: RunName
    rules: dict[str, Counter[str]]
    """How often each rule fired, per service (for the report)."""

    def initial(self) -> dict[str, Target]:
        """Replicas running (and ready) when the simulation starts."""
        ...

    def decide(
        self,
        now: float,
        signals: Mapping[str, ServiceSignals],
        states: Mapping[str, ServiceState],
    ) -> dict[str, Target]:
        """New targets for the services whose target this tick sets (frozen ones are left out)."""
        ...


class EngineController:
    """Drives the real :class:`scaler.engine.Engine` and turns its decisions into targets."""

    def __init__(
        self, name: RunName, policies: Mapping[str, ScalingPolicy], budget: BudgetConfig
    ) -> None:
        self.name = name
        self.policies = dict(policies)
        self.engine = Engine(self.policies, budget)
        self.rules: dict[str, Counter[str]] = {s: Counter() for s in self.policies}

    def initial(self) -> dict[str, Target]:
        return {s: Target(p.min_replicas, p.cpu.initial_cores) for s, p in self.policies.items()}

    def decide(
        self,
        now: float,
        signals: Mapping[str, ServiceSignals],
        states: Mapping[str, ServiceState],
    ) -> dict[str, Target]:
        decisions = self.engine.tick(now, signals, states)
        out: dict[str, Target] = {}
        rules = self.rules
        for service, d in decisions.items():
            counts = rules.get(service)
            if counts is None:
                counts = rules[service] = Counter()
            counts[d.rule] += 1
            if not d.frozen:
                out[service] = Target(d.replicas, d.cpu_per_replica_cores, d.wake_concurrency)
        return out


def static_split(
    policies: Mapping[str, ScalingPolicy],
    budget_cores: float,
    shares: Mapping[str, float] | None = None,
) -> dict[str, Target]:
    """The budget shared equally (or as ``shares``, in cores): per service, replicas × CPU
    within its bounds, at least 1 replica.

    A service's share is split into as few replicas as ``cpu.max`` allows; when ``cpu.min``
    or ``min_replicas`` need more than the share, the node's capacity decides who runs.
    """
    equal = budget_cores / max(len(policies), 1)
    out: dict[str, Target] = {}
    for service, p in policies.items():
        share = equal if shares is None else shares[service]
        replicas = max(1, p.min_replicas, math.ceil(share / p.cpu.max - 1e-9))
        replicas = min(replicas, p.max_replicas)
        cores = min(max(share / replicas, p.cpu.min), p.cpu.max)
        while replicas > max(1, p.min_replicas) and replicas * cores > share + 1e-9:
            replicas -= 1
            cores = min(max(share / replicas, p.cpu.min), p.cpu.max)
        out[service] = Target(replicas, cores)
    return out


class StaticController:
    """The ``static`` baseline: a fixed equal split decided once, never changed."""

    name: RunName = "static"

    def __init__(
        self,
        policies: Mapping[str, ScalingPolicy],
        budget: BudgetConfig,
        shares: Mapping[str, float] | None = None,
    ) -> None:
        self.targets = static_split(policies, budget.fixed_cores(), shares)
        self.rules: dict[str, Counter[str]] = {s: Counter() for s in policies}

    def initial(self) -> dict[str, Target]:
        return dict(self.targets)

    def decide(
        self,
        now: float,
        signals: Mapping[str, ServiceSignals],
        states: Mapping[str, ServiceState],
    ) -> dict[str, Target]:
        for service in self.rules:
            self.rules[service]["static"] += 1
        return {}


def make_controller(
    name: RunName, policies: Mapping[str, ScalingPolicy], budget: BudgetConfig
) -> Controller:
    if name == "static":
        return StaticController(policies, budget)
    arbitration: Literal["shared", "independent"] = (
        "independent" if name == "independent" else "shared"
    )
    return EngineController(name, policies, budget.model_copy(update={"arbitration": arbitration}))
