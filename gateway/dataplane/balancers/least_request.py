"""Least request by the power of two choices: sample two endpoints, take the one with fewer in flight.

Two distinct random endpoints are compared on ``in_flight`` (ties go to the first sampled);
with a single endpoint it is returned directly.  O(1) per pick, and it avoids the herd
effect of always choosing the global minimum.
"""

from __future__ import annotations

from gateway.dataplane.balancers import RandomSource
from gateway.dataplane.endpoints import Endpoint


def two_distinct(rng: RandomSource, n: int) -> tuple[int, int]:
    """Two different indices in range(n), n >= 2, uniformly."""
    a = int(rng.random() * n)
    b = int(rng.random() * (n - 1))
    if b >= a:
        b += 1
    return a, b


class LeastRequest:
    uses_latency = False

    __slots__ = ("_rng",)

    def __init__(self, rng: RandomSource) -> None:
        self._rng = rng

    def pick(self, endpoints: tuple[Endpoint, ...]) -> Endpoint:
        n = len(endpoints)
        if n == 1:
            return endpoints[0]
        a, b = two_distinct(self._rng, n)
        ea, eb = endpoints[a], endpoints[b]
        return eb if eb.in_flight < ea.in_flight else ea

    def observe(self, endpoint: Endpoint, latency_s: float, now: float) -> None:
        pass

    def __repr__(self) -> str:
        return "LeastRequest(p2c)"
