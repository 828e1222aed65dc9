"""Round robin: each endpoint in turn (the starting point is random, so replicas do not align)."""

from __future__ import annotations

from gateway.dataplane.balancers import RandomSource
from gateway.dataplane.endpoints import Endpoint


class RoundRobin:
    uses_latency = False

    __slots__ = ("_next",)

    def __init__(self, rng: RandomSource) -> None:
        self._next = int(rng.random() * 1024)

    def pick(self, endpoints: tuple[Endpoint, ...]) -> Endpoint:
        i = self._next
        self._next = i + 1
        return endpoints[i % len(endpoints)]

    def observe(self, endpoint: Endpoint, latency_s: float, now: float) -> None:
        pass

    def __repr__(self) -> str:
        return f"RoundRobin(next={self._next})"
