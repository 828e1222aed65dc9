"""The root configuration model and its YAML loader.

One pydantic v2 tree, validated once.  Errors are reshaped to one line per problem:
``path/to/file.yaml: services.api.routes[0].path_type: must be one of Exact, Prefix,
ImplementationSpecific, got 'prefix'`` — so an operator can go straight to the key.
The scaler owns its policy models (``scaler.policy``); this module composes them.
"""

from __future__ import annotations

import difflib
import ipaddress
import json
import math
import os
import re
import sys
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal, Self

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    model_validator,
)

from gateway.cores import usable_cores
from gateway.platforms.local.config import ReplicasConfig, group_name
from scaler.policy import (
    BudgetConfig,
    Enforcement,
    KeyedValueError,
    ScalingPolicy,
    check_floors,
)
from scaler.validation import validation_problems

PathType = Literal["Exact", "Prefix", "ImplementationSpecific"]
BalancerName = Literal["round_robin", "least_request", "peak_ewma"]
PlatformName = Literal["static", "local", "kubernetes"]

_SERVICE_NAME = re.compile(r"^[a-z0-9]([a-z0-9._-]*[a-z0-9])?(/[a-z0-9]([a-z0-9._-]*[a-z0-9])?)?$")
_HOST_LABEL = re.compile(r"^(?!-)[a-z0-9-]{1,63}(?<!-)$")


class ConfigError(Exception):
    """A configuration could not be loaded; ``problems`` holds one ``file: key.path: problem`` line each."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


def _check_address(value: str) -> str:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"must be 'host:port' with a port in 1..65535, got {value!r}")
    return value


def _check_route_host(value: str | None) -> str | None:
    if value is None:
        return None
    host = value.lower()
    labels = host.split(".")
    if labels[0] == "*":
        labels = labels[1:]
        if not any(labels):
            raise ValueError(f"a wildcard host needs a domain after '*.', got {value!r}")
    if any(not _HOST_LABEL.match(label) for label in labels):
        raise ValueError(f"must be a DNS name, optionally starting with '*.', got {value!r}")
    return host


def _check_path(value: str) -> str:
    if not value.startswith("/"):
        raise ValueError(f"must start with '/', got {value!r}")
    return value


Address = Annotated[str, AfterValidator(_check_address)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ListenConfig(_Model):
    """Where a server listens."""

    host: str = Field(default="127.0.0.1", description="Address to bind.")
    port: int = Field(default=8080, ge=0, le=65535, description="TCP port (0 = any free port).")
    h2c: bool = Field(
        default=False,
        description="Also serve HTTP/2 over plain TCP to clients that open with the HTTP/2 "
        "preface (h2c by prior knowledge); HTTP/1.1 is served as before. Turned off by a "
        "reload: open h2c connections get GOAWAY and finish their streams.",
    )


ADMIN_TOKEN_MIN_CHARS = 32


def is_loopback_host(host: str) -> bool:
    """True for ``localhost`` and loopback IP addresses (127.0.0.0/8, ::1)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class AdminConfig(_Model):
    """The admin plane: health, readiness, metrics, the JSON API."""

    host: str = Field(
        default="127.0.0.1", description="Address to bind; anything but loopback requires a token."
    )
    port: int = Field(default=9901, ge=0, le=65535, description="TCP port (0 = any free port).")
    token: SecretStr | None = Field(
        default=None,
        description="Bearer token required on every admin request (>= 32 characters; "
        "`Authorization: Bearer <token>`, compared in constant time). Required (or token_env) "
        "when host is not loopback.",
    )
    token_env: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        description="Name of an environment variable holding the token (e.g. filled from a "
        "Kubernetes Secret), read when the gateway starts or reloads; instead of token.",
    )
    metrics_token: SecretStr | None = Field(
        default=None,
        description="A read-only bearer token (>= 32 characters, not the admin token) that opens "
        "only GET /metrics, so a scraper does not hold the token that can reload the config. "
        "Needs token or token_env.",
    )

    @model_validator(mode="after")
    def _check(self) -> Self:
        if self.token is not None and len(self.token.get_secret_value()) < ADMIN_TOKEN_MIN_CHARS:
            raise KeyedValueError(
                "token",
                f"must be at least {ADMIN_TOKEN_MIN_CHARS} characters, "
                f"got {len(self.token.get_secret_value())}",
            )
        if self.token is not None and self.token_env is not None:
            raise KeyedValueError("token_env", "set token or token_env, not both")
        if self.metrics_token is not None:
            value = self.metrics_token.get_secret_value()
            if len(value) < ADMIN_TOKEN_MIN_CHARS:
                raise KeyedValueError(
                    "metrics_token",
                    f"must be at least {ADMIN_TOKEN_MIN_CHARS} characters, got {len(value)}",
                )
            if self.token is None and self.token_env is None:
                raise KeyedValueError("metrics_token", "needs token or token_env set as well")
            if self.token is not None and value == self.token.get_secret_value():
                raise KeyedValueError("metrics_token", "must differ from token")
        if self.token is None and self.token_env is None and not is_loopback_host(self.host):
            raise KeyedValueError(
                "token",
                f"is required when admin.host is not a loopback address (got host {self.host!r})",
            )
        return self


class RouteConfig(_Model):
    """One Ingress-style rule: host (optional) and path."""

    host: Annotated[str | None, AfterValidator(_check_route_host)] = Field(
        default=None,
        description="Exact host, or '*.example.com' for exactly one more label; omitted = any host.",
    )
    path: Annotated[str, AfterValidator(_check_path)] = Field(
        default="/", description="Path to match."
    )
    path_type: PathType = Field(
        default="Prefix",
        description="Exact (case-sensitive, whole path) or Prefix (whole '/'-separated elements); "
        "ImplementationSpecific is treated as Prefix.",
    )


class TimeoutsConfig(_Model):
    """Upstream timeouts, in seconds."""

    connect_s: float = Field(default=1.0, gt=0, description="Connecting to an endpoint.")
    response_header_s: float = Field(
        default=30.0, gt=0, description="From request sent to response headers."
    )
    total_s: float = Field(default=60.0, gt=0, description="The whole exchange, body included.")


class QueueConfig(_Model):
    """The bounded FIFO queue a request waits in for a free concurrency slot."""

    max: int = Field(
        default=100,
        ge=0,
        description="Most requests waiting at once; one more gets 503 (Sluice-Error: queue-full). "
        "0 = no queue: no free slot means 503 at once.",
    )
    timeout_s: float = Field(
        default=10.0,
        gt=0,
        description="Longest wait for a slot; then 503 (Sluice-Error: queue-timeout) with Retry-After.",
    )
    cold_start_max: int = Field(
        default=10000,
        ge=0,
        description="Most requests held at once while the service has no endpoint (scale "
        "from zero: platform local, or kubernetes with min_replicas 0), in place of max (Knative's activator holds 10,000 per "
        "revision); one more gets 503 (Sluice-Error: queue-full).",
    )
    cold_start_timeout_s: float = Field(
        default=300.0,
        gt=0,
        description="Longest wait for a request queued while the service has no endpoint "
        "(scale from zero, as for cold_start_max): it is held through the replica's start-up "
        "(Knative's activator and revision timeout of 300 s); then 503 (Sluice-Error: "
        "queue-timeout).",
    )


class RateLimitConfig(_Model):
    """A token bucket (aiolimiter's leaky bucket): ``rps`` sustained, ``burst`` at once."""

    rps: float = Field(gt=0, description="Requests per second allowed on average.")
    burst: int | None = Field(
        default=None,
        ge=1,
        description="Requests allowed at once above the average rate; default max(1, rps). "
        "Over the limit: 429 (Sluice-Error: rate-limited) with Retry-After.",
    )

    @property
    def burst_requests(self) -> int:
        return self.burst if self.burst is not None else max(1, math.ceil(self.rps))


class ServiceLimits(_Model):
    """Admission control for one service: concurrency slots, queue, rate limit, body size."""

    concurrency_per_replica: int | None = Field(
        default=None,
        ge=1,
        description="Requests forwarded at once per ready endpoint (slots = this × endpoints); "
        "further requests wait in the queue. Omitted = unlimited (no queueing).",
    )
    queue: QueueConfig = Field(
        default_factory=QueueConfig, description="Where requests wait for a slot."
    )
    rate_limit: RateLimitConfig | None = Field(
        default=None, description="Arrival rate limit for the service; omitted = none."
    )
    max_body_bytes: int | None = Field(
        default=None,
        ge=0,
        description="Largest request body accepted (declared Content-Length or chunked total); "
        "larger -> 413. Omitted = unlimited (bodies stream).",
    )


RetryOn = Literal["connect-failure", "reset"]


def _default_retry_on() -> list[RetryOn]:
    return ["connect-failure", "reset"]


class RetryPolicy(_Model):
    """When a failed upstream attempt is tried again, on a different endpoint."""

    max_attempts: int = Field(
        default=2,
        ge=1,
        le=10,
        description="Attempts that reach an upstream per request, including the first (1 = never "
        "retry a reset); connect failures are retried on every other endpoint within timeouts.total_s "
        "without counting here or against the budget.",
    )
    retry_on: list[RetryOn] = Field(
        default_factory=_default_retry_on,
        description="connect-failure: the request was never sent (always safe); reset: the "
        "upstream closed the connection before any response byte (only idempotent methods "
        "with a replayable body).",
    )
    budget_percent: float = Field(
        default=20.0,
        ge=0,
        le=100,
        description="Retries in progress may be at most this percent of the service's active requests…",
    )
    budget_min: int = Field(
        default=3, ge=0, description="…but at least this many retries at once are always allowed."
    )
    replay_body_bytes: int = Field(
        default=65536,
        ge=0,
        le=1 << 20,
        description="A request body up to this size, fully received before the attempt failed, "
        "is replayable; larger or still-streaming bodies are never retried after being sent.",
    )


class HealthCheckConfig(_Model):
    """Active HTTP health checks: GET ``path`` on every endpoint each ``interval_s``."""

    path: Annotated[str, AfterValidator(_check_path)] = Field(
        default="/healthz", description="Path requested; a 2xx or 3xx answer is healthy."
    )
    interval_s: float = Field(default=5.0, gt=0, description="Seconds between checks.")
    timeout_s: float = Field(
        default=1.0, gt=0, description="A check not answered within this is a failure."
    )
    unhealthy_threshold: int = Field(
        default=2, ge=1, description="Consecutive failed checks that eject an endpoint."
    )
    healthy_threshold: int = Field(
        default=1,
        ge=1,
        description="Consecutive passed checks that bring an ejected endpoint back.",
    )


class OutlierDetectionConfig(_Model):
    """Passive outlier detection (and optional active health checks) per service."""

    enabled: bool = Field(default=True, description="Eject endpoints that keep failing.")
    consecutive_failures: int = Field(
        default=5,
        ge=1,
        description="This many consecutive 5xx answers or connect failures eject the endpoint.",
    )
    base_ejection_s: float = Field(
        default=30.0,
        gt=0,
        description="First ejection's length; each repeat ejection lasts this × the number of "
        "times the endpoint has been ejected, up to max_ejection_s.",
    )
    max_ejection_s: float = Field(default=300.0, gt=0, description="Longest an ejection lasts.")
    max_ejection_percent: float = Field(
        default=50.0,
        ge=0,
        le=100,
        description="Never eject more than this percent of the service's endpoints "
        "(at least one endpoint always stays in rotation).",
    )
    health_check: HealthCheckConfig | None = Field(
        default=None, description="Active HTTP health checks; omitted = passive detection only."
    )

    @model_validator(mode="after")
    def _check(self) -> Self:
        if self.max_ejection_s < self.base_ejection_s:
            raise KeyedValueError(
                "max_ejection_s",
                f"must be >= base_ejection_s ({self.base_ejection_s:g}), got {self.max_ejection_s:g}",
            )
        return self


class GatewayLimits(_Model):
    """Limits on what a client may send, for every request (HTTP/1.1 hardening)."""

    max_header_bytes: int = Field(
        default=32768,
        ge=1024,
        description="Largest request head (request line + headers); larger -> 431 and close.",
    )
    max_headers: int = Field(
        default=100, ge=1, description="Most header fields in a request; more -> 431 and close."
    )
    max_uri_bytes: int = Field(
        default=8192, ge=256, description="Longest request target; longer -> 414 and close."
    )
    header_timeout_s: float = Field(
        default=10.0,
        gt=0,
        description="A request head must arrive whole within this many seconds of its first byte "
        "(slowloris defence); else 408 and close.",
    )
    idle_timeout_s: float = Field(
        default=60.0, gt=0, description="A keep-alive connection idle this long is closed."
    )
    underscores_in_headers: bool = Field(
        default=False,
        description="Forward request header fields whose name has an underscore (like nginx's "
        "underscores_in_headers); off: they are dropped, since CGI/WSGI stacks map X_Real_IP "
        "and X-Real-IP to the same HTTP_X_REAL_IP.",
    )


class ShutdownConfig(_Model):
    """What SIGTERM does: /readyz turns 503, stop accepting, drain, exit 0."""

    drain_s: float = Field(
        default=30.0,
        ge=0,
        description="Longest wait for in-flight requests to finish before exiting.",
    )


class AccessLogConfig(_Model):
    """One line per request (proxied, upgraded or refused), off by default."""

    enabled: bool = Field(default=False, description="Write the access log.")
    format: Literal["text", "json"] = Field(
        default="text",
        description="text: combined-like, key=value extras; json: one object per line, stable field names.",
    )
    path: str = Field(
        default="-",
        min_length=1,
        description="File to append to ('-': standard output); reopened on SIGUSR1 (logrotate).",
    )


class ReloadConfig(_Model):
    """Hot reload of the config file (also SIGHUP and POST /api/reload)."""

    watch: bool = Field(default=True, description="Reload when the config file changes.")
    interval_s: float = Field(
        default=1.0, gt=0, le=60, description="How often the file is checked for changes."
    )


class UpgradesConfig(_Model):
    """Connections upgraded to another protocol (``Connection: Upgrade``), e.g. WebSockets."""

    protocols: list[
        Annotated[str, Field(min_length=1, pattern=r"^[!#$%&'*+.^_`|~0-9A-Za-z/-]+$")]
    ] = Field(
        default_factory=lambda: ["websocket"],
        description="Upgrade protocols (case-insensitive) passed to the upstream; an "
        "upgrade request for another is served as plain HTTP without the Upgrade.",
    )
    idle_timeout_s: float = Field(
        default=300.0,
        gt=0,
        description="An upgraded connection with no bytes either way for this long is closed.",
    )


class TlsCertificateConfig(_Model):
    """One certificate and its key (PEM files); the hosts it serves come from its SANs."""

    cert_file: str = Field(
        min_length=1,
        description="PEM certificate chain (leaf first); a relative path is taken from the "
        "config file's directory.",
    )
    key_file: str = Field(
        min_length=1,
        description="PEM private key of the leaf certificate (unencrypted); relative paths as "
        "for cert_file.",
    )


class TlsConfig(_Model):
    """The TLS (HTTPS) listener, beside the plain one."""

    listen: ListenConfig = Field(
        default_factory=lambda: ListenConfig(port=8443), description="Where HTTPS is served."
    )
    certificates: list[TlsCertificateConfig] = Field(
        min_length=1,
        description="Certificates chosen by SNI against each one's subjectAltName DNS names "
        "(exact, or '*.example.com' for one label); the first is the default certificate.",
    )
    min_version: Literal["1.2", "1.3"] = Field(
        default="1.2", description="Oldest TLS version accepted."
    )
    redirect_http: bool = Field(
        default=False,
        description="Answer every request on the plain listener with 308 to the same URL on "
        "https (the TLS listener's port).",
    )
    http2: bool = Field(
        default=False,
        description="Offer HTTP/2 by ALPN ('h2', preferred over 'http/1.1'); each stream goes "
        "through the same routing, admission and balancing as a request. Turned off by a "
        "reload: open HTTP/2 connections get GOAWAY and finish their streams.",
    )
    unknown_sni: Literal["default", "reject"] = Field(
        default="default",
        description="A client naming a host no certificate covers: default = served the "
        "default (first) certificate; reject = the handshake fails (unrecognized_name alert). "
        "A client sending no SNI always gets the default certificate.",
    )


class UpstreamTlsConfig(_Model):
    """HTTPS to a service's endpoints (off by default)."""

    enabled: bool = Field(default=False, description="Connect to the endpoints over TLS.")
    ca_file: str | None = Field(
        default=None,
        description="PEM CA bundle the endpoints' certificates are verified against "
        "(default: the system's trust store); relative to the config file's directory.",
    )
    server_name: str | None = Field(
        default=None,
        description="SNI and the name the certificate must match (default: the endpoint's host).",
    )
    verify: bool = Field(
        default=True, description="Verify the endpoint's certificate chain and name."
    )


class ServiceConfig(_Model):
    """A named backend with routes, endpoints and a scaling policy."""

    routes: list[RouteConfig] = Field(
        default_factory=list, description="Requests matching any of these go here."
    )
    endpoints: list[Address] = Field(
        default_factory=list, description="Static platform: the replicas' 'host:port' addresses."
    )
    replicas: ReplicasConfig | None = Field(
        default=None,
        description="Local platform (required there): how Sluice starts this service's replicas.",
    )
    balancer: BalancerName = Field(
        default="least_request",
        description="round_robin; least_request (power of two choices over in-flight); "
        "peak_ewma (latency EWMA × (in-flight+1)).",
    )
    timeouts: TimeoutsConfig = Field(
        default_factory=TimeoutsConfig, description="Upstream timeouts."
    )
    protocol: Literal["http1", "h2c", "h2"] = Field(
        default="http1",
        description="How requests reach the endpoints: http1 (pooled keep-alive HTTP/1.1), "
        "h2c (HTTP/2 over plain TCP, one multiplexed connection per endpoint; needed for "
        "gRPC trailers end to end) or h2 (HTTP/2 over TLS by ALPN, with upstream_tls).",
    )
    scaling: ScalingPolicy = Field(
        default_factory=ScalingPolicy, description="How this service scales."
    )
    limits: ServiceLimits = Field(
        default_factory=ServiceLimits,
        description="Admission control: concurrency slots, queue, rate limit, body size.",
    )
    retries: RetryPolicy = Field(
        default_factory=RetryPolicy, description="When failed attempts are retried."
    )
    outlier_detection: OutlierDetectionConfig = Field(
        default_factory=OutlierDetectionConfig,
        description="Ejecting endpoints that keep failing.",
    )
    upgrades: UpgradesConfig = Field(
        default_factory=UpgradesConfig,
        description="Protocol upgrades (WebSockets) proxied to this service.",
    )
    upstream_tls: UpstreamTlsConfig = Field(
        default_factory=UpstreamTlsConfig,
        description="HTTPS to the endpoints (CA bundle, SNI); off by default.",
    )

    @model_validator(mode="after")
    def _check(self) -> Self:
        if self.protocol == "h2" and not self.upstream_tls.enabled:
            raise KeyedValueError(
                "protocol",
                "h2 is HTTP/2 over TLS and needs upstream_tls.enabled: true "
                "(h2c is HTTP/2 over plain TCP)",
            )
        if self.protocol == "h2c" and self.upstream_tls.enabled:
            raise KeyedValueError(
                "protocol",
                "h2c is HTTP/2 over plain TCP but upstream_tls is enabled (use protocol: h2)",
            )
        return self


_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")


def _check_dns_label(value: str) -> str:
    if len(value) > 63 or not _DNS_LABEL.match(value):
        raise ValueError(
            f"must be a Kubernetes name (lowercase DNS label, <= 63 chars), got {value!r}"
        )
    return value


def _check_dns_subdomain(value: str) -> str:
    if len(value) > 253 or not _DNS_SUBDOMAIN.match(value):
        raise ValueError(f"must be a Kubernetes name (lowercase DNS subdomain), got {value!r}")
    return value


KubeName = Annotated[str, AfterValidator(_check_dns_subdomain)]
KubeNamespace = Annotated[str, AfterValidator(_check_dns_label)]


class GatewayServiceConfig(_Model):
    """The Kubernetes Service in front of the gateway replicas themselves."""

    namespace: KubeNamespace = Field(
        default="sluice", description="Namespace of the gateway's Service."
    )
    name: KubeName = Field(
        default="sluice",
        description="Name of the gateway's Service: its EndpointSlices list the peer gateway "
        "replicas (signal merging), its load-balancer address goes into Ingress status.",
    )
    admin_port_name: str = Field(
        default="admin",
        min_length=1,
        description="Name of the Service port that reaches each replica's admin server (GET /api/signals).",
    )


class LeaseConfig(_Model):
    """Leader election with a coordination.k8s.io/v1 Lease: only the holder actuates."""

    namespace: KubeNamespace = Field(default="sluice", description="Namespace of the Lease.")
    name: KubeName = Field(default="sluice-scaler", description="Name of the Lease.")
    duration_s: int = Field(
        default=15,
        ge=1,
        le=3600,
        description="leaseDurationSeconds: how long others wait after the last observed renewal "
        "before taking over.",
    )
    renew_deadline_s: float = Field(
        default=10.0,
        gt=0,
        description="The leader stops actuating when it could not renew for this long (< duration_s).",
    )
    retry_period_s: float = Field(
        default=2.0, gt=0, description="How often to try to acquire or renew (< renew_deadline_s)."
    )

    @model_validator(mode="after")
    def _check(self) -> Self:
        if self.renew_deadline_s >= self.duration_s:
            raise KeyedValueError(
                "renew_deadline_s",
                f"must be < duration_s ({self.duration_s}), got {self.renew_deadline_s:g}",
            )
        if self.retry_period_s >= self.renew_deadline_s:
            raise KeyedValueError(
                "retry_period_s",
                f"must be < renew_deadline_s ({self.renew_deadline_s:g}), got {self.retry_period_s:g}",
            )
        return self


class KubernetesConfig(_Model):
    """platform: kubernetes — Ingress routes, EndpointSlice endpoints, /scale and /resize, a Lease."""

    scaling_policies: bool = Field(
        default=True,
        description=(
            "Watch ScalingPolicy objects (sluice.io/v1alpha1; the chart installs the CRD): a "
            "service's policy is the config file's, else its ScalingPolicy's, else its Ingress "
            "annotations'; the leader writes each policy's status."
        ),
    )

    ingress_class: KubeName = Field(
        default="sluice",
        description="Ingresses whose spec.ingressClassName (or legacy kubernetes.io/ingress.class "
        "annotation) equals this are served.",
    )
    namespaces: list[KubeNamespace] = Field(
        default_factory=list,
        description="Namespaces to watch for Ingresses and EndpointSlices; empty = all namespaces "
        "(needs a ClusterRole).",
    )
    gateway_service: GatewayServiceConfig = Field(
        default_factory=GatewayServiceConfig, description="The gateway's own Service."
    )
    status_addresses: list[str] = Field(
        default_factory=list,
        description="IPs/hostnames written to Ingress status.loadBalancer; empty = the gateway "
        "Service's load-balancer ingress, else its cluster IP.",
    )
    lease: LeaseConfig = Field(default_factory=LeaseConfig, description="Leader election.")
    identity: str | None = Field(
        default=None,
        min_length=1,
        description="This replica's Lease holder identity; default: $POD_NAME, else the hostname.",
    )
    kubeconfig: str | None = Field(
        default=None,
        description="Path to a kubeconfig; default: in-cluster config, else ~/.kube/config.",
    )
    api_max_concurrency: int = Field(
        default=4,
        ge=1,
        le=64,
        description="Worker threads for Kubernetes API calls (watches have their own).",
    )
    peer_timeout_s: float = Field(
        default=1.0, gt=0, le=30, description="Timeout for GET /api/signals on each peer gateway."
    )
    pod_metrics_interval_s: float = Field(
        default=15.0,
        ge=1,
        le=300,
        description="How often the leader lists metrics.k8s.io PodMetrics (every managed "
        "service's CPU use), once per namespace of managed services (default: "
        "metrics-server's resolution and the HPA controller's sync period; never more often "
        "than the scaler ticks).",
    )

    @model_validator(mode="after")
    def _check(self) -> Self:
        seen: set[str] = set()
        for i, ns in enumerate(self.namespaces):
            if ns in seen:
                raise KeyedValueError("namespaces", f"{ns!r} is listed twice (entry [{i}])")
            seen.add(ns)
        return self


_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")


class SamplerConfig(_Model):
    """Which traces are recorded: W3C parent-based, then a ratio of new traces by trace id."""

    type: Literal["parentbased_ratio"] = Field(
        default="parentbased_ratio",
        description="parentbased_ratio: follow the caller's sampled flag when a traceparent "
        "arrives, otherwise record this fraction of new traces (by trace id, like "
        "OpenTelemetry's parentbased_traceidratio).",
    )
    ratio: float = Field(
        default=1.0,
        ge=0.0,
        le=1.0,
        description="Fraction of new (root) traces recorded, 0..1; 0.01 = one in a hundred.",
    )


class TraceBufferConfig(_Model):
    """The in-memory ring buffer of recent traces behind GET /api/traces and `sluice traces`."""

    max_traces: int = Field(
        default=200, ge=0, le=100_000, description="Traces kept; the oldest go first (0 = off)."
    )
    max_spans_per_trace: int = Field(
        default=256,
        ge=1,
        le=10_000,
        description="Spans kept per trace; later ones are counted, not kept.",
    )


ExporterName = Literal["otlp_http", "otlp_grpc", "console", "none"]


class TracesConfig(_Model):
    """OpenTelemetry traces: a span per request and per scaler tick.

    Keys set here win over the standard OTEL_* environment variables; keys left out fall
    back to them (OTEL_TRACES_EXPORTER, OTEL_TRACES_SAMPLER[_ARG],
    OTEL_EXPORTER_OTLP[_TRACES]_ENDPOINT/_HEADERS), then to the defaults below.
    OTEL_SDK_DISABLED=true turns tracing off whatever this says.
    """

    enabled: bool = Field(default=False, description="Record traces at all.")
    sampler: SamplerConfig = Field(
        default_factory=SamplerConfig, description="Which traces are recorded."
    )
    exporter: ExporterName = Field(
        default="none",
        description="Where finished spans go besides the in-memory buffer: otlp_http (OTLP/HTTP "
        "protobuf), otlp_grpc, console (stdout), none (only the buffer).",
    )
    endpoint: str | None = Field(
        default=None,
        description="OTLP endpoint: otlp_http takes the full URL "
        "(default http://localhost:4318/v1/traces), otlp_grpc 'http[s]://host:port' "
        "(default http://localhost:4317; http = plaintext).",
    )
    headers: dict[str, SecretStr] = Field(
        default_factory=dict,
        description="Extra headers sent with every export (e.g. an API key); never logged.",
    )
    buffer: TraceBufferConfig = Field(
        default_factory=TraceBufferConfig, description="Recent traces kept in memory."
    )

    @model_validator(mode="after")
    def _check(self) -> Self:
        if self.endpoint is not None:
            if self.exporter not in ("otlp_http", "otlp_grpc"):
                raise KeyedValueError(
                    "endpoint",
                    f"only applies to the otlp_http and otlp_grpc exporters, exporter is {self.exporter!r}",
                )
            scheme, sep, rest = self.endpoint.partition("://")
            if not sep or scheme not in ("http", "https") or not rest or rest.startswith("/"):
                raise KeyedValueError(
                    "endpoint",
                    f"must be an http:// or https:// URL with a host, got {self.endpoint!r}",
                )
        for name in self.headers:
            if not _HEADER_NAME.match(name):
                raise KeyedValueError(
                    f"headers.{name}", "must be an HTTP header name (letters, digits, '-', ...)"
                )
        if self.headers and self.exporter not in ("otlp_http", "otlp_grpc"):
            raise KeyedValueError(
                "headers",
                f"only apply to the otlp_http and otlp_grpc exporters, exporter is {self.exporter!r}",
            )
        return self


class TelemetryConfig(_Model):
    """OpenTelemetry: traces (metrics are served by /metrics in Prometheus format)."""

    traces: TracesConfig = Field(
        default_factory=TracesConfig, description="Request and scaler traces."
    )


def _check_network(value: str) -> str:
    try:
        ipaddress.ip_network(value, strict=False)
    except ValueError:
        raise ValueError(f"must be an IP address or CIDR network, got {value!r}") from None
    return value


class Settings(_Model):
    """Sluice's whole configuration."""

    @property
    def worker_count(self) -> int:
        """``workers`` resolved (``auto``: the cores this process may use, ``gateway.cores``)."""
        if self.workers == "auto":
            return usable_cores()
        return self.workers

    listen: ListenConfig = Field(
        default_factory=ListenConfig, description="The data plane (proxy) listener."
    )
    admin: AdminConfig = Field(
        default_factory=lambda: AdminConfig(port=9901), description="The admin plane listener."
    )
    tls: TlsConfig | None = Field(
        default=None, description="The TLS (HTTPS) listener; omitted = plain HTTP only."
    )
    workers: Annotated[int, Field(ge=1, le=256)] | Literal["auto"] = Field(
        default="auto",
        description="Data-plane processes accepting on the same ports (SO_REUSEPORT); "
        "auto (default) = one per usable core (CPU affinity, capped by the cgroup CPU quota); "
        "1 = everything in one process. The scaler, the admin plane and (on local) the "
        "replicas stay in the main process. Restart to change.",
    )
    platform: PlatformName = Field(
        default="static",
        description="static: endpoints from this file, decisions not applied; local: Sluice runs the replicas; "
        "kubernetes: Ingress + EndpointSlices, /scale and /resize.",
    )
    trusted_proxies: list[Annotated[str, AfterValidator(_check_network)]] = Field(
        default_factory=list,
        description="Peers (IPs or CIDRs) whose X-Forwarded-* headers are trusted and extended.",
    )
    default_backend: str | None = Field(
        default=None, description="Service that receives requests no route matches (else 404)."
    )
    budget: BudgetConfig = Field(default_factory=BudgetConfig, description="The shared CPU budget.")
    limits: GatewayLimits = Field(
        default_factory=GatewayLimits,
        description="Request size and time limits for every client connection.",
    )
    shutdown: ShutdownConfig = Field(
        default_factory=ShutdownConfig, description="Graceful shutdown on SIGTERM."
    )
    reload: ReloadConfig = Field(
        default_factory=ReloadConfig, description="Hot reload of the config file."
    )
    access_log: AccessLogConfig = Field(
        default_factory=AccessLogConfig,
        description="Per-request access log (applied at start; reopened on SIGUSR1).",
    )
    services: dict[str, ServiceConfig] = Field(
        default_factory=dict, description="Services by name."
    )
    kubernetes: KubernetesConfig = Field(
        default_factory=KubernetesConfig,
        description="Settings for platform: kubernetes (ignored by the other platforms).",
    )
    telemetry: TelemetryConfig = Field(
        default_factory=TelemetryConfig, description="OpenTelemetry traces."
    )

    @model_validator(mode="after")
    def _check(self) -> Self:
        for name in self.services:
            if not _SERVICE_NAME.match(name):
                raise KeyedValueError(
                    f"services.{name}",
                    "a service name must be lowercase letters, digits, '.', '_' or '-' "
                    "(optionally 'namespace/name')",
                )
        if self.default_backend is not None and self.default_backend not in self.services:
            raise KeyedValueError(
                "default_backend",
                f"names no service (have: {', '.join(sorted(self.services)) or 'none'}), got {self.default_backend!r}",
            )
        if self.platform == "local":
            _check_local_services(self.services)
        try:
            check_floors(self.budget, {n: s.scaling for n, s in self.services.items()})
        except KeyedValueError as e:
            raise KeyedValueError(f"budget.{e.key}", e.message) from None
        return self


def _check_local_services(services: dict[str, ServiceConfig]) -> None:
    """platform: local — every service says how to start its replicas, on ports of its own."""
    seen: list[tuple[str, ReplicasConfig]] = []
    groups: dict[str, str] = {}
    for name, service in services.items():
        other_name = groups.setdefault(group_name(name), name)
        if other_name != name:
            raise KeyedValueError(
                f"services.{name}",
                f"its replicas' cgroup name {group_name(name)!r} is also services.{other_name}'s "
                "('/' becomes '_' there): rename one of them",
            )
        spec = service.replicas
        if spec is None:
            raise KeyedValueError(
                f"services.{name}.replicas",
                "is required when platform is local (command and port_range of the replicas)",
            )
        if service.endpoints:
            raise KeyedValueError(
                f"services.{name}.endpoints",
                "must be empty when platform is local (Sluice starts the replicas itself)",
            )
        if spec.port_count < service.scaling.max_replicas:
            raise KeyedValueError(
                f"services.{name}.replicas.port_range",
                f"holds {spec.port_count} port(s), fewer than scaling.max_replicas "
                f"({service.scaling.max_replicas})",
            )
        for other_name, other in seen:
            if spec.overlaps(other):
                raise KeyedValueError(
                    f"services.{name}.replicas.port_range",
                    f"{list(spec.port_range)} overlaps services.{other_name}.replicas.port_range "
                    f"{list(other.port_range)}",
                )
        seen.append((name, spec))


def parse_settings(data: Any, source: str = "<config>") -> Settings:
    """Validate already-parsed YAML/JSON data; raise :class:`ConfigError` with one line per problem."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError([f"{source}: the top level must be a mapping, got {type(data).__name__}"])
    try:
        return Settings.model_validate(data)
    except ValidationError as e:
        problems = []
        for err, (path, found) in zip(
            e.errors(include_url=False), validation_problems(e), strict=True
        ):
            problem = found
            if err["type"] == "extra_forbidden":
                problem += did_you_mean(str(err["loc"][-1]), known_keys(Settings, err["loc"][:-1]))
            problems.append(f"{source}: {path}: {problem}" if path else f"{source}: {problem}")
        raise ConfigError(problems) from None


def known_keys(model: type[BaseModel], loc: Sequence[int | str]) -> list[str]:
    """The keys allowed at ``loc`` below ``model`` (the config names, aliases included)."""
    annotation: Any = model
    for part in loc:
        annotation = _unwrap(annotation)
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            field = annotation.model_fields.get(str(part))
            if field is None:
                field = next((f for f in annotation.model_fields.values() if f.alias == part), None)
            if field is None:
                return []
            annotation = field.annotation
        else:
            args = typing.get_args(annotation)
            if not args:
                return []
            annotation = args[-1]  # dict[str, X] -> X; list[X] -> X
    annotation = _unwrap(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [f.alias or name for name, f in annotation.model_fields.items()]
    return []


def _unwrap(annotation: Any) -> Any:
    """``X | None`` and ``Annotated[X, ...]`` -> X."""
    while True:
        origin = typing.get_origin(annotation)
        if origin is typing.Annotated:
            annotation = typing.get_args(annotation)[0]
        elif origin in (typing.Union, types.UnionType):
            rest = [a for a in typing.get_args(annotation) if a is not type(None)]
            if len(rest) != 1:
                return annotation
            annotation = rest[0]
        else:
            return annotation


def did_you_mean(key: str, known: Sequence[str]) -> str:
    """``" (did you mean 'x'?)"`` for the closest known key, or ``""``."""
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def load_settings(path: str | Path) -> Settings:
    """Read and validate a YAML config file; raise :class:`ConfigError` naming the file on any problem."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError([f"{source}: cannot read: {e.strerror or e}"]) from None
    try:
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark else source
        raise ConfigError([f"{where}: invalid YAML: {e.problem or e.context}"]) from None
    except yaml.YAMLError as e:
        raise ConfigError([f"{source}: invalid YAML: {e}"]) from None
    if data is None:
        raise ConfigError(
            [
                f"{source}: the file is empty: a config needs at least 'services:' (see sluice schema)"
            ]
        )
    return with_files_from(parse_settings(data, source), Path(path).parent)


def with_files_from(settings: Settings, base: Path) -> Settings:
    """``settings`` with its relative file paths (TLS certificates and keys, upstream CA
    bundles) taken from ``base`` (the config file's directory)."""

    def absolute(name: str) -> str:
        return name if os.path.isabs(name) else str(base / name)

    update: dict[str, Any] = {}
    if settings.tls is not None:
        certificates = [
            c.model_copy(
                update={"cert_file": absolute(c.cert_file), "key_file": absolute(c.key_file)}
            )
            for c in settings.tls.certificates
        ]
        update["tls"] = settings.tls.model_copy(update={"certificates": certificates})
    services = {}
    for name, service in settings.services.items():
        ca_file = service.upstream_tls.ca_file
        if ca_file is not None and not os.path.isabs(ca_file):
            upstream_tls = service.upstream_tls.model_copy(update={"ca_file": absolute(ca_file)})
            services[name] = service.model_copy(update={"upstream_tls": upstream_tls})
        else:
            services[name] = service
    update["services"] = services
    return settings.model_copy(update=update)


def resolve_admin_token(
    settings: Settings, environ: Mapping[str, str], source: str = "<config>"
) -> Settings:
    """Fill ``admin.token`` from ``admin.token_env`` (done when the gateway starts or reloads,
    not by ``sluice check``); ConfigError when the variable is unset or too short."""
    name = settings.admin.token_env
    if name is None:
        return settings
    value = environ.get(name)
    if not value:
        raise ConfigError([f"{source}: admin.token_env: environment variable {name} is not set"])
    if len(value) < ADMIN_TOKEN_MIN_CHARS:
        raise ConfigError(
            [
                f"{source}: admin.token_env: {name} must hold at least {ADMIN_TOKEN_MIN_CHARS} "
                f"characters, got {len(value)}"
            ]
        )
    admin = settings.admin.model_copy(update={"token": SecretStr(value), "token_env": None})
    return settings.model_copy(update={"admin": admin})


def resolve_enforcement(
    settings: Settings,
    machine_cores: Callable[[], float] | None = None,
    pinnable: Callable[[], bool] | None = None,
) -> Settings:
    """``budget.enforcement: auto`` decided for this machine: ``share`` on local and static
    when the budget is every CPU the replicas can use (``machine_cores``, default: this
    process's cpuset and cgroup quota), and on local when it is a whole number of them and
    the replicas can be pinned to that many CPUs (``pinnable``, default: a writable cpuset
    cgroup controller); else ``limit``.  ``share`` on kubernetes (the budget bounds the
    pods' requests, which the kubelet turns into the kernel's weights; a service whose pods
    are Guaranteed keeps requests = limits and is decided as under limit).  Settings with an
    explicit enforcement come back as is."""
    budget = settings.budget
    if budget.enforcement != "auto":
        return settings
    if settings.platform == "kubernetes":
        rule: Enforcement = "share"
    else:
        from gateway.platforms.machine import cpuset_usable, machine_cpu

        cores = machine_cpu().cores if machine_cores is None else machine_cores()
        can_pin = False
        if settings.platform == "local":
            can_pin = cpuset_usable() if pinnable is None else pinnable()
        rule = budget.auto_enforcement(cores, pinnable=can_pin)
    return settings.model_copy(update={"budget": budget.model_copy(update={"enforcement": rule})})


def load_runtime_settings(path: str | Path) -> Settings:
    """:func:`load_settings` plus what only a running gateway resolves (the admin token,
    ``budget.enforcement: auto``)."""
    return resolve_enforcement(resolve_admin_token(load_settings(path), os.environ, str(path)))


def json_schema() -> str:
    """The JSON Schema of the config file, as ``sluice schema`` prints it."""
    schema = Settings.model_json_schema(mode="validation")
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "Sluice configuration"
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"


def load_or_exit(path: Path) -> Settings:
    """The runtime settings from ``path``; on a config error, one line per problem on stderr
    and exit 2 (what every CLI command does with a bad config)."""
    try:
        return load_runtime_settings(path)
    except ConfigError as e:
        for line in e.problems:
            print(line, file=sys.stderr)
        raise SystemExit(2) from None
