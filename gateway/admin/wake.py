"""``POST /api/wake/<service>``: another gateway replica holds a request for ``service`` at
zero (scale from zero on Kubernetes): tick the scaler now rather than at its next interval.

202 ``{"ok": true, "service": ..., "ticked": bool}``: ``ticked`` is false when the last
decision already runs a replica of it (it is starting).  A replica that does not lead ticks
too, for nothing (its scaler is frozen): followers send wakes to the Lease holder, or to every
replica when they cannot find it.  404 for an unknown service.  No body is read.  The admin
plane's token (``admin.token``) protects it like every admin path.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

if TYPE_CHECKING:
    from gateway.runtime import Runtime


def wake_route(runtime: Runtime, wake: Callable[[str, str], bool]) -> Route:
    """The route; ``wake(service, "peer")`` ticks the scaler (``Scaling.wake``)."""

    async def wake_now(request: Request) -> Response:
        service = request.path_params["service"]
        if service not in runtime.services:
            return JSONResponse(
                {"ok": False, "error": f"no service named {service!r}"}, status_code=404
            )
        ticked = wake(service, "peer")
        return JSONResponse({"ok": True, "service": service, "ticked": ticked}, status_code=202)

    return Route("/api/wake/{service:path}", wake_now, methods=["POST"])
