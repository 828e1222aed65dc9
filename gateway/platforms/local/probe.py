"""The readiness probe: one HTTP/1.1 GET to a replica on loopback, 2xx/3xx = ready.

Raw asyncio streams (a handful of bytes each way), so probing many replicas every
period costs next to nothing and needs no HTTP client library.
"""

from __future__ import annotations

import asyncio


async def probe_http(host: str, port: int, path: str, timeout_s: float) -> bool:
    """True when ``GET path`` answers 2xx or 3xx within ``timeout_s``; False on any failure."""
    writer: asyncio.StreamWriter | None = None
    try:
        async with asyncio.timeout(timeout_s):
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(
                f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUser-Agent: sluice-probe\r\n"
                "Connection: close\r\n\r\n".encode("latin-1")
            )
            await writer.drain()
            status_line = await reader.readline()
    except (OSError, TimeoutError, asyncio.IncompleteReadError):
        return False
    finally:
        if writer is not None:
            writer.close()
    parts = status_line.split(None, 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/") or not parts[1].isdigit():
        return False
    return 200 <= int(parts[1]) < 400
