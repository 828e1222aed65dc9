"""Bearer-token protection for the admin plane (pure ASGI middleware).

With ``admin.token`` set, every admin request must carry ``Authorization: Bearer <token>``;
the comparison is constant-time (``hmac.compare_digest``).  Missing or wrong -> 401 with
``WWW-Authenticate: Bearer``.  The liveness and readiness probes (``/healthz``, ``/readyz``)
stay open: they reveal nothing and orchestrators probe them without credentials.

Without a token the admin plane must be bound to loopback (the config refuses anything
else), so only local processes reach it.
"""

from __future__ import annotations

import hmac

from starlette.types import ASGIApp, Receive, Scope, Send

OPEN_PATHS = frozenset({"/healthz", "/readyz"})

_BODY = b'{"error": "unauthorized: send Authorization: Bearer <admin.token>"}\n'


class AdminTokenMiddleware:
    def __init__(self, app: ASGIApp, token: str) -> None:
        if not token:
            raise ValueError("an admin token must not be empty")
        self.app = app
        self._expected = b"Bearer " + token.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path") in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        supplied = b""
        for name, value in scope.get("headers", ()):
            if name == b"authorization":
                supplied = value
                break
        if hmac.compare_digest(supplied, self._expected):
            await self.app(scope, receive, send)
            return
        await send(
            {
                "type": "http.response.start",
                "status": 401,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(_BODY)).encode()),
                    (b"www-authenticate", b'Bearer realm="sluice-admin"'),
                ],
            }
        )
        await send({"type": "http.response.body", "body": _BODY})
