"""``platform: local``: replicas as local processes in cgroups, under one CPU budget.

* the :class:`~gateway.platforms.local.pool.LocalPool` starts every service's replicas (each in
  its own CPU cgroup; the parent cgroup capped at ``budget.cpu``; with ``budget.enforcement:
  limit`` a replica's decided CPU is its quota, with ``share`` a cgroup per service weighted
  by its entitlement, kept in step with the budget in force, holds replicas capped at
  ``cpu.max``); ready replicas are the services' endpoints, and a replica being retired is
  drained (``Gateway.wait_drained``) before its SIGTERM;
* a service with no ready replica holds its requests in its admission queue and wakes the
  scaler at once; the first ready replica gets them;
* the scaler sees the gateway's signals plus the replicas' measured cgroup CPU;
* with ``budget.enforcement: limit`` and ``budget.lending`` a
  :class:`~gateway.platforms.local.lender.QuotaLender` lends the quota of services idle for
  ``budget.lend_after_idle_s`` to the busy ones between ticks (admission's busy/idle edges),
  and the first request of an idle service takes its quota back before it is forwarded.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncIterator, Mapping
from typing import Any

from gateway.dataplane.updates import (
    CertificatesUpdate,
    EndpointUpdate,
    RoutesUpdate,
    routes_from_settings,
)
from gateway.platforms import Gateway
from gateway.platforms.local.actuator import entitlements
from gateway.platforms.local.discovery import LocalParts, local_parts
from gateway.platforms.local.lender import QuotaLender
from gateway.platforms.local.pool import LocalPool
from gateway.platforms.machine import budget_cpu
from gateway.settings import Settings, resolve_enforcement
from scaler.loop import ScalerLoop
from scaler.policy import BudgetCpu, ScalingPolicy, within_floors
from scaler.signals import ServiceSignals

log = logging.getLogger(__name__)


class LocalPlatform:
    """``platform: local``: the pool, its endpoints, measured CPU and lending (one process)."""

    name = "local"

    def __init__(self, settings: Settings, gateway: Gateway) -> None:
        self._gateway = gateway
        settings = resolve_enforcement(settings)
        self._settings = settings
        self._budget = within_floors(budget_cpu(settings.budget), self.policies())
        """The budget in force: ``budget.cpu``, or this machine's cores for ``auto`` (read once:
        the parent cgroup is capped at it)."""
        self.parts: LocalParts = local_parts(
            settings, drain=gateway.wait_drained, budget_cores=self._budget.cores
        )
        self.actuator = self.parts.actuator
        self.lender: QuotaLender | None = None
        """Lends idle services' quotas between ticks (limit enforcement with lending)."""
        self._handed: tuple[float, dict[str, ScalingPolicy]] = (
            self._budget.cores,
            dict(self.policies()),
        )
        """The budget and policies the pool's cap and entitlements were computed from."""

    def __repr__(self) -> str:
        return f"LocalPlatform({self.parts.pool!r})"

    @property
    def pool(self) -> LocalPool:
        return self.parts.pool

    def policies(self) -> Mapping[str, ScalingPolicy]:
        return {name: s.scaling for name, s in self._settings.services.items()}

    def budget_cpu(self) -> BudgetCpu:
        return self._budget

    def signals(self) -> dict[str, ServiceSignals]:
        """The gateway's live signals plus the replicas' measured CPU (cgroup counters)."""
        self.hand_budget()
        return self.parts.actuator.add_cpu_signals(self._gateway.signals())

    def hand_budget(self) -> None:
        """Keep the pool on the budget in force and the policies the engine decides with
        (called before every tick; a tuple compare unless one changed): the parent's cap
        (:meth:`LocalPool.set_total_cpu`) and every service's entitlement, the engine's fair
        share (:meth:`LocalPool.set_entitlements`, the service cgroups' weights with share)."""
        cores, policies = self.budget_cpu().cores, self.policies()
        if (cores, policies) == self._handed:
            return
        self._handed = (cores, dict(policies))
        pool = self.parts.pool
        pool.set_total_cpu(cores)
        pool.set_entitlements(
            {n: c for n, c in entitlements(cores, policies).items() if n in pool.services}
        )

    async def routes(self) -> AsyncIterator[RoutesUpdate]:
        yield routes_from_settings(self._settings)

    async def endpoints(self) -> AsyncIterator[EndpointUpdate]:
        async for update in self.parts.endpoints.updates():
            yield update

    async def certificates(self) -> AsyncIterator[CertificatesUpdate]:
        """None: only the config file's ``tls.certificates``."""
        return
        yield

    def on_busy_change(self, service: str, busy: bool) -> None:
        if self.lender is not None and service in self.lender.policies:
            self.lender.set_busy(service, busy)

    def report(self) -> Mapping[str, Any]:
        """Whether CPU is lent between ticks, who is idle, what is lent, the quota in force;
        with share enforcement each service's entitlement (its cgroup's weight, cores) and
        the CPUs the replicas are pinned to below the whole machine (``pinned_cpus``, None:
        not pinned); and per service how its replicas run (``replicas``: user, memory limit,
        OOM kills)."""
        cgroups = self.parts.pool.cgroups
        pinned = None if cgroups is None or cgroups.pinned is None else list(cgroups.pinned)
        return {
            **lending_report(self.parts.pool, self.lender, self._settings),
            "entitlement_cores": entitlements_in_force(self.parts.pool),
            "pinned_cpus": pinned,
            "replicas": replicas_report(self.parts.pool),
        }

    def holds_at_zero(self, service: str, policy: ScalingPolicy | None) -> bool:
        """Yes, every service: this platform starts its replicas (at start-up, from zero)."""
        return True

    def on_held(self, service: str) -> None:
        """Nothing to do: the scaler runs in this process."""

    async def start(self, scaler: ScalerLoop) -> None:
        await self.parts.pool.start()
        self.lender = start_lending(self._gateway, self.parts.pool, self._settings)

    async def stop(self) -> None:
        if self.lender is not None:
            stop_lending(self._gateway, self.lender)
            self.lender = None
        # The data plane has stopped taking requests: replicas stop without waiting to drain.
        await self.parts.pool.close(drain=False)


def start_lending(gateway: Gateway, pool: LocalPool, settings: Settings) -> QuotaLender | None:
    """With ``budget.enforcement: limit``, ``budget.lending`` and shared arbitration (and
    cgroups in use): a :class:`QuotaLender` on the started ``pool``, told by every service's
    admission when the service becomes busy or idle, and by its endpoints when a replica
    does.  None when lending does not apply
    (``arbitration: independent`` is the one-autoscaler-per-service baseline: nothing lent)."""
    budget = settings.budget
    if (
        budget.enforcement != "limit"
        or not budget.lending
        or budget.arbitration != "shared"
        or not pool.cpu_limits_applied
    ):
        return None
    lender = QuotaLender(
        pool,
        {name: s.scaling for name, s in settings.services.items()},
        budget.lend_after_idle_s,
        asyncio.get_running_loop(),
        keep_cores=budget.lend_keep_cores,
        replicas=budget.lend_replicas,
    )
    lender.start()
    for name, service in gateway.services.items():
        if name in lender.policies:
            admission = service.admission
            admission.watch_busy(functools.partial(lender.set_busy, name))
            lender.set_busy(name, admission.busy)
            if lender.replicas:
                service.endpoints.on_busy = functools.partial(lender.set_replica_busy, name)
                for ep in service.endpoints.endpoints:
                    lender.set_replica_busy(name, ep.address, ep.in_flight > 0)
    log.info(
        "lending idle CPU between ticks after %gs idle (%s)",
        budget.lend_after_idle_s,
        "services and replicas" if lender.replicas else "whole services only",
    )
    return lender


def stop_lending(gateway: Gateway, lender: QuotaLender) -> None:
    """Unhook the admissions and put every quota back to the decided CPU."""
    for name in lender.policies:
        service = gateway.services.get(name)
        if service is not None:
            service.admission.watch_busy(None)
            service.endpoints.on_busy = None
    lender.stop()


def replicas_report(pool: LocalPool) -> dict[str, dict[str, Any]]:
    """Per service: who its replicas run as and where, their memory limit, restarts and OOM
    kills (what ``/api/services``, ``/metrics`` and the dashboard show)."""
    out = {}
    for name, status in pool.statuses().items():
        out[name] = {
            "user": status.user,
            "workdir": status.workdir,
            "refused": status.refused,
            "memory_max_bytes": status.memory_max_bytes,
            "memory_applied": status.memory_applied,
            "restarts_total": status.restarts_total,
            "oom_kills_total": status.oom_kills_total,
            "replicas": [
                {
                    "name": r.name,
                    "phase": r.phase.value,
                    "pid": r.pid,
                    "restarts": r.restarts,
                    "oom_kills": r.oom_kills,
                }
                for r in status.replicas
            ],
        }
    return out


def entitlements_in_force(pool: LocalPool) -> dict[str, float]:
    """Share enforcement: per service whose cgroup has it as weight, its entitlement (cores);
    empty with limit enforcement (nothing enforces an entitlement there)."""
    out = {}
    for name, status in pool.statuses().items():
        cores = status.entitlement_cores
        if status.enforcement == "share" and status.cpu_applied and cores is not None:
            out[name] = cores
    return out


def quotas_in_force(pool: LocalPool) -> dict[str, float]:
    """Per service whose CPU is enforced: the quota per replica in force now (cores)."""
    out = {}
    for name, status in pool.statuses().items():
        if status.cpu_applied and status.quota_in_force_cores is not None:
            out[name] = status.quota_in_force_cores
    return out


def lending_report(
    pool: LocalPool, lender: QuotaLender | None, settings: Settings
) -> dict[str, Any]:
    """The lending part of ``GET /api/decisions``' budget block: whether CPU is lent between
    ticks, the services marked idle, per service the cores lent (negative) or borrowed
    (positive) over all its replicas, and the quota per replica in force."""
    return {
        "lending": lender is not None,
        "lend_after_idle_s": settings.budget.lend_after_idle_s,
        "lend_keep_cores": settings.budget.lend_keep_cores,
        "lend_replicas": lender.replicas if lender is not None else False,
        "idle_replicas": (
            {n: sorted(a) for n, a in lender.idle_replicas.items() if a}
            if lender is not None
            else {}
        ),
        "idle": sorted(lender.idle) if lender is not None else [],
        "lent_cores": lender.lent_cores() if lender is not None else {},
        "quota_in_force_cores": quotas_in_force(pool),
    }
