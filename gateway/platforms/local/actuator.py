"""The local platform's actuator: decisions -> the process pool (replicas, cgroup CPU per replica).

With ``budget.enforcement: limit`` the decided CPU per replica is the replica's hard limit;
with ``share`` the replicas are capped at the service's ``cpu.max`` and the service's cgroup
is weighted by its entitlement (:func:`entitlements`), and the decided CPU sets only replica
counts.  :meth:`LocalActuator.current` reports the decided CPU and the cap.

It also reports what the pool measures so the gateway can put it into the scaler's
signals: :meth:`LocalActuator.add_cpu_signals` fills ``ServiceSignals.cpu_seconds_total``
and ``cpu_throttled_seconds_total`` from the replicas' cgroup counters.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping

from gateway.platforms.local.pool import CpuTotals, LocalPool
from scaler.arbiter import fair_shares
from scaler.decision import Decision, ServiceState
from scaler.policy import ScalingPolicy
from scaler.signals import ServiceSignals

log = logging.getLogger(__name__)


def entitlements(budget_cores: float, policies: Mapping[str, ScalingPolicy]) -> dict[str, float]:
    """Each service's entitlement: its share of ``budget_cores`` when every service wants all
    it can use (floors and ``scaling.weight`` included; the engine's ``fair_share``)."""
    if not policies:
        return {}
    shares = fair_shares(budget_cores, list(policies.values()))
    return {name: float(cores) for name, cores in zip(policies, shares, strict=True)}


class LocalActuator:
    """Applies decisions to a :class:`LocalPool`.

    With ``policies``, every service starts at its ``min_replicas`` with ``cpu.request``
    (or ``cpu.min``) cores per replica until the first decision arrives, each replica is
    capped at its service's ``cpu.max`` when the pool enforces CPU as a share, and each
    service is entitled to its fair share of the pool's budget (:func:`entitlements`) until
    the pool is told otherwise (:meth:`LocalPool.set_entitlements`).
    """

    def __init__(self, pool: LocalPool, policies: Mapping[str, ScalingPolicy] | None = None):
        self.pool = pool
        self._unknown_logged: set[str] = set()
        policies = policies or {}
        if pool.total_cpu_cores is not None:
            pool.set_entitlements(
                {
                    name: cores
                    for name, cores in entitlements(pool.total_cpu_cores, policies).items()
                    if name in pool.services
                }
            )
        for name, policy in policies.items():
            if name in pool.services:
                pool.set_cpu_cap(name, policy.cpu.max)
                pool.scale(name, policy.min_replicas, policy.cpu.initial_cores)

    def __repr__(self) -> str:
        return f"LocalActuator({self.pool!r})"

    async def apply(self, decisions: Mapping[str, Decision]) -> None:
        """Shrinking CPU first, then growing it: reclaimed CPU is freed before it is lent
        (limit enforcement; with share only the replica counts change cgroups)."""
        todo: list[tuple[str, Decision]] = []
        for name, decision in decisions.items():
            if name not in self.pool.services:
                if name not in self._unknown_logged:
                    self._unknown_logged.add(name)
                    log.warning("decision for %r, which the local pool does not run: ignored", name)
                continue
            if not decision.frozen:
                todo.append((name, decision))
        current = {n: s.cpu_per_replica_cores for n, s in self.pool.statuses().items()}
        todo.sort(key=lambda nd: nd[1].cpu_per_replica_cores - (current[nd[0]] or 0.0))
        for name, decision in todo:
            cores = decision.cpu_per_replica_cores
            if cores > 0:
                self.pool.set_cpu(name, cores)
            elif decision.replicas > 0:
                log.warning("%s: decision without CPU per replica (%r): CPU unchanged", name, cores)
            self.pool.set_replicas(name, decision.replicas)

    async def current(self) -> Mapping[str, ServiceState]:
        out = {}
        for name, status in self.pool.statuses().items():
            out[name] = ServiceState(
                service=name,
                replicas=status.desired,
                ready_replicas=status.ready,
                cpu_per_replica_cores=status.cpu_per_replica_cores or 0.0,
                cpu_limits_applied=status.cpu_applied,
                cpu_cap_per_replica_cores=status.cpu_cap_per_replica_cores,
            )
        return out

    def cpu_totals(self) -> dict[str, CpuTotals]:
        """Per service: CPU seconds used and seconds throttled, from the cgroups (monotonic)."""
        return {name: self.pool.cpu_totals(name) for name in self.pool.services}

    def add_cpu_signals(self, signals: Mapping[str, ServiceSignals]) -> dict[str, ServiceSignals]:
        """The same snapshots with the measured CPU figures filled in (where measured)."""
        out = dict(signals)
        for name, sig in signals.items():
            if name not in self.pool.services:
                continue
            totals = self.pool.cpu_totals(name)
            if totals.usage_s is None and totals.throttled_s is None:
                continue
            out[name] = dataclasses.replace(
                sig,
                cpu_seconds_total=totals.usage_s,
                cpu_throttled_seconds_total=totals.throttled_s,
            )
        return out
