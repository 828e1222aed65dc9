"""One service as the data plane sees it: endpoints, balancer, live stats and timeouts.

Built by the composition root (``gateway.app``) and shared by the data plane (which reads
it per request), the admin plane and discovery (which apply endpoint updates to it).
Admission control (slots, queue, rate limit, body limit), the retry policy and budget and
the outlier detector live here too, so a hot reload reconfigures them in place
(:meth:`Service.configure`) without losing in-flight or queued requests.
"""

from __future__ import annotations

import logging
import ssl

from gateway.dataplane.admission import Admission
from gateway.dataplane.app_metrics import AppMetrics
from gateway.dataplane.balancers import Balancer, RandomSource, make_balancer
from gateway.dataplane.endpoints import EndpointSet
from gateway.dataplane.outlier import OutlierDetector
from gateway.dataplane.retry import RetryBudget
from gateway.dataplane.stats import ServiceStats
from gateway.dataplane.tls import FALLBACK_PROTOCOL, TlsError, upstream_context
from gateway.settings import ServiceConfig, TimeoutsConfig, UpstreamTlsConfig

log = logging.getLogger(__name__)


class Service:
    __slots__ = (
        "admission",
        "app_headers",
        "app_metrics",
        "balancer",
        "balancer_name",
        "config",
        "connect_s",
        "endpoints",
        "name",
        "outlier",
        "response_header_s",
        "retry_budget",
        "retry_policy",
        "rng",
        "stats",
        "total_s",
        "upgrade_protocols",
        "upstream_h2",
        "upstream_sni",
        "upstream_ssl",
        "wants_latency_histogram",
    )

    def __init__(
        self,
        name: str,
        balancer: str = "least_request",
        timeouts: TimeoutsConfig | None = None,
        rng: RandomSource | None = None,
    ) -> None:
        t = timeouts or TimeoutsConfig()
        self.name = name
        self.balancer_name = balancer
        self.balancer: Balancer = make_balancer(balancer, rng)
        self.endpoints = EndpointSet(name)
        self.stats = ServiceStats(name)
        self.connect_s = t.connect_s
        self.response_header_s = t.response_header_s
        self.total_s = t.total_s
        self.upstream_h2 = False
        """Requests go upstream over HTTP/2 (``protocol: h2c`` or ``h2``), one stream each."""
        self.rng = rng
        self.config = ServiceConfig(balancer=balancer, timeouts=t)  # type: ignore[arg-type]
        self.admission = Admission(name, self.config.limits, gauge=self.stats)
        self.retry_policy = self.config.retries
        self.retry_budget = RetryBudget(self.retry_policy)
        self.outlier = OutlierDetector(name, self.config.outlier_detection, self.endpoints)
        self.upgrade_protocols = frozenset(
            p.lower().encode() for p in self.config.upgrades.protocols
        )
        self.upstream_ssl: ssl.SSLContext | None = None
        """``upstream_tls``: the client context for the endpoints (None: plain HTTP)."""
        self.upstream_sni: str | None = None
        """The SNI and verified name (None: the endpoint's host)."""
        self.app_metrics: AppMetrics | None = None
        """``app`` metrics of ``scaling.metrics`` (None: the service has none)."""
        self.app_headers: AppMetrics | None = None
        """The same when some are read from response headers (the hot path's check)."""
        self.wants_latency_histogram = False
        """A ``latency`` metric reads the latency histogram from the signals."""
        self.endpoints.on_change = self._endpoints_changed

    @classmethod
    def from_config(
        cls, name: str, config: ServiceConfig, rng: RandomSource | None = None
    ) -> Service:
        service = cls(name, config.balancer, config.timeouts, rng)
        service.configure(config)
        return service

    def configure(self, config: ServiceConfig) -> None:
        """Apply a (reloaded) config; endpoints, stats, slots and queued requests are kept."""
        if config.balancer != self.balancer_name:
            self.balancer_name = config.balancer
            self.balancer = make_balancer(config.balancer, self.rng)
        t = config.timeouts
        self.connect_s = t.connect_s
        self.response_header_s = t.response_header_s
        self.total_s = t.total_s
        self.admission.configure(config.limits)
        self.retry_policy = config.retries
        self.retry_budget.configure(config.retries)
        self.outlier.configure(config.outlier_detection)
        self.upgrade_protocols = frozenset(p.lower().encode() for p in config.upgrades.protocols)
        upstream_h2 = config.protocol != "http1"
        if upstream_h2 != self.upstream_h2:  # the endpoints' pools are of the other kind
            self.upstream_h2 = upstream_h2
            self._close_pools()
        if config.upstream_tls != self.config.upstream_tls or (config.protocol == "h2") != (
            self.config.protocol == "h2"
        ):
            self._configure_upstream_tls(config.upstream_tls, config.protocol == "h2")
        self._configure_metrics(config)
        self.config = config

    def _configure_metrics(self, config: ServiceConfig) -> None:
        """``scaling.metrics``: what the data plane reads for them (values kept on a reload
        that keeps the same app metrics)."""
        metrics = config.scaling.metrics
        apps = [m for m in metrics if m.type == "app"]
        if not apps:
            self.app_metrics = None
        elif self.app_metrics is None or not self.app_metrics.same_specs(apps):
            self.app_metrics = AppMetrics(apps)
        app = self.app_metrics
        self.app_headers = app if app is not None and app.reads_headers else None
        self.wants_latency_histogram = any(m.type == "latency" for m in metrics)

    def allows_upgrade(self, upgrade: bytes) -> bool:
        """Whether a request's ``Upgrade`` value names only protocols this service takes."""
        tokens = {t.strip().lower() for t in upgrade.split(b",")} - {b""}
        return bool(tokens) and tokens <= self.upgrade_protocols

    def _configure_upstream_tls(self, config: UpstreamTlsConfig, h2: bool) -> None:
        try:
            context = upstream_context(config, "h2" if h2 else FALLBACK_PROTOCOL)
        except TlsError as e:  # checked before applying; the file changed since
            log.error("service %s: upstream_tls not changed: %s", self.name, e)
            return
        self.upstream_ssl = context
        self.upstream_sni = config.server_name
        self._close_pools()  # pooled connections speak the old scheme

    def _close_pools(self) -> None:
        for ep in self.endpoints.endpoints:
            if ep.pool is not None:
                ep.pool.close()
                ep.pool = None

    def _endpoints_changed(self) -> None:
        self.admission.set_replicas(len(self.endpoints.routable))

    def __repr__(self) -> str:
        return f"Service({self.name}, {self.balancer!r}, {self.endpoints!r})"
