"""What the fake API server answers for ``metrics.k8s.io/v1beta1`` PodMetrics, as
metrics-server (behind the kube-aggregator) does (pure):

* the group is served only when metrics-server is installed: otherwise 404 ``NotFound``
  ("the server could not find the requested resource"), and 503 ``ServiceUnavailable`` while
  its APIService is registered but metrics-server does not answer;
* list (namespaced or all) and get; ``labelSelector`` selects the pods by their labels; no
  watch (405);
* only Running pods it has measured are listed: a new pod is absent until its usage is known
  (metrics-server needs two scrapes); each item has the pod's name, namespace and labels, a
  ``timestamp``, a ``window`` and each container's ``usage`` (cpu, memory).
"""

from __future__ import annotations

import time
from typing import Any

from tests.support.fake_kube_rules import ApiError, Obj, labels_match

GROUP_VERSION = "metrics.k8s.io/v1beta1"
PREFIX = "/apis/" + GROUP_VERSION


def not_served() -> ApiError:
    return ApiError(404, "NotFound", "the server could not find the requested resource")


def unavailable() -> ApiError:
    return ApiError(
        503,
        "ServiceUnavailable",
        "the server is currently unable to handle the request (get pods.metrics.k8s.io)",
    )


def pod_metrics(pod: Obj, usage: dict[str, str], window: str) -> Obj:
    meta = pod["metadata"]
    return {
        "metadata": {
            "name": meta["name"],
            "namespace": meta.get("namespace"),
            "labels": dict(meta.get("labels") or {}),
            "creationTimestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        },
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "window": window,
        "containers": [
            {"name": name, "usage": {"cpu": cpu, "memory": "16Mi"}} for name, cpu in usage.items()
        ],
    }


def answer(
    state: str,
    pods: list[Obj],
    usage: dict[tuple[str, str], dict[str, str]],
    namespace: str | None,
    name: str | None,
    query: dict[str, Any],
    window: str = "15.002s",
) -> Obj:
    """The body for GET ``/apis/metrics.k8s.io/v1beta1[/namespaces/ns]/pods[/name]``, or
    ApiError. ``state``: ``absent``, ``down`` or ``up``; ``usage``: (namespace, pod) ->
    container -> cpu quantity, for the pods metrics-server has measured."""
    if state == "absent":
        raise not_served()
    if state == "down":
        raise unavailable()
    if query.get("watch") in ("true", "1"):
        raise ApiError(405, "MethodNotAllowed", "the server does not allow this method")
    items = []
    for pod in pods:
        meta = pod["metadata"]
        key = (meta.get("namespace"), meta["name"])
        if (pod.get("status") or {}).get("phase") != "Running" or key not in usage:
            continue
        if namespace is not None and key[0] != namespace:
            continue
        if not labels_match(pod, query.get("labelSelector")):
            continue
        items.append(pod_metrics(pod, usage[key], window))
    if name is not None:
        found = [i for i in items if i["metadata"]["name"] == name]
        if not found:
            raise ApiError(404, "NotFound", f'podmetrics.metrics.k8s.io "{name}" not found')
        return {"kind": "PodMetrics", "apiVersion": GROUP_VERSION, **found[0]}
    return {
        "kind": "PodMetricsList",
        "apiVersion": GROUP_VERSION,
        "metadata": {},
        "items": [{"kind": "PodMetrics", "apiVersion": GROUP_VERSION, **i} for i in items],
    }
