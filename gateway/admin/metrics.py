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
* ``sluice_request_rate_rps{service}`` — arrivals per second over the sliding window
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
* ``sluice_budget_cpu_cores`` / ``sluice_budget_cpu_allocated_total_cores`` — the budget and
  its allocated part
* ``sluice_scaler_decision_applied`` — 1 when decisions are applied (local), 0 when only
  recommended (static)
* ``sluice_scaler_rule{service,rule}`` — 1 for the rule that fired (``stable``, ``panic``,
  ``hpa``, ``frozen: stale signals``, ...); ``sluice_scaler_frozen{service}`` — 1 when frozen
* ``sluice_scaler_demand_cores{service}`` — the CPU the service demanded this tick
* ``sluice_scaler_clamped{service,quantity,bound}`` — 1 for every bound that clamped the
  decision (``max_replicas``, ``max_scale_up_rate``, ``budget``, ``hysteresis``, ...)
* ``sluice_scaler_cpu_flow_cores{service,kind}`` — CPU lent / borrowed / reclaimed / given
  back / taken for others' floors this tick
* ``sluice_cpu_quota_in_force_cores{service}`` — local platform: the CPU quota per replica in
  force in the cgroups now (the decided CPU, or while lending between ticks, ``cpu.min`` for
  an idle service and more than decided for a borrower)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from gateway.dataplane.admission import QUEUE_WAIT_BUCKETS_S
from gateway.dataplane.endpoints import EndpointState
from gateway.dataplane.service import Service
from gateway.dataplane.stats import LATENCY_BUCKETS_S
from scaler.decision import Decision
from scaler.explanation import FLOW_KINDS

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
        now = self._clock()
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
        rate = GaugeMetricFamily(
            "sluice_request_rate_rps",
            "Arrivals per second over the gateway's sliding window.",
            labels=["service"],
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
        for name, service in sorted(self._services().items()):
            stats = service.stats
            for code, n in sorted(stats.codes.items()):
                requests.add_metric([name, str(code)], n)
            arrivals.add_metric([name], stats.arrivals_total)
            in_flight.add_metric([name], stats.in_flight - stats.queued)
            upgraded.add_metric([name], stats.upgraded)
            upgrades.add_metric([name], stats.upgrades_total)
            rate.add_metric([name], stats.rps(now))
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
            rate,
            duration,
            endpoints,
            queue_depth,
            queue_wait,
            rejected,
            retries,
            retries_denied,
            ejections,
        ]


class DecisionCollector(Collector):
    """The scaler's latest decision per service, read at scrape time."""

    def __init__(
        self,
        decisions: Callable[[], Mapping[str, Decision] | None],
        budget_cpu: Callable[[], float],
        applied: Callable[[], bool],
        quotas: Callable[[], Mapping[str, float]] | None = None,
    ) -> None:
        self._decisions = decisions
        self._budget_cpu = budget_cpu
        self._applied = applied
        self._quotas = quotas

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
        flows = GaugeMetricFamily(
            "sluice_scaler_cpu_flow_cores",
            "CPU lent, borrowed, reclaimed, given back or taken for floors this tick (cores).",
            labels=["service", "kind"],
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
        budget = GaugeMetricFamily("sluice_budget_cpu_cores", "The shared CPU budget (cores).")
        budget.add_metric([], self._budget_cpu())
        total = GaugeMetricFamily(
            "sluice_budget_cpu_allocated_total_cores",
            "CPU of the budget allocated to all services together (cores).",
        )
        total.add_metric([], sum(d.allocated_cores for d in decisions.values()))
        applied = GaugeMetricFamily(
            "sluice_scaler_decision_applied",
            "1 when the scaler's decisions are applied, 0 when only recommended.",
        )
        applied.add_metric([], 1 if self._applied() else 0)
        out = [replicas, cpu, allocated, budget, total, applied, rule, frozen, demand, clamped]
        out.append(flows)
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


def build_registry(
    services: Callable[[], Mapping[str, Service]],
    clock: Callable[[], float],
    decisions: DecisionCollector | None = None,
) -> CollectorRegistry:
    """A registry of its own (not the global one) holding the service collector (and the
    decision collector when given)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ServiceCollector(services, clock))
    if decisions is not None:
        registry.register(decisions)
    return registry


def render(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)
