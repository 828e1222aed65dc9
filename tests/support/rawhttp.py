"""Raw-socket HTTP/1.1 client for hostile-input tests: send exact bytes, read exact responses.

``RawConnection.send`` writes bytes as given (optionally dripped in pieces with a pause);
``read_responses(n)`` parses ``n`` responses with llhttp (interim 1xx included);
``wait_closed()`` tells whether the peer closed (EOF or reset) within a bounded time, and
fails if it sent anything more.
"""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass, field

import httptools

READ_TIMEOUT_S = 10.0


@dataclass
class Response:
    status: int
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes = b""

    def header(self, name: str) -> str | None:
        for n, v in self.headers:
            if n.lower() == name.lower():
                return v
        return None


class _Collector:
    def __init__(self) -> None:
        self.done: list[Response] = []
        self.current: Response | None = None
        self.parser = httptools.HttpResponseParser(self)

    def on_message_begin(self) -> None:
        self.current = Response(0)

    def on_status(self, status: bytes) -> None:
        pass

    def on_header(self, name: bytes, value: bytes) -> None:
        assert self.current is not None
        self.current.headers.append((name.decode("latin-1"), value.decode("latin-1")))

    def on_headers_complete(self) -> None:
        assert self.current is not None
        self.current.status = self.parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        assert self.current is not None
        self.current.body += body

    def on_message_complete(self) -> None:
        assert self.current is not None
        self.done.append(self.current)
        self.current = None


class RawConnection:
    def __init__(self, host: str, port: int, timeout_s: float = READ_TIMEOUT_S) -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout_s)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.timeout_s = timeout_s
        self._collector = _Collector()
        self._eof = False
        self.reset = False
        self.extra = b""

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> RawConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send(self, data: bytes, drip: int = 0, pause_s: float = 0.0) -> bool:
        """Send ``data`` (in ``drip``-byte pieces with ``pause_s`` between); False if the peer
        closed or reset before everything was sent (that can be the right outcome)."""
        pieces = [data] if not drip else [data[i : i + drip] for i in range(0, len(data), drip)]
        try:
            for i, piece in enumerate(pieces):
                self.sock.sendall(piece)
                if pause_s and i + 1 < len(pieces):
                    time.sleep(pause_s)
        except (BrokenPipeError, ConnectionResetError):
            return False
        return True

    def _recv(self) -> bytes:
        try:
            data = self.sock.recv(65536)
        except ConnectionResetError:
            self.reset = True
            return b""
        if not data:
            self._eof = True
        return data

    def read_responses(self, n: int) -> list[Response]:
        """Read until ``n`` whole responses arrived (fewer if the connection ends first)."""
        deadline = time.monotonic() + self.timeout_s
        c = self._collector
        while len(c.done) < n and not self._eof and not self.reset:
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                data = self._recv()
            except TimeoutError:
                break
            if data:
                try:
                    c.parser.feed_data(data)
                except httptools.HttpParserError as e:
                    raise AssertionError(
                        f"the gateway sent a malformed response: {e}: {data!r}"
                    ) from None
        out, c.done = c.done[:n], c.done[n:]
        return out

    def wait_closed(self, timeout_s: float | None = None) -> bool:
        """True when the peer ends the connection (EOF or RST) within ``timeout_s``; any
        further bytes it sends before that are kept in ``extra``."""
        deadline = time.monotonic() + (self.timeout_s if timeout_s is None else timeout_s)
        if self._collector.done or self._collector.current is not None:
            return False
        while not self._eof and not self.reset:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self.sock.settimeout(left)
            try:
                data = self._recv()
            except TimeoutError:
                return False
            self.extra += data
        return True

    def is_open(self, probe_s: float = 0.2) -> bool:
        """True when the peer has not closed within ``probe_s`` (no bytes may arrive either)."""
        if self._eof or self.reset:
            return False
        self.sock.settimeout(probe_s)
        try:
            data = self._recv()
        except TimeoutError:
            return True
        self.extra += data
        return False
