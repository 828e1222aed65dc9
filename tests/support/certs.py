"""Test certificates, generated per test run with ``cryptography`` (no committed keys).

:func:`make_ca` returns a throwaway CA; :meth:`ThrowawayCa.issue` writes a leaf certificate and
its key (PEM) for the given DNS names, optionally already expired.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


@dataclass
class Issued:
    cert_file: Path
    key_file: Path
    serial: int

    def config(self) -> dict[str, str]:
        return {"cert_file": str(self.cert_file), "key_file": str(self.key_file)}


@dataclass
class ThrowawayCa:
    key: ec.EllipticCurvePrivateKey
    cert: x509.Certificate
    ca_file: Path

    def issue(
        self,
        directory: Path,
        stem: str,
        names: list[str],
        *,
        expired: bool = False,
        common_name: str | None = None,
    ) -> Issued:
        now = datetime.datetime.now(datetime.UTC)
        not_before, not_after = (
            (now - datetime.timedelta(days=30), now - datetime.timedelta(days=2))
            if expired
            else (now - datetime.timedelta(days=1), now + datetime.timedelta(days=90))
        )
        key = _key()
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name or stem)]))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(not_before)
            .not_valid_after(not_after)
        )
        if names:
            builder = builder.add_extension(
                x509.SubjectAlternativeName([x509.DNSName(n) for n in names]), critical=False
            )
        cert = builder.sign(self.key, hashes.SHA256())
        cert_file = directory / f"{stem}.pem"
        key_file = directory / f"{stem}.key"
        cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        key_file.write_bytes(_pem_key(key))
        return Issued(cert_file, key_file, cert.serial_number)


def make_ca(directory: Path, name: str = "Sluice Test CA") -> ThrowawayCa:
    key = _key()
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=365))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    ca_file = directory / "ca.pem"
    ca_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return ThrowawayCa(key, cert, ca_file)
