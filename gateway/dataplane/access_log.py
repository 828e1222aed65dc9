"""The access log: one line per request (proxied, upgraded or refused), text or JSON.

Lines are formatted when a request ends and held in memory; they are written (one
``os.write`` of all of them) at the end of the event-loop round, or at once when
``FLUSH_BYTES`` are held, so a request never waits on the log's file.  ``reopen`` (SIGUSR1)
closes and reopens the file for logrotate.  Field names are stable (see docs/dataplane.md).
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    import asyncio

    from gateway.dataplane.errors import Cause
    from gateway.dataplane.forward import Exchange

log = logging.getLogger(__name__)

FLUSH_BYTES = 64 * 1024
"""Held lines are written as soon as they reach this size (else at the round's end)."""
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
_SAFE_JSON = frozenset(map(chr, range(0x20, 0x7F))) - {'"', "\\"}


def _json_str(value: str | None) -> str:
    if value is None:
        return "null"
    if _SAFE_JSON.issuperset(value):
        return '"' + value + '"'
    return json.dumps(value)


def _text(value: str | None) -> str:
    """A text field: ``-`` when absent; spaces, quotes and controls escaped as ``\\xNN``."""
    if not value:
        return "-"
    if _SAFE_JSON.issuperset(value) and " " not in value:
        return value
    return "".join(c if c in _SAFE_JSON and c != " " else f"\\x{ord(c) & 0xFF:02x}" for c in value)


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
        now = self.wall_clock()
        sec = int(now)
        if sec != self._second:
            self._second = sec
            fmt = "%Y-%m-%dT%H:%M:%S" if self.json else "%d/%b/%Y:%H:%M:%S"
            self._stamp = time.strftime(fmt, time.gmtime(sec))
        ms = int((now - sec) * 1000)
        if self.json:
            return f"{self._stamp}.{ms:03d}Z"
        return f"{self._stamp}.{ms:03d} +0000"

    def exchange(self, ex: Exchange, status: int, now: float) -> None:
        """The line of an exchange that ended with ``status`` at loop time ``now``."""
        target = ex.target.decode("latin-1")
        path, _, query = target.partition("?")
        service = ex.service
        ep = ex.endpoint
        tunnel = ex.tunnel
        bytes_in = ex.body_bytes
        bytes_out = ex.resp_bytes
        if tunnel is not None:
            bytes_in += tunnel.bytes_in
            bytes_out += tunnel.bytes_out
        started = ex.started_at
        upstream_s = (
            None if ep is None or not ex.dispatched_at else round(now - ex.dispatched_at, 6)
        )
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
            query if _ else None,
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
        if self.json:
            line = _JSON % (
                self._time(),
                client,
                _json_str(method),
                _json_str(host),
                _json_str(path),
                _json_str(query),
                status,
                bytes_in,
                bytes_out,
                duration_s,
                _json_str(upstream),
                "null" if upstream_s is None else f"{upstream_s:.6f}",
                _json_str(service),
                retries,
                _json_str(cause),
                _json_str(trace_id),
                "true" if upgraded else "false",
            )
        else:
            target = path or "-"
            if query is not None:
                target += "?" + query
            line = _TEXT % (
                client,
                self._time(),
                _text(method),
                _text(target),
                version,
                status,
                bytes_out,
                bytes_in,
                duration_s,
                _text(host),
                _text(service),
                _text(upstream),
                "-" if upstream_s is None else f"{upstream_s:.6f}",
                retries,
                _text(cause),
                _text(trace_id),
                " upgraded" if upgraded else "",
            )
        self.lines.append(line)
        self.held_bytes += len(line)
        if self.held_bytes >= FLUSH_BYTES:
            self.flush()
        elif not self._scheduled:
            self._scheduled = True
            self.loop.call_soon(self._round_end)

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
