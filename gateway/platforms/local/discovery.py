"""Endpoint source for ``platform: local``: the pool's ready replicas as endpoint sets.

A replica joins its service's set once its readiness probe passes and leaves it when it
fails, crashes or is being retired (before it is drained and stopped).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

from gateway.dataplane.updates import EndpointInfo, EndpointUpdate
from gateway.platforms.local.actuator import LocalActuator
from gateway.platforms.local.pool import Drain, LocalPool
from gateway.platforms.machine import budget_cpu
from gateway.settings import Settings, resolve_enforcement


class LocalEndpointSource:
    """Adapts :meth:`LocalPool.updates` to whole ``EndpointUpdate`` sets."""

    def __init__(self, pool: LocalPool) -> None:
        self.pool = pool

    def __repr__(self) -> str:
        return f"LocalEndpointSource({self.pool!r})"

    async def updates(self) -> AsyncIterator[EndpointUpdate]:
        async for update in self.pool.updates():
            yield EndpointUpdate(
                service=update.service,
                endpoints=tuple(EndpointInfo(address=a) for a in update.addresses),
            )


@dataclass(frozen=True, slots=True)
class LocalParts:
    """The three pieces ``platform: local`` needs, sharing one pool.

    Use: ``async with platform.pool: ...`` around the gateway's lifetime; feed
    ``platform.endpoints.updates()`` to the endpoint sets, hand ``platform.actuator`` to the
    scaler loop, and pass each tick's signals through ``platform.actuator.add_cpu_signals``.
    """

    pool: LocalPool
    actuator: LocalActuator
    endpoints: LocalEndpointSource


def local_parts(
    settings: Settings, drain: Drain | None = None, budget_cores: float | None = None
) -> LocalParts:
    """Build the pool from settings: every service at ``min_replicas`` with its initial CPU, and
    the parent cgroup capped at the budget (the kernel enforces it even between two decisions);
    ``budget.enforcement`` says whether a replica's CPU is a guaranteed share or a hard limit.
    ``budget_cores``: the budget in force (default: this machine's for ``budget.cpu: auto``)."""
    settings = resolve_enforcement(settings)
    specs = {}
    for name, service in settings.services.items():
        if service.replicas is None:
            raise ValueError(f"services.{name}.replicas is required when platform is local")
        specs[name] = service.replicas
    pool = LocalPool(
        specs,
        drain=drain,
        total_cpu_cores=budget_cpu(settings.budget).cores if budget_cores is None else budget_cores,
        enforcement=settings.budget.rule,
    )
    actuator = LocalActuator(pool, {n: s.scaling for n, s in settings.services.items()})
    return LocalParts(pool=pool, actuator=actuator, endpoints=LocalEndpointSource(pool))
