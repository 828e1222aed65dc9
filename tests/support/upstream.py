"""A small real HTTP/1.1 upstream for tests, run as its own process.

    python -m tests.support.upstream --name a [--host 127.0.0.1] [--port 0]

prints ``listening HOST:PORT`` once it accepts connections.  Every response carries
``X-Upstream: <name>``.  Paths:

* ``/echo...`` (any other path too) — JSON: method, target, headers (as received, in
  order), body (text, when under 64 KiB), body_bytes and peer_port (the gateway's side)
* ``/status/<code>`` — that status with a short body
* ``/delay?s=<seconds>`` — answer after a delay (``/_delays`` reports how many overlapped)
* ``/hang`` — never answer (until the connection closes)
* ``/hold?s=<seconds>`` — answer after a delay, but record ``hold-cancelled`` in the
  event log if the connection closes first
* ``/stream?bytes=<n>[&chunked=1]`` — an ``n``-byte body, Content-Length or chunked
* ``/sink`` — read the request body streaming; JSON with its byte count and sha256
* ``/reset`` — reset the connection without answering
* ``/reset-mid-body?bytes=<n>`` — announce ``n`` bytes, send half, reset
* ``/truncate-chunked`` — a chunked body whose connection closes before the last chunk
* ``/close-delimited?bytes=<n>`` — no Content-Length, no chunking: the body ends at close
* ``/headers?h=Name:value&...`` — a response with these extra header fields
* ``/switch`` — ``101 Switching Protocols`` (to the request's ``Upgrade``, else ``foo``),
  then echo raw bytes until the peer closes
* ``/_events`` — the event log (JSON list), for tests to read directly (not via the gateway)
* ``/_delays`` — ``{"active": n, "peak": n}``: ``/delay`` requests being served now and the
  most at once since the upstream started (read directly, not via the gateway)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import socket
import ssl
import struct
import sys
from urllib.parse import parse_qs, unquote, urlsplit

CHUNK = 64 * 1024
PATTERN = bytes(range(256)) * (CHUNK // 256)


class Request:
    def __init__(self, method: str, target: str, version: str, headers: list[tuple[str, str]]):
        self.method = method
        self.target = target
        self.version = version
        self.headers = headers
        url = urlsplit(target)
        self.path = url.path
        self.query = parse_qs(url.query)

    def header(self, name: str) -> str | None:
        for n, v in self.headers:
            if n.lower() == name:
                return v
        return None

    def arg(self, name: str, default: str) -> str:
        return self.query.get(name, [default])[0]


class Upstream:
    def __init__(self, name: str) -> None:
        self.name = name
        self.events: list[dict[str, object]] = []
        self.delays_active = 0
        self.delays_peak = 0

    async def read_request(self, reader: asyncio.StreamReader) -> Request | None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError):
            return None
        lines = head.decode("latin-1").split("\r\n")
        method, target, version = lines[0].split(" ", 2)
        headers = []
        for line in lines[1:]:
            if line:
                n, _, v = line.partition(":")
                headers.append((n, v.strip()))
        return Request(method, target, version, headers)

    async def body_chunks(self, reader: asyncio.StreamReader, req: Request):  # type: ignore[no-untyped-def]
        te = (req.header("transfer-encoding") or "").lower()
        if "chunked" in te:
            while True:
                size = int((await reader.readline()).split(b";")[0].strip(), 16)
                if size == 0:
                    while (await reader.readline()) not in (b"\r\n", b""):
                        pass
                    return
                left = size
                while left:
                    data = await reader.read(min(left, CHUNK))
                    if not data:
                        raise ConnectionError("eof in chunk")
                    left -= len(data)
                    yield data
                await reader.readexactly(2)
        else:
            left = int(req.header("content-length") or 0)
            while left:
                data = await reader.read(min(left, CHUNK))
                if not data:
                    raise ConnectionError("eof in body")
                left -= len(data)
                yield data

    def head(self, status: int, headers: list[tuple[str, str]], length: int | None) -> bytes:
        lines = [
            f"HTTP/1.1 {status} X",
            f"X-Upstream: {self.name}",
            *[f"{n}: {v}" for n, v in headers],
        ]
        if length is not None:
            lines.append(f"Content-Length: {length}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    async def respond(
        self, writer: asyncio.StreamWriter, status: int, body: bytes, ctype: str = "text/plain"
    ) -> None:
        writer.write(self.head(status, [("Content-Type", ctype)], len(body)) + body)
        await writer.drain()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                req = await self.read_request(reader)
                if req is None:
                    return
                keep = await self.serve(req, reader, writer)
                if not keep:
                    return
        except ConnectionError:
            return
        finally:
            with contextlib.suppress(Exception):
                writer.close()

    def reset(self, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()

    async def serve(
        self, req: Request, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        path = req.path
        if path == "/sink":
            digest = hashlib.sha256()
            n = 0
            async for chunk in self.body_chunks(reader, req):
                digest.update(chunk)
                n += len(chunk)
            body = json.dumps(
                {"bytes": n, "sha256": digest.hexdigest(), "name": self.name}
            ).encode()
            await self.respond(writer, 200, body, "application/json")
            return True
        # Every other path reads the whole (small) body first.
        chunks = [c async for c in self.body_chunks(reader, req)]
        data = b"".join(chunks)
        if path.startswith("/status/"):
            status = int(path.rsplit("/", 1)[1])
            await self.respond(writer, status, f"status {status} from {self.name}\n".encode())
            return True
        if path == "/delay":
            self.delays_active += 1
            self.delays_peak = max(self.delays_peak, self.delays_active)
            try:
                await asyncio.sleep(float(req.arg("s", "0.1")))
            finally:
                self.delays_active -= 1
            await self.respond(writer, 200, f"delayed {self.name}\n".encode())
            return True
        if path == "/hang":
            await reader.read()
            return False
        if path == "/hold":
            sleeper = asyncio.ensure_future(asyncio.sleep(float(req.arg("s", "30"))))
            eof = asyncio.ensure_future(reader.read(1))
            done, _ = await asyncio.wait({sleeper, eof}, return_when=asyncio.FIRST_COMPLETED)
            if eof in done:
                sleeper.cancel()
                self.events.append({"event": "hold-cancelled", "target": req.target})
                return False
            eof.cancel()
            await self.respond(writer, 200, b"held\n")
            return False
        if path == "/stream":
            n = int(req.arg("bytes", "0"))
            chunked = req.arg("chunked", "0") == "1"
            if chunked:
                writer.write(self.head(200, [("Transfer-Encoding", "chunked")], None))
            else:
                writer.write(self.head(200, [("Content-Type", "application/octet-stream")], n))
            left = n
            while left:
                piece = PATTERN[: min(left, CHUNK)]
                left -= len(piece)
                if chunked:
                    writer.write(b"%x\r\n" % len(piece) + piece + b"\r\n")
                else:
                    writer.write(piece)
                await writer.drain()
            if chunked:
                writer.write(b"0\r\n\r\n")
            await writer.drain()
            return True
        if path == "/reset":
            self.reset(writer)
            return False
        if path == "/reset-mid-body":
            n = int(req.arg("bytes", "100000"))
            writer.write(self.head(200, [], n) + PATTERN[: n // 2])
            await writer.drain()
            await asyncio.sleep(0.05)
            self.reset(writer)
            return False
        if path == "/truncate-chunked":
            writer.write(self.head(200, [("Transfer-Encoding", "chunked")], None))
            writer.write(b"5\r\nhello\r\n")
            await writer.drain()
            await asyncio.sleep(0.05)
            writer.close()
            return False
        if path == "/close-delimited":
            n = int(req.arg("bytes", "1000"))
            writer.write(self.head(200, [("Connection", "close")], None) + PATTERN[:n])
            await writer.drain()
            writer.close()
            return False
        if path == "/headers":
            extra = [tuple(unquote(h).split(":", 1)) for h in req.query.get("h", [])]
            pairs = [(n.strip(), v.strip()) for n, v in extra]
            body = b"headers\n"
            writer.write(self.head(200, pairs, len(body)) + body)
            await writer.drain()
            return True
        if path == "/early-hints":
            # A 103 before the final response: separate writes, or one (?together=1).
            hints = b"HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\n"
            body = b"after hints\n"
            final = self.head(200, [("X-Final", "yes")], len(body)) + body
            if req.arg("together", "0") == "1":
                writer.write(hints + final)
            else:
                writer.write(hints)
                await writer.drain()
                await asyncio.sleep(0.02)
                writer.write(final)
            await writer.drain()
            return True
        if path == "/drip-head":
            # The response head in pieces of ?piece=N bytes, each its own write.
            piece = int(req.arg("piece", "3"))
            body = b"dripped\n"
            data = self.head(200, [("X-Dripped", "a" * 40)], len(body)) + body
            for i in range(0, len(data), piece):
                writer.write(data[i : i + piece])
                await writer.drain()
                await asyncio.sleep(0.002)
            return True
        if path == "/huge-head":
            n = int(req.arg("bytes", "70000"))
            writer.write(self.head(200, [("X-Huge", "h" * n)], 2) + b"ok")
            await writer.drain()
            return True
        if path == "/switch":
            proto = req.header("upgrade") or "foo"
            writer.write(
                f"HTTP/1.1 101 Switching Protocols\r\nConnection: upgrade\r\nUpgrade: {proto}\r\n\r\n".encode()
                + b"hello from the other side\n"
            )
            await writer.drain()
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
            return False
        if path == "/_delays":
            body = {"active": self.delays_active, "peak": self.delays_peak}
            await self.respond(writer, 200, json.dumps(body).encode(), "application/json")
            return True
        if path == "/_events":
            await self.respond(writer, 200, json.dumps(self.events).encode(), "application/json")
            return True
        peer = writer.get_extra_info("peername")
        echo = {
            "name": self.name,
            "peer_port": peer[1] if peer else None,
            "method": req.method,
            "target": req.target,
            "version": req.version,
            "headers": req.headers,
            "body_bytes": len(data),
            "body": data.decode("latin-1") if len(data) < 65536 else None,
        }
        await self.respond(writer, 200, json.dumps(echo).encode(), "application/json")
        return True


async def main(name: str, host: str, port: int, tls: tuple[str, str] | None = None) -> None:
    upstream = Upstream(name)
    context = None
    if tls is not None:  # HTTPS with this certificate and key (upstream_tls tests)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(*tls)
    server = await asyncio.start_server(upstream.handle, host, port, limit=1 << 20, ssl=context)
    bound = server.sockets[0].getsockname()
    print(f"listening {bound[0]}:{bound[1]}", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--name", default="upstream")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--tls", nargs=2, metavar=("CERT_FILE", "KEY_FILE"))
    args = parser.parse_args()
    try:
        asyncio.run(main(args.name, args.host, args.port, tuple(args.tls) if args.tls else None))
    except KeyboardInterrupt:
        sys.exit(0)
