"""Watch caches of the scaled workloads and their pods (what client-go calls informers).

:class:`WorkloadCache` keeps Deployments, StatefulSets and Pods of the watched namespaces (or
all) in memory through list+watch (:class:`~gateway.platforms.kubernetes.api.Reflector`), so
the actuator reads the state of 1,000 services without a request: in steady state the API
server sees one watch per collection, renewed every few minutes, instead of a ``/scale`` read
and a pod list per service per tick.
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.platforms.kubernetes.api import KubeApi, Reflector
from gateway.platforms.kubernetes.model import Pod, Scale, Workload, selector_matches


class WorkloadCache:
    """Deployments, StatefulSets and Pods of ``namespaces`` (empty: all), read from watches."""

    def __init__(self, api: KubeApi, namespaces: Sequence[str] = ()) -> None:
        scopes: list[str | None] = list(namespaces) or [None]
        self._scopes = scopes
        self._deployments = [api.watch_workloads("Deployment", ns) for ns in scopes]
        self._statefulsets = [api.watch_workloads("StatefulSet", ns) for ns in scopes]
        self._pods = [api.watch_pods(ns) for ns in scopes]
        self._pods_seen = -1
        self._pods_by_ns: dict[str, list[Pod]] = {}
        self._pods_by_label: dict[tuple[str, str, str], list[Pod]] = {}

    def __repr__(self) -> str:
        return f"WorkloadCache(synced={self.synced()}, watches={len(self._all())})"

    def _all(self) -> list[Reflector[Scale] | Reflector[Pod]]:
        return [*self._deployments, *self._statefulsets, *self._pods]

    def start(self) -> None:
        for r in self._all():
            r.start()

    def cluster_pod_watch(self) -> Reflector[Pod] | None:
        """The watch of every namespace's pods, when this cache has one (no namespaces set)."""
        return self._pods[0] if self._scopes == [None] else None

    def version(self) -> int:
        """Grows whenever a watched workload or pod changes."""
        return sum(r.version for r in self._all())

    def synced(self) -> bool:
        """Whether every watch has had its first list (before that, read from the API)."""
        return all(r.synced for r in self._all())

    def scale(self, target: Workload) -> Scale | None:
        """The workload as its ``/scale`` shows it; None when it does not exist."""
        watches = self._deployments if target.kind == "Deployment" else self._statefulsets
        key = f"{target.namespace}/{target.name}"
        for r in watches:
            found = r.get(key)
            if found is not None:
                return found
        return None

    def pods(self, namespace: str, selector: str) -> list[Pod]:
        """The pods of ``namespace`` whose labels match ``selector`` (never all pods for an
        empty selector: a workload always has one)."""
        if not selector:
            return []
        version = sum(r.version for r in self._pods)
        if version != self._pods_seen:
            index: dict[tuple[str, str, str], list[Pod]] = {}
            by_ns: dict[str, list[Pod]] = {}
            for r in self._pods:
                for p in r.items().values():
                    by_ns.setdefault(p.meta.namespace, []).append(p)
                    for k, v in p.meta.labels.items():
                        index.setdefault((p.meta.namespace, k, v), []).append(p)
            self._pods_by_ns, self._pods_by_label, self._pods_seen = by_ns, index, version
        # the pods carrying one of the selector's ``k=v`` labels, else the namespace's, then
        # the whole selector on those: no scan of every pod per workload
        candidates: Sequence[Pod] = self._pods_by_ns.get(namespace, ())
        for term in selector.split(","):
            key, eq, value = term.partition("=")
            if eq and not key.endswith("!") and "(" not in term:
                candidates = self._pods_by_label.get(
                    (namespace, key.strip(), value.lstrip("=").strip()), ()
                )
                break
        return sorted(
            (p for p in candidates if selector_matches(selector, p.meta.labels)),
            key=lambda p: p.meta.name,
        )
