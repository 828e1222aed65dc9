"""The admin token: constant-time bearer check, probes stay open."""

from __future__ import annotations

import httpx
import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from gateway.admin.auth import AdminTokenMiddleware

TOKEN = "t" * 40


def make_app() -> AdminTokenMiddleware:
    async def ok(request: object) -> PlainTextResponse:
        return PlainTextResponse("ok")

    app = Starlette(
        routes=[Route(p, ok) for p in ("/healthz", "/readyz", "/metrics", "/api/services")]
    )
    return AdminTokenMiddleware(app, TOKEN)


async def get(path: str, headers: dict[str, str] | None = None) -> httpx.Response:
    transport = httpx.ASGITransport(app=make_app())
    async with httpx.AsyncClient(transport=transport, base_url="http://admin") as client:
        return await client.get(path, headers=headers)


@pytest.mark.parametrize("path", ["/metrics", "/api/services"])
async def test_without_token_401(path: str) -> None:
    r = await get(path)
    assert r.status_code == 401
    assert r.headers["www-authenticate"].startswith("Bearer")


@pytest.mark.parametrize(
    "auth",
    ["Bearer wrong", f"Bearer {TOKEN}x", f"Bearer{TOKEN}", TOKEN, f"Basic {TOKEN}", "Bearer "],
)
async def test_wrong_token_401(auth: str) -> None:
    assert (await get("/metrics", {"Authorization": auth})).status_code == 401


@pytest.mark.parametrize("scheme", ["bearer", "BEARER", "bEaReR", "Bearer  "])
async def test_scheme_is_case_insensitive(scheme: str) -> None:
    """RFC 9110 §11.1: the auth-scheme is case-insensitive (and 1*SP precedes the token)."""
    r = await get("/metrics", {"Authorization": f"{scheme} {TOKEN}"})
    assert r.status_code == 200


async def test_right_token_passes() -> None:
    r = await get("/metrics", {"Authorization": f"Bearer {TOKEN}"})
    assert r.status_code == 200 and r.text == "ok"


@pytest.mark.parametrize("path", ["/healthz", "/readyz"])
async def test_probes_stay_open(path: str) -> None:
    assert (await get(path)).status_code == 200


def test_empty_token_refused() -> None:
    with pytest.raises(ValueError):
        AdminTokenMiddleware(make_app(), "")


async def test_the_metrics_token_opens_only_get_metrics() -> None:
    async def ok(request: object) -> PlainTextResponse:
        return PlainTextResponse("ok")

    scrape = "m" * 40
    app = AdminTokenMiddleware(
        Starlette(
            routes=[Route(p, ok, methods=["GET", "POST"]) for p in ("/metrics", "/api/reload")]
        ),
        TOKEN,
        scrape,
    )
    transport = httpx.ASGITransport(app=app)
    bearer = {"Authorization": f"Bearer {scrape}"}
    async with httpx.AsyncClient(transport=transport, base_url="http://admin") as client:
        assert (await client.get("/metrics", headers=bearer)).status_code == 200
        assert (await client.post("/metrics", headers=bearer)).status_code == 401
        assert (await client.get("/api/reload", headers=bearer)).status_code == 401
        assert (await client.post("/api/reload", headers=bearer)).status_code == 401
        admin = {"Authorization": f"Bearer {TOKEN}"}
        assert (await client.post("/api/reload", headers=admin)).status_code == 200


def test_the_metrics_token_is_checked_in_the_config() -> None:
    from gateway.settings import ConfigError, parse_settings

    def problems(admin: dict[str, object]) -> list[str]:
        with pytest.raises(ConfigError) as e:
            parse_settings({"admin": admin}, "cfg.yaml")
        return e.value.problems

    assert problems({"metrics_token": "m" * 40}) == [
        "cfg.yaml: admin.metrics_token: needs token or token_env set as well"
    ]
    assert problems({"token": TOKEN, "metrics_token": TOKEN}) == [
        "cfg.yaml: admin.metrics_token: must differ from token"
    ]
    assert problems({"token": TOKEN, "metrics_token": "short"}) == [
        "cfg.yaml: admin.metrics_token: must be at least 32 characters, got 5"
    ]
    ok = parse_settings({"admin": {"token": TOKEN, "metrics_token": "m" * 40}}, "cfg.yaml")
    assert ok.admin.metrics_token is not None
