"""Tracer provider setup: config + OTEL_* environment -> an owned TracerProvider.

Nothing happens at import time: :meth:`Telemetry.start` is called from the app's lifespan and
:meth:`Telemetry.shutdown` flushes and closes the exporter there.  The provider is *not*
installed as OpenTelemetry's global one: Sluice hands its tracer to the parts that trace (the
data plane, the scaler), so two gateways in one process (tests) never share state.

Precedence (see docs/telemetry.md): a key set in the config file wins; a key left out falls
back to the standard OTEL_* variable; then to the model's default.  ``OTEL_SDK_DISABLED=true``
turns tracing off whatever the file says.  Exporter endpoint/headers/timeout/compression left
out of the file come from ``OTEL_EXPORTER_OTLP[_TRACES]_*`` (read by ``gateway.telemetry.otlp``
for otlp_http, by the OpenTelemetry gRPC exporter for otlp_grpc); batching from
``OTEL_BSP_*``; the resource from ``OTEL_RESOURCE_ATTRIBUTES`` / ``OTEL_SERVICE_NAME``
(``service.name`` defaults to ``sluice``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass

from opentelemetry.sdk.resources import SERVICE_NAME, SERVICE_VERSION, Resource
from opentelemetry.sdk.trace import SpanProcessor, SynchronousMultiSpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SpanExporter,
)
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Tracer

import gateway
from gateway.settings import ExporterName, TracesConfig
from gateway.telemetry.buffer import RecentTraces

log = logging.getLogger(__name__)

SERVICE = "sluice"
INSTRUMENTATION = "sluice"

_ENV_EXPORTERS: dict[str, ExporterName] = {
    "otlp": "otlp_http",  # the spec's default protocol choice is left to OTEL_EXPORTER_OTLP_PROTOCOL
    "console": "console",
    "none": "none",
}
_ENV_SAMPLERS = {
    "parentbased_traceidratio": None,  # ratio from OTEL_TRACES_SAMPLER_ARG
    "parentbased_always_on": 1.0,
    "parentbased_always_off": 0.0,
}


class TelemetryError(Exception):
    """Tracing cannot be set up as configured (a bad OTEL_* variable, a missing exporter)."""


@dataclass(frozen=True, slots=True)
class TraceSetup:
    """The effective trace settings after config-vs-environment resolution."""

    enabled: bool
    ratio: float
    exporter: ExporterName
    endpoint: str | None
    """None: the exporter reads OTEL_EXPORTER_OTLP[_TRACES]_ENDPOINT or uses its default."""
    headers: dict[str, str] | None
    """None: the exporter reads OTEL_EXPORTER_OTLP[_TRACES]_HEADERS."""
    max_traces: int
    max_spans_per_trace: int


def resolve(config: TracesConfig, env: Mapping[str, str]) -> TraceSetup:
    """Merge the ``telemetry.traces`` config with the OTEL_* environment (pure)."""
    fields = config.model_fields_set
    enabled = config.enabled
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        enabled = False

    ratio = config.sampler.ratio
    sampler_set = "sampler" in fields and "ratio" in config.sampler.model_fields_set
    env_sampler = env.get("OTEL_TRACES_SAMPLER", "").strip().lower()
    if not sampler_set and env_sampler:
        if env_sampler not in _ENV_SAMPLERS:
            raise TelemetryError(
                f"OTEL_TRACES_SAMPLER: Sluice samples parent-based only: must be one of "
                f"{', '.join(_ENV_SAMPLERS)}, got {env_sampler!r}"
            )
        fixed = _ENV_SAMPLERS[env_sampler]
        if fixed is None:
            arg = env.get("OTEL_TRACES_SAMPLER_ARG", "1.0").strip()
            try:
                ratio = float(arg)
            except ValueError:
                ratio = -1.0
            if not 0.0 <= ratio <= 1.0:
                raise TelemetryError(
                    f"OTEL_TRACES_SAMPLER_ARG: must be a ratio in 0..1, got {arg!r}"
                )
        else:
            ratio = fixed

    exporter = config.exporter
    env_exporter = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if "exporter" not in fields and env_exporter:
        first = env_exporter.split(",")[0].strip()
        if first not in _ENV_EXPORTERS:
            raise TelemetryError(
                f"OTEL_TRACES_EXPORTER: must be one of {', '.join(_ENV_EXPORTERS)}, got {first!r}"
            )
        exporter = _ENV_EXPORTERS[first]
        protocol = (
            env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or env.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        ) or "http/protobuf"
        if exporter == "otlp_http" and protocol.strip().lower() == "grpc":
            exporter = "otlp_grpc"

    headers = None
    if config.headers:
        headers = {k.lower(): v.get_secret_value() for k, v in config.headers.items()}
    return TraceSetup(
        enabled=enabled,
        ratio=ratio,
        exporter=exporter,
        endpoint=config.endpoint,
        headers=headers,
        max_traces=config.buffer.max_traces,
        max_spans_per_trace=config.buffer.max_spans_per_trace,
    )


def _exporter(setup: TraceSetup, env: Mapping[str, str]) -> SpanExporter | None:
    if setup.exporter == "none":
        return None
    if setup.exporter == "console":
        return ConsoleSpanExporter(service_name=SERVICE)
    if setup.exporter == "otlp_http":
        from gateway.telemetry.otlp import OtlpHttpExporter, otlp_http_settings

        try:
            return OtlpHttpExporter(otlp_http_settings(setup.endpoint, setup.headers, env))
        except ValueError as e:
            raise TelemetryError(f"OTEL_EXPORTER_OTLP_*: {e}") from None
    try:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
            OTLPSpanExporter as GrpcSpanExporter,
        )
    except ImportError as e:  # pragma: no cover - a dependency of the package
        raise TelemetryError(
            f"telemetry.traces.exporter: otlp_grpc needs opentelemetry-exporter-otlp-proto-grpc ({e})"
        ) from None
    return GrpcSpanExporter(endpoint=setup.endpoint, headers=setup.headers)


def _resource() -> Resource:
    resource = Resource.create({})
    name = resource.attributes.get(SERVICE_NAME)
    if not isinstance(name, str) or name.startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: SERVICE}))
    if SERVICE_VERSION not in resource.attributes:
        resource = resource.merge(Resource({SERVICE_VERSION: gateway.__version__}))
    return resource


class Telemetry:
    """Sluice's tracing for one gateway: the provider, its tracer and the recent-traces buffer.

    Build with :meth:`start` in the lifespan, close with :meth:`shutdown`.  When tracing is
    off, ``tracer`` is None and ``requests`` is None: callers branch once on that.
    """

    def __init__(
        self,
        setup: TraceSetup,
        provider: TracerProvider | None,
        buffer: RecentTraces,
        processors: SynchronousMultiSpanProcessor | None,
    ) -> None:
        from gateway.telemetry.requests import RequestTracing

        self.setup = setup
        self.provider = provider
        self.buffer = buffer
        self.tracer: Tracer | None = None
        self.requests: RequestTracing | None = None
        if provider is not None and processors is not None:
            self.tracer = provider.get_tracer(INSTRUMENTATION)
            self.requests = RequestTracing(
                processors.on_end,
                provider.resource,
                InstrumentationScope(INSTRUMENTATION),
                setup.ratio,
            )

    def __repr__(self) -> str:
        s = self.setup
        if not s.enabled:
            return "Telemetry(traces=off)"
        return f"Telemetry(ratio={s.ratio:g}, exporter={s.exporter}, buffer={self.buffer!r})"

    @classmethod
    def start(
        cls,
        config: TracesConfig,
        env: Mapping[str, str] | None = None,
        extra_processors: tuple[SpanProcessor, ...] = (),
    ) -> Telemetry:
        """Resolve the settings and, if tracing is on, build the provider and exporter."""
        environ = os.environ if env is None else env
        setup = resolve(config, environ)
        buffer = RecentTraces(setup.max_traces, setup.max_spans_per_trace)
        if not setup.enabled:
            return cls(setup, None, buffer, None)
        processors = SynchronousMultiSpanProcessor()  # type: ignore[no-untyped-call]
        provider = TracerProvider(
            sampler=ParentBased(TraceIdRatioBased(setup.ratio)),
            resource=_resource(),
            shutdown_on_exit=False,
            active_span_processor=processors,
        )
        provider.add_span_processor(buffer)
        exporter = _exporter(setup, environ)
        if exporter is not None:
            provider.add_span_processor(BatchSpanProcessor(exporter))
        for processor in extra_processors:
            provider.add_span_processor(processor)
        log.info(
            "tracing on: sampler parentbased_ratio %g, exporter %s%s",
            setup.ratio,
            setup.exporter,
            f" -> {setup.endpoint}" if setup.endpoint else "",
        )
        return cls(setup, provider, buffer, processors)

    def force_flush(self, timeout_s: float = 5.0) -> bool:
        if self.provider is None:
            return True
        return self.provider.force_flush(int(timeout_s * 1000))

    def shutdown(self) -> None:
        """Flush what is pending and close the exporter (blocking: at most the export timeout)."""
        if self.provider is not None:
            self.provider.shutdown()
            self.provider = None
            self.tracer = None
            self.requests = None
