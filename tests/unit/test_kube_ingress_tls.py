"""Ingress spec.tls -> certificates per host (pure): which Secret serves each host, which hosts
fall back to the default certificate, and why."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.platforms.kubernetes.ingress_tls import Checked, check_secret, resolve
from gateway.platforms.kubernetes.model import (
    Ingress,
    Secret,
    ingress_from_json,
    secret_from_json,
)
from tests.support.certs import Issued, ThrowawayCa, make_ca
from tests.support.kube_objects import ingress, tls_secret


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> tuple[ThrowawayCa, Path]:
    d = tmp_path_factory.mktemp("certs")
    return make_ca(d), d


def secret(issued: Issued, name: str = "shop-tls", namespace: str = "shop") -> Secret:
    return secret_from_json(
        tls_secret(name, issued.cert_file.read_bytes(), issued.key_file.read_bytes(), namespace)
        | {"metadata": {"name": name, "namespace": namespace, "resourceVersion": "7"}}
    )


def ing(
    name: str,
    hosts: list[str],
    tls: list[tuple[list[str], str | None]] | None,
    created: str = "2026-01-01T00:00:00Z",
    namespace: str = "shop",
    ingress_class: str | None = "sluice",
) -> Ingress:
    obj = ingress(
        name,
        [(h, "/", "Prefix", "web", 80) for h in hosts],
        namespace=namespace,
        ingress_class=ingress_class,
        tls=tls,
    )
    obj["metadata"]["creationTimestamp"] = created
    return ingress_from_json(obj)


def table(*secrets: Secret) -> tuple[dict[str, Secret], dict[str, Checked]]:
    by_key = {s.meta.key: s for s in secrets}
    return by_key, {k: check_secret(s) for k, s in by_key.items()}


def test_a_secret_serves_the_hosts_its_entry_names(ca: tuple[ThrowawayCa, Path]) -> None:
    authority, d = ca
    shop = secret(authority.issue(d, "shop", ["shop.test", "*.shop.test"]))
    secrets, checked = table(shop)
    out = resolve(
        [ing("web", ["shop.test", "eu.shop.test"], [(["shop.test", "eu.shop.test"], "shop-tls")])],
        "sluice",
        secrets,
        checked,
    )
    assert [(c.source, c.hosts) for c in out.certificates] == [
        ("secret shop/shop-tls", ("shop.test", "eu.shop.test"))
    ]
    assert out.certificates[0].cert_pem == shop.data["tls.crt"]
    assert out.hosts == {
        "eu.shop.test": "secret shop/shop-tls",
        "shop.test": "secret shop/shop-tls",
    }
    assert out.problems == ()


def test_an_entry_without_hosts_serves_the_rule_hosts_its_certificate_names(
    ca: tuple[ThrowawayCa, Path],
) -> None:
    authority, d = ca
    secrets, checked = table(secret(authority.issue(d, "nohosts", ["shop.test"])))
    out = resolve([ing("web", ["shop.test"], [([], "shop-tls")])], "sluice", secrets, checked)
    assert out.hosts == {"shop.test": "secret shop/shop-tls"}
    assert out.problems == ()


@pytest.mark.parametrize(
    ("what", "expected"),
    [
        ("missing", "secret shop/shop-tls not found"),
        ("opaque", "secret shop/shop-tls is of type Opaque, not kubernetes.io/tls"),
        ("bad-pem", "secret shop/shop-tls: not a PEM certificate"),
        ("mismatch", "secret shop/shop-tls: the key does not match the certificate"),
        ("no-key", "secret shop/shop-tls: has no tls.key"),
        ("other-host", "the certificate in secret shop/shop-tls does not name it"),
    ],
)
def test_a_host_whose_secret_cannot_serve_falls_back_and_is_reported(
    ca: tuple[ThrowawayCa, Path], what: str, expected: str
) -> None:
    authority, d = ca
    good = authority.issue(d, "good", ["shop.test"])
    other = authority.issue(d, "other", ["other.test"])
    absent: dict[str, str] = {}
    found: list[Secret] = []
    if what == "missing":
        absent["shop/shop-tls"] = "not found"
    elif what == "opaque":
        absent["shop/shop-tls"] = "is of type Opaque, not kubernetes.io/tls"
    else:
        s = secret(good if what != "other-host" else other)
        data = dict(s.data)
        if what == "bad-pem":
            data["tls.crt"] = b"-----BEGIN CERTIFICATE-----\nnot base64 at all\n"
        elif what == "mismatch":
            data["tls.key"] = other.key_file.read_bytes()
        elif what == "no-key":
            del data["tls.key"]
        found.append(Secret(s.meta, s.type, data))
    secrets, checked = table(*found)
    out = resolve(
        [ing("web", ["shop.test"], [(["shop.test"], "shop-tls")])],
        "sluice",
        secrets,
        checked,
        absent,
    )
    assert out.certificates == ()
    assert out.hosts["shop.test"].startswith(f"default: {expected}")
    assert len(out.problems) == 1
    assert out.problems[0].ingress == "shop/web"
    assert out.problems[0].reason == "TLSCertificate"
    assert out.problems[0].message.startswith(f"host shop.test: {expected}")
    assert out.problems[0].message.endswith("served with the default certificate")


def test_a_secret_of_another_namespace_is_never_used(ca: tuple[ThrowawayCa, Path]) -> None:
    authority, d = ca
    elsewhere = secret(authority.issue(d, "elsewhere", ["shop.test"]), namespace="other")
    secrets, checked = table(elsewhere)
    out = resolve(
        [
            ing("web", ["shop.test"], [(["shop.test"], "shop-tls")]),
            ing("api", ["api.test"], [(["api.test"], "other/shop-tls")]),
        ],
        "sluice",
        secrets,
        checked,
    )
    assert out.certificates == ()
    assert out.hosts["shop.test"] == "default: secret shop/shop-tls not found"
    assert "only Secrets of the Ingress's namespace (shop) are read" in out.hosts["api.test"]


def test_hosts_without_an_entry(ca: tuple[ThrowawayCa, Path]) -> None:
    authority, d = ca
    secrets, checked = table(secret(authority.issue(d, "one", ["shop.test"])))
    out = resolve(
        [
            ing("web", ["shop.test", "www.shop.test"], [(["shop.test"], "shop-tls")]),
            ing("plain", ["plain.test"], None),  # plain HTTP: not a problem
            ing("nosecret", ["nosecret.test"], [(["nosecret.test"], None)]),
        ],
        "sluice",
        secrets,
        checked,
    )
    assert out.hosts == {
        "nosecret.test": "default: spec.tls[0] names no secretName",
        "plain.test": "default: the Ingress has no spec.tls",
        "shop.test": "secret shop/shop-tls",
        "www.shop.test": "default: no spec.tls entry names it",
    }
    assert [p.message for p in out.problems] == [
        "host www.shop.test: no spec.tls entry names it; served with the default certificate"
    ]


def test_the_older_ingress_wins_a_host_and_other_classes_are_ignored(
    ca: tuple[ThrowawayCa, Path],
) -> None:
    authority, d = ca
    a = secret(authority.issue(d, "a", ["shop.test"]), name="a-tls")
    b = secret(authority.issue(d, "b", ["shop.test"]), name="b-tls")
    secrets, checked = table(a, b)
    out = resolve(
        [
            ing("newer", ["shop.test"], [(["shop.test"], "b-tls")], "2026-02-01T00:00:00Z"),
            ing("older", ["shop.test"], [(["shop.test"], "a-tls")], "2026-01-01T00:00:00Z"),
            ing("theirs", ["x.test"], [(["x.test"], "b-tls")], ingress_class="nginx"),
        ],
        "sluice",
        secrets,
        checked,
    )
    assert out.hosts == {"shop.test": "secret shop/a-tls"}
    assert [c.source for c in out.certificates] == ["secret shop/a-tls"]
    assert [(p.ingress, p.message) for p in out.problems] == [
        (
            "shop/newer",
            "host shop.test: served with secret shop/a-tls (an older Ingress's); secret "
            "shop/b-tls is not used for it",
        )
    ]


def test_secret_data_is_decoded_from_base64() -> None:
    s = secret_from_json(
        {
            "metadata": {"name": "x", "namespace": "shop"},
            "type": "kubernetes.io/tls",
            "data": {"tls.crt": "aGVsbG8=", "tls.key": "not base64!"},
        }
    )
    assert s.data == {"tls.crt": b"hello"}
    assert check_secret(s) == Checked(error="has no tls.key")
