"""The TLS contexts' SSL objects call OpenSSL's read/write/pending directly (no Python wrapper
frame per call), and behave as ``ssl.SSLObject`` does: a handshake and a request/response
over memory BIOs, as the SSL transport drives them."""

from __future__ import annotations

import contextlib
import ssl
from pathlib import Path

from gateway.dataplane.tls import DirectSSLObject, server_context
from tests.support.certs import make_ca


def _pump(src: ssl.MemoryBIO, dst: ssl.MemoryBIO) -> None:
    data = src.read()
    if data:
        dst.write(data)


def test_a_server_context_wraps_into_direct_ssl_objects(tmp_path: Path) -> None:
    ca = make_ca(tmp_path)
    issued = ca.issue(tmp_path, "site", ["site.test"])
    server = server_context("1.2", ["http/1.1"])
    server.load_cert_chain(issued.cert_file, issued.key_file)
    client = ssl.create_default_context(cafile=str(ca.ca_file))
    s_in, s_out, c_in, c_out = (ssl.MemoryBIO() for _ in range(4))
    s = server.wrap_bio(s_in, s_out, server_side=True)
    c = client.wrap_bio(c_in, c_out, server_hostname="site.test")
    assert isinstance(s, DirectSSLObject)
    assert type(s.read).__name__ == "builtin_function_or_method"  # OpenSSL's, bound
    for _ in range(5):
        for side in (c, s):
            with contextlib.suppress(ssl.SSLWantReadError):
                side.do_handshake()
        _pump(c_out, s_in)
        _pump(s_out, c_in)
    assert s.selected_alpn_protocol() is None and s.version() in ("TLSv1.2", "TLSv1.3")
    request = b"GET / HTTP/1.1\r\nHost: site.test\r\n\r\n"
    c.write(request)
    _pump(c_out, s_in)
    assert s.pending() == 0
    assert s.read(65536) == request
    buffer = bytearray(16)
    c.write(b"0123456789")
    _pump(c_out, s_in)
    assert s.read(16, buffer) == 10 and bytes(buffer[:10]) == b"0123456789"
    assert s.write(b"HTTP/1.1 200 OK\r\n\r\n") == 19
    _pump(s_out, c_in)
    assert c.read(1024) == b"HTTP/1.1 200 OK\r\n\r\n"
