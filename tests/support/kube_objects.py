"""Builders for the Kubernetes objects tests put into the fake API server (camelCase JSON)."""

from __future__ import annotations

import base64
import ipaddress
from typing import Any

Obj = dict[str, Any]
TLS_TYPE = "kubernetes.io/tls"


def _is_ip(address: str) -> bool:
    try:
        ipaddress.ip_address(address)
    except ValueError:
        return False
    return True


def ingress(
    name: str,
    rules: list[tuple[str | None, str, str, str, int | str]],
    namespace: str = "shop",
    ingress_class: str | None = "sluice",
    annotations: dict[str, str] | None = None,
    default_backend: tuple[str, int | str] | None = None,
    tls: list[tuple[list[str], str | None]] | None = None,
) -> Obj:
    """``rules``: (host, path, pathType, service, port number or name); ``tls``: (hosts,
    secretName) per ``spec.tls`` entry."""

    def backend(svc: str, port: int | str) -> Obj:
        return {
            "service": {
                "name": svc,
                "port": {"number": port} if isinstance(port, int) else {"name": port},
            }
        }

    by_host: dict[str | None, list[Obj]] = {}
    for host, path, path_type, svc, port in rules:
        by_host.setdefault(host, []).append(
            {"path": path, "pathType": path_type, "backend": backend(svc, port)}
        )
    spec: Obj = {
        "rules": [
            ({"host": h} if h else {}) | {"http": {"paths": paths}} for h, paths in by_host.items()
        ]
    }
    if ingress_class:
        spec["ingressClassName"] = ingress_class
    if default_backend:
        spec["defaultBackend"] = backend(*default_backend)
    if tls:
        spec["tls"] = [
            {"hosts": hosts} | ({"secretName": secret} if secret else {}) for hosts, secret in tls
        ]
    return {
        "kind": "Ingress",
        "apiVersion": "networking.k8s.io/v1",
        "metadata": {"name": name, "namespace": namespace, "annotations": annotations or {}},
        "spec": spec,
    }


def endpoint_slice(
    name: str,
    service: str,
    endpoints: list[tuple[str, dict[str, bool]]],
    ports: list[tuple[str, int]],
    namespace: str = "shop",
    pods: list[str] | None = None,
) -> Obj:
    """``endpoints``: (address, conditions); ``ports``: (name, port); ``pods``: each
    endpoint's Pod (its ``targetRef``), when given.  Like the real API server, the fake refuses
    loopback, link-local and unspecified IPs: a test that needs the gateway to reach a local
    process uses the name ``localhost`` (an FQDN slice); others use 192.0.2.x (TEST-NET-1)."""
    fqdn = any(not _is_ip(a) for a, _ in endpoints)
    eps: list[Obj] = [{"addresses": [ip], "conditions": c} for ip, c in endpoints]
    for e, pod in zip(eps, pods or [], strict=False):
        e["targetRef"] = {"kind": "Pod", "name": pod, "namespace": namespace}
    return {
        "kind": "EndpointSlice",
        "apiVersion": "discovery.k8s.io/v1",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"kubernetes.io/service-name": service},
        },
        "addressType": "FQDN"
        if fqdn
        else ("IPv6" if any(":" in a for a, _ in endpoints) else "IPv4"),
        "ports": [{"name": n, "port": p, "protocol": "TCP"} for n, p in ports],
        "endpoints": eps,
    }


def service(
    name: str,
    ports: list[tuple[str, int]],
    namespace: str = "shop",
    cluster_ip: str = "10.0.0.10",
    lb: list[str] | None = None,
) -> Obj:
    return {
        "kind": "Service",
        "apiVersion": "v1",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"clusterIP": cluster_ip, "ports": [{"name": n, "port": p} for n, p in ports]},
        "status": {"loadBalancer": {"ingress": [{"ip": a} for a in lb or []]}},
    }


def deployment(name: str, replicas: int, namespace: str = "shop", kind: str = "Deployment") -> Obj:
    return {
        "kind": kind,
        "apiVersion": "apps/v1",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}}},
        "status": {"replicas": replicas},
    }


def pod(
    name: str,
    app: str,
    resources: dict[str, dict[str, str]],
    namespace: str = "shop",
    ready: bool = True,
    container: str = "app",
    node: str = "node-a",
) -> Obj:
    """A running pod whose status shows ``resources`` in force."""
    return {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app": app}},
        "spec": {
            "nodeName": node,
            "containers": [
                {
                    "name": container,
                    "image": "example/app:1",
                    "resources": resources,
                    "resizePolicy": [{"resourceName": "cpu", "restartPolicy": "NotRequired"}],
                }
            ],
        },
        "status": {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
            "containerStatuses": [
                {
                    "name": container,
                    "ready": ready,
                    "image": "example/app:1",
                    "imageID": "example/app@sha256:0",
                    "restartCount": 0,
                    "resources": resources,
                }
            ],
        },
    }


def node(
    name: str,
    cpu: str,
    ready: bool = True,
    unschedulable: bool = False,
    taints: tuple[str, ...] = (),
) -> Obj:
    """A node with ``cpu`` allocatable; ``taints`` are effects (``NoSchedule``...)."""
    return {
        "kind": "Node",
        "apiVersion": "v1",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "spec": {
            "unschedulable": unschedulable,
            "taints": [{"key": f"example.com/t{i}", "effect": e} for i, e in enumerate(taints)],
        },
        "status": {
            "capacity": {"cpu": cpu, "memory": "16Gi", "pods": "110"},
            "allocatable": {"cpu": cpu, "memory": "15Gi", "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def tls_secret(
    name: str, cert_pem: bytes, key_pem: bytes, namespace: str = "shop", type_: str = TLS_TYPE
) -> Obj:
    """A Secret holding a certificate and key as ``kubernetes.io/tls`` does (base64 data)."""
    return {
        "kind": "Secret",
        "apiVersion": "v1",
        "metadata": {"name": name, "namespace": namespace},
        "type": type_,
        "data": {
            "tls.crt": base64.b64encode(cert_pem).decode(),
            "tls.key": base64.b64encode(key_pem).decode(),
        },
    }
