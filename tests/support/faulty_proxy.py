"""A small fault-injecting TCP proxy for integration tests.

    with FaultyProxy(("127.0.0.1", upstream_port)) as proxy:
        proxy.fault = Fault.DELAY        # or set in the constructor
        ... point the gateway at proxy.address ...

It listens on 127.0.0.1 (port 0) in a thread with its own event loop and, per accepted
connection, applies the fault that is set at accept time:

* ``PASS`` — forward bytes both ways untouched;
* ``DELAY`` — hold the upstream's response for ``delay_s`` before forwarding it;
* ``BLACKHOLE`` — accept and read the request, never answer, never close;
* ``REFUSE`` — reset the connection at once (RST), nothing read;
* ``RESET_AFTER_REQUEST`` — read the request head (it reached the upstream), then RST;
* ``RESET_MID_BODY`` — forward the response's first ``after_bytes`` bytes, then RST;
* ``TRUNCATE`` — forward the first ``after_bytes`` response bytes, then a clean close (FIN);
* ``BAD_FRAMING`` — answer the request itself with ``bad_response`` (malformed framing).

``connections`` counts accepted connections and ``received`` keeps what clients sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import socket
import struct
import threading
from typing import Self


class Fault(enum.Enum):
    PASS = "pass"
    DELAY = "delay"
    BLACKHOLE = "blackhole"
    REFUSE = "refuse"
    RESET_AFTER_REQUEST = "reset-after-request"
    RESET_MID_BODY = "reset-mid-body"
    TRUNCATE = "truncate"
    BAD_FRAMING = "bad-framing"


DEFAULT_BAD_RESPONSE = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 7\r\n\r\nhello"


def _rst(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class FaultyProxy:
    def __init__(
        self,
        target: tuple[str, int],
        fault: Fault = Fault.PASS,
        delay_s: float = 0.5,
        after_bytes: int = 64,
        bad_response: bytes = DEFAULT_BAD_RESPONSE,
    ) -> None:
        self.target = target
        self.fault = fault
        self.delay_s = delay_s
        self.after_bytes = after_bytes
        self.bad_response = bad_response
        self.connections = 0
        self.received: list[bytes] = []
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task[None]] = set()
        self.address = ""
        self.port = 0

    def __enter__(self) -> Self:
        self._thread.start()
        fut = asyncio.run_coroutine_threadsafe(self._start(), self._loop)
        fut.result(10)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    async def _start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        self.address = f"127.0.0.1:{self.port}"

    async def _stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._handlers):
            task.cancel()
        for task in list(self._handlers):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        self.connections += 1
        fault = self.fault
        try:
            await self._apply(fault, reader, writer)
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            self._handlers.discard(task)
            if not writer.transport.is_closing():
                writer.close()

    async def _apply(
        self, fault: Fault, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        if fault is Fault.REFUSE:
            _rst(writer)
            return
        if fault is Fault.RESET_AFTER_REQUEST:
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = await reader.read(65536)
                if not chunk:
                    return
                data += chunk
            self.received.append(data)
            _rst(writer)
            return
        if fault is Fault.BLACKHOLE:
            while await reader.read(65536):
                pass
            await asyncio.sleep(3600)
            return
        if fault is Fault.BAD_FRAMING:
            data = await reader.read(65536)
            self.received.append(data)
            writer.write(self.bad_response)
            await writer.drain()
            await asyncio.sleep(0.05)
            return
        up_reader, up_writer = await asyncio.open_connection(*self.target)
        try:
            upward = asyncio.create_task(self._pump_up(reader, up_writer))
            try:
                await self._pump_down(fault, up_reader, writer)
            finally:
                upward.cancel()
                with contextlib.suppress(asyncio.CancelledError, OSError):
                    await upward
        finally:
            up_writer.close()

    async def _pump_up(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(65536):
            self.received.append(data)
            writer.write(data)
            await writer.drain()
        writer.write_eof()

    async def _pump_down(
        self, fault: Fault, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        sent = 0
        delayed = False
        while data := await reader.read(65536):
            if fault is Fault.DELAY and not delayed:
                delayed = True
                await asyncio.sleep(self.delay_s)
            if (
                fault in (Fault.RESET_MID_BODY, Fault.TRUNCATE)
                and sent + len(data) >= self.after_bytes
            ):
                writer.write(data[: self.after_bytes - sent])
                await writer.drain()
                if fault is Fault.RESET_MID_BODY:
                    _rst(writer)
                else:
                    writer.close()
                return
            sent += len(data)
            writer.write(data)
            await writer.drain()
