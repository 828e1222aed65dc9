"""Plain data of the Kubernetes objects Sluice reads, and converters from API JSON (pure).

:mod:`gateway.platforms.kubernetes.api` (the one module that imports the ``kubernetes`` client) turns every
typed result and watch event into these frozen dataclasses; everything else in Sluice codes
against them and the small exception tree here, never against the client.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

WorkloadKind = Literal["Deployment", "StatefulSet"]


# ---- errors ----------------------------------------------------------------------------------


class KubeError(Exception):
    """A Kubernetes API call failed; ``status`` is the HTTP code (0 = no answer)."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message


class NotFound(KubeError):
    pass


class Conflict(KubeError):
    pass


class Gone(KubeError):
    pass


class Invalid(KubeError):
    pass


BY_STATUS: dict[int, type[KubeError]] = {404: NotFound, 409: Conflict, 410: Gone, 422: Invalid}


# ---- plain data --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Meta:
    namespace: str
    name: str
    resource_version: str = ""
    uid: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class IngressBackend:
    service_name: str | None
    """None for a ``resource`` backend (not supported by Sluice)."""
    port_number: int | None = None
    port_name: str | None = None


@dataclass(frozen=True, slots=True)
class IngressPath:
    path: str
    path_type: str
    backend: IngressBackend


@dataclass(frozen=True, slots=True)
class IngressRule:
    host: str | None
    paths: tuple[IngressPath, ...]


@dataclass(frozen=True, slots=True)
class IngressTls:
    """One ``spec.tls`` entry: a Secret of the Ingress's namespace for these hosts."""

    hosts: tuple[str, ...]
    secret_name: str | None


@dataclass(frozen=True, slots=True)
class Ingress:
    meta: Meta
    ingress_class_name: str | None
    rules: tuple[IngressRule, ...]
    default_backend: IngressBackend | None
    load_balancer: tuple[str, ...]
    """IPs/hostnames currently in ``status.loadBalancer.ingress``."""
    tls: tuple[IngressTls, ...] = ()
    created: str = ""
    """``metadata.creationTimestamp`` (RFC 3339: sorts by time); the older Ingress wins a host."""


TLS_SECRET_TYPE = "kubernetes.io/tls"


@dataclass(frozen=True, slots=True)
class Secret:
    """A Secret as Sluice reads it: its type and decoded data (TLS Secrets only are watched)."""

    meta: Meta
    type: str
    data: Mapping[str, bytes] = field(default_factory=dict, repr=False)


@dataclass(frozen=True, slots=True)
class SlicePort:
    name: str
    port: int | None
    protocol: str = "TCP"


@dataclass(frozen=True, slots=True)
class SliceEndpoint:
    addresses: tuple[str, ...]
    ready: bool
    serving: bool
    terminating: bool
    pod: str | None = None
    """``targetRef.name`` when the endpoint is a Pod (``targetRef.kind: Pod``)."""


@dataclass(frozen=True, slots=True)
class EndpointSlice:
    meta: Meta
    service_name: str | None
    """The ``kubernetes.io/service-name`` label."""
    address_type: str
    ports: tuple[SlicePort, ...]
    endpoints: tuple[SliceEndpoint, ...]


@dataclass(frozen=True, slots=True)
class Service:
    meta: Meta
    ports: tuple[SlicePort, ...]
    """The Service's own ports (name, port)."""
    cluster_ip: str | None
    load_balancer: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Scale:
    kind: WorkloadKind
    namespace: str
    name: str
    spec_replicas: int
    status_replicas: int
    selector: str
    """Label selector of the workload's pods (``k=v,k2=v2``, ``k in (a,b)``...)."""
    resource_version: str = ""


@dataclass(frozen=True, slots=True)
class ContainerResources:
    name: str
    requests: Mapping[str, str]
    limits: Mapping[str, str]
    cpu_restart_policy: str = "NotRequired"
    """The container's ``resizePolicy`` for cpu."""


@dataclass(frozen=True, slots=True)
class Pod:
    meta: Meta
    phase: str
    ready: bool
    spec: tuple[ContainerResources, ...]
    """Desired resources (spec.containers)."""
    status: tuple[ContainerResources, ...]
    """Resources the kubelet reports as in force (status.containerStatuses[].resources)."""
    resize_pending: tuple[str, str] | None
    """(reason, message) of a PodResizePending condition, e.g. ('Infeasible', ...)."""
    deleting: bool = False
    node_name: str = ""
    """``spec.nodeName``: '' until scheduled."""
    cpu_request_cores: float = 0.0
    """The CPU the scheduler reserves for the pod on its node: the larger of its containers'
    requests (plus sidecars') and its largest init container's, plus ``spec.overhead``."""


@dataclass(frozen=True, slots=True)
class PodMetrics:
    """One pod's ``metrics.k8s.io/v1beta1`` PodMetrics: CPU use per container, averaged over
    ``window_s`` ending at ``timestamp`` (metrics-server)."""

    meta: Meta
    timestamp: str
    window_s: float
    cpu_cores: Mapping[str, float]
    """Container name -> cores used."""


@dataclass(frozen=True, slots=True)
class Node:
    meta: Meta
    allocatable_cpu_cores: float
    ready: bool
    unschedulable: bool
    no_schedule: bool
    """Has a ``NoSchedule``/``NoExecute`` taint (control-plane nodes, cordoned by taint)."""


@dataclass(frozen=True, slots=True)
class PolicyObject:
    """A ``ScalingPolicy`` custom resource as stored (its spec is parsed by
    :func:`gateway.platforms.kubernetes.crd.parse_spec`)."""

    meta: Meta
    generation: int
    created: str
    """``metadata.creationTimestamp`` (RFC 3339): the older of two conflicting policies wins."""
    spec: Mapping[str, Any]
    status: Mapping[str, Any]


def policy_object_from_json(d: Mapping[str, Any]) -> PolicyObject:
    m = d.get("metadata") or {}
    return PolicyObject(
        _meta(d),
        int(m.get("generation") or 0),
        str(m.get("creationTimestamp") or ""),
        dict(d.get("spec") or {}),
        dict(d.get("status") or {}),
    )


@dataclass(frozen=True, slots=True)
class Lease:
    namespace: str
    name: str
    holder_identity: str | None
    lease_duration_s: int | None
    acquire_time: datetime | None
    renew_time: datetime | None
    lease_transitions: int
    resource_version: str = ""


@dataclass(frozen=True, slots=True)
class Workload:
    """The object whose ``/scale`` subresource sets a service's replicas."""

    kind: WorkloadKind
    namespace: str
    name: str

    def ref(self) -> ObjectRef:
        return ObjectRef(self.kind, "apps/v1", self.namespace, self.name)


@dataclass(frozen=True, slots=True)
class ObjectRef:
    """The object an Event is about."""

    kind: str
    api_version: str
    namespace: str
    name: str
    uid: str = ""


# ---- converters (camelCase JSON -> dataclasses) ----------------------------------------------


def _meta(d: Mapping[str, Any]) -> Meta:
    m = d.get("metadata") or {}
    return Meta(
        namespace=m.get("namespace") or "",
        name=m.get("name") or "",
        resource_version=m.get("resourceVersion") or "",
        uid=m.get("uid") or "",
        labels=dict(m.get("labels") or {}),
        annotations=dict(m.get("annotations") or {}),
    )


def _lb(status: Mapping[str, Any] | None) -> tuple[str, ...]:
    entries = ((status or {}).get("loadBalancer") or {}).get("ingress") or []
    return tuple(e.get("ip") or e.get("hostname") or "" for e in entries)


def _backend(d: Mapping[str, Any] | None) -> IngressBackend | None:
    if not d:
        return None
    svc = d.get("service")
    if not svc:
        return IngressBackend(None)
    port = svc.get("port") or {}
    return IngressBackend(svc.get("name"), port.get("number"), port.get("name"))


def ingress_from_json(d: Mapping[str, Any]) -> Ingress:
    spec = d.get("spec") or {}
    rules = []
    for r in spec.get("rules") or []:
        paths = tuple(
            IngressPath(
                p.get("path") or "/",
                p.get("pathType") or "ImplementationSpecific",
                _backend(p.get("backend")) or IngressBackend(None),
            )
            for p in (r.get("http") or {}).get("paths") or []
        )
        rules.append(IngressRule(r.get("host") or None, paths))
    tls = tuple(
        IngressTls(tuple(t.get("hosts") or ()), t.get("secretName") or None)
        for t in spec.get("tls") or []
    )
    return Ingress(
        _meta(d),
        spec.get("ingressClassName"),
        tuple(rules),
        _backend(spec.get("defaultBackend")),
        _lb(d.get("status")),
        tls,
        str((d.get("metadata") or {}).get("creationTimestamp") or ""),
    )


def secret_from_json(d: Mapping[str, Any]) -> Secret:
    """``data`` values are base64 in the API's JSON; one that does not decode is left out."""
    data: dict[str, bytes] = {}
    for k, v in (d.get("data") or {}).items():
        with contextlib.suppress(binascii.Error, ValueError, TypeError):
            data[k] = base64.b64decode(v or "", validate=True)
    return Secret(_meta(d), d.get("type") or "Opaque", data)


def endpoint_slice_from_json(d: Mapping[str, Any]) -> EndpointSlice:
    meta = _meta(d)
    endpoints = []
    for e in d.get("endpoints") or []:
        c = e.get("conditions") or {}
        # API: ready nil = true; serving nil = same as ready; terminating nil = false
        ready = c.get("ready") is not False
        serving = ready if c.get("serving") is None else bool(c["serving"])
        ref = e.get("targetRef") or {}
        endpoints.append(
            SliceEndpoint(
                tuple(e.get("addresses") or ()),
                ready,
                serving,
                bool(c.get("terminating")),
                ref.get("name") if ref.get("kind") == "Pod" else None,
            )
        )
    return EndpointSlice(
        meta,
        meta.labels.get("kubernetes.io/service-name"),
        d.get("addressType") or "IPv4",
        tuple(
            SlicePort(p.get("name") or "", p.get("port"), p.get("protocol") or "TCP")
            for p in d.get("ports") or []
        ),
        tuple(endpoints),
    )


def service_from_json(d: Mapping[str, Any]) -> Service:
    spec = d.get("spec") or {}
    return Service(
        _meta(d),
        tuple(SlicePort(p.get("name") or "", p.get("port")) for p in spec.get("ports") or []),
        spec.get("clusterIP"),
        _lb(d.get("status")),
    )


def _resources(name: str, r: Mapping[str, Any] | None, policy: Any = None) -> ContainerResources:
    r = r or {}
    cpu_policy = next(
        (p.get("restartPolicy") for p in policy or [] if p.get("resourceName") == "cpu"),
        "NotRequired",
    )
    return ContainerResources(
        name,
        {k: str(v) for k, v in (r.get("requests") or {}).items()},
        {k: str(v) for k, v in (r.get("limits") or {}).items()},
        cpu_policy or "NotRequired",
    )


def _cores(quantity: Any) -> float:
    """A CPU quantity in cores; 0 when absent or malformed (the API server would refuse it)."""
    try:
        return parse_cpu_cores(str(quantity)) if quantity is not None else 0.0
    except ValueError:
        return 0.0


def _cpu_request(c: Mapping[str, Any]) -> float:
    return _cores(((c.get("resources") or {}).get("requests") or {}).get("cpu"))


def pod_cpu_request(spec: Mapping[str, Any]) -> float:
    """What the scheduler counts for a pod (KEP-753 sidecars included): running containers and
    restartable init containers add up; a plain init container needs its own request plus the
    sidecars started before it; the pod takes the larger, plus ``overhead``."""
    sidecars, init_peak = 0.0, 0.0
    for c in spec.get("initContainers") or []:
        if c.get("restartPolicy") == "Always":
            sidecars += _cpu_request(c)
        else:
            init_peak = max(init_peak, sidecars + _cpu_request(c))
    running = sidecars + sum(_cpu_request(c) for c in spec.get("containers") or [])
    return max(running, init_peak) + _cores((spec.get("overhead") or {}).get("cpu"))


def node_from_json(d: Mapping[str, Any]) -> Node:
    spec, status = d.get("spec") or {}, d.get("status") or {}
    allocatable = _cores((status.get("allocatable") or {}).get("cpu"))
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )
    return Node(
        _meta(d),
        allocatable,
        ready,
        bool(spec.get("unschedulable")),
        any(t.get("effect") in ("NoSchedule", "NoExecute") for t in spec.get("taints") or []),
    )


def parse_duration_s(value: str) -> float:
    """A Go duration as metrics-server writes ``window`` (``15.002s``, ``1m0s``, ``500ms``)."""
    total, number = 0.0, ""
    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}
    i = 0
    while i < len(value):
        c = value[i]
        if c.isdigit() or c == ".":
            number += c
            i += 1
            continue
        unit = next(
            (u for u in sorted(units, key=len, reverse=True) if value.startswith(u, i)), None
        )
        if unit is None or not number:
            raise ValueError(f"not a duration: {value!r}")
        total += float(number) * units[unit]
        number, i = "", i + len(unit)
    if number:
        raise ValueError(f"not a duration (no unit): {value!r}")
    return total


def pod_metrics_from_json(d: Mapping[str, Any]) -> PodMetrics:
    """A PodMetrics item; a container whose CPU is not a quantity is left out."""
    cpu: dict[str, float] = {}
    for c in d.get("containers") or []:
        with contextlib.suppress(ValueError, TypeError, KeyError):
            cores = parse_cpu_cores(str((c.get("usage") or {})["cpu"]))
            if math.isfinite(cores) and cores >= 0:
                cpu[str(c.get("name") or "")] = cores
    try:
        window_s = parse_duration_s(str(d.get("window") or "0s"))
    except ValueError:
        window_s = 0.0
    return PodMetrics(_meta(d), str(d.get("timestamp") or ""), window_s, cpu)


def pod_from_json(d: Mapping[str, Any]) -> Pod:
    spec, status = d.get("spec") or {}, d.get("status") or {}
    conditions = {c.get("type"): c for c in status.get("conditions") or []}
    pending = conditions.get("PodResizePending")
    return Pod(
        _meta(d),
        status.get("phase") or "Unknown",
        (conditions.get("Ready") or {}).get("status") == "True",
        tuple(
            _resources(c["name"], c.get("resources"), c.get("resizePolicy"))
            for c in spec.get("containers") or []
        ),
        tuple(
            _resources(c["name"], c.get("resources"))
            for c in status.get("containerStatuses") or []
            if c.get("resources") is not None
        ),
        (pending.get("reason") or "", pending.get("message") or "")
        if pending and pending.get("status") == "True"
        else None,
        deleting=bool((d.get("metadata") or {}).get("deletionTimestamp")),
        node_name=spec.get("nodeName") or "",
        cpu_request_cores=pod_cpu_request(spec),
    )


def _time(v: Any) -> datetime | None:
    if v is None or isinstance(v, datetime):
        return v
    return datetime.fromisoformat(str(v).replace("Z", "+00:00"))


def lease_from_json(d: Mapping[str, Any]) -> Lease:
    spec, meta = d.get("spec") or {}, _meta(d)
    return Lease(
        meta.namespace,
        meta.name,
        spec.get("holderIdentity") or None,
        spec.get("leaseDurationSeconds"),
        _time(spec.get("acquireTime")),
        _time(spec.get("renewTime")),
        int(spec.get("leaseTransitions") or 0),
        meta.resource_version,
    )


def microtime(t: datetime | None) -> datetime | None:
    # The client serialises with isoformat(), which drops the fraction when it is zero; the API
    # server parses MicroTime as RFC3339 with exactly 6 fractional digits.  1 µs is harmless.
    if t is None:
        return None
    t = t.astimezone(UTC)
    return t.replace(microsecond=1) if t.microsecond == 0 else t


def parse_cpu_cores(quantity: str) -> float:
    """A Kubernetes CPU quantity ('250m', '1', '0.5', '2500u', '1e3m') in cores."""
    q = quantity.strip()
    for suffix, scale in (("n", 1e-9), ("u", 1e-6), ("m", 1e-3), ("k", 1e3), ("M", 1e6)):
        if q.endswith(suffix):
            return float(q[: -len(suffix)]) * scale
    return float(q)


def format_cpu(cores: float) -> str:
    """Cores as a millicore quantity ('250m'); at least 1m."""
    return f"{max(1, round(cores * 1000))}m"


# ---- workloads and label selectors (for the watch caches) -------------------------------------


def format_selector(selector: Mapping[str, Any] | None) -> str:
    """A ``LabelSelector`` (matchLabels + matchExpressions) in the string form ``/scale`` reports
    as ``status.selector`` (``a=b,c in (d,e),!f``)."""
    sel = selector or {}
    parts = [f"{k}={v}" for k, v in sorted((sel.get("matchLabels") or {}).items())]
    for e in sel.get("matchExpressions") or []:
        key, op, values = e.get("key") or "", e.get("operator") or "", e.get("values") or []
        if op == "In":
            parts.append(f"{key} in ({','.join(sorted(values))})")
        elif op == "NotIn":
            parts.append(f"{key} notin ({','.join(sorted(values))})")
        elif op == "Exists":
            parts.append(key)
        elif op == "DoesNotExist":
            parts.append(f"!{key}")
    return ",".join(parts)


def _selector_terms(selector: str) -> list[str]:
    """Split on commas outside parentheses."""
    terms, depth, cur = [], 0, ""
    for ch in selector:
        if ch == "," and depth == 0:
            terms.append(cur.strip())
            cur = ""
            continue
        depth += ch == "("
        depth -= ch == ")"
        cur += ch
    if cur.strip():
        terms.append(cur.strip())
    return terms


def selector_matches(selector: str, labels: Mapping[str, str]) -> bool:
    """Whether ``labels`` match a label selector string (``=``, ``==``, ``!=``, ``in``,
    ``notin``, ``key``, ``!key``).  The empty selector matches everything."""
    for term in _selector_terms(selector):
        for op in (" notin ", " in "):
            if op in term:
                key, values = term.split(op, 1)
                vals = {v.strip() for v in values.strip().strip("()").split(",")}
                has = labels.get(key.strip())
                if (op == " in ") != (has is not None and has in vals):
                    return False
                break
        else:
            if "!=" in term:
                key, value = term.split("!=", 1)
                if labels.get(key.strip()) == value.strip():
                    return False
            elif "=" in term:
                key, value = term.replace("==", "=").split("=", 1)
                if labels.get(key.strip()) != value.strip():
                    return False
            elif term.startswith("!"):
                if term[1:].strip() in labels:
                    return False
            elif term not in labels:
                return False
    return True


def workload_from_json(d: Mapping[str, Any], kind: WorkloadKind = "Deployment") -> Scale:
    """A Deployment or StatefulSet as its ``/scale`` subresource would show it (list items
    carry no ``kind``: the caller says which)."""
    spec, status, meta = d.get("spec") or {}, d.get("status") or {}, _meta(d)
    replicas = spec.get("replicas")
    return Scale(
        kind,
        meta.namespace,
        meta.name,
        1 if replicas is None else int(replicas),
        int(status.get("replicas") or 0),
        format_selector(spec.get("selector")),
        meta.resource_version,
    )
