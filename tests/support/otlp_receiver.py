"""A real OTLP/HTTP trace receiver for tests: decodes ExportTraceServiceRequest protobuf.

Started on 127.0.0.1:0 in a thread; ``spans()`` returns flat, decoded span records with their
resource attributes; ``wait_for(predicate)`` polls (bounded) until the predicate holds.
Also an upstream that answers every request with the trace headers it received, as JSON.
"""

from __future__ import annotations

import gzip
import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span as PbSpan


def _value(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: _value(kv.value) for kv in v.kvlist_value.values}
    return getattr(v, kind) if kind else None


@dataclass(frozen=True)
class ReceivedSpan:
    trace_id: str
    span_id: str
    parent_span_id: str | None
    name: str
    kind: str
    start_ns: int
    end_ns: int
    status: str
    attributes: dict[str, Any]
    events: list[tuple[str, dict[str, Any]]]
    resource: dict[str, Any]
    trace_state: str
    flags: int


@dataclass
class OtlpReceiver:
    """Collects every span posted to ``/v1/traces``; ``requests`` counts the POSTs."""

    server: ThreadingHTTPServer | None = None
    """The OTLP/HTTP server (None for the gRPC receiver)."""
    received: list[ReceivedSpan] = field(default_factory=list)
    headers_seen: list[dict[str, str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    fail_next: int = 0
    """Answer this many of the next exports with 503 (a collector under pressure)."""

    @property
    def endpoint(self) -> str:
        assert self.server is not None
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}/v1/traces"

    def spans(self) -> list[ReceivedSpan]:
        with self.lock:
            return list(self.received)

    def wait_for(
        self, predicate: Callable[[list[ReceivedSpan]], bool], timeout_s: float = 10.0
    ) -> list[ReceivedSpan]:
        deadline = time.monotonic() + timeout_s
        while True:
            spans = self.spans()
            if predicate(spans):
                return spans
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"receiver: condition not met; got {len(spans)} span(s): {spans}"
                )
            time.sleep(0.02)

    def decode(self, body: bytes) -> None:
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        out: list[ReceivedSpan] = []
        for rs in request.resource_spans:
            resource = {kv.key: _value(kv.value) for kv in rs.resource.attributes}
            for ss in rs.scope_spans:
                for s in ss.spans:
                    out.append(
                        ReceivedSpan(
                            trace_id=s.trace_id.hex(),
                            span_id=s.span_id.hex(),
                            parent_span_id=s.parent_span_id.hex() or None,
                            name=s.name,
                            kind=PbSpan.SpanKind.Name(s.kind).removeprefix("SPAN_KIND_"),
                            start_ns=s.start_time_unix_nano,
                            end_ns=s.end_time_unix_nano,
                            status=s.status.StatusCode.Name(s.status.code).removeprefix(
                                "STATUS_CODE_"
                            ),
                            attributes={kv.key: _value(kv.value) for kv in s.attributes},
                            events=[
                                (e.name, {kv.key: _value(kv.value) for kv in e.attributes})
                                for e in s.events
                            ],
                            resource=resource,
                            trace_state=s.trace_state,
                            flags=s.flags,
                        )
                    )
        with self.lock:
            self.received.extend(out)


def _handler(receiver_ref: list[OtlpReceiver]) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            receiver = receiver_ref[0]
            length = int(self.headers.get("Content-Length", "0"))
            body = self.rfile.read(length)
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            if (
                self.path != "/v1/traces"
                or self.headers.get("Content-Type") != "application/x-protobuf"
            ):
                self.send_error(404)
                return
            with receiver.lock:
                receiver.headers_seen.append({k.lower(): v for k, v in self.headers.items()})
                refuse = receiver.fail_next > 0
                if refuse:
                    receiver.fail_next -= 1
            if refuse:
                self.send_response(503)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            receiver.decode(body)
            reply = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, format: str, *args: Any) -> None:
            return None

    return Handler


@contextmanager
def otlp_receiver() -> Iterator[OtlpReceiver]:
    ref: list[OtlpReceiver] = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(ref))
    server.daemon_threads = True
    receiver = OtlpReceiver(server)
    ref.append(receiver)
    thread = threading.Thread(target=server.serve_forever, name="otlp-receiver", daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


class _EchoHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length", "0") or 0)
        if length:
            self.rfile.read(length)
        seen = {
            name: self.headers.get(name)
            for name in ("traceparent", "tracestate", "baggage", "host")
        }
        body = json.dumps({"path": self.path, "method": self.command, "headers": seen}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_PUT = _answer

    def log_message(self, format: str, *args: Any) -> None:
        return None


@contextmanager
def echo_upstream() -> Iterator[tuple[str, int]]:
    """An HTTP/1.1 upstream on 127.0.0.1:0 answering JSON with the trace headers it received."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _EchoHandler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, name="echo-upstream", daemon=True)
    thread.start()
    try:
        host, port = server.server_address[:2]
        yield str(host), int(port)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


class _FlakyKeepAliveHandler(threading.Thread):
    """One upstream connection: answers its first request, drops the connection on the second."""

    def __init__(self, conn: Any, seen: list[dict[str, str]]) -> None:
        super().__init__(daemon=True)
        self.conn = conn
        self.seen = seen

    def run(self) -> None:
        buf = b""
        served = 0
        with self.conn:
            while True:
                while b"\r\n\r\n" not in buf:
                    data = self.conn.recv(65536)
                    if not data:
                        return
                    buf += data
                head, _, buf = buf.partition(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                headers = {}
                for line in lines[1:]:
                    name, _, value = line.partition(":")
                    headers[name.strip().lower()] = value.strip()
                if served == 1:
                    return  # a pooled connection the upstream dropped: no answer at all
                served += 1
                self.seen.append(headers)
                body = json.dumps({"headers": headers}).encode()
                self.conn.sendall(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
                )


@contextmanager
def flaky_keep_alive_upstream() -> Iterator[tuple[str, list[dict[str, str]]]]:
    """``(address, headers seen per answered request)``: each connection answers one request
    and silently drops the next, so a gateway that reuses the pooled connection must retry."""
    import socket

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    listener.settimeout(0.2)
    seen: list[dict[str, str]] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            conn.settimeout(10)
            _FlakyKeepAliveHandler(conn, seen).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        host, port = listener.getsockname()[:2]
        yield f"{host}:{port}", seen
    finally:
        stop.set()
        thread.join(timeout=5)
        listener.close()


@contextmanager
def otlp_grpc_receiver() -> Iterator[tuple[str, OtlpReceiver]]:
    """A real OTLP/gRPC trace receiver on 127.0.0.1:0: ``(endpoint, receiver)``."""
    from concurrent.futures import ThreadPoolExecutor

    import grpc
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc

    receiver = OtlpReceiver()

    class Service(trace_service_pb2_grpc.TraceServiceServicer):
        def Export(self, request: Any, context: Any) -> ExportTraceServiceResponse:
            with receiver.lock:
                receiver.headers_seen.append(dict(context.invocation_metadata()))
            receiver.decode(request.SerializeToString())
            return ExportTraceServiceResponse()

    server = grpc.server(ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Service(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"http://127.0.0.1:{port}", receiver
    finally:
        server.stop(grace=None).wait(5)
