"""``platform: kubernetes`` inside ``sluice run``: discovery, leadership, signals, scaling.

:class:`KubernetesPlatform` owns the pieces: the API client (:mod:`gateway.platforms.kubernetes.api`), the
Ingress/EndpointSlice discovery, the Lease leader elector (running), the leader-gated
actuator and the signals merged from every gateway replica.

:class:`KubernetesRunner` wires them to one gateway :class:`~gateway.app.Runtime`, as
``LocalRunner`` does for ``platform: local``:

* route sets from Ingresses go to ``Runtime.apply_routes``, endpoint sets from EndpointSlices
  to ``Runtime.apply_endpoints``;
* a :class:`~scaler.loop.ScalerLoop` ticks every ``interval_s`` on every replica: the leader
  gets the merged signals and actuates; followers get none, so their engine freezes and their
  actuator (not leading) writes nothing;
* the engine covers the config file's services plus those whose policy comes from Ingress
  annotations; when that set of policies changes, the engine is rebuilt (windows restart).

``stop()`` stops the loop and the feeds, releases the Lease and closes the API client.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING

import httpx

from gateway.admin.decisions import early_wakes
from gateway.platforms.kubernetes.actuator import KubernetesActuator
from gateway.platforms.kubernetes.api import KubeApi
from gateway.platforms.kubernetes.discovery import KubernetesDiscovery, default_identity
from gateway.platforms.kubernetes.leader import LeaderElector
from gateway.platforms.kubernetes.peers import PeerSignals
from gateway.settings import Settings
from gateway.telemetry.scaler import TracedEngine
from scaler.engine import Engine
from scaler.loop import ScalerLoop, TickEngine
from scaler.policy import ScalingPolicy
from scaler.signals import ServiceSignals

if TYPE_CHECKING:
    from opentelemetry.trace import Tracer

    from gateway.app import Runtime

log = logging.getLogger(__name__)


class KubernetesPlatform:
    """API client + discovery + running leader election + gated actuator + merged signals.

    ``async with KubernetesPlatform(settings, http) as k8s:`` then feed the gateway with
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
    ) -> None:
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
        self.actuator = KubernetesActuator(
            self.api,
            self.discovery.workloads,
            leader=self.elector,
            enforcement=settings.budget.enforcement,
            cpu_max=self._cpu_max,
        )
        token = settings.admin.token.get_secret_value() if settings.admin.token else None
        self.peer_signals = PeerSignals(
            http, self.discovery.peer_admin_addresses, cfg.peer_timeout_s, token
        )
        self._elector_task: asyncio.Task[None] | None = None

    def __repr__(self) -> str:
        return f"KubernetesPlatform({self.discovery!r}, {self.elector!r})"

    def _cpu_max(self) -> dict[str, float]:
        """Each service's ``scaling.cpu.max``: the pods' CPU limit with share enforcement."""
        return {name: p.cpu.max for name, p in self.discovery.policies().items()}

    async def signals(self, now: float | None = None) -> dict[str, ServiceSignals]:
        """Signals merged from every gateway replica when leading; {} otherwise (frozen).

        ``now`` defaults to the event loop's clock, so this is a ``ScalerLoop`` signals
        provider as it stands."""
        if not self.elector.is_leader():
            return {}
        at = asyncio.get_running_loop().time() if now is None else now
        merged, _ = await self.peer_signals.collect(at)
        return merged

    async def __aenter__(self) -> KubernetesPlatform:
        await self.discovery.__aenter__()

        async def elect() -> None:
            while True:
                try:
                    await self.elector.run()
                except asyncio.CancelledError:
                    raise
                except Exception:
                    log.exception("leader election failed; restarting in 1s")
                    await asyncio.sleep(1.0)

        self._elector_task = asyncio.create_task(elect(), name="kube-leader-election")
        return self

    async def __aexit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._elector_task is not None:
            self._elector_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._elector_task
        await self.discovery.__aexit__(t, e, tb)
        await self.api.close()


class KubernetesRunner:
    """Runs the Kubernetes platform for one gateway process (start once, stop once)."""

    def __init__(
        self,
        runtime: Runtime,
        settings: Settings,
        *,
        api: KubeApi | None = None,
        interval_s: float = 1.0,
        tracer: Tracer | None = None,
    ) -> None:
        self.runtime = runtime
        self.tracer = tracer
        self.settings = settings
        self._api = api
        self.interval_s = interval_s
        self.http: httpx.AsyncClient | None = None
        self.platform: KubernetesPlatform | None = None
        self.loop: ScalerLoop | None = None
        self._policies: dict[str, ScalingPolicy] = {}
        self._tasks: list[asyncio.Task[None]] = []

    def __repr__(self) -> str:
        return f"KubernetesRunner({self.platform!r}, {self.loop!r})"

    def policies(self) -> dict[str, ScalingPolicy]:
        """The config file's services, plus those with a policy from Ingress annotations."""
        out = {name: s.scaling for name, s in self.settings.services.items()}
        if self.platform is not None:
            for name, policy in self.platform.discovery.policies().items():
                out.setdefault(name, policy)
        return out

    def _engine(self) -> TickEngine:
        self._policies = self.policies()
        engine = Engine(self._policies, self.settings.budget)
        return engine if self.tracer is None else TracedEngine(engine, self.tracer)

    async def start(self) -> None:
        budget = self.settings.budget
        if budget.enforcement == "limit" and budget.lending:
            log.info(
                "budget.lending: pods are resized at ticks only on Kubernetes (a resize is an "
                "API round trip); idle CPU is lent between ticks on the local platform"
            )
        self.http = httpx.AsyncClient()
        self.platform = KubernetesPlatform(self.settings, self.http, api=self._api)
        await self.platform.__aenter__()
        self.loop = ScalerLoop(
            self._engine(),
            self.platform.signals,
            self.platform.actuator,
            interval_s=self.interval_s,
            early_tick_gap_s=self.settings.budget.early_tick_gap_s,
        )
        self.loop.on_decisions = early_wakes(
            self.runtime, self.loop, self.settings.budget.early_ticks
        )
        self.runtime.scaler = self.loop  # GET /api/decisions and the decision metrics
        self._tasks = [
            asyncio.create_task(self._feed_routes(), name="kubernetes routes"),
            asyncio.create_task(self._feed_endpoints(), name="kubernetes endpoints"),
            asyncio.create_task(self.loop.run(), name="scaler loop"),
        ]

    async def _feed_routes(self) -> None:
        assert self.platform is not None and self.loop is not None
        async for update in self.platform.discovery.routes():
            try:
                self.runtime.apply_routes(update)
            except Exception:
                log.exception("cannot apply the routes from the Ingresses")
            if self.policies() != self._policies:
                log.info("scaling policies changed (Ingress annotations): rebuilding the engine")
                try:
                    self.loop.engine = self._engine()
                except ValueError:
                    log.exception("the new scaling policies are not usable; keeping the old ones")

    async def _feed_endpoints(self) -> None:
        assert self.platform is not None
        async for update in self.platform.discovery.updates():
            try:
                self.runtime.apply_endpoints(update)
            except Exception:
                log.exception("cannot apply endpoints of %s", update.service)

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        if self.platform is not None:
            await self.platform.__aexit__(None, None, None)
        if self.http is not None:
            await self.http.aclose()
