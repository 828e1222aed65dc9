"""The static platform's sources: routes and endpoints exactly as the config file lists them."""

from __future__ import annotations

from collections.abc import AsyncIterator

from gateway.dataplane.updates import EndpointInfo, EndpointUpdate, RouteRule, RoutesUpdate
from gateway.settings import Settings


def routes_from_settings(settings: Settings) -> RoutesUpdate:
    """Every service's ``routes`` as rules, plus ``default_backend``."""
    rules = tuple(
        RouteRule(service=name, host=r.host, path=r.path, path_type=r.path_type)
        for name, service in settings.services.items()
        for r in service.routes
    )
    return RoutesUpdate(rules=rules, default_backend=settings.default_backend)


def endpoints_from_settings(settings: Settings) -> list[EndpointUpdate]:
    """One update per service with its static ``endpoints`` (all ready)."""
    return [
        EndpointUpdate(service=name, endpoints=tuple(EndpointInfo(a) for a in service.endpoints))
        for name, service in settings.services.items()
    ]


class StaticEndpointSource:
    """An ``EndpointSource`` that yields each service's configured endpoints once."""

    def __init__(self, settings: Settings) -> None:
        self._updates = endpoints_from_settings(settings)

    async def updates(self) -> AsyncIterator[EndpointUpdate]:
        for update in self._updates:
            yield update


class StaticRouteSource:
    """A ``RouteSource`` that yields the configured routes once."""

    def __init__(self, settings: Settings) -> None:
        self._update = routes_from_settings(settings)

    async def routes(self) -> AsyncIterator[RoutesUpdate]:
        yield self._update
