"""Recommend-only actuator (``platform: static``): records decisions, applies nothing.

It reports every decision as if it had been applied (replicas ready, CPU in force), so the
engine's next tick sees the world its decisions describe — what a dry run needs.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping

from scaler.decision import Decision, ServiceState


class RecommendOnlyActuator:
    """Keeps the last decision per service as its state; applies nothing anywhere."""

    def __init__(
        self, initial: Mapping[str, ServiceState] | None = None, history: int = 1024
    ) -> None:
        self._states: dict[str, ServiceState] = dict(initial or {})
        self.applied: deque[Decision] = deque(maxlen=history)
        """Every decision handed over, oldest first (bounded)."""

    def __repr__(self) -> str:
        return f"RecommendOnlyActuator(services={len(self._states)}, applied={len(self.applied)})"

    async def apply(self, decisions: Mapping[str, Decision]) -> None:
        for name, decision in decisions.items():
            self.applied.append(decision)
            self._states[name] = ServiceState(
                service=name,
                replicas=decision.replicas,
                ready_replicas=decision.replicas,
                cpu_per_replica_cores=decision.cpu_per_replica_cores,
            )

    async def current(self) -> Mapping[str, ServiceState]:
        return dict(self._states)
