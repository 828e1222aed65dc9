"""Load balancers: pick one endpoint from a service's routable endpoints.

Each algorithm is one small module; all share the :class:`Balancer` protocol and take an
injected random source so tests are deterministic.  ``pick`` is on the hot path: it gets a
non-empty tuple (the endpoint set's current routable snapshot) and returns one of them.
``observe`` feeds a finished request's latency to algorithms that use it.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Protocol

from gateway.dataplane.endpoints import Endpoint


class RandomSource(Protocol):
    def random(self) -> float:
        """A float in [0, 1)."""
        ...


class Balancer(Protocol):
    uses_latency: bool
    """Whether ``observe`` does anything (the data plane skips the call otherwise)."""

    def pick(self, endpoints: tuple[Endpoint, ...]) -> Endpoint:
        """One of ``endpoints`` (never empty)."""
        ...

    def observe(self, endpoint: Endpoint, latency_s: float, now: float) -> None:
        """A request to ``endpoint`` took ``latency_s`` (finished at ``now``)."""
        ...


def make_balancer(name: str, rng: RandomSource | None = None) -> Balancer:
    """The balancer called ``name`` in config (round_robin | least_request | peak_ewma)."""
    from gateway.dataplane.balancers.least_request import LeastRequest
    from gateway.dataplane.balancers.peak_ewma import PeakEwma
    from gateway.dataplane.balancers.round_robin import RoundRobin

    source: RandomSource = rng if rng is not None else random.Random()
    factories: dict[str, Callable[[], Balancer]] = {
        "round_robin": lambda: RoundRobin(source),
        "least_request": lambda: LeastRequest(source),
        "peak_ewma": lambda: PeakEwma(source),
    }
    try:
        return factories[name]()
    except KeyError:
        raise ValueError(f"balancer must be one of {', '.join(factories)}, got {name!r}") from None
