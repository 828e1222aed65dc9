"""The access log: one line per request (proxied, upgraded or refused), text or JSON.

Lines are formatted when a request ends and held in memory; they are written (one
``os.write`` of all of them) ``FLUSH_S`` after the first, or at once when ``FLUSH_BYTES``
are held, so a request never waits on the log's file.  ``reopen`` (SIGUSR1)
closes and reopens the file for logrotate.  Field names are stable (see docs/dataplane.md).
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Callable
from json.encoder import encode_basestring_ascii as _json_quote  # the C encoder
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    import asyncio

    from gateway.dataplane.errors import Cause
    from gateway.dataplane.forward import Exchange

log = logging.getLogger(__name__)

FLUSH_BYTES = 64 * 1024
"""Held lines are written as soon as they reach this size (else after ``FLUSH_S``)."""
FLUSH_S = 0.1
"""Held lines are written at most this long after the first of them (one write per
batch: writing at every loop round cost a system call per few requests under load)."""
MAX_HELD_BYTES = 8 * 1024 * 1024
"""A log that cannot be written (full disk, blocked pipe) drops lines beyond this."""

_JSON = (
    '{"time":"%s","client":"%s","method":%s,"host":%s,"path":%s,"query":%s,"status":%d,'
    '"bytes_in":%d,"bytes_out":%d,"duration_s":%.6f,"upstream":%s,"upstream_s":%s,'
    '"service":%s,"retries":%d,"cause":%s,"trace_id":%s,"upgraded":%s}\n'
)
_TEXT = (
    '%s - - [%s] "%s %s %s" %d %d in=%d dur=%.6f host=%s svc=%s up=%s up_s=%s retries=%d '
    "cause=%s trace=%s%s\n"
)
_JSON_SLOTS = _JSON.replace("%d", "%s").replace("%.6f", "%s")
_TEXT_SLOTS = _TEXT.replace("%d", "%s").replace("%.6f", "%s")
_TEXT_UNSAFE = re.compile(r'[^\x21-\x7e]|["\\]')
MEMO_MAX = 4096
"""Distinct encoded values (methods, hosts, services, upstreams, causes) kept per log."""


def _json_str(value: str | None) -> str:
    """A JSON string (``null`` when absent); non-ASCII escaped, so any input is valid JSON."""
    return "null" if value is None else _json_quote(value)


def _escape(match: re.Match[str]) -> str:
    return f"\\x{ord(match.group()) & 0xFF:02x}"


def _text(value: str | None) -> str:
    """A text field: ``-`` when absent; spaces, quotes, backslashes and controls as ``\\xNN``."""
    if not value:
        return "-"
    if _TEXT_UNSAFE.search(value) is None:
        return value
    return _TEXT_UNSAFE.sub(_escape, value)


class AccessLog:
    """Buffered access-log lines to a file (``path``) or standard output (``"-"``)."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        fmt: Literal["text", "json"] = "text",
        path: str = "-",
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.loop = loop
        self.json = fmt == "json"
        self.path = path
        self.wall_clock = wall_clock
        self.lines: list[str] = []
        self.held_bytes = 0
        self.dropped = 0
        """Lines dropped because the log could not be written."""
        self._scheduled = False
        self._second = -1
        self._stamp = ""
        self._ms = -1
        """The loop-clock millisecond whose stamp is ``_ms_text``."""
        self._ms_text = ""
        self._loop_second = -1
        self._offset = 0.0
        """Wall clock minus loop clock, re-read once per loop-clock second."""
        self._memo: dict[str | None, str] = {}
        self._templates: dict[tuple[object, ...], str] = {}
        self._fd = self._open()

    def _open(self) -> int:
        if self.path == "-":
            return 1
        return os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)

    def reopen(self) -> None:
        """Close and reopen the file (after logrotate moved it); stdout is kept."""
        self.flush()
        if self.path == "-":
            return
        try:
            fd = self._open()
        except OSError as e:
            log.error("access log: cannot reopen %s: %s (still writing the old file)", self.path, e)
            return
        old, self._fd = self._fd, fd
        os.close(old)

    def close(self) -> None:
        self.flush()
        if self._fd != 1:
            os.close(self._fd)
            self._fd = 1

    # -- lines -----------------------------------------------------------------------------

    def _time(self) -> str:
        return self._time_at(self.loop.time())

    def _time_at(self, now: float) -> str:
        """The wall-clock time of loop time ``now``, formatted once per millisecond (the
        wall clock is read once per second: lines are stamped from the loop's clock)."""
        ms_total = int(now * 1000)
        if ms_total == self._ms:
            return self._ms_text
        self._ms = ms_total
        sec = int(now)
        if sec != self._loop_second:
            self._loop_second = sec
            self._offset = self.wall_clock() - now
        wall_ms = int((now + self._offset) * 1000)
        wall_sec, ms = divmod(wall_ms, 1000)
        if wall_sec != self._second:
            self._second = wall_sec
            fmt = "%Y-%m-%dT%H:%M:%S" if self.json else "%d/%b/%Y:%H:%M:%S"
            self._stamp = time.strftime(fmt, time.gmtime(wall_sec))
        text = self._ms_text = (
            f"{self._stamp}.{ms:03d}Z" if self.json else f"{self._stamp}.{ms:03d} +0000"
        )
        return text

    def _enc(self, value: str | None) -> str:
        """A field of few distinct values (method, host, service, upstream, cause), encoded
        once and remembered."""
        memo = self._memo
        try:
            return memo[value]
        except KeyError:
            pass
        if len(memo) >= MEMO_MAX:
            memo.clear()
        encoded = memo[value] = _json_str(value) if self.json else _text(value)
        return encoded

    def exchange(self, ex: Exchange, status: int, now: float) -> None:
        """The line of an exchange that ended with ``status`` at loop time ``now``.

        The common request (no retry, no trace context, not upgraded) is formatted from a
        template per (client, method, host, status, service, endpoint, cause), so only the
        time, target, sizes and durations are formatted per line."""
        if ex.tunnel is not None or ex.tried or ex.span is not None or ex.head.traceparent:
            self._exchange_line(ex, status, now)
            return
        service = ex.service
        ep = ex.endpoint
        key = (
            ex.client.peer_ip,
            ex.method,
            ex.head.host,
            status,
            service,
            ep,
            ex.cause,
            ex.http11,
            ex.client_h2,
        )
        template = self._templates.get(key)
        if template is None:
            template = self._template(ex, status)
        started = ex.started_at
        dispatched = ex.dispatched_at
        target = ex.target.decode("latin-1")
        stamp = self._ms_text if int(now * 1000) == self._ms else self._time_at(now)
        if self.json:
            path, sep, query = target.partition("?")
            line = template % (
                stamp,
                _json_quote(path),
                _json_quote(query) if sep else "null",
                ex.body_bytes,
                ex.resp_bytes,
                now - started if started else 0.0,
                now - (dispatched or started) if ep is not None else -1.0,
            )
        else:
            line = template % (
                stamp,
                _text(target),
                ex.resp_bytes,
                ex.body_bytes,
                now - started if started else 0.0,
                now - (dispatched or started) if ep is not None else -1.0,
            )
        self.lines.append(line)  # _add, inlined
        self.held_bytes += len(line)
        if self.held_bytes >= FLUSH_BYTES:
            self.flush()
        elif not self._scheduled:
            self._scheduled = True
            self.loop.call_later(FLUSH_S, self._round_end)

    def _template(self, ex: Exchange, status: int) -> str:
        """The line of requests like ``ex``, with %-slots for what varies per request."""
        service = ex.service
        ep = ex.endpoint
        cause = ex.cause
        enc = self._enc

        def fixed(value: str | None) -> str:
            return enc(value).replace("%", "%%")

        method = fixed(ex.method.decode("latin-1"))
        host = fixed(ex.head.host.decode("latin-1"))
        upstream = fixed(None if ep is None else ep.address)
        name = fixed(None if service is None else service.name)
        code = fixed(None if cause is None else cause.code)
        client = ex.client.peer_ip.decode("latin-1").replace("%", "%%")
        timed = ep is not None
        if self.json:
            template = _JSON_SLOTS % (
                "%s", client, method, host, "%s", "%s", status, "%d", "%d", "%.6f",
                upstream, "%.6f" if timed else "null%.0s", name, 0, code, "null", "false",
            )  # fmt: skip
        else:
            version = "HTTP/2" if ex.client_h2 else "HTTP/1.1" if ex.http11 else "HTTP/1.0"
            template = _TEXT_SLOTS % (
                client, "%s", method, "%s", version, status, "%d", "%d", "%.6f", host, name,
                upstream, "%.6f" if timed else "-%.0s", 0, code, "-", "",
            )  # fmt: skip
        templates = self._templates
        if len(templates) >= MEMO_MAX:
            templates.clear()
        key = (
            ex.client.peer_ip,
            ex.method,
            ex.head.host,
            status,
            service,
            ep,
            cause,
            ex.http11,
            ex.client_h2,
        )
        templates[key] = template
        return template

    def _exchange_line(self, ex: Exchange, status: int, now: float) -> None:
        """Any exchange's line, field by field (retried, traced or upgraded ones)."""
        target = ex.target.decode("latin-1")
        path, sep, query = target.partition("?")
        service = ex.service
        ep = ex.endpoint
        tunnel = ex.tunnel
        bytes_in = ex.body_bytes
        bytes_out = ex.resp_bytes
        if tunnel is not None:
            bytes_in += tunnel.bytes_in
            bytes_out += tunnel.bytes_out
        started = ex.started_at
        upstream_s = None if ep is None else now - (ex.dispatched_at or ex.started_at)
        cause = ex.cause
        span = ex.span
        if span is not None:
            trace_id: str | None = f"{span.trace_id:032x}"
        else:
            tp = ex.head.traceparent
            trace_id = tp[3:35].decode("latin-1") if tp and len(tp) >= 35 else None
        self._line(
            ex.client.peer_ip.decode("latin-1"),
            ex.method.decode("latin-1"),
            ex.head.host.decode("latin-1"),
            path,
            query if sep else None,
            "HTTP/2" if ex.client_h2 else "HTTP/1.1" if ex.http11 else "HTTP/1.0",
            status,
            bytes_in,
            bytes_out,
            now - started if started else 0.0,
            None if ep is None else ep.address,
            upstream_s,
            None if service is None else service.name,
            len(ex.tried) if ex.tried else 0,
            None if cause is None else cause.code,
            trace_id,
            tunnel is not None,
        )

    def refused(self, peer_ip: bytes, cause: Cause, method: bytes, target: bytes) -> None:
        """The line of a request refused before it became an exchange (400, 408, 431, ...)."""
        path, _, query = target.decode("latin-1").partition("?")
        self._line(
            peer_ip.decode("latin-1"),
            method.decode("latin-1") or None,
            None,
            path or None,
            query if _ else None,
            "HTTP/1.1",
            cause.status,
            0,
            0,
            0.0,
            None,
            None,
            None,
            0,
            cause.code,
            None,
            False,
        )

    def _line(  # noqa: PLR0917  (one flat call per request: no objects built)
        self,
        client: str,
        method: str | None,
        host: str | None,
        path: str | None,
        query: str | None,
        version: str,
        status: int,
        bytes_in: int,
        bytes_out: int,
        duration_s: float,
        upstream: str | None,
        upstream_s: float | None,
        service: str | None,
        retries: int,
        cause: str | None,
        trace_id: str | None,
        upgraded: bool,
    ) -> None:
        enc = self._enc
        if self.json:
            line = _JSON % (
                self._time(),
                client,
                enc(method),
                enc(host),
                _json_str(path),
                _json_str(query),
                status,
                bytes_in,
                bytes_out,
                duration_s,
                enc(upstream),
                "null" if upstream_s is None else f"{upstream_s:.6f}",
                enc(service),
                retries,
                enc(cause),
                "null" if trace_id is None else _json_quote(trace_id),
                "true" if upgraded else "false",
            )
        else:
            target = path or "-"
            if query is not None:
                target += "?" + query
            line = _TEXT % (
                client,
                self._time(),
                enc(method),
                _text(target),
                version,
                status,
                bytes_out,
                bytes_in,
                duration_s,
                enc(host),
                enc(service),
                enc(upstream),
                "-" if upstream_s is None else f"{upstream_s:.6f}",
                retries,
                enc(cause),
                _text(trace_id),
                " upgraded" if upgraded else "",
            )
        self._add(line)

    def _add(self, line: str) -> None:
        self.lines.append(line)
        self.held_bytes += len(line)
        if self.held_bytes >= FLUSH_BYTES:
            self.flush()
        elif not self._scheduled:
            self._scheduled = True
            self.loop.call_later(FLUSH_S, self._round_end)

    # -- writing ----------------------------------------------------------------------------

    def _round_end(self) -> None:
        self._scheduled = False
        self.flush()

    def flush(self) -> None:
        """Write every held line now."""
        lines = self.lines
        if not lines:
            return
        data = "".join(lines).encode("utf-8", "backslashreplace")
        try:
            n = os.write(self._fd, data)
        except BlockingIOError:
            n = 0
        except OSError as e:
            self.dropped += len(lines)
            self.lines = []
            self.held_bytes = 0
            log.error(
                "access log: cannot write %s: %s (%d lines dropped)", self.path, e, len(lines)
            )
            return
        if n == len(data):
            self.lines = []
            self.held_bytes = 0
            return
        rest = data[n:].decode("utf-8", "backslashreplace")  # a partial write: keep the rest
        if len(rest) > MAX_HELD_BYTES:
            self.dropped += 1
            rest = ""
        self.lines = [rest] if rest else []
        self.held_bytes = len(rest)
        if rest and not self._scheduled:
            self._scheduled = True
            self.loop.call_later(0.05, self._round_end)

    def __repr__(self) -> str:
        return (
            f"AccessLog({self.path!r}, {'json' if self.json else 'text'}, {len(self.lines)} held)"
        )
