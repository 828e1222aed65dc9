"""The data plane infers HTTP/1.1 from llhttp's keep-alive verdict instead of asking for the
version (``ClientConnection.on_headers_complete``): keep-alive without a keep-alive token in
the header set must mean HTTP/1.1, whatever the request says."""

from __future__ import annotations

import httptools
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.dataplane.headers import HeadCache

VERSIONS = [b"1.1", b"1.0", b"0.9", b"2.0"]
CONNECTION_NAMES = [b"Connection", b"connection", b"CONNECTION", b"Proxy-Connection", b"X-Other"]
TOKENS = [b"keep-alive", b"Keep-Alive", b"close", b"upgrade", b"x-hop", b"keep-alive-x", b""]


class Head:
    def __init__(self) -> None:
        self.headers: list[tuple[bytes, bytes]] = []
        self.verdict: tuple[bool, str] | None = None
        self.parser: httptools.HttpRequestParser | None = None

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        assert self.parser is not None
        self.verdict = (self.parser.should_keep_alive(), self.parser.get_http_version())


def parse(version: bytes, fields: list[tuple[bytes, bytes]]) -> Head:
    head = Head()
    head.parser = httptools.HttpRequestParser(head)
    lines = [b"GET / HTTP/" + version, b"Host: h"] + [n + b": " + v for n, v in fields]
    head.parser.feed_data(b"\r\n".join(lines) + b"\r\n\r\n")
    return head


@settings(max_examples=400, deadline=None)
@given(
    version=st.sampled_from(VERSIONS),
    fields=st.lists(
        st.tuples(
            st.sampled_from(CONNECTION_NAMES),
            st.lists(st.sampled_from(TOKENS), min_size=1, max_size=3).map(b", ".join),
        ),
        max_size=3,
    ),
)
def test_keep_alive_without_a_keep_alive_token_means_http11(
    version: bytes, fields: list[tuple[bytes, bytes]]
) -> None:
    head = parse(version, fields)
    assert head.verdict is not None
    keep_alive, real_version = head.verdict
    checked = HeadCache().fields(head.headers, trusted=False)
    if keep_alive and not checked.keep_alive_token:
        assert real_version == "1.1"
