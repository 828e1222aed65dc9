"""``platform: static``: routes and endpoints exactly as the config file lists them;
decisions are computed, logged and exposed, never applied (recommend-only)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from typing import Any

from gateway.dataplane.updates import (
    CertificatesUpdate,
    EndpointUpdate,
    RoutesUpdate,
    endpoints_from_settings,
    routes_from_settings,
)
from gateway.platforms import Gateway
from gateway.platforms.machine import budget_cpu
from gateway.settings import Settings
from scaler.actuators.none import RecommendOnlyActuator
from scaler.decision import ServiceState
from scaler.loop import ScalerLoop
from scaler.policy import BudgetCpu, ScalingPolicy, within_floors
from scaler.signals import ServiceSignals


class StaticPlatform:
    """The config file's routes and endpoints once; the recommend-only actuator."""

    name = "static"

    def __init__(self, settings: Settings, gateway: Gateway) -> None:
        self._settings = settings
        self._gateway = gateway
        self._budget = within_floors(budget_cpu(settings.budget), self.policies())
        self.actuator = RecommendOnlyActuator(
            {
                name: ServiceState(
                    service=name,
                    replicas=len(s.endpoints),
                    ready_replicas=len(s.endpoints),
                    cpu_per_replica_cores=s.scaling.cpu.request or s.scaling.cpu.min,
                )
                for name, s in settings.services.items()
            }
        )

    def __repr__(self) -> str:
        return f"StaticPlatform({len(self._settings.services)} services)"

    def policies(self) -> Mapping[str, ScalingPolicy]:
        return {name: s.scaling for name, s in self._settings.services.items()}

    def budget_cpu(self) -> BudgetCpu:
        """``budget.cpu``, or for ``auto`` this machine's cores (read at start)."""
        return self._budget

    def signals(self) -> Mapping[str, ServiceSignals]:
        return self._gateway.signals()

    async def routes(self) -> AsyncIterator[RoutesUpdate]:
        yield routes_from_settings(self._settings)

    async def endpoints(self) -> AsyncIterator[EndpointUpdate]:
        for update in endpoints_from_settings(self._settings):
            yield update

    async def certificates(self) -> AsyncIterator[CertificatesUpdate]:
        """None: only the config file's ``tls.certificates``."""
        return
        yield

    def on_busy_change(self, service: str, busy: bool) -> None:
        pass

    def holds_at_zero(self, service: str, policy: ScalingPolicy | None) -> bool:
        """No: the endpoints are the config file's; nothing starts one (503 at once)."""
        return False

    def on_held(self, service: str) -> None:
        """Never called: no service holds."""

    def report(self) -> Mapping[str, Any]:
        return {"lending": False}

    async def start(self, scaler: ScalerLoop) -> None:
        await asyncio.sleep(0)

    async def stop(self) -> None:
        await asyncio.sleep(0)
