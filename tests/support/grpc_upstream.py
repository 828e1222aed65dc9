"""A real gRPC server (``grpcio``) for tests, run as its own process, without generated code.

    python -m tests.support.grpc_upstream --name a [--port 0] [--tls CERT_FILE KEY_FILE]

prints ``listening HOST:PORT`` once serving (h2c; with ``--tls``, h2 over TLS).  Methods of service ``test.Echo`` take and
return raw bytes:

* ``Unary`` — the request, prefixed with ``<name>:``; metadata ``sleep-ms`` delays it;
  a request ``fail`` answers ``INVALID_ARGUMENT`` with a message and a trailer
* ``Stream`` — server streaming: the request ``n`` parts (``n`` = the request as an int)
* ``Chat`` — bidi: each request echoed upper-cased as it arrives

plus the standard ``grpc.health.v1.Health`` service (``test.Echo`` SERVING).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterator
from concurrent import futures

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc


def serve(name: str, host: str, port: int, tls: tuple[str, str] | None = None) -> None:
    def unary(request: bytes, context: grpc.ServicerContext) -> bytes:
        delay_ms = dict(context.invocation_metadata()).get("sleep-ms")
        if delay_ms:
            time.sleep(int(delay_ms) / 1000)
        if request == b"fail":
            context.set_trailing_metadata((("why", "asked-to"),))
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "you asked for it")
        return name.encode() + b":" + request

    def stream(request: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
        for i in range(int(request)):
            yield b"part-%d" % i

    def chat(requests: Iterator[bytes], context: grpc.ServicerContext) -> Iterator[bytes]:
        for request in requests:
            yield request.upper()

    handlers = grpc.method_handlers_generic_handler(
        "test.Echo",
        {
            "Unary": grpc.unary_unary_rpc_method_handler(unary),
            "Stream": grpc.unary_stream_rpc_method_handler(stream),
            "Chat": grpc.stream_stream_rpc_method_handler(chat),
        },
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
    server.add_generic_rpc_handlers((handlers,))
    checker = health.HealthServicer()
    checker.set("test.Echo", health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(checker, server)
    if tls is None:
        bound = server.add_insecure_port(f"{host}:{port}")
    else:
        with open(tls[0], "rb") as cert, open(tls[1], "rb") as key:
            credentials = grpc.ssl_server_credentials([(key.read(), cert.read())])
        bound = server.add_secure_port(f"{host}:{port}", credentials)
    server.start()
    print(f"listening {host}:{bound}", flush=True)
    server.wait_for_termination()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--name", default="g")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--tls", nargs=2, metavar=("CERT_FILE", "KEY_FILE"))
    args = parser.parse_args()
    serve(args.name, args.host, args.port, tuple(args.tls) if args.tls else None)


if __name__ == "__main__":
    main()
