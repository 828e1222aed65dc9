"""Platforms: where routes and endpoints come from, where decisions go, what the scaler sees.

Each platform is one room (``static``, ``local/``, ``kubernetes/``) that hands the
composition root one :class:`Platform`; no platform imports another, none imports the
composition root. A platform sees the gateway only through :class:`Gateway`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # types only: gateway.settings imports platforms.local.config at start-up
    from gateway.dataplane.service import Service
    from gateway.dataplane.updates import CertificatesUpdate, EndpointUpdate, RoutesUpdate
    from scaler.actuators import Actuator
    from scaler.loop import ScalerLoop
    from scaler.policy import BudgetCpu, ScalingPolicy
    from scaler.signals import ServiceSignals


class Gateway(Protocol):
    """What a platform may use of the running gateway (``gateway.runtime.Runtime``)."""

    @property
    def services(self) -> Mapping[str, Service]: ...

    def signals(self, now: float | None = None) -> dict[str, ServiceSignals]:
        """Every service's live signals from this gateway process's data plane."""
        ...

    async def wait_drained(
        self, service: str, address: str, timeout_s: float | None = None
    ) -> bool:
        """Wait until ``address`` takes no new requests and has none in flight."""
        ...


class Platform(Protocol):
    """One platform, opened once per gateway process (``start``), closed once (``stop``).

    The composition root builds ONE scaler loop from it: the engine over ``policies()``,
    ``signals`` as the loop's signals provider, ``actuator`` to apply decisions; it feeds
    ``routes()``, ``endpoints()`` and ``certificates()`` into the data plane, rebuilds the engine when
    ``policies()`` changes after a routes update, and calls ``on_busy_change`` from each
    service's admission on its busy/idle edges (one call per edge, not per request); the
    services ``holds_at_zero`` names hold their requests while they have no endpoint, and each
    held request ticks the scaler and calls ``on_held``.
    """

    name: str

    @property
    def actuator(self) -> Actuator:
        """Applies decisions; reports what is in force."""
        ...

    def policies(self) -> Mapping[str, ScalingPolicy]:
        """The services the scaler decides for, with their policies."""
        ...

    def budget_cpu(self) -> BudgetCpu:
        """The CPU budget in force and where it came from: ``budget.cpu``, or what the platform
        measured for ``budget.cpu: auto`` (read before every tick: keep it cheap)."""
        ...

    def signals(self) -> Mapping[str, ServiceSignals] | Awaitable[Mapping[str, ServiceSignals]]:
        """What the scaler sees this tick (the data plane's signals, plus what the platform
        measures or merges; ``{}`` freezes every service, e.g. a follower)."""
        ...

    def routes(self) -> AsyncIterator[RoutesUpdate]:
        """Whole route sets, each time they change (first, the initial set)."""
        ...

    def endpoints(self) -> AsyncIterator[EndpointUpdate]:
        """Whole endpoint sets per service, each time one changes."""
        ...

    def certificates(self) -> AsyncIterator[CertificatesUpdate]:
        """Whole sets of the platform's own TLS certificates, each time they change (served
        beside ``tls.certificates``; Kubernetes: the Ingresses' TLS Secrets). Platforms with
        none end at once."""
        ...

    def on_busy_change(self, service: str, busy: bool) -> None:
        """A service went from idle to busy or back (admission's edge hook; must be cheap)."""
        ...

    def holds_at_zero(self, service: str, policy: ScalingPolicy | None) -> bool:
        """Whether ``service`` (scaled by ``policy``; None: not scaled) holds its requests
        while it has no endpoint (scale from zero: the composition root queues them in its
        admission and ticks the scaler at once) rather than answering 503 no-endpoints."""
        ...

    def on_held(self, service: str) -> None:
        """A request for ``service`` is held at zero in this process (called per held request:
        must be cheap).  Where the scaler may run in another process (Kubernetes: the Lease
        holder), the platform tells it; elsewhere nothing to do."""
        ...

    def report(self) -> Mapping[str, Any]:
        """What ``/api/decisions``, ``/metrics`` and the dashboard show of the platform
        (JSON-ready; e.g. ``quota_in_force_cores`` and lending on the local platform)."""
        ...

    async def start(self, scaler: ScalerLoop) -> None:
        """Start the platform's own work (replicas, watches, leadership) for ``scaler``."""
        ...

    async def stop(self) -> None:
        """Stop everything ``start`` started (no orphans)."""
        ...
