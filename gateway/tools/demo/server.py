"""The demo replica: HTTP/1.1 with keep-alive on asyncio streams, CPU burned in worker threads.

* ``GET /healthz`` -> ``200 ok`` (answered on the event loop, even while requests burn CPU).
* any other request -> burns ``cpu_ms`` milliseconds of CPU (measured with the thread's CPU
  clock, so a throttled replica takes longer but does the same work), then sleeps
  ``sleep_ms``, then answers a small JSON body: ``{"pid", "port", "cpu_ms", "sleep_ms",
  "path", "wall_ms"}``.  ``cpu_ms`` / ``sleep_ms`` come from the query string or the
  ``DEMO_CPU_MS`` / ``DEMO_SLEEP_MS`` environment defaults (both default 0).

SIGTERM/SIGINT: stop accepting, let in-flight requests finish (up to ``--drain-s``), exit 0.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import parse_qs, urlsplit

MAX_HEADER_BYTES = 64 * 1024
MAX_BODY_BYTES = 16 * 1024 * 1024
MAX_WORK_MS = 60_000.0


class BadRequest(Exception):
    pass


def burn_cpu(cpu_ms: float) -> float:
    """Spin until this thread has used ``cpu_ms`` of CPU; return the wall time it took (ms)."""
    start = time.perf_counter()
    end = time.thread_time() + cpu_ms / 1000.0
    x = 0
    while time.thread_time() < end:
        for i in range(2000):
            x ^= i
    return (time.perf_counter() - start) * 1000.0


def _ms(query: dict[str, list[str]], key: str, default: float) -> float:
    raw = query.get(key, [None])[-1]
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise BadRequest(f"{key} must be a number, got {raw!r}") from None
    if not 0 <= value <= MAX_WORK_MS:
        raise BadRequest(f"{key} must be in 0..{MAX_WORK_MS:g}, got {raw!r}")
    return value


def _env_ms(name: str) -> float:
    raw = os.environ.get(name, "0") or "0"
    try:
        value = float(raw)
    except ValueError:
        raise SystemExit(f"demo: {name} must be a number of milliseconds, got {raw!r}") from None
    if not 0 <= value <= MAX_WORK_MS:
        raise SystemExit(f"demo: {name} must be in 0..{MAX_WORK_MS:g}, got {raw!r}")
    return value


class DemoServer:
    """One demo replica; ``serve()`` runs until ``stop()``."""

    def __init__(self, host: str, port: int, threads: int = 8) -> None:
        self.host = host
        self.port = port
        self.default_cpu_ms = _env_ms("DEMO_CPU_MS")
        self.default_sleep_ms = _env_ms("DEMO_SLEEP_MS")
        self._executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="burn")
        self._server: asyncio.Server | None = None
        self._in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._stopping = asyncio.Event()
        self._connections: set[asyncio.StreamWriter] = set()

    async def start(self) -> int:
        self._server = await asyncio.start_server(
            self._handle, self.host, self.port, limit=MAX_HEADER_BYTES, reuse_address=True
        )
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    def stop(self) -> None:
        self._stopping.set()

    async def serve(self, drain_s: float = 30.0) -> None:
        if self._server is None:
            await self.start()
        assert self._server is not None
        await self._stopping.wait()
        self._server.close()
        try:
            async with asyncio.timeout(drain_s):
                await self._idle.wait()
        except TimeoutError:
            pass
        for writer in list(self._connections):
            writer.close()
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._connections.add(writer)
        try:
            while not self._stopping.is_set():
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                except asyncio.LimitOverrunError:
                    await self._respond(writer, 431, b"headers too large\n", close=True)
                    return
                self._in_flight += 1
                self._idle.clear()
                try:
                    keep_alive = await self._request(head, reader, writer)
                finally:
                    self._in_flight -= 1
                    if self._in_flight == 0:
                        self._idle.set()
                if not keep_alive:
                    return
        except ConnectionError:
            return
        finally:
            self._connections.discard(writer)
            writer.close()

    async def _request(
        self, head: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        try:
            method, target, version, headers = _parse_head(head)
            await _read_body(reader, headers)
        except BadRequest as e:
            await self._respond(writer, 400, f"{e}\n".encode(), close=True)
            return False
        connection = headers.get("connection", "").lower()
        keep_alive = (
            "close" not in connection if version == "HTTP/1.1" else "keep-alive" in connection
        )
        keep_alive = keep_alive and not self._stopping.is_set()
        url = urlsplit(target)
        if url.path == "/healthz":
            await self._respond(writer, 200, b"ok\n", close=not keep_alive, head=method == "HEAD")
            return keep_alive
        try:
            query = parse_qs(url.query)
            cpu_ms = _ms(query, "cpu_ms", self.default_cpu_ms)
            sleep_ms = _ms(query, "sleep_ms", self.default_sleep_ms)
        except BadRequest as e:
            await self._respond(writer, 400, f"{e}\n".encode(), close=not keep_alive)
            return keep_alive
        started = time.perf_counter()
        if cpu_ms > 0:
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(self._executor, burn_cpu, cpu_ms)
        if sleep_ms > 0:
            await asyncio.sleep(sleep_ms / 1000.0)
        body = json.dumps(
            {
                "pid": os.getpid(),
                "port": self.port,
                "cpu_ms": cpu_ms,
                "sleep_ms": sleep_ms,
                "path": url.path,
                "wall_ms": round((time.perf_counter() - started) * 1000.0, 3),
            }
        ).encode()
        await self._respond(
            writer,
            200,
            body + b"\n",
            close=not keep_alive,
            content_type=b"application/json",
            head=method == "HEAD",
        )
        return keep_alive

    async def _respond(
        self,
        writer: asyncio.StreamWriter,
        status: int,
        body: bytes,
        *,
        close: bool,
        content_type: bytes = b"text/plain",
        head: bool = False,
    ) -> None:
        reason = {200: b"OK", 400: b"Bad Request", 431: b"Request Header Fields Too Large"}
        writer.write(
            b"HTTP/1.1 %d %s\r\ncontent-type: %s\r\ncontent-length: %d\r\n%s\r\n%s"
            % (
                status,
                reason.get(status, b"Error"),
                content_type,
                len(body),
                b"connection: close\r\n" if close else b"",
                b"" if head else body,
            )
        )
        await writer.drain()


def _parse_head(head: bytes) -> tuple[str, str, str, dict[str, str]]:
    try:
        text = head.decode("latin-1")
    except UnicodeDecodeError:  # pragma: no cover - latin-1 decodes every byte
        raise BadRequest("undecodable request head") from None
    lines = text.split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or parts[2] not in ("HTTP/1.1", "HTTP/1.0"):
        raise BadRequest(f"bad request line {lines[0]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            raise BadRequest(f"bad header line {line!r}")
        headers[name.lower()] = value.strip()
    return parts[0], parts[1], parts[2], headers


async def _read_body(reader: asyncio.StreamReader, headers: dict[str, str]) -> None:
    """Read and discard the request body (Content-Length or chunked)."""
    if "chunked" in headers.get("transfer-encoding", "").lower():
        total = 0
        while True:
            size_line = await reader.readline()
            try:
                size = int(size_line.split(b";")[0].strip(), 16)
            except ValueError:
                raise BadRequest("bad chunk size") from None
            total += size
            if total > MAX_BODY_BYTES:
                raise BadRequest("body too large")
            if size == 0:
                while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                    pass
                return
            await reader.readexactly(size + 2)
    length = headers.get("content-length")
    if length is None:
        return
    if not length.isdigit() or int(length) > MAX_BODY_BYTES:
        raise BadRequest(f"bad content-length {length!r}")
    remaining = int(length)
    while remaining:
        chunk = await reader.read(min(remaining, 65536))
        if not chunk:
            raise BadRequest("body ended early")
        remaining -= len(chunk)


async def _serve(host: str, port: int, threads: int, drain_s: float) -> None:
    server = DemoServer(host, port, threads)
    bound = await server.start()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, server.stop)
    print(f"demo: listening on {host}:{bound} (pid {os.getpid()})", file=sys.stderr, flush=True)
    await server.serve(drain_s)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m gateway.tools.demo", description="Sluice demo app: requests that burn CPU."
    )
    parser.add_argument(
        "--port", type=int, default=int(os.environ.get("PORT", "0")), help="port (default $PORT)"
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (127.0.0.1)")
    parser.add_argument("--threads", type=int, default=8, help="CPU-burning worker threads")
    parser.add_argument("--drain-s", type=float, default=30.0, help="drain time on SIGTERM")
    args = parser.parse_args(argv)
    if not 0 <= args.port <= 65535:
        parser.error(f"--port must be in 0..65535, got {args.port}")
    if args.threads < 1:
        parser.error(f"--threads must be >= 1, got {args.threads}")
    asyncio.run(_serve(args.host, args.port, args.threads, args.drain_s))
    return 0
