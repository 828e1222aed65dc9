"""The scaler's decision function: ``Engine.tick(now, signals, states) -> decisions`` (pure).

Contract (other parts of Sluice code against it; extend, don't rename):

* ``Engine(policies, budget)`` holds per-service window state in memory; no I/O, no clock.
* ``tick(now, signals, states)`` takes the time on the injected clock, the latest
  ``ServiceSignals`` per service (a service missing from ``signals``, or whose snapshot is
  stale, is frozen, never scaled down) and the platform's ``ServiceState`` per service,
  and returns one ``Decision`` per configured service.
"""

from __future__ import annotations

from collections.abc import Mapping

from scaler.decision import Decision, ServiceState
from scaler.policy import BudgetConfig, ScalingPolicy
from scaler.signals import ServiceSignals


class Engine:
    def __init__(self, policies: Mapping[str, ScalingPolicy], budget: BudgetConfig) -> None:
        self.policies = dict(policies)
        self.budget = budget

    def tick(
        self,
        now: float,
        signals: Mapping[str, ServiceSignals],
        states: Mapping[str, ServiceState],
    ) -> dict[str, Decision]:
        raise NotImplementedError("the scaler engine is being built (issue 3)")
