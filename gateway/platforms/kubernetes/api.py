"""The one module that talks to the Kubernetes API (through the official ``kubernetes`` client).

Everything else in Sluice sees the plain frozen dataclasses and the small exception tree of
:mod:`gateway.platforms.kubernetes.model`.  The client
is synchronous, so:

* single calls run in a bounded thread pool (``max_concurrency`` threads) via
  ``loop.run_in_executor`` and never block the event loop;
* each watch (:class:`Reflector`) owns one thread that runs list+watch with resourceVersion,
  resumes from the last seen resourceVersion after a disconnect or a server-side timeout,
  relists on 410 Gone, backs off exponentially on errors (no busy loop), and hands whole
  snapshots to the event loop through ``call_soon_threadsafe``.

``RBAC_RULES`` lists exactly the (apiGroup, resource, verbs) this module uses; a test records
the requests a fake API server receives and compares them with it.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import json
import logging
import random
import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Generic, Literal, TypeVar

import kubernetes
import urllib3
from kubernetes import client as k8s

from gateway.platforms.kubernetes import crd
from gateway.platforms.kubernetes.model import (
    BY_STATUS,
    TLS_SECRET_TYPE,
    ContainerResources,
    EndpointSlice,
    Gone,
    Ingress,
    KubeError,
    Lease,
    Node,
    NotFound,
    ObjectRef,
    Pod,
    PodMetrics,
    PolicyObject,
    Scale,
    Secret,
    Service,
    WorkloadKind,
    endpoint_slice_from_json,
    ingress_from_json,
    lease_from_json,
    microtime,
    node_from_json,
    pod_from_json,
    pod_metrics_from_json,
    policy_object_from_json,
    secret_from_json,
    service_from_json,
    workload_from_json,
)

log = logging.getLogger(__name__)

MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
EVENT_AGGREGATION_S = 600.0
"""A repeated Event within this long updates the first one's count (client-go: 10 min)."""
EVENT_CACHE_SIZE = 4096
METRICS_GROUP, METRICS_VERSION = "metrics.k8s.io", "v1beta1"
FIELD_MANAGER = "sluice"
"""``fieldManager`` of every write: ``managedFields`` name Sluice, not the client library."""


@dataclass(frozen=True, slots=True)
class RbacRule:
    api_group: str
    """'' is the core group."""
    resource: str
    """``plural`` or ``plural/subresource``."""
    verbs: tuple[str, ...]


RBAC_RULES: tuple[RbacRule, ...] = (
    RbacRule("networking.k8s.io", "ingresses", ("list", "watch")),
    RbacRule("networking.k8s.io", "ingresses/status", ("patch",)),
    RbacRule("discovery.k8s.io", "endpointslices", ("list", "watch")),
    RbacRule("", "services", ("get",)),
    RbacRule("", "secrets", ("get", "list", "watch")),
    RbacRule("", "pods", ("list", "watch")),
    RbacRule("", "nodes", ("list", "watch")),
    RbacRule("", "pods/resize", ("patch",)),
    RbacRule("", "events", ("create", "patch")),
    RbacRule("apps", "deployments", ("list", "watch")),
    RbacRule("apps", "statefulsets", ("list", "watch")),
    RbacRule("apps", "deployments/scale", ("get", "patch")),
    RbacRule("apps", "statefulsets/scale", ("get", "patch")),
    RbacRule("coordination.k8s.io", "leases", ("get", "create", "update")),
    RbacRule("metrics.k8s.io", "pods", ("list",)),
    RbacRule("sluice.io", "scalingpolicies", ("get", "list", "watch")),
    RbacRule("sluice.io", "scalingpolicies/status", ("update",)),
)
"""Exactly what Sluice asks of the API server (the Helm chart's Role/ClusterRole)."""


def _translate(e: Exception) -> KubeError:
    if isinstance(e, k8s.ApiException):
        status = int(e.status or 0)
        reason, message = str(e.reason or ""), str(e.body or "")
        with contextlib.suppress(ValueError, TypeError):
            body = json.loads(e.body or "")
            reason, message = body.get("reason", reason), body.get("message", message)
        return BY_STATUS.get(status, KubeError)(status, reason, message)
    return KubeError(0, type(e).__name__, str(e))


# ---- the client --------------------------------------------------------------------------------

T = TypeVar("T")


def load_api_client(kubeconfig: str | None = None, host: str | None = None) -> Any:
    """In-cluster config when running in a pod, else the kubeconfig (``kubeconfig`` or the
    default location); ``host`` (tests) talks plain HTTP to that URL with no credentials."""
    cfg = k8s.Configuration()
    if host is not None:
        cfg.host = host
    elif kubeconfig is None:
        try:
            kubernetes.config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
        except kubernetes.config.ConfigException:
            kubernetes.config.load_kube_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
    else:
        kubernetes.config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)  # type: ignore[no-untyped-call]
    return k8s.ApiClient(cfg)


class KubeApi:
    """Every Kubernetes call Sluice makes, as coroutines returning plain data."""

    def __init__(
        self, api_client: Any, max_concurrency: int = 4, request_timeout_s: float = 10.0
    ) -> None:
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
        self.client = api_client
        self.request_timeout_s = request_timeout_s
        self._pool = ThreadPoolExecutor(max_concurrency, thread_name_prefix="kubeapi")
        self.core = k8s.CoreV1Api(api_client)
        self.apps = k8s.AppsV1Api(api_client)
        self.networking = k8s.NetworkingV1Api(api_client)
        self.discovery = k8s.DiscoveryV1Api(api_client)
        self.coordination = k8s.CoordinationV1Api(api_client)
        self.custom = k8s.CustomObjectsApi(api_client)
        self._reflectors: list[Reflector[Any]] = []
        self._events: dict[tuple[str, ...], tuple[str, int, float]] = {}
        """Recent Events: (object, type, reason, message) -> (name, count, first seen)."""

    @classmethod
    def connect(
        cls, kubeconfig: str | None = None, host: str | None = None, max_concurrency: int = 4
    ) -> KubeApi:
        return cls(load_api_client(kubeconfig, host), max_concurrency)

    def __repr__(self) -> str:
        return f"KubeApi(host={self.client.configuration.host!r}, watches={len(self._reflectors)})"

    async def close(self) -> None:
        for r in self._reflectors:
            r.stop()
        await asyncio.get_running_loop().run_in_executor(None, self._join_all)
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.client.close()

    def _join_all(self) -> None:
        for r in self._reflectors:
            r.join()

    async def _call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        kwargs.setdefault("_request_timeout", self.request_timeout_s)
        call = functools.partial(fn, *args, **kwargs)
        try:
            return await asyncio.get_running_loop().run_in_executor(self._pool, call)
        except (k8s.ApiException, urllib3.exceptions.HTTPError, OSError) as e:
            raise _translate(e) from None

    def _plain(self, obj: Any) -> dict[str, Any]:
        out: dict[str, Any] = self.client.sanitize_for_serialization(obj)
        return out

    # ---- watches ----

    def watch_ingresses(self, namespace: str | None = None) -> Reflector[Ingress]:
        if namespace is None:
            lister: Callable[..., Any] = self.networking.list_ingress_for_all_namespaces
        else:
            lister = functools.partial(self.networking.list_namespaced_ingress, namespace)
        return self._reflector("ingresses", lister, ingress_from_json, None)

    def watch_endpoint_slices(
        self, namespace: str | None = None, label_selector: str | None = None
    ) -> Reflector[EndpointSlice]:
        if namespace is None:
            lister: Callable[..., Any] = self.discovery.list_endpoint_slice_for_all_namespaces
        else:
            lister = functools.partial(self.discovery.list_namespaced_endpoint_slice, namespace)
        return self._reflector("endpointslices", lister, endpoint_slice_from_json, label_selector)

    def watch_workloads(self, kind: WorkloadKind, namespace: str | None = None) -> Reflector[Scale]:
        """Deployments or StatefulSets, each as its ``/scale`` would show it."""
        every: Callable[..., Any]
        one: Callable[..., Any]
        if kind == "Deployment":
            every, one = (
                self.apps.list_deployment_for_all_namespaces,
                self.apps.list_namespaced_deployment,
            )
        else:
            every, one = (
                self.apps.list_stateful_set_for_all_namespaces,
                self.apps.list_namespaced_stateful_set,
            )
        lister = every if namespace is None else functools.partial(one, namespace)
        convert = functools.partial(workload_from_json, kind=kind)
        return self._reflector(f"{kind.lower()}s", lister, convert, None)

    def watch_pods(self, namespace: str | None = None) -> Reflector[Pod]:
        if namespace is None:
            lister: Callable[..., Any] = self.core.list_pod_for_all_namespaces
        else:
            lister = functools.partial(self.core.list_namespaced_pod, namespace)
        return self._reflector("pods", lister, pod_from_json, None)

    def watch_tls_secrets(self, namespace: str | None = None) -> Reflector[Secret]:
        """Secrets of type ``kubernetes.io/tls`` only (a field selector: the API server sends
        no other Secret, so none is held in memory); the type cannot change after creation."""
        every: Callable[..., Any] = self.core.list_secret_for_all_namespaces
        if namespace is not None:
            every = functools.partial(self.core.list_namespaced_secret, namespace)
        lister = functools.partial(every, field_selector=f"type={TLS_SECRET_TYPE}")
        return self._reflector("secrets", lister, secret_from_json, None)

    def watch_nodes(self) -> Reflector[Node]:
        """Every node (cluster-scoped), for ``budget.cpu: auto``."""
        return self._reflector("nodes", self.core.list_node, node_from_json, None)

    def watch_scaling_policies(self, namespace: str | None = None) -> Reflector[PolicyObject]:
        """``ScalingPolicy`` objects (``sluice.io/v1alpha1``)."""
        if namespace is None:
            lister: Callable[..., Any] = functools.partial(
                self.custom.list_cluster_custom_object, crd.GROUP, crd.VERSION, crd.PLURAL
            )
        else:
            lister = functools.partial(
                self.custom.list_namespaced_custom_object,
                crd.GROUP,
                crd.VERSION,
                namespace,
                crd.PLURAL,
            )
        return self._reflector(crd.PLURAL, lister, policy_object_from_json, None)

    def _reflector(
        self,
        what: str,
        lister: Callable[..., Any],
        convert: Callable[[Mapping[str, Any]], T],
        label_selector: str | None,
    ) -> Reflector[T]:
        r = Reflector(what, lister, convert, label_selector)
        self._reflectors.append(r)
        return r

    # ---- single calls ----

    async def get_service(self, namespace: str, name: str) -> Service:
        obj = await self._call(self.core.read_namespaced_service, name, namespace)
        return service_from_json(self._plain(obj))

    async def get_secret(self, namespace: str, name: str) -> Secret:
        """One Secret (to tell a missing one from one of another type than the watch's)."""
        obj = await self._call(self.core.read_namespaced_secret, name, namespace)
        return secret_from_json(self._plain(obj))

    async def list_pod_metrics(
        self, namespace: str, label_selector: str | None = None
    ) -> list[PodMetrics]:
        """``metrics.k8s.io/v1beta1`` PodMetrics of ``namespace`` (metrics-server): NotFound
        when the API is not served (no metrics-server, or its APIService is not registered);
        a pod metrics-server has not measured yet is absent."""

        def fetch(**call: Any) -> list[PodMetrics]:  # in the pool: parsing too (2,000 pods)
            if label_selector is not None:
                call["label_selector"] = label_selector
            obj = self.custom.list_namespaced_custom_object(
                METRICS_GROUP, METRICS_VERSION, namespace, "pods", **call
            )
            items = obj.get("items") if isinstance(obj, dict) else None
            return [pod_metrics_from_json(i) for i in items or []]

        return await self._call(fetch)

    async def patch_ingress_status(
        self, namespace: str, name: str, addresses: list[str]
    ) -> Ingress:
        entries = [
            {"ip": a} if a.replace(".", "").isdigit() or ":" in a else {"hostname": a}
            for a in addresses
        ]
        body = {"status": {"loadBalancer": {"ingress": entries}}}
        obj = await self._call(
            self.networking.patch_namespaced_ingress_status,
            name,
            namespace,
            body,
            _content_type=MERGE_PATCH,
            field_manager=FIELD_MANAGER,
        )
        return ingress_from_json(self._plain(obj))

    def _scale_fns(self, kind: WorkloadKind) -> tuple[Callable[..., Any], Callable[..., Any]]:
        if kind == "Deployment":
            return (
                self.apps.read_namespaced_deployment_scale,
                self.apps.patch_namespaced_deployment_scale,
            )
        if kind == "StatefulSet":
            return (
                self.apps.read_namespaced_stateful_set_scale,
                self.apps.patch_namespaced_stateful_set_scale,
            )
        raise ValueError(f"cannot scale a {kind}")

    def _scale(self, kind: WorkloadKind, obj: Any) -> Scale:
        d = self._plain(obj)
        meta, spec, status = d.get("metadata") or {}, d.get("spec") or {}, d.get("status") or {}
        return Scale(
            kind,
            meta.get("namespace") or "",
            meta.get("name") or "",
            int(spec.get("replicas") or 0),
            int(status.get("replicas") or 0),
            status.get("selector") or "",
            meta.get("resourceVersion") or "",
        )

    async def read_scale(self, kind: WorkloadKind, namespace: str, name: str) -> Scale:
        read, _ = self._scale_fns(kind)
        return self._scale(kind, await self._call(read, name, namespace))

    async def patch_scale(
        self, kind: WorkloadKind, namespace: str, name: str, replicas: int
    ) -> Scale:
        _, patch = self._scale_fns(kind)
        body = {"spec": {"replicas": replicas}}
        return self._scale(
            kind,
            await self._call(
                patch,
                name,
                namespace,
                body,
                _content_type=MERGE_PATCH,
                field_manager=FIELD_MANAGER,
            ),
        )

    async def list_pods(self, namespace: str, label_selector: str) -> list[Pod]:
        obj = await self._call(
            self.core.list_namespaced_pod, namespace, label_selector=label_selector
        )
        return [pod_from_json(i) for i in self._plain(obj).get("items") or []]

    async def resize_pod(
        self, namespace: str, name: str, containers: Mapping[str, ContainerResources]
    ) -> Pod:
        """Patch ``pods/<name>/resize`` with the given containers' requests/limits."""
        body = {
            "spec": {
                "containers": [
                    {
                        "name": n,
                        "resources": {"requests": dict(c.requests), "limits": dict(c.limits)},
                    }
                    for n, c in containers.items()
                ]
            }
        }
        obj = await self._call(
            self.core.patch_namespaced_pod_resize,
            name,
            namespace,
            body,
            _content_type=STRATEGIC_MERGE_PATCH,
            field_manager=FIELD_MANAGER,
        )
        return pod_from_json(self._plain(obj))

    async def create_event(
        self,
        target: ObjectRef,
        type_: Literal["Normal", "Warning"],
        reason: str,
        message: str,
        component: str = "sluice",
    ) -> None:
        """Record an Event; the same event again (object, type, reason, message) within
        ``EVENT_AGGREGATION_S`` updates the first one's ``count`` and ``lastTimestamp`` (as
        client-go's event correlator does) instead of piling up new objects."""
        now = datetime.now(UTC)
        key = (target.kind, target.namespace, target.name, type_, reason, message[:1024])
        seen = self._events.get(key)
        if seen is not None and time.monotonic() - seen[2] < EVENT_AGGREGATION_S:
            name, count, _ = seen
            body = {
                "count": count + 1,
                "lastTimestamp": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
            }
            try:
                await self._call(
                    self.core.patch_namespaced_event,
                    name,
                    target.namespace,
                    body,
                    _content_type=MERGE_PATCH,
                    field_manager=FIELD_MANAGER,
                )
            except NotFound:
                pass  # expired (events live about an hour): record a new one
            else:
                self._events[key] = (name, count + 1, seen[2])
                return
        name = f"{target.name}.{int(time.time() * 1e9):x}{random.getrandbits(16):04x}"
        event = k8s.CoreV1Event(
            metadata=k8s.V1ObjectMeta(name=name, namespace=target.namespace),
            involved_object=k8s.V1ObjectReference(
                kind=target.kind,
                api_version=target.api_version,
                namespace=target.namespace,
                name=target.name,
                uid=target.uid or None,
            ),
            type=type_,
            reason=reason,
            message=message[:1024],
            source=k8s.V1EventSource(component=component),
            reporting_component=component,
            first_timestamp=now,
            last_timestamp=now,
            count=1,
        )
        await self._call(
            self.core.create_namespaced_event,
            target.namespace,
            event,
            field_manager=FIELD_MANAGER,
        )
        self._events[key] = (name, 1, time.monotonic())
        while len(self._events) > EVENT_CACHE_SIZE:
            self._events.pop(next(iter(self._events)))

    async def get_scaling_policy(self, namespace: str, name: str) -> PolicyObject:
        obj = await self._call(
            self.custom.get_namespaced_custom_object,
            crd.GROUP,
            crd.VERSION,
            namespace,
            crd.PLURAL,
            name,
        )
        return policy_object_from_json(self._plain(obj))

    async def update_scaling_policy_status(
        self, policy: PolicyObject, status: Mapping[str, Any]
    ) -> PolicyObject:
        """PUT ``status`` through the status subresource, with the object's resourceVersion:
        :class:`Conflict` when it changed in between."""
        body = {
            "apiVersion": crd.API_VERSION,
            "kind": crd.KIND,
            "metadata": {
                "name": policy.meta.name,
                "namespace": policy.meta.namespace,
                "resourceVersion": policy.meta.resource_version,
            },
            "spec": dict(policy.spec),
            "status": dict(status),
        }
        obj = await self._call(
            self.custom.replace_namespaced_custom_object_status,
            crd.GROUP,
            crd.VERSION,
            policy.meta.namespace,
            crd.PLURAL,
            policy.meta.name,
            body,
            field_manager=FIELD_MANAGER,
        )
        return policy_object_from_json(self._plain(obj))

    async def get_lease(self, namespace: str, name: str) -> Lease | None:
        try:
            obj = await self._call(self.coordination.read_namespaced_lease, name, namespace)
        except NotFound:
            return None
        return lease_from_json(self._plain(obj))

    def _lease_body(self, lease: Lease) -> Any:
        return k8s.V1Lease(
            metadata=k8s.V1ObjectMeta(
                name=lease.name,
                namespace=lease.namespace,
                resource_version=lease.resource_version or None,
            ),
            spec=k8s.V1LeaseSpec(
                holder_identity=lease.holder_identity,
                lease_duration_seconds=lease.lease_duration_s,
                acquire_time=microtime(lease.acquire_time),
                renew_time=microtime(lease.renew_time),
                lease_transitions=lease.lease_transitions,
            ),
        )

    async def create_lease(self, lease: Lease) -> Lease:
        obj = await self._call(
            self.coordination.create_namespaced_lease,
            lease.namespace,
            self._lease_body(lease),
            field_manager=FIELD_MANAGER,
        )
        return lease_from_json(self._plain(obj))

    async def update_lease(self, lease: Lease) -> Lease:
        """PUT with ``lease.resource_version``: :class:`Conflict` when someone wrote in between."""
        obj = await self._call(
            self.coordination.replace_namespaced_lease,
            lease.name,
            lease.namespace,
            self._lease_body(lease),
            field_manager=FIELD_MANAGER,
        )
        return lease_from_json(self._plain(obj))


# ---- list+watch ------------------------------------------------------------------------------


class Reflector(Generic[T]):
    """Keeps an in-memory copy of one collection with list+watch, in its own thread.

    ``snapshots()`` yields the whole current collection (key ``namespace/name``) after the
    initial list and after every change, coalescing bursts.  Restarts on its own after any
    failure; the last error is in ``last_error`` and counts in ``relists``/``resumes``.
    """

    def __init__(
        self,
        what: str,
        lister: Callable[..., Any],
        convert: Callable[[Mapping[str, Any]], T],
        label_selector: str | None,
        *,
        watch_timeout_s: int = 300,
        backoff_initial_s: float = 0.2,
        backoff_max_s: float = 30.0,
    ) -> None:
        self.what = what
        self._lister = lister
        self._convert = convert
        self._selector = label_selector
        self.watch_timeout_s = watch_timeout_s
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self._lock = threading.Lock()
        self._items: dict[str, T] = {}
        self._synced = False
        self._version = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._resp: Any = None
        self._wakeups: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = []
        self.resource_version: str | None = None
        self.relists = 0
        self.resumes = 0
        self.last_error: str | None = None
        self.backoffs_s: collections.deque[float] = collections.deque(maxlen=32)
        """The most recent waits before retrying (observability, and tests)."""

    def __repr__(self) -> str:
        return (
            f"Reflector({self.what}, items={len(self._items)}, rv={self.resource_version}, "
            f"relists={self.relists}, resumes={self.resumes}, last_error={self.last_error!r})"
        )

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name=f"watch-{self.what}", daemon=True
            )
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        resp = self._resp
        if resp is not None:
            with contextlib.suppress(Exception):
                resp.shutdown()

    def join(self, timeout_s: float = 5.0) -> None:
        if self._thread is not None:
            self._thread.join(timeout_s)

    def items(self) -> dict[str, T]:
        with self._lock:
            return dict(self._items)

    def get(self, key: str) -> T | None:
        """One item by ``namespace/name``."""
        with self._lock:
            return self._items.get(key)

    @property
    def synced(self) -> bool:
        """Whether the first list has arrived (the cache is complete from then on)."""
        return self._synced

    @property
    def version(self) -> int:
        """Grows on every change of the collection (cheap check before copying ``items()``)."""
        return self._version

    async def snapshots(self) -> AsyncIterator[dict[str, T]]:
        """Whole collection after the first list, then after each change (latest state only)."""
        wake = asyncio.Event()
        entry = (asyncio.get_running_loop(), wake)
        with self._lock:
            self._wakeups.append(entry)
            if self._synced:
                wake.set()  # a late consumer gets the current state at once
        self.start()
        seen = 0
        try:
            while True:
                await wake.wait()
                wake.clear()
                with self._lock:
                    if not self._synced or self._version == seen:
                        continue
                    seen, snapshot = self._version, dict(self._items)
                yield snapshot
        finally:
            with self._lock:
                self._wakeups.remove(entry)

    # ---- the thread ----

    def _changed(self) -> None:
        # called with self._lock held
        self._version += 1
        for loop, wake in self._wakeups:
            with contextlib.suppress(RuntimeError):  # loop closed
                loop.call_soon_threadsafe(wake.set)

    def _run(self) -> None:
        """The watch thread: never dies silently (anything unexpected is logged, then retried)."""
        while not self._stop.is_set():
            try:
                self._list_and_watch()
            except Exception:  # supervised thread: log, back off, carry on
                log.exception("watch %s: unexpected failure; restarting", self.what)
                self.last_error = "unexpected failure (see log)"
                self.resource_version = None
                self._back_off(self.backoff_max_s / 4)

    def _list_and_watch(self) -> None:
        backoff = self.backoff_initial_s
        gone_streak = 0
        while not self._stop.is_set():
            started = time.monotonic()
            events = 0
            try:
                if self.resource_version is None:
                    self._list()
                events = self._watch()
                gone_streak = 0
            except (
                KubeError,
                k8s.ApiException,
                urllib3.exceptions.HTTPError,
                OSError,
                ValueError,
            ) as e:
                if self._stop.is_set():
                    break
                err = e if isinstance(e, KubeError) else _translate(e)
                if isinstance(err, Gone):
                    log.info(
                        "watch %s: resourceVersion %s expired (410), relisting",
                        self.what,
                        self.resource_version,
                    )
                    self.resource_version = None
                    gone_streak += 1
                    if gone_streak > 1:  # 410 again right after a relist: do not spin
                        backoff = self._back_off(backoff)
                    continue
                self.last_error = str(err)
                log.warning("watch %s failed (%s); retrying in <= %.1fs", self.what, err, backoff)
                backoff = self._back_off(backoff)
                continue
            if events == 0 and time.monotonic() - started < self.watch_timeout_s / 2:
                # the server ended a watch early with nothing to say: back off, no busy loop
                backoff = self._back_off(backoff)
            else:
                backoff = self.backoff_initial_s
            self.resumes += 1

    def _back_off(self, backoff_s: float) -> float:
        """Wait ``backoff_s`` with jitter (50-100 %), interruptibly; return the next backoff."""
        wait_s = backoff_s * (0.5 + random.random() / 2)
        self.backoffs_s.append(wait_s)
        self._stop.wait(wait_s)
        return min(backoff_s * 2, self.backoff_max_s)

    def _list(self) -> None:
        resp = self._lister(
            label_selector=self._selector, _preload_content=False, _request_timeout=30
        )
        data = json.loads(resp.data)
        items = {}
        for raw in data.get("items") or []:
            meta = raw.get("metadata") or {}
            items[f"{meta.get('namespace', '')}/{meta.get('name')}"] = self._convert(raw)
        with self._lock:
            self._items = items
            self._synced = True
            self.resource_version = (data.get("metadata") or {}).get("resourceVersion")
            self.relists += 1
            self._changed()

    def _watch(self) -> int:
        resp = self._lister(
            label_selector=self._selector,
            watch=True,
            resource_version=self.resource_version,
            allow_watch_bookmarks=True,
            timeout_seconds=self.watch_timeout_s,
            _preload_content=False,
            _request_timeout=(10, self.watch_timeout_s + 30),
        )
        self._resp = resp
        events = 0
        try:
            # stop() sets the flag, then shuts down the response it sees: checking the flag
            # after publishing the response closes the race with a watch being opened (a real
            # API server may stay silent for minutes: no bookmark would wake this thread)
            if self._stop.is_set():
                return events
            buffer = b""
            for chunk in resp.stream(amt=None, decode_content=False):
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    if line.strip():
                        events += 1
                        self._event(json.loads(line))
                if self._stop.is_set():
                    break
        finally:
            self._resp = None
            resp.release_conn()
        return events

    def _event(self, ev: Mapping[str, Any]) -> None:
        kind, obj = ev.get("type"), ev.get("object") or {}
        if kind == "ERROR":
            code = int(obj.get("code") or 0)
            raise BY_STATUS.get(code, KubeError)(
                code, obj.get("reason", ""), obj.get("message", "")
            )
        meta = obj.get("metadata") or {}
        rv = meta.get("resourceVersion")
        if kind == "BOOKMARK":
            self.resource_version = rv or self.resource_version
            return
        key = f"{meta.get('namespace', '')}/{meta.get('name')}"
        with self._lock:
            if kind == "DELETED":
                self._items.pop(key, None)
            elif kind in ("ADDED", "MODIFIED"):
                self._items[key] = self._convert(obj)
            else:
                raise ValueError(f"unknown watch event type {kind!r}")
            self.resource_version = rv or self.resource_version
            self._changed()
