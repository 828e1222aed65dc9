"""Endpoint sources: where each service's replicas come from (static config, local pool, Kubernetes).

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
