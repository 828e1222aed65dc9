"""Kubernetes actuator: replicas via ``/scale``, CPU per replica via in-place ``pods/resize``.

* Replicas: a merge patch of the Deployment's (or StatefulSet's) ``/scale`` subresource.
* CPU per replica: the first container of every pod of the workload is resized in place
  through ``pods/<name>/resize`` without changing the pod's QoS class (Guaranteed: requests
  = limits; Burstable: the request/limit ratio is kept; BestEffort pods and containers with
  ``resizePolicy`` cpu ``RestartContainer`` are never touched).
* A resize counts as applied only when ``status.containerStatuses[].resources`` shows it:
  :meth:`current` reports the smallest CPU in force across the pods, read from status.
* ``PodResizePending`` with reason ``Infeasible`` or ``Deferred`` (or a pod that cannot be
  resized at all) sets ``ServiceState.resize_blocked`` so the arbiter scales out instead.
* Every change is recorded as an Event on the workload with the decision's reasons.
* With a leader elector, nothing is written unless it leads, checked before every write.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from scaler.decision import Decision, ServiceState
from scaler.kube_model import (
    ContainerResources,
    KubeError,
    Pod,
    Workload,
    format_cpu,
    parse_cpu_cores,
)
from scaler.kubeapi import KubeApi

log = logging.getLogger(__name__)
BLOCKING_RESIZE_REASONS = ("Infeasible", "Deferred")
_EPSILON_CORES = 0.0005


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


@dataclass(frozen=True, slots=True)
class ResizePlan:
    container: ContainerResources | None
    """The container with its new resources; None when nothing to do or not possible."""
    blocked: str | None = None
    """Why this pod cannot be resized in place (None: it can, or is already there)."""


def plan_resize(pod: Pod, cores: float) -> ResizePlan:
    """New resources for the pod's first container, keeping the pod's QoS class."""
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
    current = cpu_in_force(main)
    if current is not None and abs(current - cores) < _EPSILON_CORES:
        return ResizePlan(None)
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
    return ResizePlan(ContainerResources(main.name, new_req, new_lim, main.cpu_restart_policy))


def _cpu_shown_in_status(pod: Pod) -> float | None:
    """CPU of the main container as the kubelet reports it in force (None: not reported)."""
    if not pod.spec:
        return None
    shown = next((c for c in pod.status if c.name == pod.spec[0].name), None)
    return cpu_in_force(shown) if shown else None


def _reason_text(d: Decision) -> str:
    return "; ".join([f"rule {d.rule}", *d.reasons])


class KubernetesActuator:
    """Applies decisions to Deployments/StatefulSets and their pods; reports their state."""

    def __init__(
        self,
        api: KubeApi,
        workloads: Callable[[], Mapping[str, Workload]],
        leader: Leadership | None = None,
        component: str = "sluice",
    ) -> None:
        self.api = api
        self.workloads = workloads
        self.leader = leader
        self.component = component
        self.errors: dict[str, str] = {}
        self._blocked_reported: set[tuple[str, str]] = set()
        self._not_leader_logged = False

    def __repr__(self) -> str:
        return f"KubernetesActuator(services={len(self.workloads())}, errors={self.errors})"

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

    async def _apply_one(self, service: str, target: Workload, d: Decision) -> None:
        scale = await self.api.read_scale(target.kind, target.namespace, target.name)
        if scale.spec_replicas != d.replicas:
            if not self._leads():
                return
            await self.api.patch_scale(target.kind, target.namespace, target.name, d.replicas)
            await self._event(
                target,
                "Normal",
                "Scaled",
                f"{service}: replicas {scale.spec_replicas} -> {d.replicas}: {_reason_text(d)}",
            )
        resized = []
        for pod in await self.api.list_pods(target.namespace, scale.selector):
            if pod.deleting:
                continue
            plan = plan_resize(pod, d.cpu_per_replica_cores)
            if plan.container is None:
                continue
            if not self._leads():
                return
            await self.api.resize_pod(
                pod.meta.namespace, pod.meta.name, {plan.container.name: plan.container}
            )
            resized.append(pod.meta.name)
        if resized:
            await self._event(
                target,
                "Normal",
                "Resized",
                f"{service}: cpu per replica -> {format_cpu(d.cpu_per_replica_cores)} on "
                f"{len(resized)} pod(s) ({', '.join(resized)}): {_reason_text(d)}",
            )

    async def _event(self, target: Workload, type_: str, reason: str, message: str) -> None:
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
        """What is in force, read from the API; nothing on a follower (it decides nothing, so
        it spares the API server two reads per service per tick)."""
        out: dict[str, ServiceState] = {}
        if self.leader is not None and not self.leader.is_leader():
            return out
        for service, target in sorted(self.workloads().items()):
            try:
                scale = await self.api.read_scale(target.kind, target.namespace, target.name)
                pods = [
                    p
                    for p in await self.api.list_pods(target.namespace, scale.selector)
                    if not p.deleting
                ]
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
            applied = [c for c in map(_cpu_shown_in_status, pods) if c is not None]
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
                resize_blocked=bool(blocked),
            )
        return out
