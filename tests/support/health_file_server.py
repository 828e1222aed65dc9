"""A replica whose /healthz answers 503 while a given file exists, 200 otherwise.

usage: health_file_server.py <port> <path-of-the-file>
"""

from __future__ import annotations

import http.server
import os
import sys


class Handler(http.server.BaseHTTPRequestHandler):
    sick_file = ""

    def do_GET(self) -> None:
        status = 503 if os.path.exists(self.sick_file) else 200
        self.send_response(status)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


if __name__ == "__main__":
    Handler.sick_file = sys.argv[2]
    http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
