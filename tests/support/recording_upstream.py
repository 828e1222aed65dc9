"""An upstream that records exactly what it received, run as its own process.

    python -m tests.support.recording_upstream --log FILE [--port 0]

prints ``listening HOST:PORT`` once it accepts connections.  Every message it parses (with
llhttp, strictly) is appended to ``FILE`` as one JSON line the moment it is complete:

* ``{"event": "request", "conn": N, "method", "target", "version", "headers": [[name, value]...],
  "body": "<latin-1 text>"}`` — a whole request arrived (answered ``200`` with body ``ok``);
* ``{"event": "incomplete", "conn": N, "raw": "..."}`` — the connection closed in the middle
  of a request (the gateway aborted it): nothing was answered;
* ``{"event": "parse-error", "conn": N, "error": "...", "raw": "..."}`` — the bytes did not
  parse as HTTP/1.1: a desync would show up here.

So a test can assert the upstream saw exactly the requests it should, and nothing else.
``/slow?ms=N`` answers after N ms; ``/status/NNN`` answers with that status.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import IO, Any
from urllib.parse import parse_qs, urlsplit

import httptools


class Recorder(asyncio.Protocol):
    counter = 0

    def __init__(self, log: IO[str]) -> None:
        Recorder.counter += 1
        self.conn = Recorder.counter
        self.log = log
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.raw = b""
        self.in_message = False
        self.target = b""
        self.headers: list[list[str]] = []
        self.body = b""

    def write(self, event: dict[str, Any]) -> None:
        event["conn"] = self.conn
        self.log.write(json.dumps(event) + "\n")
        self.log.flush()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.raw += data
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self.write(
                {"event": "parse-error", "error": "upgrade", "raw": self.raw.decode("latin-1")}
            )
            self.close()
        except httptools.HttpParserError as e:
            self.write({"event": "parse-error", "error": str(e), "raw": self.raw.decode("latin-1")})
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.in_message:
            self.write({"event": "incomplete", "raw": self.raw.decode("latin-1")})

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    # httptools callbacks
    def on_message_begin(self) -> None:
        self.in_message = True
        self.target = b""
        self.headers = []
        self.body = b""

    def on_url(self, url: bytes) -> None:
        self.target += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append([name.decode("latin-1"), value.decode("latin-1")])

    def on_body(self, body: bytes) -> None:
        self.body += body

    def on_message_complete(self) -> None:
        self.in_message = False
        target = self.target.decode("latin-1")
        self.write(
            {
                "event": "request",
                "method": self.parser.get_method().decode("latin-1"),
                "target": target,
                "version": self.parser.get_http_version(),
                "headers": self.headers,
                "body": self.body.decode("latin-1"),
            }
        )
        self.raw = b""
        url = urlsplit(target)
        status = 200
        delay_s = 0.0
        if url.path.startswith("/status/"):
            status = int(url.path.rsplit("/", 1)[1])
        if url.path == "/slow":
            delay_s = int(parse_qs(url.query).get("ms", ["100"])[0]) / 1000
        keep = self.parser.should_keep_alive()
        body = b"ok"
        response = b"HTTP/1.1 %d X\r\nContent-Length: %d\r\nX-Recorded-Conn: %d\r\n%s\r\n%s" % (
            status,
            len(body),
            self.conn,
            b"" if keep else b"Connection: close\r\n",
            body,
        )
        if delay_s:
            asyncio.get_running_loop().call_later(delay_s, self._send, response, keep)
        else:
            self._send(response, keep)

    def _send(self, response: bytes, keep: bool) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        self.transport.write(response)
        if not keep:
            self.transport.close()


async def serve(host: str, port: int, log_path: str) -> None:
    with open(log_path, "a", encoding="utf-8") as log:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(lambda: Recorder(log), host, port)
        sock = server.sockets[0].getsockname()
        print(f"listening {sock[0]}:{sock[1]}", flush=True)
        async with server:
            await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--log", required=True)
    args = parser.parse_args()
    try:
        asyncio.run(serve(args.host, args.port, args.log))
    except KeyboardInterrupt:
        sys.exit(0)


if __name__ == "__main__":
    main()
