"""Ingress objects -> Sluice routes, backends and scaling policies (pure: no I/O).

``build_table`` turns the current set of ``networking.k8s.io/v1`` Ingresses into one
:class:`IngressTable`: the route set (same host/wildcard/path semantics as static routes), the
backend port of each Sluice service ``<namespace>/<service>``, the scaling policy of each
service (config file first, else ``sluice.io/...`` annotations) and its scale target, and the
problems found.  A bad path or annotation drops only that piece, never the other routes.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml
from pydantic import ValidationError

from gateway.dataplane.updates import RouteRule, RoutesUpdate
from gateway.platforms.kubernetes.model import Ingress, IngressBackend, Workload
from gateway.platforms.kubernetes.policy_objects import PolicyObjects
from gateway.settings import RouteConfig, ServiceConfig
from scaler.policy import BudgetConfig, KeyedValueError, ScalingPolicy, check_floors
from scaler.validation import validation_problems

PREFIX = "sluice.io/"
LEGACY_CLASS_ANNOTATION = "kubernetes.io/ingress.class"
SCALING_ANNOTATION = PREFIX + "scaling"
WORKLOAD_ANNOTATION = PREFIX + "workload"
_CPU_KEYS = {"cpu-min": "min", "cpu-max": "max", "cpu-request": "request"}
FLAT_ANNOTATIONS = (
    "mode",
    "metric",
    "target",
    "target-utilization",
    "min-replicas",
    "max-replicas",
    "stable-window-s",
    "panic-window-s",
    "panic-threshold",
    "scale-to-zero-grace-s",
    "tolerance",
    "weight",
    "guaranteed-cpu",
    "prefer",
    *_CPU_KEYS,
)
"""``sluice.io/<name>`` shortcuts for single ScalingPolicy fields ('-' for '_')."""


@dataclass(frozen=True, slots=True)
class Backend:
    """Where a Sluice service's traffic goes: a Kubernetes Service port."""

    namespace: str
    name: str
    port_number: int | None
    port_name: str | None

    @property
    def service(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class Problem:
    ingress: str
    """``namespace/name`` of the Ingress at fault."""
    message: str
    reason: str = "InvalidIngress"
    """The reason of the Warning Event recorded on the Ingress."""


@dataclass(frozen=True, slots=True)
class IngressTable:
    routes: RoutesUpdate
    backends: Mapping[str, Backend] = field(default_factory=dict)
    policies: Mapping[str, ScalingPolicy] = field(default_factory=dict)
    """Services Sluice scales (a config entry or annotations); others are only routed."""
    workloads: Mapping[str, Workload] = field(default_factory=dict)
    served: tuple[str, ...] = ()
    """Keys of the Ingresses of our class."""
    problems: tuple[Problem, ...] = ()


def is_ours(ingress: Ingress, ingress_class: str) -> bool:
    """spec.ingressClassName decides; without it, the legacy annotation does."""
    if ingress.ingress_class_name is not None:
        return ingress.ingress_class_name == ingress_class
    return ingress.meta.annotations.get(LEGACY_CLASS_ANNOTATION) == ingress_class


def _parse_value(raw: str) -> Any:
    try:
        return yaml.safe_load(raw)
    except yaml.YAMLError:
        return raw


def policy_from_annotations(
    annotations: Mapping[str, str],
) -> tuple[ScalingPolicy | None, list[str]]:
    """The policy the ``sluice.io/`` annotations describe (None if there are none) and problems."""
    problems: list[str] = []
    data: dict[str, Any] = {}
    if SCALING_ANNOTATION in annotations:
        try:
            blob = json.loads(annotations[SCALING_ANNOTATION])
        except ValueError:
            blob = _parse_value(annotations[SCALING_ANNOTATION])
        if isinstance(blob, dict):
            data.update(blob)
        else:
            problems.append(
                f"annotation {SCALING_ANNOTATION}: must be a JSON/YAML mapping of scaling fields"
            )
    present = False
    flat_paths: dict[str, str] = {}
    for key, raw in annotations.items():
        if not key.startswith(PREFIX):
            continue
        short = key.removeprefix(PREFIX)
        if key in (SCALING_ANNOTATION, WORKLOAD_ANNOTATION):
            present = True
            continue
        if short not in FLAT_ANNOTATIONS:
            problems.append(
                f"annotation {key}: unknown (known: {SCALING_ANNOTATION}, {WORKLOAD_ANNOTATION}, "
                + ", ".join(PREFIX + a for a in FLAT_ANNOTATIONS)
                + ")"
            )
            continue
        present = True
        if short in _CPU_KEYS:
            cpu = data.setdefault("cpu", {})
            if isinstance(cpu, dict):
                cpu[_CPU_KEYS[short]] = _parse_value(raw)
            flat_paths[f"cpu.{_CPU_KEYS[short]}"] = key
        else:
            data[short.replace("-", "_")] = _parse_value(raw)
            flat_paths[short.replace("-", "_")] = key
    if not present and not data:
        return None, problems
    try:
        return ScalingPolicy.model_validate(data), problems
    except ValidationError as e:
        for path, problem in validation_problems(e):
            where = flat_paths.get(path, f"{SCALING_ANNOTATION} ({path})")
            problems.append(f"annotation {where}: {problem}")
        return None, problems


def _workloads_from_annotation(
    raw: str, services: Iterable[Backend]
) -> tuple[dict[str, Workload], list[str]]:
    """``Kind/name`` for every backend, or ``svc=Kind/name,svc2=Kind/name``."""
    out: dict[str, Workload] = {}
    problems = []
    backends = {b.name: b for b in services}
    for part in (p.strip() for p in raw.split(",") if p.strip()):
        svc_name, _, target = part.rpartition("=")
        kind, _, name = target.partition("/")
        if kind not in ("Deployment", "StatefulSet") or not name:
            problems.append(
                f"annotation {WORKLOAD_ANNOTATION}: {part!r} must be 'Deployment/<name>' or "
                "'StatefulSet/<name>', optionally prefixed by '<service>='"
            )
            continue
        chosen = (
            [backends[svc_name]]
            if svc_name in backends
            else []
            if svc_name
            else list(backends.values())
        )
        if svc_name and not chosen:
            problems.append(
                f"annotation {WORKLOAD_ANNOTATION}: {svc_name!r} is not a backend of this Ingress"
            )
        for b in chosen:
            out[b.service] = Workload(
                "Deployment" if kind == "Deployment" else "StatefulSet", b.namespace, name
            )
    return out, problems


def _backend(ns: str, b: IngressBackend | None) -> tuple[Backend | None, str | None]:
    if b is None or b.service_name is None:
        return None, "backend: only service backends are supported (resource backends are ignored)"
    if b.port_number is None and not b.port_name:
        return None, f"backend {b.service_name}: needs port.number or port.name"
    return Backend(ns, b.service_name, b.port_number, b.port_name), None


def build_table(
    ingresses: Iterable[Ingress],
    ingress_class: str,
    configured: Mapping[str, ServiceConfig],
    budget: BudgetConfig | None = None,
    crd: PolicyObjects | None = None,
) -> IngressTable:
    """All Ingresses of ``ingress_class`` -> one table; earlier (by namespace/name) wins conflicts.
    A service's policy: the config file's, else its ScalingPolicy's (``crd``), else the
    Ingress annotations'."""
    ours = sorted((i for i in ingresses if is_ours(i, ingress_class)), key=lambda i: i.meta.key)
    problems: list[Problem] = []
    rules: list[RouteRule] = []
    seen_rules: dict[tuple[str | None, str, str], str] = {}
    backends: dict[str, Backend] = {}
    policies: dict[str, ScalingPolicy] = {}
    workloads: dict[str, Workload] = {}
    default_backend: str | None = None

    def use_backend(ing: Ingress, backend: Backend) -> None:
        known = backends.get(backend.service)
        if known is not None and (known.port_number, known.port_name) != (
            backend.port_number,
            backend.port_name,
        ):
            problems.append(
                Problem(
                    ing.meta.key,
                    f"backend {backend.name}: port {backend.port_number or backend.port_name} "
                    f"conflicts with port {known.port_number or known.port_name} used by another "
                    "rule; the first one is used",
                )
            )
            return
        backends[backend.service] = backend

    for ing in ours:
        key, ns = ing.meta.key, ing.meta.namespace
        mine: list[Backend] = []
        if ing.default_backend is not None:
            b, err = _backend(ns, ing.default_backend)
            if err or b is None:
                problems.append(Problem(key, f"defaultBackend: {err}"))
            elif default_backend is not None and default_backend != b.service:
                problems.append(
                    Problem(
                        key, f"defaultBackend {b.service} ignored: {default_backend} came first"
                    )
                )
            else:
                default_backend = b.service
                use_backend(ing, b)
                mine.append(b)
        for i, rule in enumerate(ing.rules):
            for j, p in enumerate(rule.paths):
                where = f"rules[{i}].http.paths[{j}]"
                b, err = _backend(ns, p.backend)
                if err or b is None:
                    problems.append(Problem(key, f"{where}: {err}"))
                    continue
                try:
                    route = RouteConfig(host=rule.host, path=p.path, path_type=p.path_type)  # type: ignore[arg-type]
                except ValidationError as e:
                    for path, problem in validation_problems(e):
                        problems.append(Problem(key, f"{where}.{path}: {problem}"))
                    continue
                ident = (route.host, route.path, route.path_type)
                if ident in seen_rules and seen_rules[ident] != b.service:
                    problems.append(
                        Problem(
                            key,
                            f"{where}: {route.host or '*'}{route.path} ({route.path_type}) already "
                            f"routes to {seen_rules[ident]}; ignored",
                        )
                    )
                    continue
                if ident not in seen_rules:
                    seen_rules[ident] = b.service
                    rules.append(RouteRule(b.service, route.host, route.path, route.path_type))
                use_backend(ing, b)
                mine.append(b)
        annotation_policy, annotation_problems = policy_from_annotations(ing.meta.annotations)
        problems.extend(Problem(key, m) for m in annotation_problems)
        if WORKLOAD_ANNOTATION in ing.meta.annotations:
            found, wl_problems = _workloads_from_annotation(
                ing.meta.annotations[WORKLOAD_ANNOTATION], mine
            )
            problems.extend(Problem(key, m) for m in wl_problems)
            for svc, wl in found.items():
                workloads.setdefault(svc, wl)
        for b in mine:
            workloads.setdefault(b.service, Workload("Deployment", b.namespace, b.name))
            if b.service in policies:
                continue
            if b.service in configured:
                policies[b.service] = configured[b.service].scaling
            elif crd is not None and b.service in crd.policies:
                policies[b.service] = crd.policies[b.service]
                workloads[b.service] = crd.workloads[b.service]
            elif annotation_policy is not None:
                if budget is not None:
                    fixed = {n: c.scaling for n, c in configured.items()}
                    try:
                        check_floors(budget, {**fixed, **policies, b.service: annotation_policy})
                    except KeyedValueError as e:
                        problems.append(
                            Problem(key, f"scaling policy for {b.service} not used: {e.message}")
                        )
                        continue
                policies[b.service] = annotation_policy
    return IngressTable(
        RoutesUpdate(tuple(rules), default_backend),
        backends,
        policies,
        {s: w for s, w in workloads.items() if s in policies},
        tuple(i.meta.key for i in ours),
        tuple(problems),
    )
