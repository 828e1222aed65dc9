"""The data plane's error causes and the short responses the gateway sends for them.

Each cause maps to one status and a ``Sluice-Error`` header value that names it, so a
client (or an operator reading logs) can tell a gateway error from an upstream's own::

    404 no-route                  no route matches the host and path (and no default backend)
    503 unknown-service           the route names a service the gateway does not know
    503 no-endpoints              the service has no ready endpoint
    502 upstream-connect-failed   connecting to the endpoint failed (refused, unreachable)
    504 upstream-connect-timeout  connecting took longer than timeouts.connect_s
    502 upstream-reset            the upstream closed or reset the connection before a response
    502 upstream-bad-response     the upstream's response could not be parsed
    504 upstream-header-timeout   no response head within timeouts.response_header_s
    504 upstream-timeout          the exchange took longer than timeouts.total_s
    400 bad-request               the client's request could not be parsed
    408 header-timeout            the request head did not arrive within limits.header_timeout_s
    413 body-too-large            the body is over the service's limits.max_body_bytes
    414 uri-too-long              the request target is over limits.max_uri_bytes
    431 headers-too-large         the head is over limits.max_header_bytes or max_headers
    501 unsupported-transfer-coding  a transfer coding other than chunked
    505 http-version-not-supported   HTTP/2 (prior knowledge) or another version
    429 rate-limited              over the service's rate_limit (Retry-After)
    503 queue-full                the service's admission queue is full (Retry-After)
    503 queue-timeout             no concurrency slot within queue.timeout_s (Retry-After)

Once a response head has been sent, an error can no longer change the status: the client
connection is closed without completing the body (never a silently truncated response).
"""

from __future__ import annotations

import enum
import time
from email.utils import formatdate


class Cause(enum.Enum):
    NO_ROUTE = (404, "no-route", "no route for this host and path")
    UNKNOWN_SERVICE = (503, "unknown-service", "the route's service is not known")
    NO_ENDPOINTS = (503, "no-endpoints", "no ready endpoint for this service")
    CONNECT_FAILED = (502, "upstream-connect-failed", "could not connect to the upstream")
    CONNECT_TIMEOUT = (504, "upstream-connect-timeout", "connecting to the upstream timed out")
    RESET = (502, "upstream-reset", "the upstream closed the connection before responding")
    BAD_RESPONSE = (502, "upstream-bad-response", "the upstream sent a malformed response")
    HEADER_TIMEOUT = (504, "upstream-header-timeout", "the upstream did not respond in time")
    TOTAL_TIMEOUT = (504, "upstream-timeout", "the upstream exchange took too long")
    BAD_REQUEST = (400, "bad-request", "malformed request")
    HEAD_TIMEOUT = (408, "header-timeout", "the request head took too long to arrive")
    BODY_TOO_LARGE = (413, "body-too-large", "the request body is too large")
    URI_TOO_LONG = (414, "uri-too-long", "the request target is too long")
    HEADERS_TOO_LARGE = (431, "headers-too-large", "the request header fields are too large")
    UNSUPPORTED_CODING = (
        501,
        "unsupported-transfer-coding",
        "only the chunked transfer coding is supported",
    )
    VERSION_NOT_SUPPORTED = (505, "http-version-not-supported", "only HTTP/1.x is supported")
    RATE_LIMITED = (429, "rate-limited", "too many requests for this service")
    QUEUE_FULL = (503, "queue-full", "the service is at capacity and its queue is full")
    QUEUE_TIMEOUT = (503, "queue-timeout", "the service stayed at capacity for too long")
    INTERNAL = (500, "internal-error", "the gateway failed on this request (its log says why)")

    def __init__(self, status: int, code: str, message: str) -> None:
        self.status = status
        self.code = code
        self.message = message


class ProxyError(Exception):
    """An exchange failed for ``cause`` (raised where a failure is detected, mapped at the edge)."""

    def __init__(self, cause: Cause, detail: str = "") -> None:
        super().__init__(f"{cause.code}: {detail}" if detail else cause.code)
        self.cause = cause


_REASONS = {
    400: b"Bad Request",
    404: b"Not Found",
    408: b"Request Timeout",
    413: b"Content Too Large",
    414: b"URI Too Long",
    429: b"Too Many Requests",
    431: b"Request Header Fields Too Large",
    500: b"Internal Server Error",
    501: b"Not Implemented",
    505: b"HTTP Version Not Supported",
    502: b"Bad Gateway",
    503: b"Service Unavailable",
    504: b"Gateway Timeout",
}


def _prebuild(cause: Cause) -> tuple[bytes, bytes]:
    body = cause.message.encode() + b"\n"
    before_date = (
        b"HTTP/1.1 %d %s\r\nServer: sluice\r\nContent-Type: text/plain; charset=utf-8\r\n"
        b"Content-Length: %d\r\nSluice-Error: %s\r\nDate: "
        % (cause.status, _REASONS[cause.status], len(body), cause.code.encode())
    )
    return before_date, body


_PREBUILT = {cause: _prebuild(cause) for cause in Cause}


class HttpDate:
    """The ``Date`` header value, formatted at most once per second (wall clock, for HTTP only)."""

    __slots__ = ("_sec", "_value")

    def __init__(self) -> None:
        self._sec = -1
        self._value = b""

    def get(self) -> bytes:
        now = time.time()
        sec = int(now)
        if sec != self._sec:
            self._sec = sec
            self._value = formatdate(now, usegmt=True).encode()
        return self._value


def error_response(
    cause: Cause,
    date: bytes,
    close: bool,
    head_only: bool = False,
    retry_after_s: int | None = None,
) -> bytes:
    """The whole response for ``cause`` (``Connection: close`` when the connection ends)."""
    before_date, body = _PREBUILT[cause]
    tail = b"\r\nConnection: close\r\n\r\n" if close else b"\r\n\r\n"
    if retry_after_s is not None:
        tail = b"\r\nRetry-After: %d" % retry_after_s + tail
    return before_date + date + tail + (b"" if head_only else body)


_REDIRECT_BODY = b"moved to https\n"


def redirect_response(location: bytes, date: bytes, close: bool, head_only: bool = False) -> bytes:
    """A 308 Permanent Redirect to ``location`` (``redirect_http``)."""
    return b"".join(
        (
            b"HTTP/1.1 308 Permanent Redirect\r\nServer: sluice\r\nLocation: ",
            location,
            b"\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\nDate: "
            % len(_REDIRECT_BODY),
            date,
            b"\r\nConnection: close\r\n\r\n" if close else b"\r\n\r\n",
            b"" if head_only else _REDIRECT_BODY,
        )
    )
