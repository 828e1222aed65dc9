"""Peak EWMA: cost = latency EWMA × (in flight + 1), compared by the power of two choices.

The latency estimate per endpoint (kept on the :class:`Endpoint`) jumps up to a slower
sample at once ("peak") and decays toward faster samples with time constant ``decay_s``,
so a replica that turns slow loses traffic immediately and regains it gradually.  An
endpoint with no sample yet costs ``default_latency_s`` (so it is tried, but not flooded).
"""

from __future__ import annotations

import math

from gateway.dataplane.balancers import RandomSource
from gateway.dataplane.balancers.least_request import two_distinct
from gateway.dataplane.endpoints import Endpoint

DEFAULT_DECAY_S = 10.0
DEFAULT_LATENCY_S = 0.001


class PeakEwma:
    uses_latency = True

    __slots__ = ("_rng", "decay_s", "default_latency_s")

    def __init__(
        self,
        rng: RandomSource,
        decay_s: float = DEFAULT_DECAY_S,
        default_latency_s: float = DEFAULT_LATENCY_S,
    ) -> None:
        if decay_s <= 0:
            raise ValueError(f"decay_s must be > 0, got {decay_s}")
        if default_latency_s <= 0:
            raise ValueError(f"default_latency_s must be > 0, got {default_latency_s}")
        self._rng = rng
        self.decay_s = decay_s
        self.default_latency_s = default_latency_s

    def cost(self, endpoint: Endpoint) -> float:
        ewma = endpoint.ewma_s if endpoint.ewma_at is not None else self.default_latency_s
        return ewma * (endpoint.in_flight + 1)

    def pick(self, endpoints: tuple[Endpoint, ...]) -> Endpoint:
        n = len(endpoints)
        if n == 1:
            return endpoints[0]
        a, b = two_distinct(self._rng, n)
        ea, eb = endpoints[a], endpoints[b]
        return eb if self.cost(eb) < self.cost(ea) else ea

    def observe(self, endpoint: Endpoint, latency_s: float, now: float) -> None:
        last = endpoint.ewma_at
        if last is None or latency_s > endpoint.ewma_s:
            endpoint.ewma_s = latency_s
        else:
            w = math.exp(-max(now - last, 0.0) / self.decay_s)
            endpoint.ewma_s = endpoint.ewma_s * w + latency_s * (1.0 - w)
        endpoint.ewma_at = now

    def __repr__(self) -> str:
        return f"PeakEwma(decay_s={self.decay_s})"
