"""A replica that ignores SIGTERM (only SIGKILL stops it); answers 200 to every GET."""

from __future__ import annotations

import http.server
import signal
import sys


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("content-length", "3")
        self.end_headers()
        self.wfile.write(b"ok\n")

    def log_message(self, format: str, *args: object) -> None:
        pass


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
