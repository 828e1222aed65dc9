"""CPU use on Kubernetes: the CPU the managed pods use, from ``metrics.k8s.io`` PodMetrics
(metrics-server), polled by the leader once per namespace per interval, for every managed
service: it is the ``cpu_utilization`` metric of a service scaled on it, and for the others
the use the scaler sizes CPU and replicas into idle CPU from, as the local platform's cgroups.

:func:`service_usage` is the pure rule (the main container's use over the service's Ready
pods, counted as the actuator counts them); :class:`CpuCounter` turns successive figures into the monotonic
``cpu_seconds_total`` the scaler derives its rate from; :class:`PodMetricsSource` polls and
fills the signals. When the metrics API is not served the figure stays missing (a missing
``cpu_utilization`` never scales down; the others are sized from their concurrency alone) and
that is logged once.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from gateway.platforms.kubernetes.api import KubeApi
from gateway.platforms.kubernetes.cache import WorkloadCache
from gateway.platforms.kubernetes.model import KubeError, NotFound, Pod, PodMetrics, Workload
from scaler.signals import ServiceSignals

log = logging.getLogger(__name__)

ABSENT_RETRY_FACTOR = 4
"""With the metrics API absent or failing, it is asked again after this many intervals."""


@dataclass(frozen=True, slots=True)
class Usage:
    """A service's CPU use now: ``cores`` over its ``ready`` pods, ``measured`` of them
    reported by metrics-server (the others are counted at the measured pods' average)."""

    cores: float
    measured: int
    ready: int


def pod_cores(pod: Pod, sample: PodMetrics) -> float | None:
    """The CPU ``pod``'s main container uses (the one the actuator sizes: its first); all
    containers when the pod spec is not known."""
    if pod.spec:
        return sample.cpu_cores.get(pod.spec[0].name)
    return sum(sample.cpu_cores.values()) if sample.cpu_cores else None


def service_usage(pods: Iterable[Pod], samples: Mapping[str, PodMetrics]) -> Usage | None:
    """The CPU a service's Ready pods use (``samples`` by pod name); None when none of them
    is measured. The scaler divides it by the CPU those pods hold (Ready pods × the CPU per
    replica in force), so a Ready pod metrics-server does not report yet (new pods are absent
    until it has two scrapes) counts at the measured pods' average rather than as idle."""
    ready = [p for p in pods if p.ready]  # as the actuator counts the ready replicas
    used = [
        c
        for p in ready
        if (s := samples.get(p.meta.name)) is not None and (c := pod_cores(p, s)) is not None
    ]
    if not used:
        return None
    return Usage(sum(used) * len(ready) / len(used), len(used), len(ready))


class CpuCounter:
    """A monotonic CPU-seconds counter made of successive usage figures (cores), integrated
    over the gateway's clock: the scaler's rate over two ticks is the figure in force.

    A measurement that stops resets the counter to 0 (once): the scaler takes a counter going
    down as a restart and forgets its rate, so a stale figure is never reused; while nothing
    is measured it reports None. When figures come back the counter restarts from 0 as if the
    first new figure had held since the reset."""

    __slots__ = ("_at", "_total", "_was_measured")

    def __init__(self) -> None:
        self._total = 1.0  # > 0: a reset to 0 is always a step down
        self._at: float | None = None
        self._was_measured = False

    def update(self, at: float, cores: float | None) -> float | None:
        """The counter at ``at`` (the signals' own time) given the figure now."""
        if cores is None:
            if self._was_measured:
                self._was_measured, self._total, self._at = False, 0.0, at
                return 0.0
            return None
        if self._at is not None and at > self._at:
            self._total += cores * (at - self._at)
        self._at, self._was_measured = at, True
        return self._total


class PodMetricsSource:
    """Polls PodMetrics for the ``wanted`` services (leader only) and adds their CPU to the
    signals."""

    def __init__(
        self,
        api: KubeApi,
        cache: WorkloadCache,
        workloads: Callable[[], Mapping[str, Workload]],
        wanted: Callable[[], Iterable[str]],
        *,
        interval_s: float,
        is_leader: Callable[[], bool] = lambda: True,
    ) -> None:
        self.api = api
        self.cache = cache
        self.workloads = workloads
        self.wanted = wanted
        """The services whose CPU is measured (the platform: every managed one)."""
        self.interval_s = interval_s
        self.is_leader = is_leader
        self.samples: dict[str, dict[str, PodMetrics]] = {}
        """Namespace -> pod name -> its latest PodMetrics."""
        self.absent: str | None = None
        """Why the metrics API cannot be read (None: it answers)."""
        self._counters: dict[str, CpuCounter] = {}
        self._usage: dict[str, Usage | None] = {}
        self._usage_of: tuple[int, int] = (-1, -1)
        """(polls, pod cache version) the figures in ``_usage`` were computed from."""
        self.polls = 0

    def __repr__(self) -> str:
        return (
            f"PodMetricsSource(interval_s={self.interval_s:g}, namespaces={len(self.samples)}, "
            f"absent={self.absent!r})"
        )

    def _targets(self) -> dict[str, Workload]:
        workloads = self.workloads()
        return {s: workloads[s] for s in self.wanted() if s in workloads}

    async def run(self) -> None:
        """Poll every interval while leading (after a failure, every few intervals)."""
        while True:
            wait_s = self.interval_s
            if self.is_leader() and self._targets():
                wait_s *= 1 if await self.poll() else ABSENT_RETRY_FACTOR
            await asyncio.sleep(wait_s)

    async def poll(self) -> bool:
        """One list per namespace (with the label selector when one workload lives there);
        False when the metrics API did not answer."""
        by_ns: dict[str, list[Workload]] = {}
        for w in self._targets().values():
            by_ns.setdefault(w.namespace, []).append(w)
        ok = True
        for ns, targets in sorted(by_ns.items()):
            selector = None
            if len(targets) == 1:
                scale = self.cache.scale(targets[0])
                selector = scale.selector if scale is not None and scale.selector else None
            try:
                items = await self.api.list_pod_metrics(ns, selector)
            except NotFound as e:
                self._unavailable(
                    f"the metrics.k8s.io API is not served ({e.message or e.reason}); install "
                    "metrics-server"
                )
                ok = False
                break
            except KubeError as e:
                self._unavailable(f"metrics.k8s.io cannot be read: {e}")
                ok = False
                break
            self.samples[ns] = {m.meta.name: m for m in items}
        self.polls += 1
        if ok:
            if self.absent is not None:
                log.info("CPU use: metrics.k8s.io answers again")
            self.absent = None
        else:
            self.samples.clear()
        return ok

    def _unavailable(self, why: str) -> None:
        if why != self.absent:
            log.warning(
                "CPU use: %s; the CPU metric is missing (a cpu_utilization metric never scales "
                "down; other services are sized from their concurrency alone)",
                why,
            )
        self.absent = why

    def add_cpu_signals(self, signals: Mapping[str, ServiceSignals]) -> dict[str, ServiceSignals]:
        """``signals`` with ``cpu_seconds_total`` of every wanted service (None when not
        measured)."""
        out = dict(signals)
        targets = self._targets()
        state = (self.polls, self.cache.version())
        if state != self._usage_of:  # a new poll, or a pod or workload changed
            self._usage.clear()
            self._usage_of = state
        for service in list(self._counters):
            if service not in targets:
                del self._counters[service]
                self._usage.pop(service, None)
        for service, target in targets.items():
            sig = out.get(service)
            if sig is None:
                continue
            if service in self._usage:
                usage = self._usage[service]
            else:
                usage = None
                scale = self.cache.scale(target)
                samples = self.samples.get(target.namespace)
                if scale is not None and samples is not None:
                    pods = self.cache.pods(target.namespace, scale.selector)
                    usage = service_usage(pods, samples)
                self._usage[service] = usage
            total = self._counters.setdefault(service, CpuCounter()).update(
                sig.at, None if usage is None else usage.cores
            )
            if total is not None and math.isfinite(total):
                out[service] = dataclasses.replace(sig, cpu_seconds_total=total)
        return out

    def report(self) -> dict[str, object]:
        """For the platform's report: the API's state and each service's last figure."""
        return {
            "interval_s": self.interval_s,
            "absent": self.absent,
            "services": {
                s: None
                if u is None
                else {
                    "cores": round(u.cores, 4),
                    "measured_pods": u.measured,
                    "ready_pods": u.ready,
                }
                for s, u in sorted(self._usage.items())
            },
        }
