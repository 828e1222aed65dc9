"""OpenTelemetry tracing for Sluice: request spans, scaler tick spans, recent traces in memory.

* ``provider``: config + OTEL_* env -> an owned TracerProvider (:class:`Telemetry`), built in
  the app's lifespan, never at import time;
* ``requests``: the data plane's hooks (sample first, spans only for sampled requests);
* ``propagation``: W3C ``traceparent`` on raw bytes;
* ``buffer``: the ring buffer of recent traces (a SpanProcessor);
* ``otlp``: the OTLP/HTTP exporter with a lean protobuf encoder;
* ``scaler``: ``TracedEngine``, a span per scaler tick and per changed decision;
* ``api``: ``GET /api/traces``; ``view``: the terminal tree that ``sluice traces`` prints.

See docs/telemetry.md.
"""
