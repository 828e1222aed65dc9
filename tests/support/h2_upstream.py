"""A small real HTTP/2 (h2c) upstream for tests, built on the ``h2`` library, in its own process.

    python -m tests.support.h2_upstream --name a [--port 0] [--refuse-first N]

prints ``listening HOST:PORT`` once serving.  Every response carries ``x-upstream: <name>``.

* any path — after the request's END_STREAM: JSON with the method, path, request headers,
  request trailers (as received) and body_bytes, then trailers ``x-body-bytes`` and
  ``x-trailer-count``
* ``/big?bytes=N`` — an N-byte body, sent as fast as the client's windows allow
* ``/hang`` — headers only, then nothing (until the stream or connection ends)

With ``--refuse-first N`` the first N streams (counted over all connections) are reset with
``REFUSED_STREAM`` before anything is processed.  ``/_count`` (not refused) answers how many
streams were refused, how many served, and how many response body bytes were handed to the
connection so far (``sent_bytes``: what the gateway's windows let through).
"""

from __future__ import annotations

import argparse
import asyncio
import json
from urllib.parse import parse_qs, urlsplit

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions

CHUNK = 16 * 1024


class State:
    def __init__(self, name: str, refuse_first: int) -> None:
        self.name = name
        self.refuse_left = refuse_first
        self.refused = 0
        self.served = 0
        self.sent_bytes = 0


class Stream:
    def __init__(self, headers: list[tuple[bytes, bytes]]) -> None:
        self.headers = headers
        self.trailers: list[tuple[bytes, bytes]] = []
        self.body_bytes = 0
        self.remaining = 0
        """Response body bytes still to send (``/big``)."""


class Server(asyncio.Protocol):
    def __init__(self, state: State) -> None:
        self.state = state
        self.conn = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=False, header_encoding=None)
        )
        self.transport: asyncio.Transport | None = None
        self.streams: dict[int, Stream] = {}

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.conn.initiate_connection()
        self.flush()

    def flush(self) -> None:
        data = self.conn.data_to_send()
        if data and self.transport is not None:
            self.transport.write(data)

    def data_received(self, data: bytes) -> None:
        try:
            events = self.conn.receive_data(data)
        except h2.exceptions.ProtocolError:
            self.flush()
            if self.transport is not None:
                self.transport.close()
            return
        for event in events:
            self.event(event)
        self.flush()

    def event(self, event: h2.events.Event) -> None:
        if isinstance(event, h2.events.RequestReceived):
            sid = event.stream_id
            headers = list(event.headers)
            path = dict(headers).get(b":path", b"/")
            if self.state.refuse_left > 0 and path != b"/_count":
                self.state.refuse_left -= 1
                self.state.refused += 1
                self.conn.reset_stream(sid, h2.errors.ErrorCodes.REFUSED_STREAM)
                return
            self.streams[sid] = Stream(headers)
            if event.stream_ended is not None:
                self.respond(sid)
        elif isinstance(event, h2.events.DataReceived):
            self.conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            stream = self.streams.get(event.stream_id)
            if stream is not None:
                stream.body_bytes += len(event.data)
                if event.stream_ended is not None:
                    self.respond(event.stream_id)
        elif isinstance(event, h2.events.TrailersReceived):
            stream = self.streams.get(event.stream_id)
            if stream is not None:
                stream.trailers = list(event.headers)
                self.respond(event.stream_id)
        elif isinstance(event, h2.events.StreamReset):
            self.streams.pop(event.stream_id, None)
        elif isinstance(event, h2.events.WindowUpdated):
            for sid in list(self.streams):
                self.send_pending(sid)

    def respond(self, sid: int) -> None:
        stream = self.streams[sid]
        fields = dict(stream.headers)
        url = urlsplit(fields.get(b":path", b"/").decode("latin-1"))
        query = parse_qs(url.query)
        head = [(b":status", b"200"), (b"x-upstream", self.state.name.encode())]
        if url.path == "/_count":
            state = self.state
            body = json.dumps(
                {"refused": state.refused, "served": state.served, "sent_bytes": state.sent_bytes}
            )
            self.conn.send_headers(sid, [*head, (b"content-type", b"application/json")])
            self.conn.send_data(sid, body.encode(), end_stream=True)
            self.streams.pop(sid, None)
            return
        self.state.served += 1
        if url.path == "/hang":
            self.conn.send_headers(sid, head)
            return
        if url.path == "/big":
            n = int(query.get("bytes", ["0"])[0])
            self.conn.send_headers(sid, [*head, (b"content-length", b"%d" % n)])
            stream.remaining = n
            self.send_pending(sid)
            return
        answer = {
            "method": fields.get(b":method", b"").decode(),
            "path": fields.get(b":path", b"").decode(),
            "headers": [[n.decode(), v.decode()] for n, v in stream.headers],
            "trailers": [[n.decode(), v.decode()] for n, v in stream.trailers],
            "body_bytes": stream.body_bytes,
        }
        self.conn.send_headers(sid, [*head, (b"content-type", b"application/json")])
        self.conn.send_data(sid, json.dumps(answer).encode())
        self.conn.send_headers(
            sid,
            [
                (b"x-body-bytes", b"%d" % stream.body_bytes),
                (b"x-trailer-count", b"%d" % len(stream.trailers)),
            ],
            end_stream=True,
        )
        self.streams.pop(sid, None)

    def send_pending(self, sid: int) -> None:
        stream = self.streams.get(sid)
        if stream is None or not stream.remaining:
            return
        while stream.remaining:
            window = min(
                self.conn.local_flow_control_window(sid),
                self.conn.max_outbound_frame_size,
                CHUNK,
                stream.remaining,
            )
            if window <= 0:
                return
            stream.remaining -= window
            self.state.sent_bytes += window
            self.conn.send_data(sid, b"x" * window, end_stream=not stream.remaining)
        self.streams.pop(sid, None)

    def connection_lost(self, exc: Exception | None) -> None:
        self.streams.clear()


async def main(name: str, host: str, port: int, refuse_first: int) -> None:
    state = State(name, refuse_first)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: Server(state), host, port)
    bound = server.sockets[0].getsockname()
    print(f"listening {bound[0]}:{bound[1]}", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--name", default="h2")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--refuse-first", type=int, default=0)
    args = parser.parse_args()
    asyncio.run(main(args.name, args.host, args.port, args.refuse_first))
