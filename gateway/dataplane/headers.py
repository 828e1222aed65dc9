"""Header rewriting for the proxy, both directions (pure, bytes in, bytes out).

* RFC 9110 §7.6.1 hop-by-hop fields are removed: ``Connection`` and every field it names,
  ``Keep-Alive``, ``Proxy-Connection``, ``TE``, ``Transfer-Encoding``, ``Upgrade``,
  ``Proxy-Authorization`` (and ``Trailer``, which only describes this hop's framing).
* ``Via: 1.1 sluice`` is appended (RFC 9110 §7.6.3) in both directions.
* ``X-Forwarded-For`` / ``-Proto`` / ``-Host``: a client in ``trusted_proxies`` has its
  values kept (its address appended to ``X-Forwarded-For``); anyone else's are replaced.
  ``Forwarded`` and ``X-Real-IP`` are kept from a trusted client, removed from anyone else.
* Request fields whose name has an underscore are dropped unless ``underscores`` is set;
  a client's ``Connection`` cannot drop the fields in :data:`END_TO_END`.
* Responses: no second ``Date`` or ``Server`` is added when the upstream sent one; a
  ``Date`` is added only when missing (RFC 9110 §6.6.1).

Each function makes one pass over the headers with one dict lookup per field; only when a
``Connection`` header names extra fields does it take a second pass to drop them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from http import HTTPStatus

from gateway.dataplane.limits import check_fields

H2_FIELD_NAME = re.compile(rb"[!#$%&'*+\-.^_`|~0-9a-z]+\Z")
"""An HTTP/2 field name: an RFC 9110 token in lower case (RFC 9113 §8.2.1)."""
H2_BAD_VALUE = re.compile(rb"[\x00\r\n]|\A[ \t]|[ \t]\Z")
"""What an HTTP/2 field value must not hold: NUL, CR, LF, or whitespace at either end."""
H2_CONNECTION_SPECIFIC = frozenset(
    {b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding", b"upgrade"}
)
"""Fields an HTTP/2 message must not carry (RFC 9113 §8.2.2)."""

HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-connection",
        b"te",
        b"transfer-encoding",
        b"upgrade",
        b"proxy-authorization",
        b"trailer",
    }
)
END_TO_END = frozenset(
    {
        b"authorization",
        b"cookie",
        b"host",
        b"content-length",
        b"content-type",
        b"content-encoding",
        b"forwarded",
        b"x-forwarded-for",
        b"x-forwarded-proto",
        b"x-forwarded-host",
        b"x-real-ip",
        b"via",
        b"traceparent",
        b"tracestate",
    }
)
"""Request fields a client's ``Connection`` cannot make hop-by-hop (they are never dropped
because ``Connection`` names them): credentials, routing, framing and provenance."""
VIA_TOKEN = b"1.1 sluice"
CRLF = b"\r\n"

# Actions per lowercased field name (anything absent is forwarded as is).
_DROP = 0
_CONNECTION = 1
_TRANSFER_ENCODING = 2
_HOST = 3
_CONTENT_LENGTH = 4
_VIA = 5
_EXPECT = 6
_XFF = 7
_XFP = 8
_XFH = 9
_DATE = 10
_TRACEPARENT = 11
_TRACESTATE = 12
_UNTRUSTED = 13

_REQUEST_ACTIONS = {
    **dict.fromkeys(HOP_BY_HOP, _DROP),
    b"connection": _CONNECTION,
    b"transfer-encoding": _TRANSFER_ENCODING,
    b"host": _HOST,
    b"content-length": _CONTENT_LENGTH,
    b"via": _VIA,
    b"expect": _EXPECT,
    b"x-forwarded-for": _XFF,
    b"x-forwarded-proto": _XFP,
    b"x-forwarded-host": _XFH,
    b"traceparent": _TRACEPARENT,
    b"tracestate": _TRACESTATE,
    b"forwarded": _UNTRUSTED,
    b"x-real-ip": _UNTRUSTED,
}
_RESPONSE_ACTIONS = {
    **dict.fromkeys(HOP_BY_HOP, _DROP),
    b"connection": _CONNECTION,
    b"transfer-encoding": _TRANSFER_ENCODING,
    b"content-length": _CONTENT_LENGTH,
    b"via": _VIA,
    b"date": _DATE,
}


_REASONS = {s.value: s.phrase.encode() for s in HTTPStatus}


def reason_phrase(status: int) -> bytes:
    """The standard reason phrase for ``status`` (empty for unregistered codes)."""
    return _REASONS.get(status, b"")


def _tokens(value: bytes) -> set[bytes]:
    return {t for t in (part.strip().lower() for part in value.split(b",")) if t}


def connection_tokens(headers: list[tuple[bytes, bytes]]) -> frozenset[bytes]:
    """Lowercased field names listed in every ``Connection`` header (e.g. ``close``, ``x-foo``)."""
    tokens: set[bytes] = set()
    for name, value in headers:
        if name.lower() == b"connection":
            tokens |= _tokens(value)
    return frozenset(tokens)


def response_fields(raw_head: bytes) -> list[tuple[bytes, bytes]]:
    """The fields of a response head as llhttp accepted it (status line, then ``name: value``
    lines, each ending in CRLF), as its ``on_header`` callbacks would give them.

    llhttp has already refused what is not a valid head (bare LF, obs-fold, whitespace
    before the colon), so a split is enough: a value loses its leading SP/HTAB and keeps
    trailing whitespace, as llhttp reports it.
    """
    out = []
    for line in raw_head.split(b"\r\n")[1:-1]:
        name, _, value = line.partition(b":")
        out.append((name, value.lstrip(b" \t")))
    return out


def _is_chunked(value: bytes) -> bool:
    return value.rsplit(b",", 1)[-1].strip().lower() == b"chunked"


@dataclass(frozen=True, slots=True)
class RequestHead:
    """The rewritten request head plus what the data plane needs to know about the request."""

    head: bytes
    host: bytes
    expect_continue: bool
    chunked: bool
    """The client sent a chunked body (it is forwarded chunked)."""
    has_body: bool
    """The request has a body (chunked, or a Content-Length above 0)."""
    traceparent: bytes | None = None
    """The client's W3C ``traceparent`` (forwarded as is; b"" when it sent several: invalid)."""
    tracestate: bytes | None = None
    """The client's ``tracestate`` fields joined with ',' (forwarded as is)."""
    declared_length: int | None = None
    """The request's Content-Length (None without one)."""


@dataclass(frozen=True, slots=True)
class RequestFields:
    """The part of a rewritten request head that depends only on its header fields.

    ``head = request line + middle + "X-Forwarded-For: " + xff_prefix + peer + CRLF CRLF``.
    """

    middle: bytes
    """Kept fields, then Transfer-Encoding (if chunked), Via, X-Forwarded-Proto/-Host."""
    xff_prefix: bytes
    """A trusted peer's X-Forwarded-For chain plus ``", "``, else empty."""
    host: bytes
    expect_continue: bool
    chunked: bool
    has_body: bool
    traceparent: bytes | None
    tracestate: bytes | None
    declared_length: int | None = None


def request_fields(
    headers: list[tuple[bytes, bytes]] | tuple[tuple[bytes, bytes], ...],
    *,
    trusted: bool,
    proto: bytes = b"http",
    drop: frozenset[bytes] | set[bytes] = frozenset(),
    underscores: bool = False,
) -> RequestFields:
    """Rewrite a client request's header fields for the upstream (see the module docstring);
    ``underscores``: keep fields whose name has an underscore (else dropped)."""
    out: list[bytes] = []
    host = via = xff = xfp = xfh = b""
    expect_continue = chunked = has_body = False
    declared_length: int | None = None
    traceparent: bytes | None = None
    tracestate: bytes | None = None
    named: set[bytes] | None = None
    actions = _REQUEST_ACTIONS
    for name, value in headers:
        lname = name.lower()
        action = actions.get(lname)
        if action is None:
            if drop and lname in drop:
                continue
            if not underscores and lname.find(b"_") != -1:
                continue  # X_Forwarded_For would become HTTP_X_FORWARDED_FOR behind CGI/WSGI
        elif action == _DROP:
            continue
        elif action == _CONNECTION:
            extra = _tokens(value) - HOP_BY_HOP - END_TO_END
            if extra:
                named = extra if named is None else named | extra
            continue
        elif action == _TRANSFER_ENCODING:
            chunked = _is_chunked(value)
            has_body = True
            continue
        elif action == _UNTRUSTED:
            if not trusted:
                continue  # Forwarded / X-Real-IP from a peer outside trusted_proxies
        elif action == _HOST:
            host = value
        elif action == _CONTENT_LENGTH:
            digits = value.strip()
            if digits.isdigit():  # llhttp has checked it: re-serialised (no leading zeros)
                declared_length = int(digits)
                has_body = has_body or declared_length > 0
                out += (name, b": %d\r\n" % declared_length)
                continue
            has_body = has_body or digits not in (b"0", b"")
        elif action == _VIA:
            via = via + b", " + value if via else value
            continue
        elif action == _EXPECT:
            if value.strip().lower() == b"100-continue":
                expect_continue = True  # answered by the gateway; not forwarded
                continue
        elif action == _TRACEPARENT:
            traceparent = value if traceparent is None else b""
            if drop and lname in drop:
                continue  # sampled: replaced by the gateway's own (see forward.py)
        elif action == _TRACESTATE:
            tracestate = value if tracestate is None else tracestate + b"," + value
            if drop and lname in drop:
                continue
        elif not trusted:
            continue  # X-Forwarded-* from an untrusted peer: replaced below
        elif action == _XFF:
            xff = xff + b", " + value if xff else value
            continue
        elif action == _XFP:
            xfp = value
            continue
        else:
            xfh = value
            continue
        out += (name, b": ", value, CRLF)
    if named is not None and not drop:
        return request_fields(
            headers, trusted=trusted, proto=proto, drop=named, underscores=underscores
        )
    if chunked:
        out.append(b"Transfer-Encoding: chunked\r\n")
    out += (b"Via: ", via + b", " + VIA_TOKEN if via else VIA_TOKEN, CRLF)
    out += (b"X-Forwarded-Proto: ", xfp or proto, CRLF)
    if xfh or host:
        out += (b"X-Forwarded-Host: ", xfh or host, CRLF)
    return RequestFields(
        b"".join(out),
        xff + b", " if xff else b"",
        host,
        expect_continue,
        chunked,
        has_body,
        traceparent,
        tracestate,
        declared_length,
    )


def request_head(
    method: bytes, target: bytes, fields: RequestFields, peer_ip: bytes
) -> RequestHead:
    """The whole head to send upstream (``target`` in origin-form) and what it says."""
    head = b"".join(
        (
            method,
            b" ",
            target,
            b" HTTP/1.1\r\n",
            fields.middle,
            b"X-Forwarded-For: ",
            fields.xff_prefix,
            peer_ip,
            b"\r\n\r\n",
        )
    )
    return RequestHead(
        head,
        fields.host,
        fields.expect_continue,
        fields.chunked,
        fields.has_body,
        fields.traceparent,
        fields.tracestate,
        fields.declared_length,
    )


def rewrite_request(
    method: bytes,
    target: bytes,
    headers: list[tuple[bytes, bytes]],
    peer_ip: bytes,
    *,
    trusted: bool,
    proto: bytes = b"http",
    drop: frozenset[bytes] | set[bytes] = frozenset(),
    underscores: bool = False,
) -> RequestHead:
    """The head to send upstream for a client request (``target`` in origin-form)."""
    fields = request_fields(
        headers, trusted=trusted, proto=proto, drop=drop, underscores=underscores
    )
    return request_head(method, target, fields, peer_ip)


@dataclass(frozen=True, slots=True)
class ResponseHead:
    """The rewritten response head and how its body is framed toward the client."""

    head: bytes
    chunked: bool
    """The gateway re-frames the body as chunked (the upstream gave no Content-Length)."""
    close_delimited: bool
    """The upstream's body ends when it closes the connection."""
    keep_alive: bool
    """The client connection can stay open after this response."""


def rewrite_response(
    status: int,
    reason: bytes,
    headers: list[tuple[bytes, bytes]],
    date: bytes,
    *,
    http11: bool,
    head_only: bool,
    keep_alive: bool,
    drop: frozenset[bytes] | set[bytes] = frozenset(),
) -> ResponseHead:
    """The head to send the client for an upstream response.

    ``http11``: the client speaks HTTP/1.1 (else 1.0: no chunked, keep-alive only when
    asked); ``head_only``: the response has no body (HEAD, 204, 304); ``keep_alive``: the
    client connection may stay open as far as the request is concerned; ``date``: the
    Date to add if the upstream sent none.
    """
    out = [b"HTTP/1.1 %d " % status, reason, CRLF]
    via = b""
    has_date = has_length = up_chunked = False
    named: set[bytes] | None = None
    actions = _RESPONSE_ACTIONS
    for name, value in headers:
        lname = name.lower()
        action = actions.get(lname)
        if action is None:
            if drop and lname in drop:
                continue
        elif action == _DROP:
            continue
        elif action == _CONNECTION:
            extra = _tokens(value) - HOP_BY_HOP
            if extra:
                named = extra if named is None else named | extra
            continue
        elif action == _TRANSFER_ENCODING:
            up_chunked = _is_chunked(value)
            continue
        elif action == _CONTENT_LENGTH:
            has_length = True
        elif action == _VIA:
            via = via + b", " + value if via else value
            continue
        else:  # date
            has_date = True
        out += (name, b": ", value, CRLF)
    if named is not None and not drop:
        return rewrite_response(
            status,
            reason,
            headers,
            date,
            http11=http11,
            head_only=head_only,
            keep_alive=keep_alive,
            drop=named,
        )
    close_delimited = not head_only and not has_length and not up_chunked
    chunked = not head_only and not has_length and http11
    if not head_only and not has_length and not http11:
        keep_alive = False  # an HTTP/1.0 client's body ends when the connection closes
    if not has_date:
        out += (b"Date: ", date, CRLF)
    out += (b"Via: ", via + b", " + VIA_TOKEN if via else VIA_TOKEN, CRLF)
    if chunked:
        out.append(b"Transfer-Encoding: chunked\r\n")
    if not keep_alive:
        out.append(b"Connection: close\r\n")
    elif not http11:
        out.append(b"Connection: keep-alive\r\n")
    out.append(CRLF)
    return ResponseHead(b"".join(out), chunked, close_delimited, keep_alive)


class CheckedFields:
    """A request header set as the cache keeps it: rewritten, and checked per HTTP version."""

    __slots__ = ("field_bytes", "fields", "headers", "keep_alive_token", "passed", "te")

    def __init__(
        self,
        fields: RequestFields,
        keep_alive_token: bool,
        headers: list[tuple[bytes, bytes]] | None = None,
    ) -> None:
        self.fields = fields
        self.keep_alive_token = keep_alive_token
        """A Connection or Proxy-Connection field mentions keep-alive (conservatively: the
        substring, any case), so llhttp may keep even an HTTP/1.0 connection alive."""
        self.passed: set[str] = set()
        """HTTP versions whose field checks (``limits.check_fields``) this set passed."""
        self.headers: list[tuple[bytes, bytes]] = headers or []
        """The fields as llhttp's ``on_header`` would report them (raw heads only)."""
        self.field_bytes = sum(len(name) + len(value) + 4 for name, value in self.headers)
        """What the fields count against ``max_header_bytes`` (name, value, ": ", CRLF)."""
        self.te = any(name.lower() == b"transfer-encoding" for name, _ in self.headers)
        """A Transfer-Encoding field (the body is chunked or the request is refused)."""

    def check(self, version: str, headers: list[tuple[bytes, bytes]]) -> None:
        """``limits.check_fields`` for ``version`` (raises ``RequestRejected``), remembered
        when it passes."""
        check_fields(version, headers)
        self.passed.add(version)

    def __repr__(self) -> str:
        return f"CheckedFields(host={self.fields.host!r}, passed={sorted(self.passed)})"


def request_fields_raw(raw_fields: bytes) -> list[tuple[bytes, bytes]]:
    """The fields of a request head as llhttp accepted it, from the bytes after the request
    line's CRLF up to and including the last field's CRLF, as its ``on_header`` callbacks
    would give them (like :func:`response_fields`: llhttp has refused bare LF, obs-fold and
    whitespace before the colon; a value loses its leading SP/HTAB, keeps trailing ones)."""
    out = []
    for line in raw_fields.split(b"\r\n")[:-1]:
        name, _, value = line.partition(b":")
        out.append((name, value.lstrip(b" \t")))
    return out


def _names_keep_alive(headers: list[tuple[bytes, bytes]]) -> bool:
    return any(
        b"keep-alive" in value.lower()
        for name, value in headers
        if name.lower() in (b"connection", b"proxy-connection")
    )


class HeadCache:
    """Memoises the request-head checks and header rewriting per distinct input, bounded
    (cleared when full).

    Clients and upstreams repeat the same header sets (a keep-alive session, one upstream's
    responses within a second), so most heads cost a tuple comparison or a dict lookup
    instead of passes over every field.  A request's header set is checked
    (``limits.check_fields``) when it is first seen; a refused one is not remembered.
    Keys hold the whole input (the request line and the peer's address are added per
    request), so a hit is exactly what the pure functions would return.
    """

    __slots__ = (
        "_last_fields",
        "_last_fields_key",
        "_last_raw",
        "_last_raw_key",
        "_last_request",
        "_last_request_key",
        "_last_response",
        "_last_response_key",
        "_raw_requests",
        "_requests",
        "_responses",
        "max_entries",
        "proto",
        "underscores",
    )

    def __init__(
        self, max_entries: int = 1024, underscores: bool = False, proto: bytes = b"http"
    ) -> None:
        self.max_entries = max_entries
        self.underscores = underscores
        """Request fields with an underscore in their name are kept (else dropped)."""
        self.proto = proto
        """The scheme the client used (``X-Forwarded-Proto`` for an untrusted client)."""
        self._requests: dict[tuple[object, ...], CheckedFields] = {}
        self._responses: dict[tuple[object, ...], ResponseHead] = {}
        self._raw_requests: dict[tuple[bytes, bool], CheckedFields] = {}
        # The previous input and result of each (checked before the dicts).
        self._last_fields_key: tuple[object, ...] | None = None
        self._last_fields = CheckedFields(
            RequestFields(b"", b"", b"", False, False, False, None, None), False
        )
        self._last_raw_key: tuple[bytes, bool] | None = None
        self._last_raw = self._last_fields
        self._last_request_key: tuple[object, ...] | None = None
        self._last_request = RequestHead(b"", b"", False, False, False)
        self._last_response_key: tuple[object, ...] | None = None
        self._last_response = ResponseHead(b"", False, False, False)

    def request(  # noqa: PLR0917  (positional on purpose)
        self,
        method: bytes,
        target: bytes,
        version: str,
        headers: list[tuple[bytes, bytes]],
        peer_ip: bytes,
        trusted: bool,
        drop: frozenset[bytes] = frozenset(),
    ) -> RequestHead:
        """The head to send upstream; raises ``RequestRejected`` for a refused header set.

        The three steps the data plane takes separately (see ``ClientConnection``)."""
        checked = self.fields(headers, trusted, drop)
        if version not in checked.passed:
            checked.check(version, headers)
        return self.head(method, target, checked.fields, peer_ip)

    def fields(
        self,
        headers: list[tuple[bytes, bytes]],
        trusted: bool,
        drop: frozenset[bytes] = frozenset(),
    ) -> CheckedFields:
        """The rewritten fields of a request's header set (not yet checked for a version)."""
        key = (tuple(headers), trusted, drop)
        if key == self._last_fields_key:
            return self._last_fields
        cache = self._requests
        checked = cache.get(key)
        if checked is None:
            checked = CheckedFields(
                request_fields(
                    headers,
                    trusted=trusted,
                    proto=self.proto,
                    drop=drop,
                    underscores=self.underscores,
                ),
                _names_keep_alive(headers),
            )
            if len(cache) >= self.max_entries:
                cache.clear()
            cache[key] = checked
        self._last_fields_key = key
        self._last_fields = checked
        return checked

    def raw_fields(self, raw_fields: bytes, trusted: bool) -> CheckedFields:
        """The rewritten fields of a request head received raw (see :func:`request_fields_raw`),
        with the fields as ``on_header`` would report them; not yet checked for a version."""
        key = (raw_fields, trusted)
        if key == self._last_raw_key:
            return self._last_raw
        cache = self._raw_requests
        checked = cache.get(key)
        if checked is None:
            headers = request_fields_raw(raw_fields)
            checked = CheckedFields(
                request_fields(
                    headers, trusted=trusted, proto=self.proto, underscores=self.underscores
                ),
                _names_keep_alive(headers),
                headers,
            )
            if len(cache) >= self.max_entries:
                cache.clear()
            cache[key] = checked
        self._last_raw_key = key
        self._last_raw = checked
        return checked

    def head(
        self, method: bytes, target: bytes, fields: RequestFields, peer_ip: bytes
    ) -> RequestHead:
        """``request_head``, joined again only when the request line or the peer changed
        (a client polling, a health checker: comparing is cheaper than joining)."""
        key = (method, target, peer_ip, fields)
        if key == self._last_request_key:
            return self._last_request
        head = request_head(method, target, fields, peer_ip)
        self._last_request_key = key
        self._last_request = head
        return head

    def response(  # noqa: PLR0917  (positional on purpose: called once per response)
        self,
        status: int,
        raw_head: bytes,
        date: bytes,
        http11: bool,
        head_only: bool,
        keep_alive: bool,
    ) -> ResponseHead:
        """The rewritten head for an upstream head received as ``raw_head`` (see
        :func:`response_fields`; the status is the one llhttp read from it)."""
        key = (raw_head, date, http11, head_only, keep_alive)
        if key == self._last_response_key:
            return self._last_response
        cache = self._responses
        head = cache.get(key)
        if head is None:
            head = rewrite_response(
                status,
                reason_phrase(status),
                response_fields(raw_head),
                date,
                http11=http11,
                head_only=head_only,
                keep_alive=keep_alive,
            )
            if len(cache) >= self.max_entries:
                cache.clear()
            cache[key] = head
        self._last_response_key = key
        self._last_response = head
        return head
