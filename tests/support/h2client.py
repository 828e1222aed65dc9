"""A blocking HTTP/2 client over one socket for tests (the ``h2`` library's state machine)."""

from __future__ import annotations

import socket
from typing import Any

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.settings
from hyperframe.frame import Frame, GoAwayFrame

from tests.support.processes import Gateway


class Client:
    """A blocking HTTP/2 client over one socket (the ``h2`` library's state machine)."""

    def __init__(
        self, gw: Gateway, window: int | None = None, sock: socket.socket | None = None
    ) -> None:
        """``sock``: an open connection to use (e.g. TLS with ``h2`` chosen by ALPN)."""
        self.sock = sock or socket.create_connection((gw.host, gw.port), timeout=10)
        self.h2 = h2.connection.H2Connection(h2.config.H2Configuration(header_encoding=None))
        self.h2.initiate_connection()
        if window is not None:
            self.h2.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: window})
        self.sock.sendall(self.h2.data_to_send())
        self.responses: dict[int, dict[str, Any]] = {}
        self.terminated: h2.events.ConnectionTerminated | None = None
        self._inbound = b""

    def _frames(self, data: bytes) -> bytes:
        """The whole frames of what arrived, a graceful GOAWAY (NO_ERROR) taken out: the ``h2``
        library closes its state machine on any GOAWAY, so the streams the server goes on
        answering (RFC 9113 §6.8) could not be read.  It is recorded in ``terminated``."""
        buf = self._inbound + data
        out = []
        while len(buf) >= 9:
            end = 9 + int.from_bytes(buf[:3], "big")
            if len(buf) < end:
                break
            raw, buf = buf[:end], buf[end:]
            if raw[3] == GoAwayFrame.type:
                frame, _length = Frame.parse_frame_header(memoryview(raw[:9]))
                frame.parse_body(memoryview(raw[9:end]))
                assert isinstance(frame, GoAwayFrame)
                if frame.error_code == h2.errors.ErrorCodes.NO_ERROR:
                    event = h2.events.ConnectionTerminated()
                    event.error_code = h2.errors.ErrorCodes.NO_ERROR
                    event.last_stream_id = frame.last_stream_id
                    self.terminated = event
                    continue
            out.append(raw)
        self._inbound = buf
        return b"".join(out)

    def request(
        self,
        path: str,
        host: str = "main.test",
        method: str = "GET",
        body: bytes = b"",
        extra: tuple[tuple[str, str], ...] = (),
        trailers: tuple[tuple[str, str], ...] = (),
    ) -> int:
        sid = self.h2.get_next_available_stream_id()
        headers = [(":method", method), (":path", path), (":scheme", "http")]
        headers.append((":authority", host))
        headers += extra
        self.h2.send_headers(sid, headers, end_stream=not body and not trailers)
        self.responses[sid] = {
            "headers": None,
            "body": b"",
            "ended": False,
            "reset": None,
            "trailers": None,
        }
        sent = 0
        while sent < len(body):  # as the gateway's windows allow
            n = min(self.h2.local_flow_control_window(sid), self.h2.max_outbound_frame_size)
            if n <= 0:
                self.sock.sendall(self.h2.data_to_send())
                self._read()
                continue
            chunk = body[sent : sent + n]
            sent += len(chunk)
            self.h2.send_data(sid, chunk, end_stream=sent == len(body) and not trailers)
        if trailers:
            self.h2.send_headers(sid, list(trailers), end_stream=True)
        self.sock.sendall(self.h2.data_to_send())
        return sid

    def _read(self) -> bool:
        data = self.sock.recv(65536)
        if not data:
            return False
        for event in self.h2.receive_data(self._frames(data)):
            self._event(event)
        out = self.h2.data_to_send()
        if out:
            self.sock.sendall(out)
        return True

    def pump(self, until: set[int]) -> None:
        """Read until every stream in ``until`` ended or was reset (or the connection closed,
        or a GOAWAY other than a graceful NO_ERROR one arrived)."""
        while any(not (self.responses[s]["ended"] or self.responses[s]["reset"]) for s in until):
            if not self._read() or (self.terminated is not None and self.terminated.error_code):
                return

    def _event(self, event: h2.events.Event) -> None:
        if isinstance(event, h2.events.ResponseReceived):
            self.responses[event.stream_id]["headers"] = dict(event.headers)
        elif isinstance(event, h2.events.DataReceived):
            self.responses[event.stream_id]["body"] += event.data
            self.h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
        elif isinstance(event, h2.events.TrailersReceived):
            self.responses[event.stream_id]["trailers"] = dict(event.headers)
        elif isinstance(event, h2.events.StreamEnded):
            self.responses[event.stream_id]["ended"] = True
        elif isinstance(event, h2.events.StreamReset):
            self.responses[event.stream_id]["reset"] = event.error_code
        elif isinstance(event, h2.events.ConnectionTerminated):
            self.terminated = event

    def close(self) -> None:
        self.sock.close()
