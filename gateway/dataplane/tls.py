"""TLS termination: certificates, SNI, ALPN and the protocol that serves a TLS connection.

* :func:`load_certificate` reads one certificate/key pair into its own ``ssl.SSLContext``
  and learns the hosts it serves from its subjectAltName DNS names (the subject's common
  name when it has none).  Every problem is a :class:`TlsError` naming the file.
* :func:`load_pem_certificate` does the same for PEM held in memory (a platform's, e.g. a
  Kubernetes TLS Secret), with the hosts it is to serve given.
* :class:`CertificateSet` holds the loaded certificates of one config generation and picks
  one for an SNI name: an exact name first, then ``*.parent`` for one more label.
* :class:`TlsListener` owns the listener's front context.  Its SNI callback switches the
  handshake to the chosen certificate's context, reading the *current* set, so a reload
  (:meth:`TlsListener.update`) changes what new handshakes get and leaves established
  connections alone.  A name no certificate covers gets the default (first) certificate,
  or the handshake fails with ``unrecognized_name`` when ``unknown_sni: reject``.
* ALPN: the listener advertises the names of a protocol mapping (``{"http/1.1": factory}``,
  most preferred first) and :class:`AlpnDispatch` hands each connection, after its
  handshake, to the factory of the protocol the client chose (``http/1.1`` when it chose
  none).  Adding a protocol (``h2``) is one more entry in ``DataPlane.tls_protocols``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import ssl
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from cryptography import x509
from cryptography.x509.oid import ExtensionOID, NameOID

from gateway.settings import Settings, TlsCertificateConfig, TlsConfig, UpstreamTlsConfig

log = logging.getLogger(__name__)

ProtocolFactory = Callable[[], asyncio.Protocol]
"""Makes the protocol object that serves one TLS connection once its handshake is done."""
FALLBACK_PROTOCOL = "http/1.1"
"""What serves a client that negotiated no ALPN protocol."""

_VERSIONS = {"1.2": ssl.TLSVersion.TLSv1_2, "1.3": ssl.TLSVersion.TLSv1_3}


class TlsError(Exception):
    """A certificate or key cannot be used; the message starts with the file's path."""


@dataclass(frozen=True, slots=True)
class Certificate:
    """One loaded certificate: its files, the hosts it serves, its expiry and context."""

    cert_file: str
    key_file: str
    hosts: tuple[str, ...]
    not_after_s: float
    """Expiry, in seconds since the epoch (``notAfter``)."""
    context: ssl.SSLContext = field(compare=False, repr=False)

    def expires_in_s(self, now_s: float) -> float:
        """Seconds left before expiry at wall-clock ``now_s`` (negative once expired)."""
        return self.not_after_s - now_s


class DirectSSLObject(ssl.SSLObject):
    """``ssl.SSLObject`` whose ``read``, ``write`` and ``pending`` are the C object's own
    methods: the SSL transport binds them once per connection and then calls them several
    times per request, each call through ``ssl.SSLObject``'s Python wrapper otherwise (a
    Python frame that only forwards its arguments)."""

    @property
    def read(self) -> Callable[..., Any]:
        return cast(Callable[..., Any], self._sslobj.read)  # type: ignore[attr-defined]

    @property
    def write(self) -> Callable[..., Any]:
        return cast(Callable[..., Any], self._sslobj.write)  # type: ignore[attr-defined]

    @property
    def pending(self) -> Callable[[], int]:
        return cast(Callable[[], int], self._sslobj.pending)  # type: ignore[attr-defined]


def server_context(min_version: str, alpn: Iterable[str]) -> ssl.SSLContext:
    """A server context with the listener's version floor and ALPN list (no certificate)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.sslobject_class = DirectSSLObject
    context.minimum_version = _VERSIONS[min_version]
    context.set_alpn_protocols(list(alpn))
    return context


def _read(path: str, what: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise TlsError(f"{path}: cannot read the {what}: {e.strerror or e}") from None


def _hosts(cert: x509.Certificate) -> tuple[str, ...]:
    try:
        san = cert.extensions.get_extension_for_oid(ExtensionOID.SUBJECT_ALTERNATIVE_NAME)
    except x509.ExtensionNotFound:
        names = [str(a.value) for a in cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)]
    else:
        names = san.value.get_values_for_type(x509.DNSName)  # type: ignore[attr-defined]
    return tuple(dict.fromkeys(n.lower().rstrip(".") for n in names))


def load_certificate(
    config: TlsCertificateConfig, min_version: str = "1.2", alpn: Iterable[str] = ()
) -> Certificate:
    """Load one certificate/key pair into a context of its own; :class:`TlsError` naming
    the file when a file is missing or unreadable, not PEM, or the key does not match."""
    pem = _read(config.cert_file, "certificate")
    _read(config.key_file, "key")
    try:
        leaf = x509.load_pem_x509_certificate(pem)
    except ValueError as e:
        raise TlsError(f"{config.cert_file}: not a PEM certificate ({e})") from None
    context = server_context(min_version, alpn)
    try:
        context.load_cert_chain(config.cert_file, config.key_file)
    except ssl.SSLError as e:
        if "KEY_VALUES_MISMATCH" in str(e) or e.reason == "KEY_VALUES_MISMATCH":
            raise TlsError(
                f"{config.key_file}: the key does not match the certificate {config.cert_file}"
            ) from None
        raise TlsError(
            f"{config.key_file}: not a usable PEM private key for {config.cert_file} "
            f"({e.reason or e})"
        ) from None
    except OSError as e:  # raced with a change on disk
        raise TlsError(f"{config.cert_file}: cannot load: {e.strerror or e}") from None
    hosts = _hosts(leaf)
    return Certificate(
        config.cert_file, config.key_file, hosts, leaf.not_valid_after_utc.timestamp(), context
    )


@contextlib.contextmanager
def _pem_path(data: bytes) -> Iterator[str]:
    """A path that reads as ``data`` while the block runs, for ``load_cert_chain`` (which only
    reads files): an anonymous memory file, else a private temporary file removed at once."""
    try:
        fd = os.memfd_create("sluice-tls", os.MFD_CLOEXEC)
    except (AttributeError, OSError):
        fd = -1
    if fd >= 0:
        try:
            os.write(fd, data)
            path = f"/proc/self/fd/{fd}"
            if os.path.exists(path):
                yield path
                return
        finally:
            os.close(fd)
    with tempfile.TemporaryDirectory(prefix="sluice-tls-") as private:  # mode 0700
        path = os.path.join(private, "pem")
        with open(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600), "wb") as f:
            f.write(data)
        yield path


def load_pem_certificate(
    source: str,
    cert_pem: bytes,
    key_pem: bytes,
    *,
    hosts: Iterable[str] = (),
    min_version: str = "1.2",
    alpn: Iterable[str] = (),
) -> Certificate:
    """A certificate held in memory (``source`` names it in messages, e.g. ``secret
    ns/name``), serving ``hosts`` (its own DNS names when empty); :class:`TlsError` when it
    is not PEM or the key is not a usable key matching it."""
    try:
        leaf = x509.load_pem_x509_certificate(cert_pem)
    except ValueError as e:
        raise TlsError(f"{source}: not a PEM certificate ({e})") from None
    context = server_context(min_version, alpn)
    try:
        with _pem_path(cert_pem) as cert_path, _pem_path(key_pem) as key_path:
            context.load_cert_chain(cert_path, key_path)
    except ssl.SSLError as e:
        if "KEY_VALUES_MISMATCH" in str(e) or e.reason == "KEY_VALUES_MISMATCH":
            raise TlsError(f"{source}: the key does not match the certificate") from None
        raise TlsError(f"{source}: not a usable PEM private key ({e.reason or e})") from None
    served = tuple(dict.fromkeys(h.lower().rstrip(".") for h in hosts)) or _hosts(leaf)
    return Certificate(source, source, served, leaf.not_valid_after_utc.timestamp(), context)


def covers(certificate_hosts: Iterable[str], host: str) -> bool:
    """Whether a certificate naming ``certificate_hosts`` is valid for ``host`` (exact, or a
    ``*.`` name for exactly one more label, as clients check)."""
    name = host.lower().rstrip(".")
    _, dot, parent = name.partition(".")
    for h in certificate_hosts:
        if h == name or (dot and h.startswith("*.") and h[2:] == parent):
            return True
    return False


class CertificateSet:
    """The certificates of one config generation, looked up by SNI name."""

    __slots__ = ("_exact", "_wildcard", "certificates", "default", "reject_unknown")

    def __init__(
        self,
        certificates: list[Certificate],
        reject_unknown: bool = False,
        default: Certificate | None = None,
    ) -> None:
        """The first certificate naming a host serves it; ``default`` (else the first)
        serves the rest."""
        if not certificates:
            raise ValueError("a certificate set needs at least one certificate")
        self.certificates = certificates
        self.default = default or certificates[0]
        self.reject_unknown = reject_unknown
        self._exact: dict[str, Certificate] = {}
        self._wildcard: dict[str, Certificate] = {}
        for cert in certificates:  # the first certificate naming a host serves it
            for host in cert.hosts:
                if host.startswith("*."):
                    self._wildcard.setdefault(host[2:], cert)
                else:
                    self._exact.setdefault(host, cert)

    def lookup(self, server_name: str) -> Certificate | None:
        """The certificate for ``server_name``: exact name, else ``*.`` + its parent."""
        name = server_name.lower().rstrip(".")
        cert = self._exact.get(name)
        if cert is None:
            _, dot, parent = name.partition(".")
            if dot:
                cert = self._wildcard.get(parent)
        return cert

    def hosts(self) -> list[tuple[str, Certificate]]:
        """Every (host, certificate) served, for reports and metrics."""
        return [*self._exact.items(), *(("*." + p, c) for p, c in self._wildcard.items())]

    def __repr__(self) -> str:
        return (
            f"CertificateSet({len(self.certificates)} certificate(s), default "
            f"{self.default.cert_file!r}, reject_unknown={self.reject_unknown})"
        )


def load_certificates(tls: TlsConfig, alpn: Iterable[str] = (FALLBACK_PROTOCOL,)) -> CertificateSet:
    """Every certificate of ``tls``; :class:`TlsError` (all problems, one per line) if any fails."""
    alpn = list(alpn)
    loaded: list[Certificate] = []
    problems: list[str] = []
    for config in tls.certificates:
        try:
            loaded.append(load_certificate(config, tls.min_version, alpn))
        except TlsError as e:
            problems.append(str(e))
    if problems:
        raise TlsError("\n".join(problems))
    return CertificateSet(loaded, reject_unknown=tls.unknown_sni == "reject")


def check_tls(settings: Settings, source: str, now_s: float) -> tuple[list[str], list[str]]:
    """``sluice check``'s TLS part: (problems, warnings), one line each (expired or
    not-yet-chosen certificates are warnings)."""
    problems = check_upstream_tls(settings, source)
    warnings: list[str] = []
    if settings.tls is None:
        return problems, warnings
    for i, config in enumerate(settings.tls.certificates):
        try:
            cert = load_certificate(config, settings.tls.min_version)
        except TlsError as e:
            problems.append(f"{source}: tls.certificates[{i}]: {e}")
            continue
        warnings.extend(expiry_warnings([cert], now_s))
        if not cert.hosts:
            warnings.append(f"{cert.cert_file}: names no DNS host (served only as the default)")
    return problems, warnings


def upstream_context(
    config: UpstreamTlsConfig, alpn: str = FALLBACK_PROTOCOL
) -> ssl.SSLContext | None:
    """The client context for a service's ``upstream_tls`` (None when off), offering ``alpn``
    (``h2`` for ``protocol: h2``); :class:`TlsError` naming the CA file when it cannot be used."""
    if not config.enabled:
        return None
    try:
        context = ssl.create_default_context(cafile=config.ca_file)
    except OSError as e:
        raise TlsError(f"{config.ca_file}: cannot read the CA bundle: {e.strerror or e}") from None
    except ssl.SSLError as e:
        raise TlsError(f"{config.ca_file}: not a PEM CA bundle ({e.reason or e})") from None
    if not config.verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    context.set_alpn_protocols([alpn])
    context.sslobject_class = DirectSSLObject
    return context


def check_upstream_tls(settings: Settings, source: str) -> list[str]:
    """One problem per service whose ``upstream_tls`` cannot be used (its CA bundle)."""
    problems = []
    for name, service in settings.services.items():
        try:
            upstream_context(service.upstream_tls)
        except TlsError as e:
            problems.append(f"{source}: services.{name}.upstream_tls.ca_file: {e}")
    return problems


def expiry_warnings(certificates: Iterable[Certificate], now_s: float) -> list[str]:
    """One line per expired certificate."""
    return [
        f"{c.cert_file}: certificate expired {-c.expires_in_s(now_s) / 86400:.1f} days ago "
        f"(hosts: {', '.join(c.hosts) or 'none'})"
        for c in certificates
        if c.expires_in_s(now_s) <= 0
    ]


class TlsListener:
    """The TLS listener's front context and the certificate set its SNI callback reads."""

    def __init__(self, certificates: CertificateSet, min_version: str, alpn: Iterable[str]) -> None:
        self.alpn = list(alpn)
        self.certificates = certificates
        self.context = server_context(min_version, self.alpn)
        self.context.sni_callback = self._on_sni
        self._load_default()
        self.handshakes_rejected = 0
        """Handshakes refused for an unknown SNI name (``unknown_sni: reject``)."""

    def _load_default(self) -> None:
        default = self.certificates.default
        self.context.load_cert_chain(default.cert_file, default.key_file)

    def update(
        self, certificates: CertificateSet, min_version: str, alpn: Iterable[str] | None = None
    ) -> None:
        """Hot reload: new handshakes use ``certificates`` (and ``alpn``, when given);
        established connections keep theirs."""
        self.certificates = certificates
        self.context.minimum_version = _VERSIONS[min_version]
        if alpn is not None:
            self.alpn = list(alpn)
            self.context.set_alpn_protocols(self.alpn)
        try:  # the default certificate, for clients sending no SNI
            self._load_default()
        except (OSError, ssl.SSLError) as e:  # changed again since it was loaded
            log.warning("tls: keeping the previous default certificate: %s", e)

    def swap(self, certificates: CertificateSet) -> None:
        """New handshakes choose among ``certificates`` (same default, version floor and
        ALPN: a platform's certificates changed); established connections keep theirs."""
        self.certificates = certificates

    def _on_sni(
        self, ssl_object: ssl.SSLObject, server_name: str | None, context: ssl.SSLContext
    ) -> int | None:
        if server_name is None:
            return None  # the front context's (default) certificate
        certs = self.certificates
        cert = certs.lookup(server_name)
        if cert is None:
            if certs.reject_unknown:
                self.handshakes_rejected += 1
                return cast(int, ssl.ALERT_DESCRIPTION_UNRECOGNIZED_NAME)
            cert = certs.default
        ssl_object.context = cert.context
        return None

    def __repr__(self) -> str:
        return f"TlsListener(alpn={self.alpn}, {self.certificates!r})"


class AlpnDispatch(asyncio.Protocol):
    """Accepts one TLS connection; after the handshake, hands it to the protocol the client
    chose by ALPN (``protocols[name]``), or ``http/1.1`` when it chose none."""

    __slots__ = ("protocols",)

    def __init__(self, protocols: Mapping[str, ProtocolFactory]) -> None:
        self.protocols = protocols

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        ssl_object = transport.get_extra_info("ssl_object")
        chosen = ssl_object.selected_alpn_protocol() if ssl_object is not None else None
        factory = self.protocols.get(chosen or FALLBACK_PROTOCOL)
        if factory is None:  # not advertised, so a client cannot have chosen it
            transport.close()
            return
        protocol = factory()
        transport.set_protocol(protocol)
        protocol.connection_made(transport)
