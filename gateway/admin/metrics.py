"""Prometheus metrics, read from the live stats at scrape time (nothing per request).

A custom collector walks every service's :class:`~gateway.dataplane.stats.ServiceStats` and
endpoint set when ``/metrics`` is scraped, so the hot path pays only for the plain
counters it already keeps.

* ``sluice_requests_total{service,code}`` — completed requests by HTTP status (499: the
  client left first; gateway errors use their own status, see docs/dataplane.md)
* ``sluice_arrivals_total{service}`` — requests that reached the service
* ``sluice_in_flight{service}`` — requests being forwarded now (upgraded connections included)
* ``sluice_upgraded_connections{service}`` / ``sluice_upgrades_total{service}`` — upgraded
  connections (WebSockets) open now, and upgrades accepted (101) since start
* ``sluice_request_duration_seconds{service}`` — histogram, arrival to completion
* ``sluice_endpoints{service,state}`` — endpoints by state (ready, terminating,
  not_ready, draining, ejected)
* ``sluice_queue_depth{service}`` — requests waiting in the admission queue now
* ``sluice_queue_wait_seconds{service}`` — histogram of the wait of requests that queued
* ``sluice_admission_rejected_total{service,cause}`` — rate-limited, queue-full, queue-timeout
* ``sluice_retries_total{service}`` / ``sluice_retries_denied_total{service}`` — retries
  started, and refused by the retry budget
* ``sluice_ejections_total{service}`` — outlier ejections

From the scaler's latest decisions (``DecisionCollector``; absent when no scaler runs):

* ``sluice_replicas{service}`` — replicas decided
* ``sluice_cpu_per_replica_cores{service}`` — CPU per replica decided
* ``sluice_budget_cpu_allocated_cores{service}`` — the service's share of the budget
  (replicas × CPU per replica)
* ``sluice_budget_cpu_cores`` — the budget (its allocated part:
  ``sum(sluice_budget_cpu_allocated_cores)``)
* ``sluice_scaler_target{service,metric}`` / ``sluice_scaler_observed{service,metric,window}``
  — the policy's target per replica and the metric the scaler saw (the service's total over
  the ``stable`` and ``panic`` windows; ``average`` per replica in HPA mode)
* ``sluice_scaler_min_replicas{service}`` / ``sluice_scaler_max_replicas{service}``
* ``sluice_scaler_cpu_used_cores{service}`` / ``sluice_scaler_cpu_throttled_ratio{service}`` —
  measured CPU use and throttled seconds per second, as the scaler read them
* ``sluice_scaler_decision_applied`` — 1 when decisions are applied (local), 0 when only
  recommended (static)
* ``sluice_scaler_rule{service,rule}`` — 1 for the rule that fired (``stable``, ``panic``,
  ``hpa``, ``frozen: stale signals``, ...); ``sluice_scaler_frozen{service}`` — 1 when frozen
* ``sluice_scaler_demand_cores{service}`` — the CPU the service demanded this tick
* ``sluice_scaler_clamped{service,quantity,bound}`` — 1 for every bound that clamped the
  decision (``max_replicas``, ``max_scale_up_rate``, ``budget``, ``hysteresis``, ...)
* ``sluice_scaler_resize_blocked{service}`` — 1 when in-place CPU resize is blocked
  (Kubernetes: a pod's resize ``Infeasible``/``Deferred``), so replicas scale instead
* ``sluice_scaler_cpu_flow_cores{service,kind}`` — CPU lent / borrowed / reclaimed / given
  back / taken for others' floors this tick
* ``sluice_scaler_leader`` — 1 while this gateway leads (decides and applies; always 1
  outside Kubernetes), 0 on a Kubernetes follower
* ``sluice_cpu_quota_in_force_cores{service}`` — local platform: the CPU quota per replica in
  force in the cgroups now (the decided CPU, or while lending between ticks, ``cpu.min`` for
  an idle service and more than decided for a borrower)
* ``sluice_replica_restarts_total{service}`` — local platform: replica restarts after a crash
* ``sluice_replica_oom_kills_total{service}`` — local platform: replica processes the kernel
  killed for exceeding ``replicas.memory_max``

The gateway itself (``GatewayCollector``): ``sluice_build_info{version,python_version}``,
``sluice_unmatched_requests_total`` (no route matched), ``sluice_config_reloads_total{result}``,
``sluice_config_last_reload_successful``, ``sluice_config_last_reload_success_timestamp_seconds``
and ``sluice_config_generation``; plus prometheus_client's ``process_*`` and ``python_*``.
"""

from __future__ import annotations

import math
import platform
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    generate_latest,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from gateway.admin.reload import ReloadCounts
from gateway.dataplane.admission import QUEUE_WAIT_BUCKETS_S
from gateway.dataplane.endpoints import EndpointState
from gateway.dataplane.service import Service
from scaler.decision import Decision
from scaler.explanation import FLOW_KINDS
from scaler.metrics import metrics_of
from scaler.policy import ScalingPolicy
from scaler.signals import LATENCY_BUCKETS_S

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class ServiceCollector(Collector):
    def __init__(
        self, services: Callable[[], Mapping[str, Service]], clock: Callable[[], float]
    ) -> None:
        self._services = services
        self._clock = clock

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterable[Metric]:
        requests = CounterMetricFamily(
            "sluice_requests",
            "Completed requests by service and HTTP status.",
            labels=["service", "code"],
        )
        arrivals = CounterMetricFamily(
            "sluice_arrivals", "Requests that reached the service.", labels=["service"]
        )
        in_flight = GaugeMetricFamily(
            "sluice_in_flight", "Requests being forwarded to the service now.", labels=["service"]
        )
        upgraded = GaugeMetricFamily(
            "sluice_upgraded_connections",
            "Upgraded connections (WebSockets) open now; each also counts in sluice_in_flight.",
            labels=["service"],
        )
        upgrades = CounterMetricFamily(
            "sluice_upgrades", "Upgrades accepted by the upstream (101).", labels=["service"]
        )
        duration = HistogramMetricFamily(
            "sluice_request_duration_seconds",
            "Time from arrival to the end of the response.",
            labels=["service"],
        )
        endpoints = GaugeMetricFamily(
            "sluice_endpoints", "Endpoints by state.", labels=["service", "state"]
        )
        queue_depth = GaugeMetricFamily(
            "sluice_queue_depth", "Requests waiting in the admission queue.", labels=["service"]
        )
        queue_wait = HistogramMetricFamily(
            "sluice_queue_wait_seconds",
            "Time queued requests waited for a slot (admitted or timed out).",
            labels=["service"],
        )
        rejected = CounterMetricFamily(
            "sluice_admission_rejected",
            "Requests refused by admission control.",
            labels=["service", "cause"],
        )
        retries = CounterMetricFamily(
            "sluice_retries", "Requests retried on another endpoint.", labels=["service"]
        )
        retries_denied = CounterMetricFamily(
            "sluice_retries_denied",
            "Retries refused because the retry budget was spent.",
            labels=["service"],
        )
        ejections = CounterMetricFamily(
            "sluice_ejections", "Endpoints ejected by outlier detection.", labels=["service"]
        )
        malformed = CounterMetricFamily(
            "sluice_app_metric_malformed",
            "App metric header values ignored as malformed (scaling.metrics, type: app).",
            labels=["service", "metric"],
        )
        for name, service in sorted(self._services().items()):
            app = service.app_metrics
            if app is not None:
                for metric, n in sorted(app.malformed.items()):
                    malformed.add_metric([name, metric], n)
            stats = service.stats
            for code, n in sorted(stats.codes.items()):
                requests.add_metric([name, str(code)], n)
            arrivals.add_metric([name], stats.arrivals_total)
            in_flight.add_metric([name], stats.in_flight - stats.queued)
            upgraded.add_metric([name], stats.upgraded)
            upgrades.add_metric([name], stats.upgrades_total)
            buckets: list[tuple[str, float]] = []
            cumulative = 0
            for bound, n in zip(LATENCY_BUCKETS_S, stats.latency_counts, strict=False):
                cumulative += n
                buckets.append((repr(bound), cumulative))
            buckets.append(("+Inf", sum(stats.latency_counts)))
            duration.add_metric([name], buckets, stats.latency_sum_s)
            counts = dict.fromkeys([*(s.value for s in EndpointState), "ejected"], 0)
            for ep in service.endpoints.endpoints:
                counts["ejected" if ep.ejected else ep.state.value] += 1
            for state, n in counts.items():
                endpoints.add_metric([name, state], n)
            adm = service.admission
            queue_depth.add_metric([name], adm.queued)
            wait_buckets: list[tuple[str, float]] = []
            cumulative = 0
            for bound, n in zip(QUEUE_WAIT_BUCKETS_S, adm.wait_counts, strict=False):
                cumulative += n
                wait_buckets.append((repr(bound), cumulative))
            wait_buckets.append(("+Inf", sum(adm.wait_counts)))
            queue_wait.add_metric([name], wait_buckets, adm.wait_sum_s)
            for cause, n in sorted(adm.rejected.items()):
                rejected.add_metric([name, cause], n)
            retries.add_metric([name], service.retry_budget.started_total)
            retries_denied.add_metric([name], service.retry_budget.denied_total)
            ejections.add_metric([name], service.outlier.ejections_total)
        return [
            requests,
            arrivals,
            in_flight,
            upgraded,
            upgrades,
            duration,
            endpoints,
            queue_depth,
            queue_wait,
            rejected,
            retries,
            retries_denied,
            ejections,
            malformed,
        ]


class DecisionCollector(Collector):
    """The scaler's latest decision per service, read at scrape time."""

    def __init__(
        self,
        decisions: Callable[[], Mapping[str, Decision] | None],
        budget_cpu: Callable[[], float],
        applied: Callable[[], bool],
        quotas: Callable[[], Mapping[str, float]] | None = None,
        *,
        policies: Callable[[], Mapping[str, ScalingPolicy]] | None = None,
        leader: Callable[[], bool] | None = None,
    ) -> None:
        self._leader = leader
        self._decisions = decisions
        self._budget_cpu = budget_cpu
        self._applied = applied
        self._quotas = quotas
        self._policies = policies

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterable[Metric]:
        decisions = self._decisions()
        if decisions is None:
            return []
        replicas = GaugeMetricFamily(
            "sluice_replicas", "Replicas decided by the scaler.", labels=["service"]
        )
        cpu = GaugeMetricFamily(
            "sluice_cpu_per_replica_cores",
            "CPU per replica decided by the scaler (cores).",
            labels=["service"],
        )
        allocated = GaugeMetricFamily(
            "sluice_budget_cpu_allocated_cores",
            "The service's share of the CPU budget: replicas x CPU per replica (cores).",
            labels=["service"],
        )
        rule = GaugeMetricFamily(
            "sluice_scaler_rule", "1 for the rule that fired.", labels=["service", "rule"]
        )
        frozen = GaugeMetricFamily(
            "sluice_scaler_frozen",
            "1 when the service's decision is frozen (signals missing, stale or refused).",
            labels=["service"],
        )
        demand = GaugeMetricFamily(
            "sluice_scaler_demand_cores",
            "CPU the service demanded this tick (cores).",
            labels=["service"],
        )
        clamped = GaugeMetricFamily(
            "sluice_scaler_clamped",
            "1 for every bound that clamped the service's decision.",
            labels=["service", "quantity", "bound"],
        )
        resize_blocked = GaugeMetricFamily(
            "sluice_scaler_resize_blocked",
            "1 when in-place CPU resize is blocked for the service (replicas scale instead).",
            labels=["service"],
        )
        flows = GaugeMetricFamily(
            "sluice_scaler_cpu_flow_cores",
            "CPU lent, borrowed, reclaimed, given back or taken for floors this tick (cores).",
            labels=["service", "kind"],
        )
        answer = GaugeMetricFamily(
            "sluice_scaler_metric_replicas",
            "scaling.metrics: the replicas each metric asked for (absent: no data or no opinion).",
            labels=["service", "metric"],
        )
        winner = GaugeMetricFamily(
            "sluice_scaler_metric_won",
            "scaling.metrics: 1 for the metric whose answer was taken.",
            labels=["service", "metric"],
        )
        for name, d in sorted(decisions.items()):
            replicas.add_metric([name], d.replicas)
            cpu.add_metric([name], d.cpu_per_replica_cores)
            allocated.add_metric([name], d.allocated_cores)
            explanation = d.explanation
            rule.add_metric([name, d.rule], 1)
            frozen.add_metric([name], 1 if d.frozen else 0)
            wanted = explanation.inputs.get("demand_cores")
            if wanted is not None:
                demand.add_metric([name], wanted)
            for clamp in {(c.quantity, c.name) for c in explanation.clamps}:
                clamped.add_metric([name, *clamp], 1)
            for kind in FLOW_KINDS:
                flows.add_metric([name, kind], explanation.flow_cores(kind))
            blocked = any(s.kind.startswith("split.resize_blocked") for s in explanation.steps)
            resize_blocked.add_metric([name], 1 if blocked else 0)
            verdict = metrics_of(explanation)
            if verdict is not None:
                for a in verdict["answers"]:
                    if a["replicas"] is not None:
                        answer.add_metric([name, a["name"]], a["replicas"])
                    winner.add_metric([name, a["name"]], 1 if a["name"] == verdict["winner"] else 0)
        budget = GaugeMetricFamily("sluice_budget_cpu_cores", "The shared CPU budget (cores).")
        budget.add_metric([], self._budget_cpu())
        applied = GaugeMetricFamily(
            "sluice_scaler_decision_applied",
            "1 when the scaler's decisions are applied, 0 when only recommended.",
        )
        applied.add_metric([], 1 if self._applied() else 0)
        out: list[Metric] = [
            *(replicas, cpu, allocated, budget, applied, rule, frozen, demand, clamped, flows),
            resize_blocked,
            *(answer, winner),
        ]
        out += self._targets(decisions)
        leader = GaugeMetricFamily(
            "sluice_scaler_leader", "1 while this gateway is the scaler's leader, else 0."
        )
        leader.add_metric([], 1 if self._leader is None or self._leader() else 0)
        out.append(leader)
        quotas = self._quotas() if self._quotas is not None else {}
        if quotas:
            in_force = GaugeMetricFamily(
                "sluice_cpu_quota_in_force_cores",
                "CPU quota per replica in force now (cores): decided, or lent/borrowed between ticks.",
                labels=["service"],
            )
            for name, cores in sorted(quotas.items()):
                in_force.add_metric([name], cores)
            out.append(in_force)
        return out

    def _targets(self, decisions: Mapping[str, Decision]) -> list[Metric]:
        """Observed vs target, replica bounds, measured CPU: what each decision started from."""
        policies = self._policies() if self._policies is not None else {}
        target = GaugeMetricFamily(
            "sluice_scaler_target",
            "The policy's target value per replica of the scaling metric.",
            labels=["service", "metric"],
        )
        observed = GaugeMetricFamily(
            "sluice_scaler_observed",
            "The scaling metric as the scaler saw it: the service's total over the stable and "
            "panic windows (KPA), the per-replica average (HPA).",
            labels=["service", "metric", "window"],
        )
        min_r = GaugeMetricFamily(
            "sluice_scaler_min_replicas", "The policy's min_replicas.", labels=["service"]
        )
        max_r = GaugeMetricFamily(
            "sluice_scaler_max_replicas", "The policy's max_replicas.", labels=["service"]
        )
        used = GaugeMetricFamily(
            "sluice_scaler_cpu_used_cores",
            "CPU the service's replicas used, as the scaler measured it (cores).",
            labels=["service"],
        )
        throttled = GaugeMetricFamily(
            "sluice_scaler_cpu_throttled_ratio",
            "Seconds the service's replicas were throttled per second, as the scaler read it.",
            labels=["service"],
        )
        for name, d in sorted(decisions.items()):
            inputs = d.explanation.inputs
            policy = policies.get(name)
            if policy is not None:
                target.add_metric([name, policy.metric], policy.target)
                min_r.add_metric([name], policy.min_replicas)
                max_r.add_metric([name], policy.max_replicas)
                for window in ("stable", "panic", "average"):
                    value = inputs.get(window)
                    if value is not None and math.isfinite(value):
                        observed.add_metric([name, policy.metric, window], value)
            for family, key in ((used, "cpu_used_cores"), (throttled, "cpu_throttled_s_per_s")):
                value = inputs.get(key)
                if value is not None and math.isfinite(value):
                    family.add_metric([name], value)
        return [target, observed, min_r, max_r, used, throttled]


class GatewayCollector(Collector):
    """Build info, requests no route matched, and config reloads."""

    def __init__(
        self,
        version: str,
        unmatched: Callable[[], int] | None = None,
        reloads: Callable[[], ReloadCounts | None] | None = None,
    ) -> None:
        self._version = version
        self._unmatched = unmatched
        self._reloads = reloads

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterable[Metric]:
        info = GaugeMetricFamily(
            "sluice_build_info",
            "Always 1; the labels say which Sluice and Python run.",
            labels=["version", "python_version"],
        )
        info.add_metric([self._version, platform.python_version()], 1)
        out: list[Metric] = [info]
        if self._unmatched is not None:
            unmatched = CounterMetricFamily(
                "sluice_unmatched_requests", "Requests that matched no route (answered 404)."
            )
            unmatched.add_metric([], self._unmatched())
            out.append(unmatched)
        counts = self._reloads() if self._reloads is not None else None
        if counts is not None:
            reloads = CounterMetricFamily(
                "sluice_config_reloads",
                "Config reloads by result (success: applied or unchanged; failure: rejected).",
                labels=["result"],
            )
            reloads.add_metric(["success"], counts.succeeded_total)
            reloads.add_metric(["failure"], counts.rejected_total)
            last_ok = GaugeMetricFamily(
                "sluice_config_last_reload_successful",
                "1 when the last reload (or the start) succeeded, 0 when it was rejected.",
            )
            last_ok.add_metric([], 1 if counts.last_ok else 0)
            last_at = GaugeMetricFamily(
                "sluice_config_last_reload_success_timestamp_seconds",
                "Unix time of the last successful reload (or of the start).",
            )
            last_at.add_metric([], counts.last_success_unix_s)
            generation = GaugeMetricFamily(
                "sluice_config_generation",
                "The config version in force: 1 at start, +1 per change.",
            )
            generation.add_metric([], counts.generation)
            out += [reloads, last_ok, last_at, generation]
        return out


class TlsCollector(Collector):
    """``sluice_tls_certificate_expiry_seconds{host}``: seconds until each served host's
    certificate expires (negative once expired), from the certificates in force."""

    def __init__(
        self,
        expiries: Callable[[], Iterable[tuple[str, float]]],
        wall_clock: Callable[[], float],
    ) -> None:
        self._expiries = expiries
        self._wall_clock = wall_clock

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterable[Metric]:
        now_s = self._wall_clock()
        expiry = GaugeMetricFamily(
            "sluice_tls_certificate_expiry_seconds",
            "Seconds until the certificate serving this host expires (negative: expired).",
            labels=["host"],
        )
        for host, not_after_s in self._expiries():
            expiry.add_metric([host], not_after_s - now_s)
        return [expiry]


class ReplicaCollector(Collector):
    """Restarts and OOM kills of the replicas a platform runs (local), read at scrape time
    from the platform's report (``{service: {"restarts_total": n, "oom_kills_total": n}}``)."""

    def __init__(self, replicas: Callable[[], Mapping[str, Mapping[str, Any]]]) -> None:
        self._replicas = replicas

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterable[Metric]:
        report = self._replicas()
        if not report:
            return []
        restarts = CounterMetricFamily(
            "sluice_replica_restarts",
            "Replica restarts after a crash (any exit, OOM kills included).",
            labels=["service"],
        )
        ooms = CounterMetricFamily(
            "sluice_replica_oom_kills",
            "Replica processes the kernel killed for exceeding replicas.memory_max.",
            labels=["service"],
        )
        for name, r in sorted(report.items()):
            restarts.add_metric([name], r.get("restarts_total", 0))
            ooms.add_metric([name], r.get("oom_kills_total", 0))
        return [restarts, ooms]


def build_registry(
    services: Callable[[], Mapping[str, Service]],
    clock: Callable[[], float],
    decisions: DecisionCollector | None = None,
    gateway: GatewayCollector | None = None,
    extra: Iterable[Collector] = (),
) -> CollectorRegistry:
    """A registry of its own (not the global one) holding the service collector, the decision,
    gateway and ``extra`` collectors when given, and prometheus_client's process, platform and GC
    collectors (``process_*``, ``python_*``)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ServiceCollector(services, clock))
    if decisions is not None:
        registry.register(decisions)
    for collector in extra:
        registry.register(collector)
    if gateway is not None:
        registry.register(gateway)
    for standard in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
        registry.register(standard)
    return registry


def render(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)
