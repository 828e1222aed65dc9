"""WebSocket echo: the server and the load client that ``benchmarks/proxy.py --websocket`` runs.

    python benchmarks/ws_echo.py serve --port P
    python benchmarks/ws_echo.py client --port P [--connections 10] [--duration-s 5] [--size 128]

``serve``: a ``websockets`` echo server on 127.0.0.1 (prints ``listening`` when ready).
``client``: ``--connections`` sockets, each sending a ``--size``-byte binary message and
waiting for its echo, back to back, for ``--duration-s``; prints one JSON object:
messages, seconds, messages per second and round-trip p50/p99 in milliseconds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time

from websockets.asyncio.client import connect
from websockets.asyncio.server import ServerConnection, serve


async def _echo(ws: ServerConnection) -> None:
    async for message in ws:
        await ws.send(message)


async def run_server(port: int) -> None:
    async with serve(_echo, "127.0.0.1", port, compression=None, max_size=None, backlog=1024):
        print("listening", flush=True)
        await asyncio.Future()


async def run_client(port: int, connections: int, duration_s: float, size: int) -> dict[str, float]:
    payload = os.urandom(size)
    url = f"ws://127.0.0.1:{port}/"
    sockets = [
        await connect(url, compression=None, max_size=None, ping_interval=None, open_timeout=30)
        for _ in range(connections)
    ]
    latencies: list[float] = []
    loop = asyncio.get_running_loop()
    stop_at = loop.time() + duration_s

    async def one(ws: object) -> None:
        send = ws.send  # type: ignore[attr-defined]
        recv = ws.recv  # type: ignore[attr-defined]
        while loop.time() < stop_at:
            t = time.perf_counter()
            await send(payload)
            await recv()
            latencies.append(time.perf_counter() - t)

    started = time.perf_counter()
    await asyncio.wait_for(asyncio.gather(*(one(ws) for ws in sockets)), duration_s + 30)
    seconds = time.perf_counter() - started
    for ws in sockets:
        await ws.close()
    ms = sorted(x * 1000 for x in latencies)
    return {
        "messages": len(ms),
        "seconds": seconds,
        "mps": len(ms) / seconds,
        "p50_ms": statistics.median(ms) if ms else float("nan"),
        "p99_ms": ms[min(len(ms) - 1, int(len(ms) * 0.99))] if ms else float("nan"),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="mode", required=True)
    s = sub.add_parser("serve")
    s.add_argument("--port", type=int, required=True)
    c = sub.add_parser("client")
    c.add_argument("--port", type=int, required=True)
    c.add_argument("--connections", type=int, default=10)
    c.add_argument("--duration-s", type=float, default=5.0)
    c.add_argument("--size", type=int, default=128)
    args = parser.parse_args()
    if args.mode == "serve":
        asyncio.run(run_server(args.port))
        return 0
    result = asyncio.run(run_client(args.port, args.connections, args.duration_s, args.size))
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
