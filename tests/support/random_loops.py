"""Random closed loops for the engine: policies, a budget, and each tick's signals and states.

Used by the property-style tests that compare the engine's two forms and by
``benchmarks/engine_equivalence.py``, which records such loops to replay them through
another revision.  Every draw comes from the ``random.Random`` passed in.
"""

from __future__ import annotations

import random
from collections.abc import Mapping

from scaler.decision import Decision, ServiceState
from scaler.policy import BudgetConfig, ScalingPolicy
from scaler.signals import ServiceSignals


def random_policy(rnd: random.Random) -> ScalingPolicy:
    cpu_min = rnd.choice([0.05, 0.1, 0.25, 0.5])
    cpu_max = cpu_min * rnd.choice([1.0, 1.5, 2.0, 4.0])
    min_r = rnd.randint(0, 2)
    stable = rnd.choice([6.0, 20.0, 60.0])
    return ScalingPolicy(
        mode=rnd.choice(["kpa", "kpa", "kpa", "hpa"]),
        metric=rnd.choice(["concurrency", "concurrency", "rps"]),
        target=rnd.choice([1.0, 2.0, 5.0, 10.0]),
        min_replicas=min_r,
        max_replicas=rnd.randint(max(1, min_r), 10),
        stable_window_s=stable,
        panic_window_s=min(stable, rnd.choice([2.0, 6.0])),
        scale_to_zero_grace_s=rnd.choice([0.0, 5.0, 30.0]),
        max_scale_down_rate=rnd.choice([1.5, 2.0, 10.0]),
        cpu={
            "min": cpu_min,
            "max": cpu_max,
            "request": rnd.choice([None, rnd.uniform(cpu_min, cpu_max)]),
        },
        weight=rnd.choice([0.5, 1.0, 2.0]),
        guaranteed_cpu=rnd.choice([None, min_r * cpu_min + rnd.uniform(0, 0.5)]),
        prefer=rnd.choice(["vertical", "horizontal"]),
    )


def random_budget(rnd: random.Random, policies: Mapping[str, ScalingPolicy]) -> BudgetConfig:
    """A budget the floors fit in, shared (mostly) or independent."""
    floors = sum(p.floor_cores for p in policies.values())
    return BudgetConfig(
        cpu=max(0.05, floors + rnd.uniform(0.0, 2.0) * max(1.0, len(policies) / 4)),
        arbitration=rnd.choice(["shared", "shared", "shared", "independent"]),
    )


class RandomLoad:
    """Per tick: each service's load wanders (idle, light, heavy), its counters go up (and
    now and then restart), its signals are sometimes missing or stale; the platform applies
    the decisions, with some replicas not ready and some resizes blocked."""

    def __init__(
        self, rnd: random.Random, policies: Mapping[str, ScalingPolicy], measured: bool
    ) -> None:
        self.rnd = rnd
        self.services = list(policies)
        self.measured = measured
        self.arrivals = dict.fromkeys(self.services, 0)
        self.cpu = dict.fromkeys(self.services, 0.0)
        self.level = {s: rnd.uniform(0, 30) for s in self.services}
        self.states: dict[str, ServiceState] = {}

    def tick(self, now: float) -> tuple[dict[str, ServiceSignals], dict[str, ServiceState]]:
        """This tick's signals and the platform's states."""
        rnd = self.rnd
        signals: dict[str, ServiceSignals] = {}
        for s in self.services:
            if rnd.random() < 0.1:
                self.level[s] = rnd.choice([0.0, rnd.uniform(0, 8), rnd.uniform(0, 120)])
            load = max(0.0, self.level[s] * rnd.uniform(0.7, 1.3))
            self.arrivals[s] = 0 if rnd.random() < 0.01 else self.arrivals[s] + int(load)
            self.cpu[s] += load * 0.01
            roll = rnd.random()
            if roll < 0.03:
                continue  # missing
            at = now - rnd.uniform(4.0, 30.0) if roll < 0.07 else now
            signals[s] = ServiceSignals(
                s,
                at,
                in_flight=int(load),
                queued=rnd.randint(0, 3),
                arrivals_total=self.arrivals[s],
                rps=load,
                cpu_seconds_total=self.cpu[s] if self.measured else None,
                cpu_throttled_seconds_total=(
                    self.cpu[s] * 0.1 if self.measured and rnd.random() < 0.5 else None
                ),
            )
        blocked = {s for s in self.states if rnd.random() < 0.05}
        self.states = {
            s: ServiceState(s, x.replicas, x.ready_replicas, x.cpu_per_replica_cores, s in blocked)
            for s, x in self.states.items()
        }
        return signals, self.states

    def applied(self, decisions: Mapping[str, Decision]) -> None:
        """The platform applied ``decisions`` (most replicas ready)."""
        rnd = self.rnd
        self.states = {
            s: ServiceState(
                s,
                d.replicas,
                d.replicas if rnd.random() < 0.85 else rnd.randint(0, d.replicas),
                d.cpu_per_replica_cores,
            )
            for s, d in decisions.items()
        }
