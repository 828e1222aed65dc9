"""The admin plane (its own port): health, readiness, Prometheus metrics and the JSON API.

* ``GET /`` — the web dashboard (``gateway.admin.dashboard``), and ``GET /api/overview``
* ``GET /healthz`` — 200 while the process runs
* ``GET /readyz`` — 200 once the data plane listens and endpoints are loaded; 503 before
  that and while shutting down
* ``GET /metrics`` — Prometheus text (see ``gateway.admin.metrics``)
* ``GET /api/services`` — per service: balancer, timeouts, endpoints with their state and
  in-flight count, completions by status class and the live signals
* ``GET /api/signals`` — every service's ``ServiceSignals`` (what the scaler reads; the
  Kubernetes platform merges these across gateway replicas)
* routes passed in ``extra_routes`` (``GET /api/traces`` from ``gateway.telemetry.api``,
  ``GET /api/decisions`` from ``gateway.admin.decisions``, ``POST /api/metrics/<service>``
  from ``gateway.admin.app_metrics``, ``POST /api/wake/<service>`` from
  ``gateway.admin.wake``)
* ``POST /api/reload`` — reload the config file now: 200 ``{"ok": true, "generation": N}``,
  or 422 ``{"ok": false, "errors": ["file: key.path: problem", ...]}`` (the running config
  keeps serving)

With ``admin.token`` set every path but ``/healthz`` and ``/readyz`` needs
``Authorization: Bearer <token>``; without one, requests with a foreign ``Host`` and
cross-origin state changes are refused (``gateway.admin.auth``).

Starlette on uvicorn, started on the gateway's event loop: not on the hot path.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import socket
from collections.abc import Callable, Generator, Sequence
from typing import TYPE_CHECKING, Any

import uvicorn
from prometheus_client.registry import Collector
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import BaseRoute, Route

import gateway
from gateway.admin.auth import AdminTokenMiddleware, LocalOriginMiddleware
from gateway.admin.dashboard import dashboard_routes
from gateway.admin.metrics import (
    CONTENT_TYPE,
    DecisionCollector,
    GatewayCollector,
    ReplicaCollector,
    build_registry,
    render,
)
from gateway.admin.reload import Reloader

if TYPE_CHECKING:
    from gateway.runtime import Runtime


def service_view(runtime: Runtime, name: str, now: float) -> dict[str, Any]:
    service = runtime.services[name]
    return {
        "balancer": service.balancer_name,
        "timeouts": {
            "connect_s": service.connect_s,
            "response_header_s": service.response_header_s,
            "total_s": service.total_s,
        },
        "endpoints": [
            {
                "address": ep.address,
                "state": ep.state.value,
                "ejected": ep.ejected,
                "routable": ep in service.endpoints.routable,
                "in_flight": runtime.endpoint_in_flight(name, ep.address),
                "latency_ewma_s": ep.ewma_s if ep.ewma_at is not None else None,
            }
            for ep in service.endpoints.endpoints
        ],
        "completions": service.stats.completions_by_class(),
        "upgraded": {
            "open": service.stats.upgraded,
            "total": service.stats.upgrades_total,
        },
        "admission": {
            "slots_in_use": service.admission.in_use,
            "slots": None
            if service.admission.per_replica is None
            else int(service.admission.capacity),
            "queued": service.admission.queued,
            "rejected": dict(service.admission.rejected),
        },
        "signals": dataclasses.asdict(runtime.signals_of(name, now)),
        "replicas": _platform_replicas(runtime).get(name),
    }


def _platform_replicas(runtime: Runtime) -> dict[str, Any]:
    """What the platform reports of each service's replicas (local: user, memory limit,
    restarts, OOM kills); empty where the platform reports none."""
    if runtime.platform is None:
        return {}
    return dict(runtime.platform.report().get("replicas", {}))


def build_app(
    runtime: Runtime,
    extra_routes: Sequence[BaseRoute] = (),
    reloader: Reloader | None = None,
    unmatched: Callable[[], int] | None = None,
    collectors: Sequence[Collector] = (),
) -> Starlette:
    registry = build_registry(
        lambda: runtime.services,
        runtime.now,
        DecisionCollector(
            lambda: None if runtime.scaler is None else runtime.scaler.last,
            runtime.budget_cores,
            lambda: runtime.settings.platform != "static",
            lambda: (
                dict(runtime.platform.report().get("quota_in_force_cores", {}))
                if runtime.platform is not None
                else {}
            ),
            policies=lambda: {n: c.scaling for n, c in runtime.settings.services.items()},
            leader=lambda: (
                bool(runtime.platform.report().get("leader", True))
                if runtime.platform is not None
                else True
            ),
        ),
        GatewayCollector(
            gateway.__version__, unmatched, None if reloader is None else (lambda: reloader)
        ),
        (*collectors, ReplicaCollector(lambda: _platform_replicas(runtime))),
    )

    async def healthz(request: Request) -> Response:
        return PlainTextResponse("ok\n")

    async def readyz(request: Request) -> Response:
        if runtime.ready:
            return PlainTextResponse("ready\n")
        return PlainTextResponse("not ready\n", status_code=503)

    async def metrics(request: Request) -> Response:
        await runtime.refresh()
        return Response(render(registry), media_type=CONTENT_TYPE)

    async def services(request: Request) -> Response:
        await runtime.refresh()
        now = runtime.now()
        return JSONResponse(
            {
                "at": now,
                "services": {
                    name: service_view(runtime, name, now) for name in sorted(runtime.services)
                },
            }
        )

    async def signals(request: Request) -> Response:
        await runtime.refresh()
        now = runtime.now()
        return JSONResponse(
            {
                "at": now,
                "signals": {
                    name: dataclasses.asdict(s) for name, s in sorted(runtime.signals(now).items())
                },
            }
        )

    async def reload(request: Request) -> Response:
        if reloader is None:
            return JSONResponse(
                {"ok": False, "errors": ["the gateway was not started from a config file"]},
                status_code=409,
            )
        result = reloader.reload("POST /api/reload")
        return JSONResponse(result.as_json(), status_code=200 if result.ok else 422)

    return Starlette(
        routes=[
            Route("/healthz", healthz),
            Route("/readyz", readyz),
            Route("/metrics", metrics),
            Route("/api/services", services),
            Route("/api/signals", signals),
            Route("/api/reload", reload, methods=["POST"]),
            *dashboard_routes(runtime),
            *extra_routes,
        ]
    )


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield  # the gateway owns SIGINT/SIGTERM


class AdminServer:
    """uvicorn serving :func:`build_app` on a socket bound up front (so port 0 works)."""

    def __init__(
        self,
        runtime: Runtime,
        extra_routes: Sequence[BaseRoute] = (),
        reloader: Reloader | None = None,
        unmatched: Callable[[], int] | None = None,
        collectors: Sequence[Collector] = (),
    ) -> None:
        self.runtime = runtime
        self.unmatched = unmatched
        """Requests no route matched so far (the data plane's count), for ``/metrics``."""
        self.extra_routes = tuple(extra_routes)
        self.reloader = reloader
        self.collectors = tuple(collectors)
        """Extra Prometheus collectors for ``/metrics`` (e.g. the TLS certificates' expiry)."""
        """``POST /api/reload`` reloads through it (None: not started from a config file)."""
        self._server: _Server | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self, host: str, port: int) -> tuple[str, int]:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
        sock.setblocking(False)
        bound = sock.getsockname()
        app: Any = build_app(
            self.runtime, self.extra_routes, self.reloader, self.unmatched, self.collectors
        )
        token = self.runtime.settings.admin.token
        if token is not None:
            metrics_token = self.runtime.settings.admin.metrics_token
            app = AdminTokenMiddleware(
                app,
                token.get_secret_value(),
                None if metrics_token is None else metrics_token.get_secret_value(),
            )
        else:
            app = LocalOriginMiddleware(app, str(bound[0]))
        config = uvicorn.Config(
            app,
            log_level="warning",
            access_log=False,
            lifespan="off",
            http="h11",
        )
        self._server = _Server(config)
        self._task = asyncio.get_running_loop().create_task(self._server.serve(sockets=[sock]))
        while not self._server.started:
            if self._task.done():
                self._task.result()  # raises the startup error
                raise RuntimeError("the admin server stopped during startup")
            await asyncio.sleep(0.01)
        return str(bound[0]), int(bound[1])

    async def stop(self) -> None:
        if self._server is not None and self._task is not None:
            self._server.should_exit = True
            await self._task
