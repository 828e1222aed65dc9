"""What platforms hand the data plane: whole endpoint sets per service and whole route sets.

A source is an async stream of whole endpoint sets, one service at a time.  The gateway
applies each set to the service's ``EndpointSet`` (new endpoints join, removed ones drain).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class EndpointInfo:
    """One replica as its platform sees it (EndpointSlice conditions, or a local replica's probe)."""

    address: str
    """``host:port``"""
    ready: bool = True
    """Ready for new requests (serving and not terminating)."""
    serving: bool = True
    terminating: bool = False


@dataclass(frozen=True, slots=True)
class EndpointUpdate:
    """The whole current endpoint set of one service."""

    service: str
    endpoints: tuple[EndpointInfo, ...]


class EndpointSource(Protocol):
    def updates(self) -> AsyncIterator[EndpointUpdate]:
        """Yield the full endpoint set of a service each time it changes (first, every service's)."""
        ...


@dataclass(frozen=True, slots=True)
class RouteRule:
    """One routing rule from a route source (config file or an Ingress), already validated."""

    service: str
    host: str | None
    """Exact host, ``*.example.com`` (exactly one more label), or None for any host."""
    path: str
    path_type: str
    """``Exact``, ``Prefix`` or ``ImplementationSpecific`` (treated as Prefix)."""


@dataclass(frozen=True, slots=True)
class RoutesUpdate:
    """The whole current route set; the gateway builds a new immutable RouteTable and swaps it in."""

    rules: tuple[RouteRule, ...]
    default_backend: str | None = None


class RouteSource(Protocol):
    def routes(self) -> AsyncIterator[RoutesUpdate]:
        """Yield the whole route set each time it changes (first, the initial set)."""
        ...
