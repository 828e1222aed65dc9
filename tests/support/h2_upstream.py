"""A small real HTTP/2 (h2c) upstream for tests, built on the ``h2`` library, in its own process.

    python -m tests.support.h2_upstream --name a [--port 0] [--refuse-first N]
        [--tls CERT_FILE KEY_FILE] [--fired-dir DIR] [--max-streams N]

prints ``listening HOST:PORT`` once serving (h2c; with ``--tls``, h2 over TLS by ALPN).  Every
response carries ``x-upstream: <name>`` and ``x-connection: <n>`` (the connection's number,
from 1, counted over the process).

* any path — after the request's END_STREAM: JSON with the method, path, request headers,
  request trailers (as received) and body_bytes, then trailers ``x-body-bytes`` and
  ``x-trailer-count``
* ``/big?bytes=N`` (or any path ending so) — an N-byte body, sent as fast as the client's windows allow
* ``/hang`` — headers only, then nothing (until the stream or connection ends)
* ``/early`` — a complete ``413`` the moment the request's headers arrive, before its body
  ends, and no RST_STREAM (RFC 9113 §8.1 lets a server stop there): the stream stays open
  on the client's side until the client ends or resets it
* ``/malformed?kind=K`` — a response RFC 9113 calls malformed, of kind ``K`` (see
  ``MALFORMED``: its header block, or its trailers after a good head and a body)
* ``/hold?key=K`` — no answer until a ``/goaway-above?key=K`` arrives on the same connection
* ``/goaway-above?key=K`` — the first time for K: a GOAWAY (NO_ERROR) whose last stream id
  is the stream before this one, so this stream is not processed (RFC 9113 §6.8); then
  the streams held under K are answered on the same connection (after the GOAWAY), which
  is left for the client to close (closing it here could reset it under the client's
  unread answers, as a socket closed with unread input does).  Later times: answered as
  any path
* ``/goaway-at?key=K`` — the first time for K (over every process given the same
  ``--fired-dir``, which records the keys fired): a GOAWAY (NO_ERROR) whose last stream id is
  this stream's (it may have been processed), then the connection is closed without an
  answer.  Later times: answered as any path

With ``--max-streams N`` the server's SETTINGS_MAX_CONCURRENT_STREAMS is N (default: h2's).
With ``--refuse-first N`` the first N streams (counted over all connections) are reset with
``REFUSED_STREAM`` before anything is processed.  ``/_count`` (or any path ending so; not refused) answers how many
streams were refused, how many served, and how many response body bytes were handed to the
connection so far (``sent_bytes``: what the gateway's windows let through), and how many
times each ``key`` arrived (``arrivals``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import ssl
from urllib.parse import parse_qs, urlsplit

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings
from hyperframe.frame import GoAwayFrame

CHUNK = 16 * 1024


MALFORMED: dict[str, tuple[list[tuple[bytes, bytes]], list[tuple[bytes, bytes]] | None]] = {
    "uppercase-name": ([(b":status", b"200"), (b"X-Upper", b"1")], None),
    "crlf-in-value": ([(b":status", b"200"), (b"x-a", b"a\r\nx-injected: 1")], None),
    "space-around-value": ([(b":status", b"200"), (b"x-a", b" padded")], None),
    "connection-field": ([(b":status", b"200"), (b"connection", b"close")], None),
    "pseudo-after-regular": ([(b"x-a", b"1"), (b":status", b"200")], None),
    "no-status": ([(b"x-a", b"1")], None),
    "request-pseudo": ([(b":status", b"200"), (b":path", b"/")], None),
    "bad-status": ([(b":status", b"2x0")], None),
    "trailer-pseudo": ([(b":status", b"200")], [(b":status", b"200")]),
    "trailer-crlf": ([(b":status", b"200")], [(b"grpc-message", b"a\r\nb")]),
}
"""Malformed responses: (header block, trailers or None)."""


class State:
    def __init__(self, name: str, refuse_first: int, fired_dir: str | None = None) -> None:
        self.name = name
        self.fired_dir = fired_dir
        self.refuse_left = refuse_first
        self.refused = 0
        self.served = 0
        self.sent_bytes = 0
        self.connections = 0
        self.arrivals: dict[str, int] = {}
        self.fired: set[str] = set()
        """Keys whose GOAWAY was sent."""

    def fire(self, key: str) -> bool:
        """True the first time ``key`` is asked for (in this process, or in any process
        sharing ``fired_dir``)."""
        if key in self.fired:
            return False
        self.fired.add(key)
        if self.fired_dir is None:
            return True
        try:
            os.close(os.open(os.path.join(self.fired_dir, key), os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            return False
        return True


class Stream:
    def __init__(self, headers: list[tuple[bytes, bytes]]) -> None:
        self.headers = headers
        self.trailers: list[tuple[bytes, bytes]] = []
        self.body_bytes = 0
        self.remaining = 0
        """Response body bytes still to send (``/big``)."""


class Server(asyncio.Protocol):
    def __init__(self, state: State, max_streams: int | None = None) -> None:
        self.state = state
        self.conn = h2.connection.H2Connection(
            h2.config.H2Configuration(
                client_side=False,
                header_encoding=None,
                validate_outbound_headers=False,  # (what /malformed sends is checked nowhere)
                normalize_outbound_headers=False,
            )
        )
        if max_streams is not None:
            self.conn.local_settings = h2.settings.Settings(
                client=False,
                initial_values={h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: max_streams},
            )
        self.transport: asyncio.Transport | None = None
        self.streams: dict[int, Stream] = {}
        self.held: dict[str, list[int]] = {}
        self.number = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.state.connections += 1
        self.number = self.state.connections
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
            if self.state.refuse_left > 0 and not path.endswith(b"/_count"):
                self.state.refuse_left -= 1
                self.state.refused += 1
                self.conn.reset_stream(sid, h2.errors.ErrorCodes.REFUSED_STREAM)
                return
            self.streams[sid] = Stream(headers)
            url = urlsplit(path.decode("latin-1"))
            key = parse_qs(url.query).get("key", [""])[0]
            if key:
                self.state.arrivals[key] = self.state.arrivals.get(key, 0) + 1
            if url.path == "/early":
                self.state.served += 1
                self.conn.send_headers(
                    sid, [(b":status", b"413"), (b"x-upstream", self.state.name.encode())], True
                )
                self.streams.pop(sid, None)
                return
            if url.path == "/hold":
                self.held.setdefault(key, []).append(sid)
                return
            if url.path in ("/goaway-above", "/goaway-at") and self.state.fire(key):
                above = url.path == "/goaway-above"
                self.goaway(sid - 2 if above else sid)
                self.streams.pop(sid, None)
                if above:
                    for held in self.held.pop(key, []):
                        self.respond(held)
                elif self.transport is not None:
                    self.flush()
                    self.transport.close()
                return
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

    def goaway(self, last_stream_id: int) -> None:
        """Write a graceful GOAWAY by hand: the ``h2`` library's ``close_connection`` would
        close its state machine, and the streams up to ``last_stream_id`` still get answers."""
        self.flush()
        frame = GoAwayFrame(0)
        frame.last_stream_id = last_stream_id
        frame.error_code = h2.errors.ErrorCodes.NO_ERROR
        if self.transport is not None:
            self.transport.write(frame.serialize())

    def respond(self, sid: int) -> None:
        stream = self.streams[sid]
        fields = dict(stream.headers)
        url = urlsplit(fields.get(b":path", b"/").decode("latin-1"))
        query = parse_qs(url.query)
        head = [
            (b":status", b"200"),
            (b"x-upstream", self.state.name.encode()),
            (b"x-connection", b"%d" % self.number),
        ]
        if url.path.endswith("/_count"):
            state = self.state
            body = json.dumps(
                {
                    "refused": state.refused,
                    "served": state.served,
                    "sent_bytes": state.sent_bytes,
                    "arrivals": state.arrivals,
                }
            )
            self.conn.send_headers(sid, [*head, (b"content-type", b"application/json")])
            self.conn.send_data(sid, body.encode(), end_stream=True)
            self.streams.pop(sid, None)
            return
        self.state.served += 1
        if url.path.endswith("/malformed"):
            block, trailers = MALFORMED[query["kind"][0]]
            self.conn.send_headers(sid, block, end_stream=trailers is None)
            if trailers is not None:
                self.conn.send_data(sid, b"body")
                self.conn.send_headers(sid, trailers, end_stream=True)
            self.streams.pop(sid, None)
            return
        if url.path == "/hang":
            self.conn.send_headers(sid, head)
            return
        if url.path.endswith("/big"):
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


async def main(
    name: str,
    host: str,
    port: int,
    refuse_first: int,
    tls: tuple[str, str] | None,
    fired_dir: str | None,
    max_streams: int | None = None,
) -> None:
    state = State(name, refuse_first, fired_dir)
    context = None
    if tls is not None:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(*tls)
        context.set_alpn_protocols(["h2"])
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: Server(state, max_streams), host, port, ssl=context)
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
    parser.add_argument("--tls", nargs=2, metavar=("CERT_FILE", "KEY_FILE"))
    parser.add_argument("--fired-dir")
    parser.add_argument("--max-streams", type=int)
    args = parser.parse_args()
    tls = (args.tls[0], args.tls[1]) if args.tls else None
    asyncio.run(
        main(
            args.name,
            args.host,
            args.port,
            args.refuse_first,
            tls,
            args.fired_dir,
            args.max_streams,
        )
    )
