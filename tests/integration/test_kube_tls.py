"""Ingress ``spec.tls`` Secrets on the kubernetes platform: the real gateway process (one
process and two workers) against the fake API server, Secrets written with the official
client, real TLS handshakes (Python ``ssl``, SNI) checking which certificate is served while
a Secret is created, rotated and deleted, with a keep-alive connection open throughout."""

from __future__ import annotations

import json
import socket
import ssl
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography import x509
from kubernetes import client as k8s

from tests.support.certs import Issued, ThrowawayCa, make_ca
from tests.support.fake_kube import FakeKube
from tests.support.kube_objects import endpoint_slice, ingress, tls_secret
from tests.support.processes import Upstream, gateway, upstreams
from tests.support.procs import wait_until


@dataclass
class Certs:
    ca: ThrowawayCa
    default: Issued
    shop_v1: Issued
    shop_v2: Issued
    elsewhere: Issued


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    d = tmp_path_factory.mktemp("certs")
    ca = make_ca(d)
    return Certs(
        ca,
        ca.issue(d, "default", ["default.example.test"]),
        ca.issue(d, "shop-v1", ["shop.example.test"]),
        ca.issue(d, "shop-v2", ["shop.example.test"]),
        ca.issue(d, "elsewhere", ["shop.example.test"]),
    )


def secret_body(name: str, cert: Issued, namespace: str = "shop") -> dict[str, Any]:
    return tls_secret(name, cert.cert_file.read_bytes(), cert.key_file.read_bytes(), namespace)


def kubeconfig_for(fake: FakeKube, path: Path) -> str:
    path.write_text(
        f"""
apiVersion: v1
kind: Config
clusters: [{{name: fake, cluster: {{server: "{fake.url}"}}}}]
users: [{{name: sluice, user: {{token: test-token}}}}]
contexts: [{{name: fake, context: {{cluster: fake, user: sluice}}}}]
current-context: fake
"""
    )
    return str(path)


class KeepAlive:
    """One TLS connection sending requests one after another (HTTP/1.1 keep-alive)."""

    def __init__(self, port: int, server_name: str, ctx: ssl.SSLContext) -> None:
        raw = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.sock = ctx.wrap_socket(raw, server_hostname=server_name)
        self.host = server_name
        self.buffer = b""

    def serial(self) -> int:
        der = self.sock.getpeercert(binary_form=True)
        assert der is not None
        return x509.load_der_x509_certificate(der).serial_number

    def get(self) -> int:
        self.sock.sendall(f"GET /echo HTTP/1.1\r\nHost: {self.host}\r\n\r\n".encode())
        while b"\r\n\r\n" not in self.buffer:
            chunk = self.sock.recv(65536)
            assert chunk, "the gateway closed the keep-alive connection"
            self.buffer += chunk
        head, _, rest = self.buffer.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        length = next(
            int(v)
            for n, _, v in (h.partition(":") for h in lines[1:])
            if n.lower() == "content-length"
        )
        while len(rest) < length:
            chunk = self.sock.recv(65536)
            assert chunk, "the gateway closed the keep-alive connection"
            rest += chunk
        self.buffer = rest[length:]
        return int(lines[0].split()[1])

    def close(self) -> None:
        self.sock.close()


def served_serial(port: int, server_name: str, ca: ThrowawayCa) -> int:
    """The serial number of the certificate a new handshake with ``server_name`` gets."""
    ctx = ssl.create_default_context(cafile=str(ca.ca_file))
    ctx.check_hostname = False  # the default certificate names another host
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
        ctx.wrap_socket(raw, server_hostname=server_name) as s,
    ):
        der = s.getpeercert(binary_form=True)
        assert der is not None
        return x509.load_der_x509_certificate(der).serial_number


def all_served(port: int, name: str, ca: ThrowawayCa, serial: int, times: int) -> bool:
    """``times`` new handshakes in a row get ``serial`` (with workers, several of them)."""
    return all(served_serial(port, name, ca) == serial for _ in range(times))


@pytest.fixture
def fake() -> Iterator[FakeKube]:
    with FakeKube() as f:
        yield f


@pytest.fixture
def web() -> Iterator[Upstream]:
    with upstreams("web") as started:
        yield started[0]


@pytest.mark.parametrize("workers", [1, 2])
def test_ingress_secret_is_served_rotated_and_removed(
    fake: FakeKube, web: Upstream, certs: Certs, tmp_path: Path, workers: int
) -> None:
    api = k8s.ApiClient(k8s.Configuration(host=fake.url))
    core, networking = k8s.CoreV1Api(api), k8s.NetworkingV1Api(api)
    port_of_web = int(web.address.rpartition(":")[2])
    fake.put(
        endpoint_slice("web-1", "web", [("localhost", {"ready": True})], [("http", port_of_web)])
    )
    networking.create_namespaced_ingress(
        "shop",
        ingress(
            "shop",
            [
                ("shop.example.test", "/", "Prefix", "web", "http"),
                ("api.example.test", "/", "Prefix", "web", "http"),
                ("www.example.test", "/", "Prefix", "web", "http"),
            ],
            tls=[(["shop.example.test"], "shop-tls"), (["api.example.test"], "opaque")],
        ),
    )
    core.create_namespaced_secret("shop", secret_body("shop-tls", certs.shop_v1))
    core.create_namespaced_secret(
        "shop",
        {"metadata": {"name": "opaque"}, "type": "Opaque", "stringData": {"tls.crt": "x"}},
    )
    # a Secret of the same name in another namespace is never read for this Ingress
    core.create_namespaced_secret("other", secret_body("shop-tls", certs.elsewhere, "other"))
    config = {
        "workers": workers,
        "platform": "kubernetes",
        "kubernetes": {
            "kubeconfig": kubeconfig_for(fake, tmp_path / "kubeconfig"),
            "status_addresses": ["127.0.0.1"],
        },
        "tls": {
            "listen": {"host": "127.0.0.1", "port": 0},
            "certificates": [certs.default.config()],
        },
    }
    shop, ca = "shop.example.test", certs.ca
    with gateway(config, tmp_path / "sluice.yaml") as gw:
        assert gw.tls_url is not None
        port = int(gw.tls_url.rpartition(":")[2])
        assert wait_until(lambda: all_served(port, shop, ca, certs.shop_v1.serial, 4)), gw.output()
        # the client verifies the hostname: the Secret's certificate is the right one
        conn = KeepAlive(port, shop, ssl.create_default_context(cafile=str(ca.ca_file)))
        try:
            assert conn.serial() == certs.shop_v1.serial
            assert conn.get() == 200

            # rotation: new handshakes get the new certificate, the open connection goes on
            core.replace_namespaced_secret(
                "shop-tls", "shop", secret_body("shop-tls", certs.shop_v2)
            )
            assert wait_until(lambda: all_served(port, shop, ca, certs.shop_v2.serial, 4))
            assert conn.get() == 200
            assert conn.serial() == certs.shop_v1.serial

            # the API server's rules: the type of a Secret cannot change
            with pytest.raises(k8s.ApiException) as refused:
                core.patch_namespaced_secret("shop-tls", "shop", {"type": "Opaque"})
            assert refused.value.status == 422
            assert "field is immutable" in json.loads(refused.value.body)["message"]

            # removal: the default certificate, reported
            core.delete_namespaced_secret("shop-tls", "shop")
            assert wait_until(lambda: all_served(port, shop, ca, certs.default.serial, 4))
            assert conn.get() == 200
        finally:
            conn.close()
        assert served_serial(port, "api.example.test", ca) == certs.default.serial

        def tls_report() -> dict[str, Any]:
            r = httpx.get(f"{gw.admin_url}/api/decisions", timeout=10)
            return dict(r.json().get("tls") or {})

        assert wait_until(lambda: "not found" in tls_report().get("hosts", {}).get(shop, ""))
        report = tls_report()
        assert report["hosts"][shop] == "default: secret shop/shop-tls not found"
        assert report["hosts"]["api.example.test"] == (
            "default: secret shop/opaque is of type Opaque, not kubernetes.io/tls"
        )
        assert report["hosts"]["www.example.test"] == "default: no spec.tls entry names it"

        def warnings() -> list[str]:
            return sorted(
                e["message"]
                for e in fake.list("events")
                if e["reason"] == "TLSCertificate" and e["involvedObject"]["name"] == "shop"
            )

        # one Event per problem, created one after another by the leader: wait for all three
        expected = (
            "shop/shop-tls not found",
            "is of type Opaque",
            "www.example.test: no spec.tls entry names it",
        )
        assert wait_until(lambda: all(any(e in m for m in warnings()) for e in expected)), (
            warnings()
        )
        assert "ingress shop/shop: host shop.example.test: secret shop/shop-tls not found" in (
            gw.output()
        )

    # only TLS Secrets were listed and watched, and none outside the watched scope was read
    secret_calls = [c for c in fake.requests if c.resource == "secrets"]
    assert {c.verb for c in secret_calls} >= {"list", "watch", "get"}
    assert all(c.namespace in (None, "shop") for c in secret_calls if c.verb == "get")
