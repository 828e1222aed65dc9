"""``budget.cpu: auto`` on Kubernetes: the CPU of the nodes the managed workloads run on, minus
what the pods Sluice does not manage request there, from watches (no polling).

:func:`cluster_budget` is the pure rule; :class:`ClusterCapacity` feeds it from a node watch
and a cluster-wide pod watch (the workload cache's own when it watches every namespace) and
recomputes only when one of them, or the set of managed workloads, has changed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Set
from dataclasses import dataclass

from gateway.platforms.kubernetes.api import KubeApi, Reflector
from gateway.platforms.kubernetes.cache import WorkloadCache
from gateway.platforms.kubernetes.model import Node, Pod, Workload
from scaler.policy import BudgetCpu

log = logging.getLogger(__name__)

_DONE = ("Succeeded", "Failed")
"""Pod phases the scheduler no longer counts on a node."""


@dataclass(frozen=True, slots=True)
class ClusterFigures:
    """What :func:`cluster_budget` measured (for the reasons and the tests)."""

    nodes: tuple[str, ...]
    allocatable_cores: float
    others_cores: float
    other_pods: int
    rule: str


def cluster_figures(
    nodes: Iterable[Node], pods: Iterable[Pod], managed: Set[str]
) -> ClusterFigures:
    """The nodes counted and what is left of them for the managed pods.

    The nodes are those running a managed pod (Ready, cordoned or not: its pods still run
    there); when no managed pod is scheduled yet, every Ready, schedulable node without a
    ``NoSchedule``/``NoExecute`` taint.  Pods in a final phase request nothing."""
    live = [p for p in pods if p.phase not in _DONE and p.node_name]
    by_name = {n.meta.name: n for n in nodes if n.ready}
    hosting = {p.node_name for p in live if p.meta.key in managed} & by_name.keys()
    if hosting:
        chosen = sorted(hosting)
        rule = "the nodes running managed pods"
    else:
        chosen = sorted(
            name for name, n in by_name.items() if not n.unschedulable and not n.no_schedule
        )
        rule = "every schedulable node (no managed pod is scheduled yet)"
    counted = set(chosen)
    others = [p for p in live if p.node_name in counted and p.meta.key not in managed]
    return ClusterFigures(
        tuple(chosen),
        sum(by_name[n].allocatable_cpu_cores for n in chosen),
        sum(p.cpu_request_cores for p in others),
        len(others),
        rule,
    )


def cluster_budget(figures: ClusterFigures, reserved: float) -> BudgetCpu:
    """The budget left for the managed workloads (at least 0; the scaler then holds the
    services' floors)."""
    cores = figures.allocatable_cores - figures.others_cores - reserved
    source = (
        f"auto: {len(figures.nodes)} node(s), {figures.rule}, {figures.allocatable_cores:g} "
        f"allocatable minus {figures.others_cores:g} requested by {figures.other_pods} other "
        "pod(s)"
    )
    if reserved:
        source += f" minus reserved {reserved:g}"
    return BudgetCpu(max(cores, 0.0), source)


class ClusterCapacity:
    """``budget.cpu: auto`` on Kubernetes, kept current by watches of nodes and pods."""

    def __init__(
        self,
        api: KubeApi,
        cache: WorkloadCache,
        workloads: Callable[[], Mapping[str, Workload]],
        reserved: float = 0.0,
    ) -> None:
        self._cache = cache
        self._workloads = workloads
        self.reserved = reserved
        self._nodes = api.watch_nodes()
        own = cache.cluster_pod_watch()
        self._pods: Reflector[Pod] = own if own is not None else api.watch_pods(None)
        self._seen: tuple[object, ...] = ()
        self._last = BudgetCpu(0.0, "auto: waiting for the first list of nodes and pods")

    def __repr__(self) -> str:
        return f"ClusterCapacity({self._last.cores:g} cores, {self._nodes!r})"

    def start(self) -> None:
        self._nodes.start()
        self._pods.start()

    def budget_cpu(self) -> BudgetCpu:
        """The budget now; recomputed only when nodes, pods or managed workloads changed."""
        if not (self._nodes.synced and self._pods.synced):
            why = self._nodes.last_error or self._pods.last_error
            waiting = "auto: waiting for the first list of nodes and pods"
            return BudgetCpu(0.0, f"{waiting} ({why})" if why else waiting)
        targets = tuple(sorted(self._workloads().values(), key=lambda w: (w.namespace, w.name)))
        state = (self._nodes.version, self._pods.version, self._cache.version(), targets)
        if state != self._seen:
            managed = self._managed(targets)
            figures = cluster_figures(
                self._nodes.items().values(), self._pods.items().values(), managed
            )
            budget = cluster_budget(figures, self.reserved)
            if budget != self._last:
                log.info("budget.cpu auto: %g cores (%s)", budget.cores, budget.source)
            self._seen, self._last = state, budget
        return self._last

    def _managed(self, targets: Iterable[Workload]) -> set[str]:
        """``namespace/name`` of every pod of a workload Sluice scales."""
        keys: set[str] = set()
        for w in targets:
            scale = self._cache.scale(w)
            if scale is not None:
                keys.update(p.meta.key for p in self._cache.pods(w.namespace, scale.selector))
        return keys
