"""A blocking HTTP/2 client over one socket for tests (the ``h2`` library's state machine)."""

from __future__ import annotations

import socket
from typing import Any

import h2.config
import h2.connection
import h2.events
import h2.settings

from tests.support.processes import Gateway


class Client:
    """A blocking HTTP/2 client over one socket (the ``h2`` library's state machine)."""

    def __init__(self, gw: Gateway, window: int | None = None) -> None:
        self.sock = socket.create_connection((gw.host, gw.port), timeout=10)
        self.h2 = h2.connection.H2Connection(h2.config.H2Configuration(header_encoding=None))
        self.h2.initiate_connection()
        if window is not None:
            self.h2.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: window})
        self.sock.sendall(self.h2.data_to_send())
        self.responses: dict[int, dict[str, Any]] = {}
        self.terminated: h2.events.ConnectionTerminated | None = None

    def request(
        self,
        path: str,
        host: str = "main.test",
        method: str = "GET",
        body: bytes = b"",
        extra: tuple[tuple[str, str], ...] = (),
    ) -> int:
        sid = self.h2.get_next_available_stream_id()
        headers = [(":method", method), (":path", path), (":scheme", "http")]
        headers.append((":authority", host))
        headers += extra
        self.h2.send_headers(sid, headers, end_stream=not body)
        self.responses[sid] = {"headers": None, "body": b"", "ended": False, "reset": None}
        sent = 0
        while sent < len(body):  # as the gateway's windows allow
            n = min(self.h2.local_flow_control_window(sid), self.h2.max_outbound_frame_size)
            if n <= 0:
                self.sock.sendall(self.h2.data_to_send())
                self._read()
                continue
            chunk = body[sent : sent + n]
            sent += len(chunk)
            self.h2.send_data(sid, chunk, end_stream=sent == len(body))
        self.sock.sendall(self.h2.data_to_send())
        return sid

    def _read(self) -> bool:
        data = self.sock.recv(65536)
        if not data:
            return False
        for event in self.h2.receive_data(data):
            self._event(event)
        out = self.h2.data_to_send()
        if out:
            self.sock.sendall(out)
        return True

    def pump(self, until: set[int]) -> None:
        """Read until every stream in ``until`` ended or was reset (or the connection closed)."""
        while any(not (self.responses[s]["ended"] or self.responses[s]["reset"]) for s in until):
            if not self._read() or self.terminated is not None:
                return

    def _event(self, event: h2.events.Event) -> None:
        if isinstance(event, h2.events.ResponseReceived):
            self.responses[event.stream_id]["headers"] = dict(event.headers)
        elif isinstance(event, h2.events.DataReceived):
            self.responses[event.stream_id]["body"] += event.data
            self.h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
        elif isinstance(event, h2.events.StreamEnded):
            self.responses[event.stream_id]["ended"] = True
        elif isinstance(event, h2.events.StreamReset):
            self.responses[event.stream_id]["reset"] = event.error_code
        elif isinstance(event, h2.events.ConnectionTerminated):
            self.terminated = event

    def close(self) -> None:
        self.sock.close()
