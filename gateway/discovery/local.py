"""Endpoint source for ``platform: local``: the pool's ready replicas as endpoint sets.

A replica joins its service's set once its readiness probe passes and leaves it when it
fails, crashes or is being retired (before it is drained and stopped).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from gateway.discovery import EndpointInfo, EndpointUpdate
from scaler.localpool.pool import LocalPool


class LocalEndpointSource:
    """Adapts :meth:`LocalPool.updates` to the gateway's :class:`EndpointSource` protocol."""

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
