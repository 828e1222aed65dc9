"""Endpoint sets per service: which replicas get new requests, and which are draining.

An :class:`EndpointSet` applies whole ``EndpointUpdate``s from a platform:

* endpoints new to the set join;
* endpoints missing from an update **drain**: no new requests, their in-flight requests
  complete, and once the last one finishes they leave the set (``on_drained`` fires, so a
  platform can SIGTERM the replica only then; ``is_drained`` answers the same question);
* routing uses ready endpoints only; ``serving && terminating`` ones only when nothing is
  ready (EndpointSlice semantics); ejected endpoints (outlier detection, issue 4) get none.

The data plane reads :attr:`EndpointSet.routable` — a tuple recomputed on every change, so
the per-request cost is one attribute read — and calls :meth:`Endpoint.acquire` /
:meth:`Endpoint.release` around each forwarded request.  Pure: no I/O, no clock.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Protocol

from gateway.dataplane.updates import EndpointInfo, EndpointUpdate


class EndpointState(enum.Enum):
    READY = "ready"
    """Gets new requests."""
    TERMINATING = "terminating"
    """Serving but terminating: used only when no endpoint is ready."""
    NOT_READY = "not_ready"
    """Listed by the platform but not ready: no new requests."""
    DRAINING = "draining"
    """Removed by the platform: no new requests, waiting for in-flight ones to finish."""


class EndpointPool(Protocol):
    """What an endpoint's upstream connection pool must offer the set (closing it on removal)."""

    def close(self) -> None: ...


def split_address(address: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port`` too) -> (host, port); ValueError on anything else."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"an endpoint address must be 'host:port', got {address!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port)


class Endpoint:
    """One replica: its address, state, in-flight count and latency estimate (peak EWMA)."""

    __slots__ = (
        "_owner",
        "address",
        "ejected",
        "ewma_at",
        "ewma_s",
        "host",
        "in_flight",
        "pool",
        "port",
        "state",
    )

    def __init__(self, address: str, state: EndpointState = EndpointState.READY) -> None:
        self.address = address
        self.host, self.port = split_address(address)
        self.state = state
        self.ejected = False
        self.in_flight = 0
        self.ewma_s = 0.0
        self.ewma_at: float | None = None
        self.pool: EndpointPool | None = None
        """The data plane's keep-alive connections to this endpoint (created lazily)."""
        self._owner: EndpointSet | None = None

    def acquire(self) -> None:
        self.in_flight += 1
        if self.in_flight == 1 and (owner := self._owner) is not None and owner.on_busy:
            owner.on_busy(self.address, True)  # before the request is sent

    def release(self) -> None:
        self.in_flight -= 1
        if self.in_flight == 0 and (owner := self._owner) is not None:
            if owner.on_busy is not None:
                owner.on_busy(self.address, False)
            if self.state is EndpointState.DRAINING:
                owner._drained(self)

    def __repr__(self) -> str:
        extra = ", ejected" if self.ejected else ""
        return f"Endpoint({self.address}, {self.state.value}, in_flight={self.in_flight}{extra})"


def _state_of(info: EndpointInfo) -> EndpointState:
    if info.ready:
        return EndpointState.READY
    if info.serving and info.terminating:
        return EndpointState.TERMINATING
    return EndpointState.NOT_READY


class BusyHook(Protocol):
    """``on_busy(address, busy, held=False)``: an endpoint's in-flight count left 0 (busy) or
    came back to it; ``held`` (only from the worker relay): it has been idle for the
    lender's hold already."""

    def __call__(self, address: str, busy: bool, held: bool = False, /) -> None: ...


class EndpointSet:
    """The endpoints of one service."""

    __slots__ = ("_endpoints", "on_busy", "on_change", "on_drained", "routable", "service")

    def __init__(self, service: str, on_drained: Callable[[Endpoint], None] | None = None) -> None:
        self.service = service
        self._endpoints: dict[str, Endpoint] = {}
        self.routable: tuple[Endpoint, ...] = ()
        """Endpoints that get new requests now (ready ones, else serving-terminating ones)."""
        self.on_drained = on_drained
        self.on_change: Callable[[], None] | None = None
        """Called after ``routable`` changed (admission recomputes its slots)."""
        self.on_busy: BusyHook | None = None
        """Called with an endpoint's address when its in-flight count leaves 0 (True, before
        the request is sent) or comes back to it (False): the local platform's lender."""

    def apply(self, update: EndpointUpdate) -> None:
        """Make the set equal to ``update``: new endpoints join, missing ones drain."""
        if update.service != self.service:
            raise ValueError(
                f"update for service {update.service!r} applied to {self.service!r}'s endpoints"
            )
        for info in update.endpoints:
            split_address(info.address)  # all or nothing: validate before changing anything
        listed: set[str] = set()
        for info in update.endpoints:
            listed.add(info.address)
            state = _state_of(info)
            ep = self._endpoints.get(info.address)
            if ep is None:
                ep = Endpoint(info.address, state)
                ep._owner = self
                self._endpoints[info.address] = ep
            else:
                ep.state = state
        for address, ep in list(self._endpoints.items()):
            if address not in listed and ep.state is not EndpointState.DRAINING:
                ep.state = EndpointState.DRAINING
                if ep.in_flight == 0:
                    self._drained(ep)
        self._refresh()

    def eject(self, address: str, ejected: bool = True) -> None:
        """Take an endpoint out of (or back into) rotation without changing its platform state."""
        self._endpoints[address].ejected = ejected
        self._refresh()

    def _refresh(self) -> None:
        eps = [ep for ep in self._endpoints.values() if not ep.ejected]
        ready = tuple(ep for ep in eps if ep.state is EndpointState.READY)
        if not ready:
            ready = tuple(ep for ep in eps if ep.state is EndpointState.TERMINATING)
        self.routable = ready
        if self.on_change is not None:
            self.on_change()

    def _drained(self, ep: Endpoint) -> None:
        if self._endpoints.get(ep.address) is ep:
            del self._endpoints[ep.address]
        ep._owner = None
        if ep.pool is not None:
            ep.pool.close()
            ep.pool = None
        self._refresh()
        if self.on_drained is not None:
            self.on_drained(ep)

    def get(self, address: str) -> Endpoint | None:
        return self._endpoints.get(address)

    def is_drained(self, address: str) -> bool:
        """True once ``address`` gets no new requests and has none in flight (or is unknown)."""
        ep = self._endpoints.get(address)
        if ep is None:
            return True
        return ep.in_flight == 0 and ep not in self.routable

    @property
    def endpoints(self) -> tuple[Endpoint, ...]:
        """Every endpoint still in the set, draining ones included."""
        return tuple(self._endpoints.values())

    def __len__(self) -> int:
        return len(self._endpoints)

    def __repr__(self) -> str:
        return f"EndpointSet({self.service}, {len(self._endpoints)} endpoints, {len(self.routable)} routable)"
