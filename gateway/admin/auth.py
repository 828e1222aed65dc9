"""Protection of the admin plane (pure ASGI middleware).

With ``admin.token`` set, every admin request must carry ``Authorization: Bearer <token>``
(the scheme in any case, RFC 9110 §11.1); the comparison is constant-time
(``hmac.compare_digest``).  Missing or wrong -> 401 with ``WWW-Authenticate: Bearer``.  The
liveness and readiness probes (``/healthz``, ``/readyz``) stay open: they reveal nothing and
orchestrators probe them without credentials.

Without a token the admin plane must be bound to loopback (the config refuses anything
else), and :class:`LocalOriginMiddleware` refuses what a browser on this machine could be
made to send (403): a ``Host`` that is not a loopback address (DNS rebinding) and a
state-changing request (not GET/HEAD/OPTIONS) with a foreign ``Origin`` (CSRF).
"""

from __future__ import annotations

import hmac

from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.settings import is_loopback_host

OPEN_PATHS = frozenset({"/healthz", "/readyz"})
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})

_BODY = b'{"error": "unauthorized: send Authorization: Bearer <admin.token>"}\n'


def bearer_credentials(value: bytes) -> bytes | None:
    """The token of an ``Authorization: Bearer <token>`` value (scheme in any case, one or
    more spaces before the token); None for another scheme."""
    scheme, _, rest = value.partition(b" ")
    if scheme.lower() != b"bearer":
        return None
    return rest.lstrip(b" ")


async def _refuse(send: Send, status: int, body: bytes, extra: list[tuple[bytes, bytes]]) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *extra,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


METRICS_PATH = "/metrics"


class AdminTokenMiddleware:
    """``token`` opens every path; ``metrics_token`` (read-only, for scrapers) only
    ``GET /metrics``."""

    def __init__(self, app: ASGIApp, token: str, metrics_token: str | None = None) -> None:
        if not token:
            raise ValueError("an admin token must not be empty")
        if metrics_token == "":
            raise ValueError("a metrics token must not be empty")
        self.app = app
        self._expected = token.encode()
        self._metrics = None if metrics_token is None else metrics_token.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path") in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        supplied: bytes | None = None
        for name, value in scope.get("headers", ()):
            if name == b"authorization":
                supplied = bearer_credentials(value)
                break
        if supplied is not None and hmac.compare_digest(supplied, self._expected):
            await self.app(scope, receive, send)
            return
        if (
            supplied is not None
            and self._metrics is not None
            and scope.get("path") == METRICS_PATH
            and scope.get("method") in ("GET", "HEAD")
            and hmac.compare_digest(supplied, self._metrics)
        ):
            await self.app(scope, receive, send)
            return
        await _refuse(send, 401, _BODY, [(b"www-authenticate", b'Bearer realm="sluice-admin"')])


class LocalOriginMiddleware:
    """For an admin plane without a token (loopback only): refuse requests a web page could
    make a local browser send.  ``Host`` must name a loopback address (``localhost``,
    127.0.0.0/8, ``[::1]``, any port: SSH tunnels and port-forwards keep working) or the
    bound one — a rebound DNS name is refused; a state-changing request must carry no
    ``Origin`` or the request's own (``http(s)://`` + its ``Host``).  Requests without
    ``Host`` (HTTP/1.0 tools) pass."""

    def __init__(self, app: ASGIApp, host: str) -> None:
        self.app = app
        self.bound = host.strip("[]").lower()

    def local(self, host: bytes) -> bool:
        text = host.decode("latin-1").lower()
        name = text.rpartition("]")[0] + "]" if text.startswith("[") else text.partition(":")[0]
        return name.strip("[]") == self.bound or is_loopback_host(name)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        host: bytes | None = None
        origin: bytes | None = None
        for name, value in scope.get("headers", ()):
            if name == b"host":
                host = value.lower()
            elif name == b"origin":
                origin = value.lower()
        if host is not None and not self.local(host):
            await _refuse(send, 403, b'{"error": "forbidden: foreign Host"}\n', [])
            return
        if (
            origin is not None
            and scope.get("method") not in SAFE_METHODS
            and (host is None or origin not in (b"http://" + host, b"https://" + host))
        ):
            await _refuse(send, 403, b'{"error": "forbidden: cross-origin request"}\n', [])
            return
        await self.app(scope, receive, send)
