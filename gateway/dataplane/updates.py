"""What platforms hand the data plane: whole endpoint sets per service, whole route sets and
the whole set of certificates a platform found (Kubernetes: the Ingresses' TLS Secrets).

A platform streams whole endpoint sets, one service at a time, and whole route sets
(``gateway.platforms.Platform``); the gateway applies each endpoint set to the service's
``EndpointSet`` (new endpoints join, removed ones drain) and swaps each route set in whole.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gateway.settings import Settings


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


@dataclass(frozen=True, slots=True)
class PemCertificate:
    """One certificate a platform found, as PEM (already checked by the platform)."""

    source: str
    """Where it came from, for logs and reports (``secret shop/web-tls``)."""
    hosts: tuple[str, ...]
    """The host names it serves (exact, or ``*.example.com``)."""
    cert_pem: bytes
    key_pem: bytes


@dataclass(frozen=True, slots=True)
class CertificatesUpdate:
    """The whole current set of platform certificates; the TLS listener serves them beside
    the config file's ``tls.certificates`` (the first of which stays the default)."""

    certificates: tuple[PemCertificate, ...] = ()


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
