"""Actuators apply decisions to a platform and report its current state.

One module per platform: ``none`` (recommend-only), ``local`` (process pool + cgroups),
``kubernetes`` (Deployment /scale, Pod /resize).  This is the scaler's I/O edge.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from scaler.decision import Decision, ServiceState


class Actuator(Protocol):
    """Applies decisions; reports what is in force.  Both may await I/O."""

    async def apply(self, decisions: Mapping[str, Decision]) -> None:
        """Make the platform match ``decisions`` (best effort; failures are logged and reported in state)."""
        ...

    async def current(self) -> Mapping[str, ServiceState]:
        """The platform's state for every service it knows."""
        ...
