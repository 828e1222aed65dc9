"""``POST /api/metrics/<service>``: a service pushes the value of one of its ``app`` metrics.

Body: ``{"name": "queue_length", "value": 1234}``, for an ``app`` metric of that service whose
source is ``push: true``.  200 with what was recorded; 400 for a body that is not such an
object, a value that is not a finite number >= 0 or a metric the service does not take pushes
for (the message names the ones it does); 404 for an unknown service; 413 over 4 KiB.  The
admin plane's token (``admin.token``) protects it like every admin path.
"""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

if TYPE_CHECKING:
    from gateway.runtime import Runtime

MAX_BODY_BYTES = 4096


def _bad(message: str, status: int = 400) -> Response:
    return JSONResponse({"ok": False, "error": message}, status_code=status)


def _parse(body: bytes) -> tuple[str, float] | str:
    """``(name, value)`` from the body, or what is wrong with it."""
    try:
        data: Any = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return 'the body must be JSON: {"name": "...", "value": number}'
    if not isinstance(data, dict):
        return 'the body must be a JSON object: {"name": "...", "value": number}'
    unknown = sorted(set(data) - {"name", "value"})
    if unknown:
        return f"{unknown[0]}: unknown key (allowed: name, value)"
    name, value = data.get("name"), data.get("value")
    if not isinstance(name, str) or not name:
        return "name: must be a non-empty string"
    if isinstance(value, bool) or not isinstance(value, int | float):
        return f"value: must be a number, got {value!r}"
    if not math.isfinite(value) or value < 0:
        return f"value: must be finite and >= 0, got {value!r}"
    return name, float(value)


def push_route(runtime: Runtime) -> Route:
    """The route; values go to the service's :class:`~gateway.dataplane.app_metrics.AppMetrics`."""

    async def push(request: Request) -> Response:
        service_name = request.path_params["service"]
        service = runtime.services.get(service_name)
        if service is None:
            return _bad(f"no service named {service_name!r}", 404)
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > MAX_BODY_BYTES:
            return _bad(f"the body must be at most {MAX_BODY_BYTES} bytes", 413)
        body = await request.body()
        if len(body) > MAX_BODY_BYTES:
            return _bad(f"the body must be at most {MAX_BODY_BYTES} bytes", 413)
        parsed = _parse(body)
        if isinstance(parsed, str):
            return _bad(parsed)
        name, value = parsed
        app = service.app_metrics
        if app is None or not app.push(name, value, runtime.now()):
            takes = ", ".join(app.pushable()) if app is not None else ""
            return _bad(
                f"name: {service_name} has no app metric {name!r} with source push: true"
                + (f" (it takes: {takes})" if takes else "")
            )
        return JSONResponse({"ok": True, "service": service_name, "name": name, "value": value})

    return Route("/api/metrics/{service:path}", push, methods=["POST"])
