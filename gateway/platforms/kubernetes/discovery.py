"""platform: kubernetes — routes from Ingresses, endpoints from EndpointSlices, peers, status.

``KubernetesDiscovery`` streams route sets (``routes()``) and endpoint sets (``updates()``).  Used as an async context manager it runs three
watches (through :mod:`gateway.platforms.kubernetes.api`): Ingresses and EndpointSlices in the configured
namespaces (or all), and the gateway's own EndpointSlices (its peers).  Each change rebuilds
the :class:`~gateway.platforms.kubernetes.ingress_rules.IngressTable`; problems (bad paths, bad
``sluice.io/`` annotations) are logged and recorded once, by the leader, as Warning Events on
the Ingress;
the gateway's address is written into each served Ingress's ``status.loadBalancer``.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from types import TracebackType

from gateway.dataplane.updates import EndpointInfo, EndpointUpdate, RoutesUpdate
from gateway.platforms.kubernetes.api import KubeApi, Reflector
from gateway.platforms.kubernetes.ingress_rules import Backend, IngressTable, Problem, build_table
from gateway.platforms.kubernetes.ingress_tls import IngressCertificates
from gateway.platforms.kubernetes.model import (
    EndpointSlice,
    Ingress,
    KubeError,
    ObjectRef,
    PolicyObject,
    Secret,
    SlicePort,
    Workload,
)
from gateway.platforms.kubernetes.policy_objects import PolicyObjects, resolve
from gateway.settings import Settings
from scaler.policy import ScalingPolicy

log = logging.getLogger(__name__)
SERVICE_NAME_LABEL = "kubernetes.io/service-name"
RETRY_S = 2.0
"""Retry period for a backend port that could not be resolved."""


def default_identity() -> str:
    """A gateway replica's identity: $POD_NAME when set (downward API), else the hostname."""
    return os.environ.get("POD_NAME") or socket.gethostname()


def _address(ip: str, port: int) -> str:
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


def endpoints_for(
    backend: Backend, slices: Mapping[str, EndpointSlice], service_ports: Mapping[int, str] | None
) -> tuple[EndpointInfo, ...] | None:
    """The backend's endpoints from its Service's slices; None when the port cannot be resolved
    without the Service's port list (``service_ports``: Service port number -> name)."""
    mine = [
        s
        for s in slices.values()
        if s.meta.namespace == backend.namespace and s.service_name == backend.name
    ]
    out: dict[str, EndpointInfo] = {}
    for s in sorted(mine, key=lambda s: s.meta.name):
        port = _slice_port(backend, s.ports, service_ports)
        if port is None:
            if backend.port_name is None and len(s.ports) > 1 and service_ports is None:
                return None
            continue
        for e in s.endpoints:
            for ip in e.addresses[:1]:  # addresses of one endpoint are fungible: use the first
                addr = _address(ip, port)
                out[addr] = EndpointInfo(addr, e.ready, e.serving, e.terminating)
    return tuple(out[a] for a in sorted(out))


def _slice_port(
    backend: Backend, ports: tuple[SlicePort, ...], service_ports: Mapping[int, str] | None
) -> int | None:
    """EndpointSlice ports carry the Service port's *name*: match by name."""
    if backend.port_name is not None:
        name: str | None = backend.port_name
    elif len(ports) == 1:
        return ports[0].port
    elif (
        service_ports is not None
        and backend.port_number is not None
        and backend.port_number in service_ports
    ):
        name = service_ports[backend.port_number]
    else:
        return None
    return next((p.port for p in ports if p.name == name), None)


class KubernetesDiscovery:
    def __init__(self, api: KubeApi, settings: Settings) -> None:
        self.api = api
        self.settings = settings
        self.config = settings.kubernetes
        namespaces: list[str | None] = list(self.config.namespaces) or [None]
        self._ingress_watches = [api.watch_ingresses(ns) for ns in namespaces]
        self._slice_watches = [api.watch_endpoint_slices(ns) for ns in namespaces]
        gw = self.config.gateway_service
        self._peer_watch = api.watch_endpoint_slices(
            gw.namespace, label_selector=f"{SERVICE_NAME_LABEL}={gw.name}"
        )
        self._policy_watches = (
            [api.watch_scaling_policies(ns) for ns in namespaces]
            if self.config.scaling_policies
            else []
        )
        self._policy_objects: list[dict[str, PolicyObject]] = [{} for _ in self._policy_watches]
        self.tls = (
            IngressCertificates(api, self.config.namespaces, self.config.ingress_class)
            if settings.tls is not None
            else None
        )
        """The Ingresses' TLS Secrets (only with a TLS listener: ``tls`` in the config)."""
        self.policy_objects = PolicyObjects()
        """The ScalingPolicy objects: which are in force, and each one's verdict."""
        self._ingresses: list[dict[str, Ingress]] = [{} for _ in namespaces]
        self._slices: list[dict[str, EndpointSlice]] = [{} for _ in namespaces]
        self._synced_ingresses = [False] * len(namespaces)
        self._synced_slices = [False] * len(namespaces)
        self.table = IngressTable(RoutesUpdate(()))
        self._service_ports: dict[tuple[str, str], dict[int, str]] = {}
        self._peer_slices: dict[str, EndpointSlice] = {}
        self._reported: set[tuple[str, str, str]] = set()
        self._tls_reported: set[tuple[str, str, str]] = set()
        """TLS problems recorded (forgotten once solved: a recurrence is reported again)."""
        self._problems: tuple[tuple[Problem, ...], Mapping[str, Ingress]] = ((), {})
        self._recording = asyncio.Lock()
        """Held while problems are recorded: a caller returns once every problem in force when
        it was called has been recorded, by it or by a concurrent caller."""
        self.is_leader: Callable[[], bool] = lambda: True
        """Only the leader records InvalidIngress Events (the platform sets its elector's)."""
        self._version = 0
        self._changed = asyncio.Condition()
        self._tasks: list[asyncio.Task[None]] = []

    def __repr__(self) -> str:
        return (
            f"KubernetesDiscovery(class={self.config.ingress_class!r}, routes={len(self.table.routes.rules)}, "
            f"services={len(self.table.backends)}, peers={len(self.peer_admin_addresses())})"
        )

    async def __aenter__(self) -> KubernetesDiscovery:
        for i, iw in enumerate(self._ingress_watches):
            self._supervise(f"ingresses[{i}]", functools.partial(self._follow_ingresses, i, iw))
        for i, sw in enumerate(self._slice_watches):
            self._supervise(f"endpointslices[{i}]", functools.partial(self._follow_slices, i, sw))
        self._supervise("peers", self._follow_peers)
        for i, tw in enumerate(self.tls.watches() if self.tls is not None else ()):
            self._supervise(f"secrets[{i}]", functools.partial(self._follow_secrets, i, tw))
        for i, pw in enumerate(self._policy_watches):
            self._supervise(
                f"scalingpolicies[{i}]", functools.partial(self._follow_policies, i, pw)
            )
        return self

    def _supervise(self, name: str, follow: Callable[[], Awaitable[None]]) -> None:
        async def guarded() -> None:
            while True:
                try:
                    await follow()
                except asyncio.CancelledError:
                    raise
                except Exception:
                    log.exception(
                        "kubernetes discovery: %s follower failed; restarting in 1s", name
                    )
                    await asyncio.sleep(1.0)

        self._tasks.append(asyncio.create_task(guarded(), name=f"kube-discovery-{name}"))

    async def __aexit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    # ---- what others read ----

    def policies(self) -> dict[str, ScalingPolicy]:
        """Scaling policy per Sluice service found through Ingresses (config, else annotations)."""
        return dict(self.table.policies)

    def workloads(self) -> dict[str, Workload]:
        return dict(self.table.workloads)

    def _peer_admins(self) -> Iterator[tuple[str | None, str]]:
        """(pod, ``host:port``) of every ready gateway replica's admin server."""
        name = self.config.gateway_service.admin_port_name
        for s in self._peer_slices.values():
            port = next((p.port for p in s.ports if p.name == name), None)
            if port is None:
                continue
            for e in s.endpoints:
                if e.ready and e.addresses:
                    yield e.pod, _address(e.addresses[0], port)

    def peer_admin_addresses(self) -> list[str]:
        """``host:port`` of every ready gateway replica's admin server (this one included)."""
        return sorted({address for _, address in self._peer_admins()})

    def peer_admin_address_of(self, pod: str) -> str | None:
        """``host:port`` of the ready gateway replica whose endpoint names ``pod`` (its
        ``targetRef``), or None when no ready endpoint does."""
        return next((address for p, address in self._peer_admins() if p == pod), None)

    async def routes(self) -> AsyncIterator[RoutesUpdate]:
        """The whole route set after the first sync, then after each change."""
        seen, last = 0, None
        while True:
            seen = await self._wait(seen, lambda: all(self._synced_ingresses))
            if self.table.routes != last:
                last = self.table.routes
                yield last

    async def updates(self) -> AsyncIterator[EndpointUpdate]:
        """Every backend's endpoints after the first sync, then each service whose set changed;
        a service no Ingress references any more gets one empty set (its endpoints drain).

        A backend whose port cannot be resolved now (its Service could not be read) keeps its
        last endpoints and is retried every ``RETRY_S``: an API hiccup never drains a service."""
        seen = 0
        emitted: dict[str, tuple[EndpointInfo, ...]] = {}
        unresolved: set[str] = set()
        while True:
            seen = await self._wait(
                seen,
                lambda: all(self._synced_ingresses) and all(self._synced_slices),
                RETRY_S if unresolved else None,
            )
            slices = {k: v for part in self._slices for k, v in part.items()}
            current: dict[str, tuple[EndpointInfo, ...]] = {}
            unresolved = set()
            for service, backend in self.table.backends.items():
                ports = self._service_ports.get((backend.namespace, backend.name))
                eps = endpoints_for(backend, slices, ports)
                if eps is None:
                    ports = await self._lookup_service_ports(backend)
                    eps = endpoints_for(backend, slices, ports) if ports is not None else None
                if eps is None:
                    unresolved.add(service)
                    continue
                current[service] = eps
            for service in sorted(set(emitted) - set(current) - unresolved):
                del emitted[service]
                yield EndpointUpdate(service, ())
            for service, eps in sorted(current.items()):
                if emitted.get(service) != eps:
                    emitted[service] = eps
                    yield EndpointUpdate(service, eps)

    # ---- internals ----

    async def _wait(
        self, seen: int, ready: Callable[[], bool], timeout_s: float | None = None
    ) -> int:
        """The next version after ``seen`` once ``ready()``; on ``timeout_s``, ``seen`` again."""
        async with self._changed:
            try:
                await asyncio.wait_for(
                    self._changed.wait_for(lambda: self._version > seen and ready()), timeout_s
                )
            except TimeoutError:
                return seen
            return self._version

    async def _bump(self) -> None:
        async with self._changed:
            self._version += 1
            self._changed.notify_all()

    async def _lookup_service_ports(self, backend: Backend) -> dict[int, str] | None:
        try:
            svc = await self.api.get_service(backend.namespace, backend.name)
        except KubeError as e:
            log.warning(
                "service %s: cannot read its ports to match port %s: %s",
                backend.service,
                backend.port_number,
                e,
            )
            return None
        ports = {p.port: p.name for p in svc.ports if p.port is not None}
        self._service_ports[(backend.namespace, backend.name)] = ports
        return ports

    def _rebuild(self) -> list[Ingress]:
        """The table from every Ingress and ScalingPolicy (the config file wins, then the
        ScalingPolicy, then annotations)."""
        everything = [ing for part in self._ingresses for ing in part.values()]
        configured = {n: s.scaling for n, s in self.settings.services.items()}
        objects = [o for part in self._policy_objects for o in part.values()]
        crd = resolve(objects, configured, self.settings.budget)
        self.table = build_table(
            everything,
            self.config.ingress_class,
            self.settings.services,
            self.settings.budget,
            crd=crd,
        )
        self.policy_objects = crd.not_routed(self.table.backends)
        return everything

    async def _follow_ingresses(self, i: int, watch: Reflector[Ingress]) -> None:
        async for snapshot in watch.snapshots():
            self._ingresses[i] = snapshot
            self._synced_ingresses[i] = True
            self._service_ports.clear()
            everything = self._rebuild()
            await self._bump()
            self._problems = (self.table.problems, {ing.meta.key: ing for ing in everything})
            if self.tls is not None:
                await self.tls.set_ingresses(everything)
            await self.report_problems()
            await self._publish_status(everything)

    async def _follow_policies(self, i: int, watch: Reflector[PolicyObject]) -> None:
        async for snapshot in watch.snapshots():
            self._policy_objects[i] = snapshot
            self._rebuild()
            await self._bump()

    def policy_objects_by_key(self) -> dict[str, PolicyObject]:
        """Every ScalingPolicy object seen (``namespace/name``)."""
        return {k: o for part in self._policy_objects for k, o in part.items()}

    async def _follow_slices(self, i: int, watch: Reflector[EndpointSlice]) -> None:
        async for snapshot in watch.snapshots():
            self._slices[i] = snapshot
            self._synced_slices[i] = True
            await self._bump()

    async def _follow_secrets(self, i: int, watch: Reflector[Secret]) -> None:
        assert self.tls is not None
        async for problems_changed in self.tls.follow(i, watch):
            if problems_changed:
                await self.report_problems()

    async def _follow_peers(self) -> None:
        async for snapshot in self._peer_watch.snapshots():
            self._peer_slices = snapshot

    async def report_problems(self) -> None:
        """Log each Ingress problem and record it as one Warning Event (``InvalidIngress``;
        ``TLSCertificate`` for a host served with the default certificate): once per
        (Ingress, problem) for the Ingress's lifetime (a status patch, Sluice's own included,
        does not repeat it; a TLS problem solved and back is reported again), and only on the
        leader; a replica that becomes leader records what was not recorded yet on its next
        call."""
        # forget solved TLS problems now, not after waiting for a concurrent caller: a problem
        # solved and back while that caller records is still reported again
        _, tls, by_key = self._current_problems()
        self._tls_reported &= {_ident(p, by_key) for p in tls}
        async with self._recording:
            if not self.is_leader():
                return
            problems, tls, by_key = self._current_problems()
            for p in (*problems, *tls):
                seen = self._tls_reported if p in tls else self._reported
                if _ident(p, by_key) in seen:
                    continue
                seen.add(_ident(p, by_key))
                log.warning("ingress %s: %s", p.ingress, p.message)
                if (ing := by_key.get(p.ingress)) is None:
                    continue
                ref = ObjectRef(
                    "Ingress",
                    "networking.k8s.io/v1",
                    ing.meta.namespace,
                    ing.meta.name,
                    ing.meta.uid,
                )
                try:
                    await self.api.create_event(ref, "Warning", p.reason, p.message)
                except KubeError as e:
                    log.warning("cannot record an event on ingress %s: %s", p.ingress, e)

    def _current_problems(
        self,
    ) -> tuple[tuple[Problem, ...], tuple[Problem, ...], Mapping[str, Ingress]]:
        """The Ingress problems, the TLS problems, and the Ingresses by key."""
        problems, by_key = self._problems
        return problems, self.tls.resolution.problems if self.tls is not None else (), by_key

    async def _status_addresses(self) -> list[str]:
        if self.config.status_addresses:
            return list(self.config.status_addresses)
        gw = self.config.gateway_service
        try:
            svc = await self.api.get_service(gw.namespace, gw.name)
        except KubeError as e:
            log.warning(
                "gateway service %s/%s: %s; Ingress status not written", gw.namespace, gw.name, e
            )
            return []
        if svc.load_balancer:
            return list(svc.load_balancer)
        return [svc.cluster_ip] if svc.cluster_ip and svc.cluster_ip != "None" else []

    async def _publish_status(self, ingresses: list[Ingress]) -> None:
        served = set(self.table.served)
        stale = [i for i in ingresses if i.meta.key in served]
        if not stale:
            return
        addresses = await self._status_addresses()
        if not addresses:
            return
        for ing in stale:
            if list(ing.load_balancer) == addresses:
                continue
            try:
                await self.api.patch_ingress_status(ing.meta.namespace, ing.meta.name, addresses)
            except KubeError as e:
                log.warning("ingress %s: cannot write status.loadBalancer: %s", ing.meta.key, e)


def _ident(p: Problem, by_key: Mapping[str, Ingress]) -> tuple[str, str, str]:
    """A problem as remembered: (Ingress, its uid, message); a new Ingress of the same name is
    reported afresh."""
    ing = by_key.get(p.ingress)
    return (p.ingress, ing.meta.uid if ing else "", p.message)
