"""What the scaler is told each tick: a plain-data snapshot of one service's live load.

The gateway builds these (``gateway.stats``); the platform may add CPU figures.  Nothing
here knows where they came from, so the scaler can be fed by a simulator just the same.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ServiceSignals:
    """One service's load at time ``at`` (seconds on the injected clock).

    Counters named ``*_total`` are monotonic since the gateway started; rates and
    windows are derived by the scaler from successive snapshots.
    """

    service: str
    at: float
    in_flight: int = 0
    """Requests forwarded to an upstream and not yet answered."""
    queued: int = 0
    """Requests admitted but waiting in the gateway for a slot or a replica."""
    arrivals_total: int = 0
    completions_total: int = 0
    errors_total: int = 0
    """5xx answers and failed forwards."""
    rps: float = 0.0
    """Arrival rate over the gateway's short sliding window."""
    latency_p50_s: float | None = None
    latency_p99_s: float | None = None
    ready_replicas: int | None = None
    """Endpoints currently routable, if the gateway knows them."""
    cpu_seconds_total: float | None = None
    """CPU consumed by all replicas (cgroup usage), if the platform measures it."""
    cpu_throttled_seconds_total: float | None = None
    """Time the replicas spent throttled by their CPU limit, if measured."""

    @property
    def concurrency(self) -> int:
        """In flight at the upstreams plus queued in the gateway (DESIGN.md 'concurrency')."""
        return self.in_flight + self.queued
