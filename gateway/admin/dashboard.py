"""The web dashboard: ``GET /`` (a static page shipped as package data) and ``GET /api/overview``.

The page (``gateway/admin/static/``: HTML, JS and CSS, no build step) polls the JSON API
(``/api/overview``, ``/api/services``, ``/api/decisions``, ``/api/traces``) once a second and
draws everything in the browser.  ``/api/overview`` adds what the other endpoints do not
carry: each service's routes, bounds, floor and fair share, and the budget.  The same token
rules apply as for every admin path (``gateway.admin.auth``).
"""

from __future__ import annotations

from importlib import resources
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

import gateway
from scaler.arbiter import fair_shares

if TYPE_CHECKING:
    from gateway.runtime import Runtime

STATIC_FILES: dict[str, str] = {
    "index.html": "text/html; charset=utf-8",
    "dashboard.js": "text/javascript; charset=utf-8",
    "dashboard.css": "text/css; charset=utf-8",
}


def static_file(name: str) -> bytes:
    """One of :data:`STATIC_FILES`, read from the installed package."""
    return resources.files("gateway.admin").joinpath("static", name).read_bytes()


def overview_json(runtime: Runtime) -> dict[str, Any]:
    """Routes, replica bounds, floor and fair share of every configured service, and the budget.

    The floor is what the arbiter never takes away (``max(min_replicas × cpu.min,
    guaranteed_cpu)``); the fair share is what the service gets when every service wants all
    it can use (``scaler.arbiter.fair_shares``)."""
    settings = runtime.settings
    names = sorted(settings.services)
    policies = [settings.services[n].scaling for n in names]
    fair: list[float] = (
        [float(c) for c in fair_shares(max(runtime.budget_cores(), 1e-9), policies)]
        if names
        else []
    )
    services: dict[str, Any] = {}
    for i, name in enumerate(names):
        config = settings.services[name]
        policy = config.scaling
        services[name] = {
            "routes": [
                {"host": r.host, "path": r.path, "path_type": r.path_type} for r in config.routes
            ],
            "mode": policy.mode,
            "metric": policy.metric,
            "target": policy.target,
            "min_replicas": policy.min_replicas,
            "max_replicas": policy.max_replicas,
            "cpu_min_cores": policy.cpu.min,
            "cpu_max_cores": policy.cpu.max,
            "weight": policy.weight,
            "floor_cores": max(policy.min_replicas * policy.cpu.min, policy.floor_cores),
            "fair_share_cores": fair[i],
        }
    return {
        "at": runtime.now(),
        "version": gateway.__version__,
        "platform": settings.platform,
        "scaler": runtime.scaler is not None,
        "budget": {
            "cpu": runtime.budget_cores(),
            "cpu_config": settings.budget.cpu,
            "source": runtime.budget.source if runtime.budget is not None else "not measured yet",
            "arbitration": settings.budget.arbitration,
            "enforcement": settings.budget.enforcement,
        },
        "services": services,
    }


def dashboard_routes(runtime: Runtime) -> list[Route]:
    """``GET /``, its script and style, and ``GET /api/overview``."""

    def serve(name: str) -> Route:
        media_type = STATIC_FILES[name]
        body = static_file(name)

        async def page(request: Request) -> Response:
            return Response(body, media_type=media_type, headers={"cache-control": "no-cache"})

        return Route("/" if name == "index.html" else f"/{name}", page)

    async def overview(request: Request) -> Response:
        await runtime.refresh()
        return JSONResponse(overview_json(runtime))

    return [*(serve(name) for name in STATIC_FILES), Route("/api/overview", overview)]
