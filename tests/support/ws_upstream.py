"""A real WebSocket upstream (the ``websockets`` package) for tests, run as its own process.

    python -m tests.support.ws_upstream [--host 127.0.0.1] [--port 0]

prints ``listening HOST:PORT`` once it accepts connections.  Paths:

* ``/echo`` — every message (text or binary, any size) sent back as it came
* ``/abort`` — the first message makes the server reset the TCP connection (no close frame)
* ``/forbidden`` — the handshake is refused with a plain ``403`` response
* ``/headers`` — sends one text message: the handshake request's headers as JSON, then closes
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import struct

from websockets.asyncio.server import ServerConnection, serve
from websockets.http11 import Request, Response


async def handler(ws: ServerConnection) -> None:
    path = ws.request.path if ws.request is not None else "/"
    if path.startswith("/abort"):
        await ws.recv()
        sock = ws.transport.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        ws.transport.abort()
        return
    if path.startswith("/headers"):
        assert ws.request is not None
        await ws.send(json.dumps([[k, v] for k, v in ws.request.headers.raw_items()]))
        return
    async for message in ws:
        await ws.send(message)


def refuse(ws: ServerConnection, request: Request) -> Response | None:
    if request.path.startswith("/forbidden"):
        return ws.respond(403, "forbidden\n")
    return None


async def main(host: str, port: int) -> None:
    async with serve(
        handler,
        host,
        port,
        max_size=None,
        process_request=refuse,
        compression=None,
        backlog=2048,
    ) as server:
        bound = next(iter(server.sockets)).getsockname()
        print(f"listening {bound[0]}:{bound[1]}", flush=True)
        await server.serve_forever()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    asyncio.run(main(args.host, args.port))
