"""Loading certificates (errors name the file), SNI lookup, check warnings, config paths.

Certificates are generated into tmp_path (``tests.support.certs``); no sockets.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from gateway.dataplane.tls import (
    CertificateSet,
    TlsError,
    check_tls,
    load_certificate,
    load_certificates,
)
from gateway.settings import ConfigError, TlsCertificateConfig, load_settings, parse_settings
from tests.support.certs import ThrowawayCa, make_ca


@pytest.fixture
def ca(tmp_path: Path) -> ThrowawayCa:
    return make_ca(tmp_path)


def cfg(cert: Path, key: Path) -> TlsCertificateConfig:
    return TlsCertificateConfig(cert_file=str(cert), key_file=str(key))


def test_hosts_come_from_the_sans(ca: ThrowawayCa, tmp_path: Path) -> None:
    issued = ca.issue(tmp_path, "shop", ["Shop.Example.test", "*.cdn.example.test"])
    cert = load_certificate(cfg(issued.cert_file, issued.key_file))
    assert cert.hosts == ("shop.example.test", "*.cdn.example.test")
    assert cert.expires_in_s(time.time()) > 80 * 86400


def test_without_sans_the_common_name_is_the_host(ca: ThrowawayCa, tmp_path: Path) -> None:
    issued = ca.issue(tmp_path, "old", [], common_name="legacy.example.test")
    assert load_certificate(cfg(issued.cert_file, issued.key_file)).hosts == (
        "legacy.example.test",
    )


def test_a_missing_key_names_the_file(ca: ThrowawayCa, tmp_path: Path) -> None:
    issued = ca.issue(tmp_path, "shop", ["shop.example.test"])
    missing = tmp_path / "nope.key"
    with pytest.raises(TlsError, match=rf"^{missing}: cannot read the key: No such file"):
        load_certificate(cfg(issued.cert_file, missing))


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_an_unreadable_certificate_names_the_file(ca: ThrowawayCa, tmp_path: Path) -> None:
    issued = ca.issue(tmp_path, "shop", ["shop.example.test"])
    issued.cert_file.chmod(0)
    with pytest.raises(TlsError, match=rf"^{issued.cert_file}: cannot read the certificate"):
        load_certificate(cfg(issued.cert_file, issued.key_file))


def test_a_mismatched_key_names_both_files(ca: ThrowawayCa, tmp_path: Path) -> None:
    a = ca.issue(tmp_path, "a", ["a.example.test"])
    b = ca.issue(tmp_path, "b", ["b.example.test"])
    with pytest.raises(TlsError) as e:
        load_certificate(cfg(a.cert_file, b.key_file))
    assert str(e.value) == f"{b.key_file}: the key does not match the certificate {a.cert_file}"


def test_garbage_files_are_named(ca: ThrowawayCa, tmp_path: Path) -> None:
    issued = ca.issue(tmp_path, "shop", ["shop.example.test"])
    junk = tmp_path / "junk.pem"
    junk.write_text("hello\n")
    with pytest.raises(TlsError, match=rf"^{junk}: not a PEM certificate"):
        load_certificate(cfg(junk, issued.key_file))
    with pytest.raises(TlsError, match=rf"^{junk}: not a usable PEM private key"):
        load_certificate(cfg(issued.cert_file, junk))


def test_lookup_exact_then_one_label_wildcard_first_listed_wins(
    ca: ThrowawayCa, tmp_path: Path
) -> None:
    default = load_certificate(cfg(*_files(ca.issue(tmp_path, "d", ["d.example.test"]))))
    wild = load_certificate(cfg(*_files(ca.issue(tmp_path, "w", ["*.example.test"]))))
    exact = load_certificate(cfg(*_files(ca.issue(tmp_path, "e", ["api.example.test"]))))
    again = load_certificate(cfg(*_files(ca.issue(tmp_path, "x", ["api.example.test"]))))
    certs = CertificateSet([default, wild, exact, again])
    assert certs.default is default
    assert certs.lookup("api.example.test") is exact  # exact beats the wildcard; first wins
    assert certs.lookup("API.example.test.") is exact
    assert certs.lookup("www.example.test") is wild
    assert certs.lookup("a.b.example.test") is None
    assert certs.lookup("example.test") is None
    assert certs.lookup("d.example.test") is default
    assert not certs.reject_unknown


def _files(issued: object) -> tuple[Path, Path]:
    return issued.cert_file, issued.key_file  # type: ignore[attr-defined]


def test_load_certificates_reports_every_bad_file(ca: ThrowawayCa, tmp_path: Path) -> None:
    good = ca.issue(tmp_path, "good", ["good.example.test"])
    settings = parse_settings(
        {
            "tls": {
                "certificates": [
                    good.config(),
                    {"cert_file": str(tmp_path / "a.pem"), "key_file": str(good.key_file)},
                    {"cert_file": str(good.cert_file), "key_file": str(tmp_path / "b.key")},
                ],
                "unknown_sni": "reject",
            }
        }
    )
    assert settings.tls is not None
    with pytest.raises(TlsError) as e:
        load_certificates(settings.tls)
    lines = str(e.value).splitlines()
    assert [line.split(":")[0] for line in lines] == [
        str(tmp_path / "a.pem"),
        str(tmp_path / "b.key"),
    ]
    only_good = settings.tls.model_copy(update={"certificates": settings.tls.certificates[:1]})
    assert load_certificates(only_good).reject_unknown


def test_check_tls_problems_name_the_key_path_and_expiry_is_a_warning(
    ca: ThrowawayCa, tmp_path: Path
) -> None:
    expired = ca.issue(tmp_path, "old", ["old.example.test"], expired=True)
    settings = parse_settings(
        {
            "tls": {
                "certificates": [
                    expired.config(),
                    {"cert_file": str(tmp_path / "gone.pem"), "key_file": str(expired.key_file)},
                ]
            },
            "services": {
                "api": {"upstream_tls": {"enabled": True, "ca_file": str(tmp_path / "ca-gone.pem")}}
            },
        }
    )
    problems, warnings = check_tls(settings, "sluice.yaml", time.time())
    assert problems == [
        f"sluice.yaml: services.api.upstream_tls.ca_file: {tmp_path / 'ca-gone.pem'}: "
        "cannot read the CA bundle: No such file or directory",
        f"sluice.yaml: tls.certificates[1]: {tmp_path / 'gone.pem'}: "
        "cannot read the certificate: No such file or directory",
    ]
    assert len(warnings) == 1
    assert warnings[0].startswith(f"{expired.cert_file}: certificate expired 2.0 days ago")


def test_relative_files_are_taken_from_the_config_files_directory(tmp_path: Path) -> None:
    path = tmp_path / "conf" / "sluice.yaml"
    path.parent.mkdir()
    path.write_text(
        "tls:\n  certificates:\n    - {cert_file: certs/a.pem, key_file: /abs/a.key}\n"
        "services:\n  api:\n    upstream_tls: {enabled: true, ca_file: ca.pem}\n"
    )
    settings = load_settings(path)
    assert settings.tls is not None
    assert settings.tls.certificates[0].cert_file == str(tmp_path / "conf" / "certs" / "a.pem")
    assert settings.tls.certificates[0].key_file == "/abs/a.key"
    assert settings.services["api"].upstream_tls.ca_file == str(tmp_path / "conf" / "ca.pem")


def test_tls_config_errors_name_the_key() -> None:
    with pytest.raises(ConfigError) as e:
        parse_settings({"tls": {"certificates": [], "min_version": "1.1"}}, "s.yaml")
    assert any(p.startswith("s.yaml: tls.certificates:") for p in e.value.problems), (
        e.value.problems
    )
    assert any(p.startswith("s.yaml: tls.min_version:") for p in e.value.problems), e.value.problems
