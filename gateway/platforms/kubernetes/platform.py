"""``platform: kubernetes``: Ingress routes, EndpointSlice endpoints, Lease leadership, peer signals.

:class:`KubernetesControl` owns the pieces: the API client (:mod:`gateway.platforms.kubernetes.api`),
the Ingress/EndpointSlice discovery, the Lease leader elector (running), the leader-gated
actuator and the signals merged from every gateway replica. :class:`KubernetesPlatform` is the
:class:`~gateway.platforms.Platform` the composition root builds its one scaler loop from.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from types import TracebackType
from typing import Any

import httpx

from gateway.dataplane.updates import CertificatesUpdate, EndpointUpdate, RoutesUpdate
from gateway.platforms import Gateway
from gateway.platforms.kubernetes.actuator import KubernetesActuator
from gateway.platforms.kubernetes.api import KubeApi
from gateway.platforms.kubernetes.cache import WorkloadCache
from gateway.platforms.kubernetes.capacity import ClusterCapacity
from gateway.platforms.kubernetes.discovery import KubernetesDiscovery, default_identity
from gateway.platforms.kubernetes.leader import LeaderElector
from gateway.platforms.kubernetes.peers import PeerSignals
from gateway.platforms.kubernetes.pod_metrics import PodMetricsSource
from gateway.platforms.kubernetes.policy_status import PolicyStatusWriter
from gateway.platforms.kubernetes.wake import LeaderWake
from gateway.settings import Settings, resolve_enforcement
from scaler.loop import ScalerLoop
from scaler.policy import BudgetCpu, ScalingPolicy
from scaler.signals import ServiceSignals

log = logging.getLogger(__name__)


class KubernetesControl:
    """API client + discovery + running leader election + gated actuator + merged signals.

    ``async with KubernetesControl(settings, http) as k8s:`` then feed the gateway with
    ``k8s.discovery.routes()`` / ``.updates()``, the scaler loop with ``await k8s.signals(now)``,
    ``k8s.discovery.policies()``, ``k8s.actuator``.  Only the Lease holder gets signals and
    actuates; on exit the Lease is released, the watches stop and the client closes.
    """

    def __init__(
        self,
        settings: Settings,
        http: httpx.AsyncClient,
        api: KubeApi | None = None,
        clock: Callable[[], float] | None = None,
        own_signals: Callable[[float], dict[str, ServiceSignals]] | None = None,
    ) -> None:
        settings = resolve_enforcement(settings)
        cfg = settings.kubernetes
        self.api = api or KubeApi.connect(cfg.kubeconfig, max_concurrency=cfg.api_max_concurrency)
        self.discovery = KubernetesDiscovery(self.api, settings)
        self.elector = LeaderElector(
            self.api,
            cfg.lease.namespace,
            cfg.lease.name,
            cfg.identity or default_identity(),
            lease_duration_s=cfg.lease.duration_s,
            renew_deadline_s=cfg.lease.renew_deadline_s,
            retry_period_s=cfg.lease.retry_period_s,
            clock=clock,
        )
        self.discovery.is_leader = self.elector.is_leader
        self.cache = WorkloadCache(self.api, cfg.namespaces)
        self.actuator = KubernetesActuator(
            self.api,
            self.discovery.workloads,
            leader=self.elector,
            enforcement=settings.budget.rule,
            cpu_max=self._cpu_max,
            cache=self.cache,
        )
        token = settings.admin.token.get_secret_value() if settings.admin.token else None
        self.capacity: ClusterCapacity | None = None
        """``budget.cpu: auto``: the nodes' CPU left for the managed workloads, from watches."""
        if settings.budget.cpu == "auto":
            self.capacity = ClusterCapacity(
                self.api, self.cache, self.discovery.workloads, settings.budget.reserved
            )
        self.pod_metrics = PodMetricsSource(
            self.api,
            self.cache,
            self.discovery.workloads,
            self.cpu_measured_services,
            interval_s=cfg.pod_metrics_interval_s,
            is_leader=self.elector.is_leader,
        )
        """Every managed service's CPU use: metrics.k8s.io PodMetrics, polled by the leader."""
        self._pod_metrics_task: asyncio.Task[None] | None = None
        self.peer_signals = PeerSignals(
            http, self.discovery.peer_admin_addresses, cfg.peer_timeout_s, token
        )
        self.leader_wake = LeaderWake(
            http,
            leads=self.elector.is_leader,
            holder=self.elector.holder,
            address_of=self.discovery.peer_admin_address_of,
            peers=self.discovery.peer_admin_addresses,
            timeout_s=cfg.peer_timeout_s,
            admin_token=token,
            clock=clock,
        )
        """A request a follower holds at zero, told to the leader at once."""
        self._elector_task: asyncio.Task[None] | None = None
        self.own_signals = own_signals
        self.signal_source = "peers"
        """Where the leader's signals come from: ``peers``, ``own`` or ``none`` (frozen)."""
        self._peer_ever_answered = False
        self._source_why = ""

    def __repr__(self) -> str:
        return f"KubernetesControl({self.discovery!r}, {self.elector!r})"

    def _cpu_max(self) -> dict[str, float]:
        """Each service's ``scaling.cpu.max``: the pods' CPU limit with share enforcement."""
        return {name: p.cpu.max for name, p in self.discovery.policies().items()}

    def cpu_measured_services(self) -> list[str]:
        """The services whose CPU use is measured from PodMetrics: every managed one.  Those
        scaled on CPU utilisation need it for their metric; for the others it is what the
        scaler sizes CPU from and starts replicas into idle CPU on (without it, a service's
        demand comes from its concurrency alone: the suite's ``--platform kubernetes`` run
        measures the difference)."""
        return sorted(self.discovery.policies())

    async def signals(self, now: float | None = None) -> dict[str, ServiceSignals]:
        """Signals merged from every gateway replica when leading, with each service's CPU use
        as metrics.k8s.io measures it; {} otherwise (frozen).

        ``now`` defaults to the event loop's clock, so this is a ``ScalerLoop`` signals
        provider as it stands."""
        return self.pod_metrics.add_cpu_signals(await self._merged(now))

    async def _merged(self, now: float | None) -> dict[str, ServiceSignals]:
        if not self.elector.is_leader():
            return {}
        at = asyncio.get_running_loop().time() if now is None else now
        await self.discovery.report_problems()  # what a previous leader had not recorded
        if not self.discovery.peer_admin_addresses():
            return self._own(
                at,
                "no gateway replica found in the EndpointSlices of "
                f"{self._gateway_service()} (one replica, or running outside the cluster)",
            )
        merged, report = await self.peer_signals.collect(at)
        if report.answered:
            self._peer_ever_answered = True
            self._source("peers", "signals merged from the gateway replicas")
            return merged
        if not self._peer_ever_answered:
            return self._own(
                at,
                f"none of the {len(report.failed)} gateway replicas found has ever answered "
                "(running outside the cluster network?)",
            )
        self._source("none", "no peer answered this tick; scaling is frozen")
        return {}

    def _gateway_service(self) -> str:
        gw = self.discovery.config.gateway_service
        return f"{gw.namespace}/{gw.name}"

    def _own(self, at: float, why: str) -> dict[str, ServiceSignals]:
        if self.own_signals is None:
            self._source("none", f"{why}; no own signals to scale on, scaling is frozen")
            return {}
        self._source("own", f"{why}: scaling on this replica's own signals")
        return self.own_signals(at)

    def _source(self, source: str, why: str) -> None:
        """Log where the signals come from whenever that changes."""
        if source != self.signal_source or (source != "peers" and why != self._source_why):
            (log.info if source == "peers" else log.warning)("signals: %s", why)
        self.signal_source, self._source_why = source, why

    async def __aenter__(self) -> KubernetesControl:
        await self.discovery.__aenter__()
        self.cache.start()
        if self.capacity is not None:
            self.capacity.start()

        async def elect() -> None:
            while True:
                try:
                    await self.elector.run()
                except asyncio.CancelledError:
                    raise
                except Exception:
                    log.exception("leader election failed; restarting in 1s")
                    await asyncio.sleep(1.0)

        async def poll_metrics() -> None:
            while True:
                try:
                    await self.pod_metrics.run()
                except asyncio.CancelledError:
                    raise
                except Exception:
                    log.exception("metrics.k8s.io polling failed; restarting in 1s")
                    await asyncio.sleep(1.0)

        self._elector_task = asyncio.create_task(elect(), name="kube-leader-election")
        self._pod_metrics_task = asyncio.create_task(poll_metrics(), name="kube-pod-metrics")
        return self

    async def __aexit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        for task in (self._pod_metrics_task, self._elector_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        await self.leader_wake.close()
        await self.discovery.__aexit__(t, e, tb)
        await self.api.close()


class KubernetesPlatform:
    """``platform: kubernetes`` for one gateway process: routes from Ingresses, endpoints from
    EndpointSlices; the leader scales on the signals merged from every gateway replica,
    followers see ``{}`` (frozen) and write nothing."""

    name = "kubernetes"

    def __init__(self, settings: Settings, gateway: Gateway, *, api: KubeApi | None = None) -> None:
        settings = resolve_enforcement(settings)
        self.settings = settings
        self._gateway = gateway
        self._api = api
        self.http = httpx.AsyncClient()
        self.control = KubernetesControl(settings, self.http, api=api, own_signals=gateway.signals)
        self.actuator = self.control.actuator
        self.status_writer: PolicyStatusWriter | None = None
        """Writes the ScalingPolicy statuses (leader only), once started."""
        self._status_task: asyncio.Task[None] | None = None

    def __repr__(self) -> str:
        return f"KubernetesPlatform({self.control!r})"

    def policies(self) -> dict[str, ScalingPolicy]:
        """The config file's services, plus those with a policy from Ingress annotations."""
        out = {name: s.scaling for name, s in self.settings.services.items()}
        for name, policy in self.control.discovery.policies().items():
            out.setdefault(name, policy)
        return out

    def budget_cpu(self) -> BudgetCpu:
        """``budget.cpu``, or for ``auto`` the cluster's CPU left for the managed workloads."""
        fixed = self.settings.budget.fixed()
        if fixed is not None or self.control.capacity is None:
            return fixed or BudgetCpu(0.0, "auto: not measured")
        return self.control.capacity.budget_cpu()

    async def signals(self) -> dict[str, ServiceSignals]:
        return await self.control.signals()

    def routes(self) -> AsyncIterator[RoutesUpdate]:
        return self.control.discovery.routes()

    def endpoints(self) -> AsyncIterator[EndpointUpdate]:
        return self.control.discovery.updates()

    async def certificates(self) -> AsyncIterator[CertificatesUpdate]:
        """The Ingresses' TLS Secrets (with a TLS listener configured)."""
        tls = self.control.discovery.tls
        if tls is None:
            return
        async for update in tls.certificates():
            yield update

    def on_busy_change(self, service: str, busy: bool) -> None:
        pass

    def holds_at_zero(self, service: str, policy: ScalingPolicy | None) -> bool:
        """The services whose policy allows zero replicas (``min_replicas: 0``): Sluice may
        have scaled them to zero, so a request waits for the replica it wakes, as Knative's
        activator holds it.  Any other service without a ready endpoint has pods that are
        failing or not ready, and its requests get 503 no-endpoints at once."""
        return policy is not None and policy.min_replicas == 0

    def on_held(self, service: str) -> None:
        """On a follower, the leader is told at once (``POST /api/wake/<service>``)."""
        self.control.leader_wake.held(service)

    def report(self) -> Mapping[str, Any]:
        out: dict[str, Any] = {
            "lending": False,
            "leader": self.control.elector.is_leader(),
            "signals": self.control.signal_source,
        }
        tls = self.control.discovery.tls
        if tls is not None:
            out["tls"] = tls.report()
        if self.control.cpu_measured_services():
            out["pod_metrics"] = self.control.pod_metrics.report()
        return out

    def _status_writer(self, scaler: ScalerLoop) -> PolicyStatusWriter:
        control, discovery = self.control, self.control.discovery

        def replicas(service: str) -> int | None:
            workload = discovery.workloads().get(service)
            scale = None if workload is None else control.cache.scale(workload)
            return None if scale is None else scale.status_replicas

        def fair_share(service: str) -> float | None:
            share = getattr(scaler.engine, "fair_share", None)
            try:
                return None if share is None else float(share(service))
            except KeyError:
                return None

        def budget() -> str:
            b = self.budget_cpu()
            return f"{b.cores:g} cores ({b.source})"

        return PolicyStatusWriter(
            control.api,
            objects=discovery.policy_objects_by_key,
            verdicts=lambda: discovery.policy_objects.verdicts,
            decisions=lambda: scaler.last,
            replicas=replicas,
            fair_share=fair_share,
            budget=budget,
            policy=lambda service: discovery.policies().get(service),
            is_leader=control.elector.is_leader,
        )

    async def start(self, scaler: ScalerLoop) -> None:
        budget = self.settings.budget
        if budget.enforcement == "limit" and budget.lending:
            log.info(
                "budget.lending: pods are resized at ticks only on Kubernetes (a resize is an "
                "API round trip); idle CPU is lent between ticks on the local platform"
            )
        await self.control.__aenter__()
        if self.settings.kubernetes.scaling_policies:
            self.status_writer = self._status_writer(scaler)
            self._status_task = asyncio.create_task(
                self.status_writer.run(), name="kube-scalingpolicy-status"
            )

    async def stop(self) -> None:
        if self._status_task is not None:
            self._status_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._status_task
            self._status_task = None
        await self.control.__aexit__(None, None, None)
        await self.http.aclose()
