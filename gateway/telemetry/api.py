"""``GET /api/traces``: the recent-traces buffer over the admin API (a Starlette route).

Query parameters (all optional): ``service`` (a service name: a trace matches when any span
has ``sluice.service`` equal to it), ``min_duration_ms`` (the whole trace's extent),
``status`` (``ok`` | ``error``: error when the root span's status is ERROR, i.e. the request
failed; a failed attempt that a retry recovered shows in ``error_spans``), ``trace_id`` (32 hex
digits), ``kind`` (``request`` | ``scaler``), ``limit`` (1..1000, default 20).  The answer is
``{"traces": [...], "buffer": {...}}``, most recent first; a bad parameter gets 400 with
``{"error": "<parameter>: <problem>"}``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from gateway.telemetry.buffer import RecentTraces, TraceKind, TraceStatus

_TRACE_ID = re.compile(r"[0-9a-f]{32}")
_DIGITS = re.compile(r"[0-9]{1,9}")  # ASCII only: str.isdigit() takes "²", which int() refuses
MAX_LIMIT = 1000


class QueryError(ValueError):
    """A bad /api/traces query parameter."""


def parse_query(params: dict[str, str]) -> dict[str, Any]:
    """Query parameters -> keyword arguments of :meth:`RecentTraces.query`; raises QueryError."""
    allowed = {"service", "min_duration_ms", "status", "trace_id", "kind", "limit"}
    for key in params:
        if key not in allowed:
            raise QueryError(f"{key}: unknown parameter (allowed: {', '.join(sorted(allowed))})")
    out: dict[str, Any] = {}
    if "service" in params:
        out["service"] = params["service"]
    if "min_duration_ms" in params:
        raw = params["min_duration_ms"]
        try:
            value = float(raw)
        except ValueError:
            value = -1.0
        if not value >= 0 or value == float("inf"):
            raise QueryError(f"min_duration_ms: must be a number >= 0, got {raw[:40]!r}")
        out["min_duration_ms"] = value
    if "status" in params:
        status = params["status"].lower()
        if status not in ("ok", "error"):
            raise QueryError(f"status: must be one of ok, error, got {params['status']!r}")
        typed_status: TraceStatus = "ok" if status == "ok" else "error"
        out["status"] = typed_status
    if "kind" in params:
        kind = params["kind"].lower()
        if kind not in ("request", "scaler"):
            raise QueryError(f"kind: must be one of request, scaler, got {params['kind']!r}")
        typed_kind: TraceKind = "request" if kind == "request" else "scaler"
        out["kind"] = typed_kind
    if "trace_id" in params:
        trace_id = params["trace_id"].lower()
        if not _TRACE_ID.fullmatch(trace_id):
            raise QueryError(f"trace_id: must be 32 hex digits, got {params['trace_id']!r}")
        out["trace_id"] = int(trace_id, 16)
    if "limit" in params:
        raw = params["limit"]
        if not _DIGITS.fullmatch(raw) or not 1 <= int(raw) <= MAX_LIMIT:
            raise QueryError(f"limit: must be an integer in 1..{MAX_LIMIT}, got {raw[:40]!r}")
        out["limit"] = int(raw)
    return out


def traces_endpoint(buffer: RecentTraces, enabled: bool = True) -> Callable[[Request], Any]:
    """The handler of ``GET /api/traces`` over ``buffer``."""

    async def api_traces(request: Request) -> JSONResponse:
        try:
            query = parse_query(dict(request.query_params))
        except QueryError as e:
            return JSONResponse({"error": str(e)}, status_code=400)
        traces = buffer.query(**query)
        return JSONResponse(
            {
                "traces": traces,
                "buffer": {
                    "tracing": "on" if enabled else "off",
                    "traces": len(buffer),
                    "max_traces": buffer.max_traces,
                    "max_spans_per_trace": buffer.max_spans_per_trace,
                },
            }
        )

    return api_traces


def traces_route(buffer: RecentTraces, enabled: bool = True) -> Route:
    """The route to add to the admin app: ``routes.append(traces_route(telemetry.buffer))``."""
    return Route("/api/traces", traces_endpoint(buffer, enabled), methods=["GET"])
