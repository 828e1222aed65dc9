"""Request-head limits and the checks llhttp does not make (issue 4 hardening).

llhttp (through httptools) already refuses most malformed input: bad tokens, bare CR/LF,
obs-fold, NUL and control characters, invalid methods, ``Content-Length`` together with
``Transfer-Encoding``, duplicate or malformed ``Content-Length``, bad chunk sizes.  What it
lets through and HTTP/1.1 still forbids is checked here, once per request head, by
:func:`check_head` (pure, bytes in; raises :class:`RequestRejected` with the cause):

* versions: HTTP/1.2 to 1.9 are served as 1.1 (RFC 9110 §2.5), 0.x -> 400, 2.0 and above
  -> 505 (the parser is lenient about the version digits; everything else is checked here);
* ``CONNECT`` in any form (this is not a forward proxy) -> 400, never forwarded;
  asterisk-form only for ``OPTIONS *`` (routed like ``/`` on its Host) -> else 400;
* a fragment in the target; absolute-form targets other than ``http(s)://authority`` with
  a non-empty authority and no userinfo -> 400 (valid ones are routed by their authority);
* ``Host``: missing in HTTP/1.1, repeated, empty or not a valid ``host[:port]`` -> 400;
* ``Transfer-Encoding`` in HTTP/1.0, or whose final coding is not ``chunked`` -> 400; other
  codings before ``chunked`` (``gzip, chunked``) -> 501 (only chunked is implemented).

The data plane makes the request-line checks (:func:`check_request_line`) only for what is
not the common case (an origin-form target without ``#`` in HTTP/1.0 or 1.1), and the field
checks (:func:`check_fields`) once per distinct header set (``HeadCache.request``).

Size and time limits (``limits`` in the config) are counted by the server as bytes arrive,
so an oversized head is refused as soon as it crosses the limit, whether it came at once
or dripped: :class:`HeadLimits` holds them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import httptools

from gateway.dataplane.errors import Cause
from gateway.settings import GatewayLimits

_HOST = re.compile(rb"^(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._~!$&'()*+,;=%-]+)(?::[0-9]{1,5})?$")
_CODING = re.compile(rb"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")


class RequestRejected(Exception):
    def __init__(self, cause: Cause, detail: str = "") -> None:
        super().__init__(f"{cause.code}: {detail}" if detail else cause.code)
        self.cause = cause


@dataclass(frozen=True, slots=True)
class HeadLimits:
    max_header_bytes: int = 32768
    max_headers: int = 100
    max_uri_bytes: int = 8192
    header_timeout_s: float = 10.0
    idle_timeout_s: float = 60.0
    underscores_in_headers: bool = False
    """Forward header fields with an underscore in their name (else dropped)."""

    @classmethod
    def from_settings(cls, limits: GatewayLimits) -> HeadLimits:
        return cls(
            limits.max_header_bytes,
            limits.max_headers,
            limits.max_uri_bytes,
            limits.header_timeout_s,
            limits.idle_timeout_s,
            limits.underscores_in_headers,
        )


def _check_target(method: bytes, target: bytes) -> None:
    if b"#" in target:
        raise RequestRejected(Cause.BAD_REQUEST, "fragment in the request target")
    if target[:1] == b"/":
        return
    if target == b"*":
        if method == b"OPTIONS":
            return  # routed like "/" on its Host, forwarded as "OPTIONS *"
        raise RequestRejected(Cause.BAD_REQUEST, "asterisk-form is for OPTIONS only")
    scheme, sep, rest = target.partition(b"://")
    if not sep or scheme.lower() not in (b"http", b"https"):
        raise RequestRejected(Cause.BAD_REQUEST, "absolute-form needs http(s)://")
    end = len(rest)
    for stop in (b"/", b"?"):
        i = rest.find(stop)
        if i != -1:
            end = min(end, i)
    authority = rest[:end]
    if not authority or b"@" in authority or not _HOST.match(authority):
        raise RequestRejected(Cause.BAD_REQUEST, "absolute-form needs a host and no userinfo")


def origin_form(
    target: bytes, headers: list[tuple[bytes, bytes]]
) -> tuple[bytes, list[tuple[bytes, bytes]]]:
    """An absolute-form target (checked by :func:`check_request_line`) as origin-form, with
    ``Host`` replaced by its authority (RFC 9112 §3.2.2): the request is routed by it."""
    try:
        url = httptools.parse_url(target)
    except httptools.HttpParserInvalidURLError:
        return target, headers
    path = url.path or b"/"
    target = path + (b"?" + url.query if url.query else b"")
    if url.host:
        authority = url.host + (b":%d" % url.port if url.port else b"")
        headers = [(n, v) for n, v in headers if n.lower() != b"host"]
        headers.append((b"Host", authority))
    return target, headers


def _check_codings(values: list[bytes]) -> None:
    codings = [c.strip().lower() for v in values for c in v.split(b",")]
    if not codings or codings[-1] != b"chunked" or codings.count(b"chunked") != 1:
        raise RequestRejected(Cause.BAD_REQUEST, "Transfer-Encoding must end with chunked once")
    if len(codings) > 1:
        if not all(_CODING.match(c) for c in codings):
            raise RequestRejected(Cause.BAD_REQUEST, "malformed Transfer-Encoding")
        raise RequestRejected(Cause.UNSUPPORTED_CODING, "only chunked is supported")


def check_head(
    method: bytes, target: bytes, version: str, headers: list[tuple[bytes, bytes]]
) -> int | None:
    """Refuse what llhttp accepts but HTTP/1.1 forbids; return the declared Content-Length."""
    check_request_line(method, target, version)
    return check_fields(version, headers)


def check_request_line(method: bytes, target: bytes, version: str) -> str:
    """The version and the request target (see the module docstring); return the version
    the request is served as (``1.x`` above 1.1 is served as 1.1, RFC 9110 §2.5)."""
    if version not in {"1.1", "1.0"}:
        if version[:2] == "1.":
            version = "1.1"
        elif version[:2] == "0.":
            raise RequestRejected(Cause.BAD_REQUEST, f"HTTP/{version}")
        else:
            raise RequestRejected(Cause.VERSION_NOT_SUPPORTED, f"HTTP/{version} is not served")
    if method == b"CONNECT":
        raise RequestRejected(Cause.BAD_REQUEST, "CONNECT is not served (not a forward proxy)")
    if target[:1] != b"/" or b"#" in target:
        _check_target(method, target)
    return version


def check_fields(
    version: str, headers: list[tuple[bytes, bytes]] | tuple[tuple[bytes, bytes], ...]
) -> int | None:
    """Host and Transfer-Encoding rules; return the declared Content-Length (or None)."""
    host: bytes | None = None
    hosts = 0
    te: list[bytes] | None = None
    length: int | None = None
    for name, value in headers:
        n = len(name)
        if n == 4 and name.lower() == b"host":
            hosts += 1
            host = value
        elif n == 17 and name.lower() == b"transfer-encoding":
            if te is None:
                te = []
            te.append(value)
        elif n == 14 and name.lower() == b"content-length":
            length = int(value)  # llhttp has checked the digits and duplicates
    if hosts > 1:
        raise RequestRejected(Cause.BAD_REQUEST, "repeated Host")
    if host is None:
        if version == "1.1":
            raise RequestRejected(Cause.BAD_REQUEST, "missing Host")
    elif not _HOST.match(host):
        raise RequestRejected(Cause.BAD_REQUEST, "invalid Host")
    if te is not None:
        if version == "1.0":
            raise RequestRejected(Cause.BAD_REQUEST, "Transfer-Encoding in HTTP/1.0")
        _check_codings(te)
    return length
