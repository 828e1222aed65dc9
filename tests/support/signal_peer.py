"""A stand-in gateway admin server for tests: serves GET /api/signals from a settable list."""

from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from scaler.signals import ServiceSignals
from scaler.signals_json import signals_to_json


class SignalPeer:
    def __init__(self) -> None:
        self.signals: list[ServiceSignals] = []
        self.raw: Any = None
        self.hits = 0
        peer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                peer.hits += 1
                if self.path != "/api/signals":
                    self.send_error(404)
                    return
                body = json.dumps(
                    peer.raw if peer.raw is not None else signals_to_json(0.0, peer.signals)
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def __enter__(self) -> SignalPeer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


def closed_port_address() -> str:
    """A loopback address where nothing listens (connection refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"127.0.0.1:{port}"
