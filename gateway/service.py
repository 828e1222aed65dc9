"""One service as the data plane sees it: endpoints, balancer, live stats and timeouts.

Built by the composition root (``gateway.app``) and shared by the data plane (which reads
it per request), the admin plane and discovery (which apply endpoint updates to it).
Issue 4's admission state (slots, queue, rate limit) belongs here too.
"""

from __future__ import annotations

from gateway.balancers import Balancer, RandomSource, make_balancer
from gateway.endpoints import EndpointSet
from gateway.settings import ServiceConfig, TimeoutsConfig
from gateway.stats import ServiceStats


class Service:
    __slots__ = (
        "balancer",
        "balancer_name",
        "connect_s",
        "endpoints",
        "name",
        "response_header_s",
        "stats",
        "total_s",
    )

    def __init__(
        self,
        name: str,
        balancer: str = "least_request",
        timeouts: TimeoutsConfig | None = None,
        rng: RandomSource | None = None,
    ) -> None:
        t = timeouts or TimeoutsConfig()
        self.name = name
        self.balancer_name = balancer
        self.balancer: Balancer = make_balancer(balancer, rng)
        self.endpoints = EndpointSet(name)
        self.stats = ServiceStats(name)
        self.connect_s = t.connect_s
        self.response_header_s = t.response_header_s
        self.total_s = t.total_s

    @classmethod
    def from_config(
        cls, name: str, config: ServiceConfig, rng: RandomSource | None = None
    ) -> Service:
        return cls(name, config.balancer, config.timeouts, rng)

    def __repr__(self) -> str:
        return f"Service({self.name}, {self.balancer!r}, {self.endpoints!r})"
