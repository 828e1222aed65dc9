"""Runtime.apply_settings (hot reload): services reconfigured in place, routes swapped whole
on the static platform, Ingress-derived routes kept on kubernetes."""

from __future__ import annotations

from typing import Any

from gateway.dataplane.updates import (
    RouteRule,
    RoutesUpdate,
    endpoints_from_settings,
    routes_from_settings,
)
from gateway.runtime import Runtime
from gateway.settings import parse_settings


def settings(platform: str = "static", **services: Any) -> Any:
    return parse_settings({"platform": platform, "services": services})


def started(s: Any) -> Runtime:
    rt = Runtime(s, clock=lambda: 1.0)
    rt.apply_routes(routes_from_settings(s))
    for update in endpoints_from_settings(s):
        rt.apply_endpoints(update)
    return rt


def test_static_reload_reconfigures_in_place_and_swaps_routes() -> None:
    old = settings(
        api={"routes": [{"path": "/api"}], "endpoints": ["127.0.0.1:1"]},
        gone={"routes": [{"path": "/gone"}], "endpoints": ["127.0.0.1:3"]},
    )
    rt = started(old)
    api = rt.services["api"]
    api.admission.in_use = 2  # two requests hold slots across the reload
    new = settings(
        api={
            "routes": [{"path": "/v2"}],
            "endpoints": ["127.0.0.1:2"],
            "balancer": "round_robin",
            "limits": {"concurrency_per_replica": 4},
        },
    )
    rt.apply_settings(new)
    assert rt.services["api"] is api  # same object: stats, slots, queue kept
    assert api.admission.in_use == 2 and api.admission.capacity == 4
    assert api.balancer_name == "round_robin"
    assert rt.routes.match("x", "/v2/a") == "api"
    assert rt.routes.match("x", "/api") is None
    assert [ep.address for ep in api.endpoints.routable] == ["127.0.0.1:2"]
    assert "gone" not in rt.services
    assert rt.settings is new


def test_kubernetes_reload_keeps_ingress_routes() -> None:
    old = settings("kubernetes", **{"ns/web": {}})
    rt = Runtime(old, clock=lambda: 1.0)
    rt.apply_routes(
        RoutesUpdate(rules=(RouteRule(service="ns/web", host=None, path="/", path_type="Prefix"),))
    )
    rt.apply_settings(settings("kubernetes", **{"ns/web": {"limits": {"max_body_bytes": 10}}}))
    assert rt.routes.match("any", "/x") == "ns/web"
    assert rt.services["ns/web"].admission.max_body_bytes == 10
