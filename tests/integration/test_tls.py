"""The TLS listener of the real gateway process, with real clients over 127.0.0.1.

Certificates are generated per module (``tests.support.certs``).  Python ``ssl`` checks
which certificate each SNI name gets and what ALPN chose; httpx and curl (when installed)
are the clients people use; the redirect, reload rotation and the expiry metric too.
"""

from __future__ import annotations

import json
import shutil
import socket
import ssl
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography import x509

from tests.support.certs import Issued, ThrowawayCa, make_ca
from tests.support.processes import Gateway, Upstream, gateway, upstreams


@dataclass
class Certs:
    ca: ThrowawayCa
    default: Issued
    shop: Issued
    wild: Issued


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    d = tmp_path_factory.mktemp("certs")
    ca = make_ca(d)
    return Certs(
        ca,
        ca.issue(d, "default", ["default.example.test"]),
        ca.issue(d, "shop", ["shop.example.test", "www.shop.example.test"]),
        ca.issue(d, "wild", ["*.apps.example.test"]),
    )


@pytest.fixture(scope="module")
def up() -> Iterator[Upstream]:
    with upstreams("u1") as started:
        yield started[0]


def tls_config(up: Upstream, certs: list[Issued], **tls: Any) -> dict[str, Any]:
    return {
        "reload": {"watch": False},
        "tls": {
            "listen": {"host": "127.0.0.1", "port": 0},
            "certificates": [c.config() for c in certs],
            **tls,
        },
        "services": {"svc": {"routes": [{"path": "/"}], "endpoints": [up.address]}},
    }


@pytest.fixture(scope="module")
def gw(up: Upstream, certs: Certs, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    path = tmp_path_factory.mktemp("gw") / "sluice.yaml"
    with gateway(tls_config(up, [certs.default, certs.shop, certs.wild]), path) as g:
        yield g


def tls_port(g: Gateway) -> int:
    assert g.tls_url is not None, g.output()
    return int(g.tls_url.rpartition(":")[2])


def client_context(ca: ThrowawayCa, alpn: list[str] | None = ("http/1.1",)) -> ssl.SSLContext:  # type: ignore[assignment]
    ctx = ssl.create_default_context(cafile=str(ca.ca_file))
    if alpn:
        ctx.set_alpn_protocols(list(alpn))
    return ctx


@dataclass
class Handshake:
    serial: int
    alpn: str | None
    version: str | None
    response: bytes


def request_over_tls(
    port: int,
    server_name: str | None,
    ctx: ssl.SSLContext,
    host_header: str | None = None,
    path: str = "/echo",
) -> Handshake:
    """Handshake with ``server_name`` as SNI, send one GET, read the whole response."""
    if server_name is None:
        ctx.check_hostname = False
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
        ctx.wrap_socket(raw, server_hostname=server_name) as s,
    ):
        der = s.getpeercert(binary_form=True)
        assert der is not None
        serial = x509.load_der_x509_certificate(der).serial_number
        host = host_header or server_name or "default.example.test"
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
        return Handshake(serial, s.selected_alpn_protocol(), s.version(), b"".join(chunks))


def echo_headers(response: bytes) -> dict[str, str]:
    head, _, body = response.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), response[:300]
    return {n.lower(): v for n, v in json.loads(body)["headers"]}


@pytest.mark.parametrize(
    ("name", "which"),
    [
        ("shop.example.test", "shop"),
        ("www.shop.example.test", "shop"),
        ("SHOP.example.test", "shop"),
        ("api.apps.example.test", "wild"),
        ("default.example.test", "default"),
        ("unknown.example.test", "default"),
        ("a.b.apps.example.test", "default"),  # a wildcard covers one label only
    ],
)
def test_sni_picks_the_certificate_by_its_sans(
    gw: Gateway, certs: Certs, name: str, which: str
) -> None:
    expected: Issued = getattr(certs, which)
    ctx = client_context(certs.ca)
    if which == "default" and name != "default.example.test":
        ctx.check_hostname = False  # the default certificate does not name this host
    got = request_over_tls(tls_port(gw), name, ctx)
    assert got.serial == expected.serial
    assert got.alpn == "http/1.1"
    headers = echo_headers(got.response)
    assert headers["x-forwarded-proto"] == "https"
    assert headers["host"] == name


def test_a_client_without_sni_or_alpn_gets_the_default_certificate_and_http11(
    gw: Gateway, certs: Certs
) -> None:
    got = request_over_tls(tls_port(gw), None, client_context(certs.ca, alpn=None))
    assert got.serial == certs.default.serial
    assert got.alpn is None
    assert echo_headers(got.response)["x-forwarded-proto"] == "https"


def test_alpn_offering_h2_and_http11_selects_http11(gw: Gateway, certs: Certs) -> None:
    got = request_over_tls(
        tls_port(gw), "shop.example.test", client_context(certs.ca, ["h2", "http/1.1"])
    )
    assert got.alpn == "http/1.1"
    echo_headers(got.response)


def test_min_version_is_enforced(up: Upstream, certs: Certs, tmp_path: Path) -> None:
    cfg = tls_config(up, [certs.shop], min_version="1.3")
    with gateway(cfg, tmp_path / "sluice.yaml") as g:
        ctx = client_context(certs.ca)
        ctx.maximum_version = ssl.TLSVersion.TLSv1_2
        with (
            socket.create_connection(("127.0.0.1", tls_port(g)), timeout=10) as raw,
            pytest.raises(ssl.SSLError),
        ):
            ctx.wrap_socket(raw, server_hostname="shop.example.test")
        ok = request_over_tls(tls_port(g), "shop.example.test", client_context(certs.ca))
        assert ok.version == "TLSv1.3"


def test_plain_listener_still_says_http(gw: Gateway) -> None:
    r = httpx.get(gw.url + "/echo", headers={"Host": "shop.example.test"}, timeout=10)
    assert r.status_code == 200
    assert dict((n.lower(), v) for n, v in r.json()["headers"])["x-forwarded-proto"] == "http"


def test_httpx_keep_alive_over_tls(gw: Gateway, certs: Certs) -> None:
    url = f"https://shop.example.test:{tls_port(gw)}/echo"
    transport = httpx.HTTPTransport(verify=client_context(certs.ca))
    with httpx.Client(transport=transport, timeout=10) as client:
        for i in range(20):
            # connect to 127.0.0.1 while SNI and Host name the site
            r = client.get(
                f"https://127.0.0.1:{tls_port(gw)}/echo?i={i}",
                headers={"Host": f"shop.example.test:{tls_port(gw)}"},
                extensions={"sni_hostname": "shop.example.test"},
            )
            assert r.status_code == 200
            assert r.json()["target"] == f"/echo?i={i}"
            assert r.http_version == "HTTP/1.1"
    assert url  # the URL a browser would use


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_curl_over_tls(gw: Gateway, certs: Certs) -> None:
    port = tls_port(gw)
    for name in ("shop.example.test", "api.apps.example.test"):
        out = subprocess.run(
            [
                "curl",
                "-sS",
                "--max-time",
                "10",
                "--resolve",
                f"{name}:{port}:127.0.0.1",
                "--cacert",
                str(certs.ca.ca_file),
                "-w",
                "\\n%{http_code} %{http_version} %{ssl_verify_result}",
                f"https://{name}:{port}/echo",
            ],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
        body, _, status = out.rpartition("\n")
        assert status == "200 1.1 0", out
        headers = {n.lower(): v for n, v in json.loads(body)["headers"]}
        assert headers["x-forwarded-proto"] == "https"


def test_expiry_metric_per_host(gw: Gateway) -> None:
    text = httpx.get(gw.admin_url + "/metrics", timeout=10).text
    lines = [ln for ln in text.splitlines() if ln.startswith("sluice_tls_certificate_expiry")]
    hosts = {ln.split('host="')[1].split('"')[0]: float(ln.rsplit(" ", 1)[1]) for ln in lines}
    assert set(hosts) == {
        "default.example.test",
        "shop.example.test",
        "www.shop.example.test",
        "*.apps.example.test",
    }
    assert all(80 * 86400 < v < 91 * 86400 for v in hosts.values())


def test_unknown_sni_rejected_when_configured(up: Upstream, certs: Certs, tmp_path: Path) -> None:
    cfg = tls_config(up, [certs.shop], unknown_sni="reject")
    with gateway(cfg, tmp_path / "sluice.yaml") as g:
        port = tls_port(g)
        ctx = client_context(certs.ca)
        ctx.check_hostname = False
        # The handshake fails (uvloop closes without flushing the unrecognized_name
        # alert, so the client sees an EOF during the handshake).
        with (
            socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
            pytest.raises(ssl.SSLError),
        ):
            ctx.wrap_socket(raw, server_hostname="other.example.test")
        ok = request_over_tls(port, "shop.example.test", client_context(certs.ca))
        assert ok.serial == certs.shop.serial


def test_redirect_http_sends_308_to_https(up: Upstream, certs: Certs, tmp_path: Path) -> None:
    cfg = tls_config(up, [certs.shop], redirect_http=True)
    with gateway(cfg, tmp_path / "sluice.yaml") as g:
        port = tls_port(g)
        with httpx.Client(timeout=10) as client:
            for method in ("GET", "POST", "HEAD"):
                r = client.request(
                    method,
                    g.url + "/cart?item=1",
                    headers={"Host": f"shop.example.test:{g.port}"},
                    content=b"x" * 10 if method == "POST" else None,
                )
                assert r.status_code == 308
                assert r.headers["location"] == f"https://shop.example.test:{port}/cart?item=1"
        ok = request_over_tls(port, "shop.example.test", client_context(certs.ca))
        assert echo_headers(ok.response)["x-forwarded-proto"] == "https"


def test_reload_rotates_certificates_without_touching_open_connections(
    up: Upstream, certs: Certs, tmp_path: Path
) -> None:
    d = tmp_path / "live"
    d.mkdir()
    first = certs.ca.issue(d, "site", ["shop.example.test"])
    cfg = tls_config(up, [first])
    with gateway(cfg, tmp_path / "sluice.yaml") as g:
        port = tls_port(g)
        ctx = client_context(certs.ca)
        with (
            socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
            ctx.wrap_socket(raw, server_hostname="shop.example.test") as held,
        ):
            der = held.getpeercert(binary_form=True)
            assert der is not None
            assert x509.load_der_x509_certificate(der).serial_number == first.serial
            # rotate the files in place (same paths, as cert-manager or certbot do)
            second = certs.ca.issue(d, "site", ["shop.example.test"])
            assert second.serial != first.serial
            r = httpx.post(g.admin_url + "/api/reload", timeout=10)
            assert r.status_code == 200, r.text
            assert r.json()["ok"] is True
            fresh = request_over_tls(port, "shop.example.test", client_context(certs.ca))
            assert fresh.serial == second.serial
            # the connection opened before the reload keeps working
            held.sendall(b"GET /echo HTTP/1.1\r\nHost: shop.example.test\r\n\r\n")
            assert held.recv(65536).startswith(b"HTTP/1.1 200")
            # a broken key on reload is refused and the certificates in force stay
            (d / "site.key").write_text("not a key\n")
            r = httpx.post(g.admin_url + "/api/reload", timeout=10)
            assert r.json()["ok"] is False
            assert any("site.key" in p for p in r.json()["errors"]), r.text
            again = request_over_tls(port, "shop.example.test", client_context(certs.ca))
            assert again.serial == second.serial


def test_upstream_tls_verifies_the_endpoint_with_the_ca_bundle_and_sni(
    certs: Certs, tmp_path: Path
) -> None:
    backend = certs.ca.issue(tmp_path, "backend", ["backend.internal.test"])
    https_up = Upstream("secure", tls=(str(backend.cert_file), str(backend.key_file)))
    try:

        def service(upstream_tls: dict[str, Any]) -> dict[str, Any]:
            return {"endpoints": [https_up.address], "upstream_tls": upstream_tls}

        cfg = {
            "reload": {"watch": False},
            "services": {
                "good": {
                    "routes": [{"path": "/good"}],
                    **service(
                        {
                            "enabled": True,
                            "ca_file": str(certs.ca.ca_file),
                            "server_name": "backend.internal.test",
                        }
                    ),
                },
                "wrongname": {
                    "routes": [{"path": "/wrongname"}],
                    **service({"enabled": True, "ca_file": str(certs.ca.ca_file)}),
                },
                "plain": {"routes": [{"path": "/plain"}], "endpoints": [https_up.address]},
            },
        }
        with gateway(cfg, tmp_path / "sluice.yaml") as g, httpx.Client(timeout=10) as client:
            for i in range(3):  # the pooled TLS connection is reused
                r = client.get(g.url + f"/good/echo?i={i}")
                assert r.status_code == 200, r.text
                assert r.json()["target"] == f"/good/echo?i={i}"
            # the certificate names backend.internal.test, not 127.0.0.1: refused
            assert client.get(g.url + "/wrongname/echo").status_code == 502
            # plain HTTP to a TLS endpoint fails too (the default is off)
            assert client.get(g.url + "/plain/echo").status_code == 502
    finally:
        https_up.stop()


def test_an_expired_certificate_is_served_with_a_warning_and_a_negative_metric(
    up: Upstream, certs: Certs, tmp_path: Path
) -> None:
    old = certs.ca.issue(tmp_path, "old", ["old.example.test"], expired=True)
    with gateway(tls_config(up, [old]), tmp_path / "sluice.yaml") as g:
        assert f"tls: {old.cert_file}: certificate expired" in g.output()
        text = httpx.get(g.admin_url + "/metrics", timeout=10).text
        line = next(ln for ln in text.splitlines() if 'host="old.example.test"' in ln)
        assert float(line.rsplit(" ", 1)[1]) < -86400


def test_the_server_span_says_https(up: Upstream, certs: Certs, tmp_path: Path) -> None:
    cfg = tls_config(up, [certs.shop])
    cfg["telemetry"] = {
        "traces": {
            "enabled": True,
            "sampler": {"type": "parentbased_ratio", "ratio": 1.0},
            "exporter": "none",
        }
    }
    trace_id = "5" * 32
    with gateway(cfg, tmp_path / "sluice.yaml") as g:
        port = tls_port(g)
        transport = httpx.HTTPTransport(verify=client_context(certs.ca))
        with httpx.Client(transport=transport, timeout=10) as client:
            r = client.get(
                f"https://127.0.0.1:{port}/echo",
                headers={
                    "Host": "shop.example.test",
                    "traceparent": f"00-{trace_id}-{'6' * 16}-01",
                },
                extensions={"sni_hostname": "shop.example.test"},
            )
            assert r.status_code == 200
        plain = httpx.get(g.url + "/echo", headers={"traceparent": f"00-{'7' * 32}-{'6' * 16}-01"})
        assert plain.status_code == 200
        schemes = {}
        for tid in (trace_id, "7" * 32):
            body = httpx.get(g.admin_url + "/api/traces", params={"trace_id": tid}, timeout=10)
            [trace] = body.json()["traces"]
            [server] = [s for s in trace["spans"] if s["kind"] == "SERVER"]
            schemes[tid] = server["attributes"]["url.scheme"]
        assert schemes == {trace_id: "https", "7" * 32: "http"}
