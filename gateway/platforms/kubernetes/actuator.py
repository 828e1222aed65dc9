"""Kubernetes actuator: replicas via ``/scale``, CPU per replica via in-place ``pods/resize``.

* Replicas: a merge patch of the Deployment's (or StatefulSet's) ``/scale`` subresource.
* CPU per replica: the first container of every pod of the workload is resized in place
  through ``pods/<name>/resize`` without changing the pod's QoS class, which the API server
  refuses (422 ``Invalid``: "Pod QOS Class may not change as a result of resizing").
  BestEffort pods and containers with ``resizePolicy`` cpu ``RestartContainer`` are never
  touched.  ``enforcement`` (``budget.enforcement``) says what the decided CPU becomes:

  - ``limit``: the CPU in force.  Guaranteed pods: requests = limits = it; Burstable pods:
    the limit, the request/limit ratio kept;
  - ``share``: the request (the pod's guaranteed CPU: its cgroup weight and what the
    scheduler reserves), the limit being the service's ``cpu.max``, so the pod uses idle
    node CPU up to it.  Only Burstable pods can have requests < limits: a Guaranteed pod
    keeps requests = limits = the decided CPU (as in ``limit``), and this is logged and
    recorded as a ``ResizeLimited`` Warning event once per pod.  A Burstable pod whose
    request would reach its limit while memory requests = limits would become Guaranteed:
    its request stays 1m below the limit.
* A resize counts as applied only when ``status.containerStatuses[].resources`` shows it:
  :meth:`current` reports the smallest CPU in force across the pods, read from status (the
  request with ``share``, the limit else the request with ``limit``), and the smallest limit.
* ``PodResizePending`` with reason ``Infeasible`` or ``Deferred`` (or a pod that cannot be
  resized at all) sets ``ServiceState.resize_blocked`` so the arbiter scales out instead.
* The API server refusing a resize at admission (403 ``Forbidden`` with cause
  ``NodeCapacity``: the node has not enough allocatable CPU; 422 "Pod running on node without
  support for resize") blocks that pod the same way: one ``ResizeBlocked`` Warning event, the
  service's other pods are still resized, and the pod is not tried again before a back-off
  (``REFUSAL_BACKOFF_S``, doubling up to ``REFUSAL_BACKOFF_MAX_S``) has passed.
* With a :class:`~gateway.platforms.kubernetes.cache.WorkloadCache` (the platform always
  passes one), the state is read from watch caches, not requested per tick; a write is made
  only when the cached value differs from the decision and the same write was not already
  made for the object's current resourceVersion (the watch may lag behind our own write).
* Every change is recorded as an Event on the workload with the decision's reasons.
* With a leader elector, nothing is written unless it leads, checked before every write.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Literal, Protocol, TypeAlias

from gateway.platforms.kubernetes.api import KubeApi
from gateway.platforms.kubernetes.cache import WorkloadCache
from gateway.platforms.kubernetes.model import (
    ContainerResources,
    KubeError,
    NotFound,
    Pod,
    Scale,
    Workload,
    format_cpu,
    parse_cpu_cores,
)
from scaler.decision import Decision, ServiceState

log = logging.getLogger(__name__)
BLOCKING_RESIZE_REASONS = ("Infeasible", "Deferred")
_EPSILON_CORES = 0.0005
_MILLI = 0.001
REFUSAL_BACKOFF_S = 30.0
REFUSAL_BACKOFF_MAX_S = 600.0


def resize_refusal(e: KubeError) -> str | None:
    """Why the API server refused a pod resize for good (not a transient error), else None:
    403 with cause ``NodeCapacity`` (or its message), 422 for a node without resize support."""
    text = e.message.lower()
    if e.status == 403 and ("nodecapacity" in text or "enough allocatable" in text):
        return "the node has not enough allocatable CPU (403 NodeCapacity)"
    if e.status == 422 and "without support for resize" in text:
        return "the pod runs on a node without support for resize (422)"
    return None


@dataclass(slots=True)
class _Refusal:
    why: str
    retry_at: float
    backoff_s: float


Enforcement: TypeAlias = Literal["share", "limit"]
"""What the decided CPU per replica is: the pods' request (guaranteed share), or their limit."""


class Leadership(Protocol):
    def is_leader(self) -> bool: ...


def qos_class(containers: tuple[ContainerResources, ...]) -> str:
    """The pod QoS class from its containers' cpu/memory requests and limits."""
    if not any(c.requests or c.limits for c in containers):
        return "BestEffort"
    for c in containers:
        for r in ("cpu", "memory"):
            limit = c.limits.get(r)
            if limit is None or c.requests.get(r, limit) != limit:
                return "Burstable"
    return "Guaranteed"


def cpu_in_force(res: ContainerResources) -> float | None:
    """The CPU a container may use: its limit, else its request."""
    q = res.limits.get("cpu") or res.requests.get("cpu")
    return parse_cpu_cores(q) if q else None


def cpu_request(res: ContainerResources) -> float | None:
    """The CPU a container is guaranteed: its request (the API defaults it to the limit)."""
    q = res.requests.get("cpu") or res.limits.get("cpu")
    return parse_cpu_cores(q) if q else None


def cpu_limit(res: ContainerResources) -> float | None:
    q = res.limits.get("cpu")
    return parse_cpu_cores(q) if q else None


@dataclass(frozen=True, slots=True)
class ResizePlan:
    container: ContainerResources | None
    """The container with its new resources; None when nothing to do or not possible."""
    blocked: str | None = None
    """Why this pod cannot be resized in place (None: it can, or is already there)."""
    limited: str | None = None
    """Share enforcement only: why the plan does not give exactly requests = the decided
    CPU and limits = cpu.max (it is still applied)."""


def plan_resize(
    pod: Pod,
    cores: float,
    enforcement: Enforcement = "limit",
    cap_cores: float | None = None,
) -> ResizePlan:
    """New resources for the pod's first container, keeping the pod's QoS class.

    ``cap_cores`` (share enforcement): the CPU limit to set (``cpu.max``); None keeps the
    container's own limit, if any."""
    if not pod.spec:
        return ResizePlan(None, "pod has no containers")
    qos = qos_class(pod.spec)
    main = pod.spec[0]
    if qos == "BestEffort":
        return ResizePlan(None, "BestEffort pod: giving it CPU would change its QoS class")
    if main.cpu_restart_policy != "NotRequired":
        return ResizePlan(
            None,
            f"container {main.name}: resizePolicy cpu {main.cpu_restart_policy} would restart it",
        )
    req, lim = main.requests.get("cpu"), main.limits.get("cpu")
    if req is None and lim is None:
        return ResizePlan(None, f"container {main.name} has no cpu request or limit to resize")
    if enforcement == "share" and qos != "Guaranteed":
        return _plan_share(pod.spec, cores, cap_cores)
    limited = None
    if enforcement == "share":
        limited = (
            "Guaranteed pod (requests = limits): the QoS class cannot change in place, so "
            "its CPU limit stays equal to its request (the decided CPU), not cpu.max; give the "
            "workload's pods CPU requests < limits (Burstable) to let them use idle CPU"
        )
    current = cpu_in_force(main)
    if current is not None and abs(current - cores) < _EPSILON_CORES:
        return ResizePlan(None, limited=limited)
    new_req, new_lim = dict(main.requests), dict(main.limits)
    if qos == "Guaranteed":
        new_req["cpu"] = new_lim["cpu"] = format_cpu(cores)
    elif lim is not None:
        ratio = parse_cpu_cores(req) / parse_cpu_cores(lim) if req is not None else 1.0
        new_lim["cpu"] = format_cpu(cores)
        if req is not None:
            new_req["cpu"] = format_cpu(cores * ratio)
    else:
        new_req["cpu"] = format_cpu(cores)
    return ResizePlan(
        ContainerResources(main.name, new_req, new_lim, main.cpu_restart_policy), limited=limited
    )


def _plan_share(
    containers: tuple[ContainerResources, ...], cores: float, cap_cores: float | None
) -> ResizePlan:
    """Burstable pod, share enforcement: request = the decided CPU, limit = the cap."""
    main = containers[0]
    cap = cap_cores if cap_cores is not None else cpu_limit(main)
    request = cores if cap is None else min(cores, cap)
    limited = None
    if cap is not None and cap_cores is not None and cores > cap_cores + _EPSILON_CORES:
        limited = (
            f"decided {format_cpu(cores)} is above cpu.max {format_cpu(cap)}: request = cpu.max"
        )
    new_lim = dict(main.limits)
    if cap_cores is not None:
        new_lim["cpu"] = format_cpu(cap_cores)
    new_req = {**main.requests, "cpu": format_cpu(request)}
    shape = (replace(main, requests=new_req, limits=new_lim), *containers[1:])
    if qos_class(shape) != "Burstable":
        # requests = limits for cpu and memory everywhere would make it Guaranteed (refused):
        # keep the request 1m below the limit (or, at the 1m minimum, the limit 1m above).
        if request > 2 * _MILLI - _EPSILON_CORES:
            new_req["cpu"] = format_cpu(request - _MILLI)
        else:
            new_lim["cpu"] = format_cpu(request + _MILLI)
        limited = (
            f"request {new_req['cpu']} kept 1m below the {new_lim['cpu']} limit: "
            "requests = limits would make the Burstable pod Guaranteed (the QoS class cannot "
            "change in place)"
        )
    if _same_cpu(main, new_req, new_lim):
        return ResizePlan(None, limited=limited)
    return ResizePlan(
        ContainerResources(main.name, new_req, new_lim, main.cpu_restart_policy), limited=limited
    )


def _same_cpu(main: ContainerResources, req: dict[str, str], lim: dict[str, str]) -> bool:
    """Whether ``main`` already has these CPU request and limit (as quantities)."""

    def close(a: str | None, b: str | None) -> bool:
        if a is None or b is None:
            return a is b
        return abs(parse_cpu_cores(a) - parse_cpu_cores(b)) < _EPSILON_CORES

    return close(main.requests.get("cpu"), req.get("cpu")) and close(
        main.limits.get("cpu"), lim.get("cpu")
    )


def _shown_in_status(pod: Pod) -> ContainerResources | None:
    """The main container's resources as the kubelet reports them in force (None: not yet)."""
    if not pod.spec:
        return None
    return next((c for c in pod.status if c.name == pod.spec[0].name), None)


def _reason_text(d: Decision) -> str:
    return "; ".join([f"rule {d.rule}", *d.reasons])


class KubernetesActuator:
    """Applies decisions to Deployments/StatefulSets and their pods; reports their state.

    ``enforcement``: see the module docstring; with ``share``, ``cpu_max()`` gives each
    service's ``scaling.cpu.max`` (the limit to set; a service without one keeps its pods'
    own limits)."""

    def __init__(
        self,
        api: KubeApi,
        workloads: Callable[[], Mapping[str, Workload]],
        leader: Leadership | None = None,
        component: str = "sluice",
        *,
        enforcement: Enforcement = "limit",
        cpu_max: Callable[[], Mapping[str, float]] | None = None,
        cache: WorkloadCache | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if enforcement not in ("share", "limit"):
            raise ValueError(f"enforcement must be 'share' or 'limit', got {enforcement!r}")
        self.api = api
        self.workloads = workloads
        self.leader = leader
        self.component = component
        self.enforcement: Enforcement = enforcement
        self.cpu_max = cpu_max or dict
        self.errors: dict[str, str] = {}
        self.limited: dict[str, str] = {}
        """Share enforcement: per pod (``namespace/name``), why it does not get exactly
        requests = the decided CPU and limits = cpu.max (see :class:`ResizePlan`)."""
        self._limited_pods: dict[str, set[str]] = {}
        self._blocked_reported: set[tuple[str, str]] = set()
        self._not_leader_logged = False
        self.cache = cache
        self.clock = clock
        self.refused: dict[str, _Refusal] = {}
        """Pods (``namespace/name``) whose resize the API server refused, until retry_at."""
        self._wrote: dict[str, tuple[str, object]] = {}
        """Per object: (resourceVersion it had when we wrote, what we wrote)."""
        self.writes = 0
        """Writes made (scale and resize patches, events)."""

    def __repr__(self) -> str:
        return (
            f"KubernetesActuator(services={len(self.workloads())}, {self.enforcement}, "
            f"errors={self.errors})"
        )

    def _leads(self) -> bool:
        ok = self.leader is None or self.leader.is_leader()
        if not ok and not self._not_leader_logged:
            log.info("not the leader: decisions are not applied")
        self._not_leader_logged = not ok
        return ok

    async def apply(self, decisions: Mapping[str, Decision]) -> None:
        targets = self.workloads()
        for service, d in sorted(decisions.items()):
            target = targets.get(service)
            if target is None or d.frozen:
                continue
            if not self._leads():
                return
            try:
                await self._apply_one(service, target, d)
                self.errors.pop(service, None)
            except KubeError as e:
                self.errors[service] = str(e)
                log.warning(
                    "%s: cannot apply decision to %s %s/%s: %s",
                    service,
                    target.kind,
                    target.namespace,
                    target.name,
                    e,
                )

    def _cached(self) -> WorkloadCache | None:
        return self.cache if self.cache is not None and self.cache.synced() else None

    async def _read(self, target: Workload) -> tuple[Scale, list[Pod]]:
        """The workload's scale and live pods: from the watch caches once they are synced,
        else from the API (a ``/scale`` read and a pod list)."""
        cache = self._cached()
        if cache is None:
            scale = await self.api.read_scale(target.kind, target.namespace, target.name)
            pods = await self.api.list_pods(target.namespace, scale.selector)
        else:
            found = cache.scale(target)
            if found is None:
                raise NotFound(
                    404, "NotFound", f"{target.kind} {target.namespace}/{target.name} not found"
                )
            scale, pods = found, cache.pods(target.namespace, found.selector)
        return scale, [p for p in pods if not p.deleting]

    def _already_wrote(self, key: str, rv: str, value: object) -> bool:
        """Whether this very write was made while the object (in the cache) was at ``rv``: the
        watch has not shown our write yet, so making it again would be a duplicate."""
        return self._cached() is not None and self._wrote.get(key) == (rv, value)

    def _wrote_now(self, key: str, rv: str, value: object) -> None:
        self._wrote[key] = (rv, value)
        self.writes += 1

    async def _apply_one(self, service: str, target: Workload, d: Decision) -> None:
        scale, pods = await self._read(target)
        scale_key = f"{target.kind}/{target.namespace}/{target.name}"
        if scale.spec_replicas != d.replicas and not self._already_wrote(
            scale_key, scale.resource_version, d.replicas
        ):
            if not self._leads():
                return
            await self.api.patch_scale(target.kind, target.namespace, target.name, d.replicas)
            self._wrote_now(scale_key, scale.resource_version, d.replicas)
            await self._event(
                target,
                "Normal",
                "Scaled",
                f"{service}: replicas {scale.spec_replicas} -> {d.replicas}: {_reason_text(d)}",
            )
        resized = []
        cap = self.cpu_max().get(service) if self.enforcement == "share" else None
        seen: set[str] = set()
        failed: KubeError | None = None
        now = self.clock()
        for pod in pods:
            plan = plan_resize(pod, d.cpu_per_replica_cores, self.enforcement, cap)
            if not self._leads():
                return
            key = await self._report_limited(service, target, pod, plan.limited)
            seen.add(key)
            if plan.container is None:
                continue
            refusal = self.refused.get(key)
            if refusal is not None and now < refusal.retry_at:
                continue  # backing off after a refusal
            if self._already_wrote(f"Pod/{key}", pod.meta.resource_version, plan.container):
                continue
            try:
                await self.api.resize_pod(
                    pod.meta.namespace, pod.meta.name, {plan.container.name: plan.container}
                )
            except KubeError as e:
                why = resize_refusal(e)
                if why is None:
                    failed = failed or e
                    continue
                await self._refused_now(service, target, key, why, before=refusal, now=now)
                continue
            self.refused.pop(key, None)
            self._wrote_now(f"Pod/{key}", pod.meta.resource_version, plan.container)
            resized.append(pod.meta.name)
        for gone in self._limited_pods.get(service, set()) - seen:
            self.limited.pop(gone, None)
            self.refused.pop(gone, None)
            self._wrote.pop(f"Pod/{gone}", None)
        self._limited_pods[service] = seen
        if resized:
            what = (
                f"cpu request per replica -> {format_cpu(d.cpu_per_replica_cores)}"
                + (f" (limit {format_cpu(cap)})" if cap is not None else "")
                if self.enforcement == "share"
                else f"cpu per replica -> {format_cpu(d.cpu_per_replica_cores)}"
            )
            await self._event(
                target,
                "Normal",
                "Resized",
                f"{service}: {what} on {len(resized)} pod(s) ({', '.join(resized)}): "
                f"{_reason_text(d)}",
            )
        if failed is not None:
            raise failed

    async def _refused_now(
        self,
        service: str,
        target: Workload,
        key: str,
        why: str,
        *,
        before: _Refusal | None,
        now: float,
    ) -> None:
        """The API server refused this pod's resize: back off, and say so once."""
        backoff = (
            REFUSAL_BACKOFF_S
            if before is None
            else min(before.backoff_s * 2, REFUSAL_BACKOFF_MAX_S)
        )
        self.refused[key] = _Refusal(why, now + backoff, backoff)
        log.warning(
            "%s: pod %s: resize refused: %s; CPU per replica stays, scaling replicas instead "
            "(next try in %.0fs)",
            service,
            key,
            why,
            backoff,
        )
        name, text = key.split("/", 1)[1], f"resize refused: {why}"
        if (name, text) not in self._blocked_reported:
            self._blocked_reported.add((name, text))
            await self._event(
                target,
                "Warning",
                "ResizeBlocked",
                f"{service}: pod {name}: {text}; scaling out instead",
            )

    async def _report_limited(
        self, service: str, target: Workload, pod: Pod, why: str | None
    ) -> str:
        """Log and record (once per pod and reason) why share enforcement is not exact;
        return the pod's key."""
        key = f"{pod.meta.namespace}/{pod.meta.name}"
        if why is None:
            self.limited.pop(key, None)
        elif self.limited.get(key) != why:
            self.limited[key] = why
            log.warning("%s: pod %s: %s", service, key, why)
            await self._event(target, "Warning", "ResizeLimited", f"{service}: pod {key}: {why}")
        return key

    async def _event(self, target: Workload, type_: str, reason: str, message: str) -> None:
        self.writes += 1
        try:
            await self.api.create_event(
                target.ref(),
                "Warning" if type_ == "Warning" else "Normal",
                reason,
                message,
                self.component,
            )
        except KubeError as e:
            log.warning(
                "cannot record event %s on %s/%s: %s", reason, target.namespace, target.name, e
            )

    async def current(self) -> Mapping[str, ServiceState]:
        """What is in force, from the watch caches (from the API until they are synced);
        nothing on a follower (it decides nothing)."""
        out: dict[str, ServiceState] = {}
        if self.leader is not None and not self.leader.is_leader():
            return out
        now = self.clock()
        for service, target in sorted(self.workloads().items()):
            try:
                scale, pods = await self._read(target)
            except KubeError as e:
                self.errors[service] = str(e)
                log.warning(
                    "%s: cannot read %s %s/%s: %s",
                    service,
                    target.kind,
                    target.namespace,
                    target.name,
                    e,
                )
                continue
            shown = [c for c in map(_shown_in_status, pods) if c is not None]
            in_force = cpu_request if self.enforcement == "share" else cpu_in_force
            applied = [c for c in map(in_force, shown) if c is not None]
            limits = [cpu_limit(c) for c in shown]
            blocked = []
            for p in pods:
                if p.resize_pending and p.resize_pending[0] in BLOCKING_RESIZE_REASONS:
                    blocked.append(
                        (p.meta.name, f"resize {p.resize_pending[0]}: {p.resize_pending[1]}")
                    )
                else:
                    why = plan_resize(p, cpu_in_force(p.spec[0]) or 0.0).blocked if p.spec else None
                    if why:
                        blocked.append((p.meta.name, why))
                refusal = self.refused.get(f"{p.meta.namespace}/{p.meta.name}")
                if refusal is not None and now < refusal.retry_at:
                    blocked.append((p.meta.name, f"resize refused: {refusal.why}"))
            for pod_name, why in blocked:
                if (pod_name, why) not in self._blocked_reported and self._leads():
                    self._blocked_reported.add((pod_name, why))
                    await self._event(
                        target,
                        "Warning",
                        "ResizeBlocked",
                        f"{service}: pod {pod_name}: {why}; scaling out instead",
                    )
            out[service] = ServiceState(
                service=service,
                replicas=scale.spec_replicas,
                ready_replicas=sum(1 for p in pods if p.ready),
                cpu_per_replica_cores=min(applied) if applied else 0.0,
                cpu_cap_per_replica_cores=(
                    min(c for c in limits if c is not None)
                    if limits and all(c is not None for c in limits)
                    else None
                ),
                resize_blocked=bool(blocked),
                # share: a Guaranteed pod keeps requests = limits = the decided CPU, so it
                # cannot use idle CPU; the engine then decides for the service as under limit.
                cpu_capped=self.enforcement == "share"
                and any(p.spec and qos_class(p.spec) == "Guaranteed" for p in pods),
            )
        return out
